"""Prometheus over https with a private CA (spec.metrics.tls), through the real client against a TLS server on loopback
made with a throwaway CA (e2e/pki.py): the CA the resource names is trusted and no other, the URL's host is checked
against the certificate, a client certificate is shown when one is given, every bound of the plain client holds over
TLS, and each failure is a named MetricsAvailable=False reason, never ssl's traceback."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_cluster import FakeCluster
from test_live_reconcile import NS, CountingPlanner, live_topology, run
from test_reconcile import cond

from e2e.hostile_prometheus import HostileServer, drip_answer, endless_answer, json_answer, raw_answer
from e2e.pki import ServingPki, make_serving_pki
from servingtopology.operator.api.resource import MetricsSpec
from servingtopology.operator.live.metrics import MetricsUnavailable, PrometheusMetrics
from servingtopology.operator.live.prometheus_http import BoundedPrometheus, PrometheusAnswerError, PrometheusFailure, ReadLimits
from servingtopology.operator.live.prometheus_tls import TlsConfigInvalid, TlsMaterial, client_context
from servingtopology.operator.live.url_policy import UrlAllowList, parse_network, parse_prometheus_url
from servingtopology.operator.live_replan import prometheus_source
from servingtopology.planner.layout import Engine
from servingtopology.planner.live.observe import MetricSample

M = {"namespace": "ml", "servingtopology_io_topology": "chat"}
FAST = ReadLimits(query_s=2.0)
ANSWER = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.5,"7"]}]}}'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ServingPki:
    return make_serving_pki(tmp_path_factory.mktemp("pki"))


def server_context(pki: ServingPki, *, client_ca: Path | None = None) -> ssl.SSLContext:
    """What a Prometheus with web.config.file's tls_server_config serves (client_auth_type RequireAndVerifyClientCert
    with a client_ca_file: `client_ca`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_crt, pki.server_key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def material(pki: ServingPki, *, ca: Path | None = None, client: bool = False) -> TlsMaterial:
    return TlsMaterial(ca_pem=(ca or pki.ca_crt).read_text(), cert_pem=pki.client_crt.read_text() if client else None,
                       key_pem=pki.client_key.read_text() if client else None)


def fetch(url: str, tls: TlsMaterial | None, **kwargs: Any) -> MetricSample:
    src = PrometheusMetrics(url, engine=Engine.VLLM, matchers=M, window_s=120, read_limits=kwargs.pop("limits", FAST),
                            read_deadline_s=10.0, tls=tls, **kwargs)
    return src.fetch_sample(at_s=0.0, interval_s=60.0)


def failure(url: str, tls: TlsMaterial | None, **kwargs: Any) -> MetricsUnavailable:
    with pytest.raises(MetricsUnavailable) as caught:
        fetch(url, tls, **kwargs)
    return caught.value


@pytest.fixture
def served(pki: ServingPki) -> Iterator[HostileServer]:
    with HostileServer(json_answer(ANSWER), tls=server_context(pki)) as prom:
        yield prom


# --- trust -----------------------------------------------------------------------------------------------------------

def test_a_prometheus_signed_by_the_named_private_ca_is_read_over_https(pki: ServingPki, served: HostileServer) -> None:
    assert served.url.startswith("https://127.0.0.1:")
    sample = fetch(served.url, material(pki), bearer_token="s3cret")
    assert sample.request_rate_rps == 7.0 and sample.ttft_ms == 7000.0
    assert served.heads and all(b"Authorization: Bearer s3cret\r\n" in h for h in served.heads)


@pytest.mark.parametrize("ca", ["other", "system"])
def test_a_certificate_of_another_ca_is_untrusted_and_nothing_is_sent(pki: ServingPki, served: HostileServer, ca: str) -> None:
    tls = material(pki, ca=pki.other_ca_crt) if ca == "other" else None      # None: the system's CAs
    caught = failure(served.url, tls, bearer_token="s3cret")
    assert caught.reason == "PrometheusCertificateUntrusted"
    assert "unable to get local issuer certificate" in str(caught) and "spec.metrics.tls.ca" in str(caught)
    assert served.heads == [], "a request (and its token) reached a server whose certificate was not verified"


def test_the_urls_host_is_checked_against_the_certificate_at_the_address_the_policy_checked(pki: ServingPki,
                                                                                          served: HostileServer) -> None:
    # The name resolves to the server's address (allowed by the administrator's network), but the certificate names
    # 127.0.0.1 and localhost only: a CA's certificate for another host is not this host's.
    port = served.url.rsplit(":", 1)[1]
    policy = UrlAllowList.of(["https://prometheus-operated.*.svc:*"], networks=[parse_network("127.0.0.0/8")]).addresses
    client = BoundedPrometheus(parse_prometheus_url(f"https://prometheus-operated.ml.svc:{port}"), limits=FAST, addresses=policy,
                               tls=client_context(material(pki)),
                               resolve=lambda host, p: [(2, 1, 6, "", ("127.0.0.1", p))])
    with pytest.raises(PrometheusAnswerError) as caught:
        client.custom_query("up")
    assert caught.value.reason is PrometheusFailure.CERT_UNTRUSTED and "Hostname mismatch" in str(caught.value)
    assert served.heads == []
    local = BoundedPrometheus(parse_prometheus_url(served.url), limits=FAST, tls=client_context(material(pki)))
    assert local.custom_query("up")[0]["value"][1] == "7"      # the same server by the address its certificate names


def test_a_plain_http_server_behind_an_https_url_is_a_tls_failure(pki: ServingPki) -> None:
    # An HTTP server answers the ClientHello as a bad request (Go's: 400 "Client sent an HTTP request to an HTTPS server").
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
        threading.Thread(target=answer, daemon=True).start()
        caught = failure(f"https://127.0.0.1:{listener.getsockname()[1]}", material(pki))
    assert caught.reason == "PrometheusTLSFailed" and "may not serve TLS" in str(caught)


# --- client certificates ---------------------------------------------------------------------------------------------

def test_a_server_that_requires_a_client_certificate_gets_the_one_spec_names(pki: ServingPki) -> None:
    with HostileServer(json_answer(ANSWER), tls=server_context(pki, client_ca=pki.ca_crt)) as prom:
        caught = failure(prom.url, material(pki))
        assert caught.reason == "PrometheusTLSFailed" and "client certificate" in str(caught)
        assert prom.heads == [] and prom.handshake_failed()
        assert fetch(prom.url, material(pki, client=True)).request_rate_rps == 7.0
        assert prom.heads


def test_a_client_certificate_the_server_does_not_trust_is_a_named_tls_failure(pki: ServingPki) -> None:
    with HostileServer(json_answer(ANSWER), tls=server_context(pki, client_ca=pki.other_ca_crt)) as prom:
        caught = failure(prom.url, material(pki, client=True))
    assert caught.reason == "PrometheusTLSFailed" and "client certificate" in str(caught) and prom.heads == []


# --- spec.metrics.tls that cannot be used ----------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "field", "why"), [
    ({"ca_pem": "not a certificate"}, "spec.metrics.tls.ca", "no PEM certificate"),
    ({"ca_pem": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, "spec.metrics.tls.ca", "can be loaded"),
    ({"key_pem": "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"}, "spec.metrics.tls.key",
     "encrypted"),
    ({"key_pem": None}, "spec.metrics.tls.key", "both cert and key"),
    ({"ca_pem": "-----BEGIN CERTIFICATE-----\n" + "A" * (300 << 10)}, "spec.metrics.tls.ca", "KiB"),
])
def test_unusable_pem_text_is_refused_naming_the_field(pki: ServingPki, change: dict[str, Any], field: str, why: str) -> None:
    good = material(pki, client=True)
    tls = TlsMaterial(**{"ca_pem": good.ca_pem, "cert_pem": good.cert_pem, "key_pem": good.key_pem, **change})
    with pytest.raises(TlsConfigInvalid) as caught:
        client_context(tls)
    assert caught.value.field == field and why in str(caught.value)
    refused = failure("https://127.0.0.1:9", tls)
    assert refused.reason == "PrometheusTLSConfigInvalid" and field in str(refused)


def test_a_key_of_another_certificate_is_refused_naming_the_key(pki: ServingPki, tmp_path: Path) -> None:
    other = make_serving_pki(tmp_path / "other")
    tls = TlsMaterial(ca_pem=pki.ca_crt.read_text(), cert_pem=pki.client_crt.read_text(), key_pem=other.client_key.read_text())
    with pytest.raises(TlsConfigInvalid) as caught:
        client_context(tls)
    assert caught.value.field == "spec.metrics.tls.key" and "not the private key" in str(caught.value)


def test_tls_is_refused_for_an_http_url_by_the_schema_and_the_client(pki: ServingPki) -> None:
    with pytest.raises(ValueError, match="https"):
        MetricsSpec.model_validate({"prometheusUrl": "http://prometheus-operated.ml.svc:9090",
                                    "tls": {"ca": {"configMap": {"name": "prom-ca", "key": "ca.crt"}}}})
    with pytest.raises(ValueError, match="exactly one of secret or configMap"):
        MetricsSpec.model_validate({"prometheusUrl": "https://p.ml.svc:9090", "tls": {"ca": {}}})
    with pytest.raises(ValueError, match="cert and key together"):
        MetricsSpec.model_validate({"prometheusUrl": "https://p.ml.svc:9090", "tls": {
            "ca": {"configMap": {"name": "prom-ca", "key": "ca.crt"}}, "cert": {"configMap": {"name": "c", "key": "tls.crt"}}}})
    assert failure("http://127.0.0.1:9", material(pki)).reason == "PrometheusTLSConfigInvalid"


# --- the bounds hold over TLS ----------------------------------------------------------------------------------------

def test_every_bound_of_the_plain_client_holds_over_tls(pki: ServingPki) -> None:
    tls = material(pki)
    with HostileServer(drip_answer(every_s=0.05), tls=server_context(pki)) as prom:
        started = time.monotonic()
        assert failure(prom.url, tls, limits=ReadLimits(query_s=0.5)).reason == "PrometheusTimeout"
        assert time.monotonic() - started < 8.0
    with HostileServer(endless_answer(total_bytes=16 << 20), tls=server_context(pki)) as prom:
        assert failure(prom.url, tls).reason == "PrometheusAnswerTooLarge"
        time.sleep(0.2)
        assert prom.sent_bytes < 8 << 20
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
    with HostileServer(raw_answer(interim + head + ANSWER), tls=server_context(pki)) as prom:
        assert fetch(prom.url, tls).request_rate_rps == 7.0
    with HostileServer(raw_answer(interim * 9 + head + ANSWER), tls=server_context(pki)) as prom:
        assert "more than 8 interim" in str(failure(prom.url, tls))


# --- through the reconcile: the PEM text from the resource's ConfigMap and Secret ------------------------------------

def _tls_topology(url: str) -> dict[str, Any]:
    obj = live_topology()
    obj["spec"]["metrics"] |= {"prometheusUrl": url, "tls": {
        "ca": {"configMap": {"name": "prom-ca", "key": "ca.crt"}},
        "cert": {"secret": {"name": "prom-client", "key": "tls.crt"}},
        "key": {"secret": {"name": "prom-client", "key": "tls.key"}}}}
    return obj


def test_the_reconcile_reads_the_ca_and_client_certificate_from_the_resources_namespace(pki: ServingPki) -> None:
    allow = UrlAllowList.of(["https://127.0.0.1:*"])
    with HostileServer(json_answer(ANSWER), tls=server_context(pki, client_ca=pki.ca_crt)) as prom:
        obj, cluster, planner = _tls_topology(prom.url), FakeCluster(), CountingPlanner()
        cluster.config_maps[(NS, "prom-ca")] = {"ca.crt": pki.ca_crt.read_text()}
        cluster.secrets[(NS, "prom-client")] = {"tls.crt": pki.client_crt.read_text(), "tls.key": pki.client_key.read_text()}
        for minute in range(3):
            run(obj, cluster, planner, prometheus_source, minute, allow=allow)   # type: ignore[arg-type]
        assert cond(obj, "MetricsAvailable")["status"] == "True" and prom.heads
        cluster.config_maps[(NS, "prom-ca")] = {"ca.crt": pki.other_ca_crt.read_text()}     # the CA rotated to another one
        run(obj, cluster, planner, prometheus_source, 4, allow=allow)   # type: ignore[arg-type]
        assert (cond(obj, "MetricsAvailable")["status"], cond(obj, "MetricsAvailable")["reason"]) == (
            "False", "PrometheusCertificateUntrusted")
        del cluster.secrets[(NS, "prom-client")]
        run(obj, cluster, planner, prometheus_source, 6, allow=allow)   # type: ignore[arg-type]
    available = cond(obj, "MetricsAvailable")
    assert (available["status"], available["reason"]) == ("False", "PrometheusTLSConfigInvalid")
    assert "spec.metrics.tls.cert" in available["message"] and f"Secret {NS}/prom-client" in available["message"]
