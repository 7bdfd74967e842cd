"""`calibrate --prometheus` reads through prometheus-api-client (servingtopology/cli/prometheus_reader.py), against the
hostile servers the operator's client is tested with (e2e/hostile_prometheus.py, on loopback): every bound of the
operator's client holds on the library's path (a capped, streamed body; one deadline; no redirect, no retry, no proxy;
bounded heads; NaN, Infinity, nesting and non-JSON refused), and no failure repeats the server's words."""

from __future__ import annotations

import socket
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_api_client.prometheus_connect import PrometheusConnect

from e2e.hostile_prometheus import Answer, HostileServer, drip_answer, endless_answer, json_answer, raw_answer, redirect_answer
from servingtopology.cli import prometheus_reader
from servingtopology.cli.main import main
from servingtopology.cli.prometheus_reader import LibraryPrometheus
from servingtopology.operator.live.history import fetch_history
from servingtopology.operator.live.metrics import Figure, Query
from servingtopology.operator.live.prometheus_http import BoundedPrometheus, PrometheusAnswerError, PrometheusFailure, ReadLimits
from servingtopology.operator.live.url_policy import parse_prometheus_url

FAST = ReadLimits(query_s=2.0)
END_S = 1_700_000_000.0


def matrix(*values: str) -> bytes:
    points = ",".join(f'[{END_S - 60 * i:.0f},"{v}"]' for i, v in enumerate(values))
    return b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[%s]}]}}' % points.encode()


GOOD = matrix("7")


def reader(url: str, limits: ReadLimits = FAST) -> LibraryPrometheus:
    return LibraryPrometheus(parse_prometheus_url(url), limits=limits)


def read(url: str, limits: ReadLimits = FAST) -> list[dict[str, Any]]:
    client = reader(url, limits)
    try:
        return client.range_query("up", start_s=END_S - 120, end_s=END_S, step_s=60)
    finally:
        client.close()


def refusal(url: str, limits: ReadLimits = FAST) -> PrometheusAnswerError:
    with pytest.raises(PrometheusAnswerError) as caught:
        read(url, limits)
    return caught.value


def test_a_good_answer_is_read_through_the_library_chunked_or_not() -> None:
    for chunked in (False, True):
        with HostileServer(json_answer(GOOD, chunked=chunked)) as prom:
            assert read(prom.url)[0]["values"][0][1] == "7"
        assert len(prom.heads) == 1 and b"GET /api/v1/query_range?query=up&start=" in prom.heads[0]
        assert b"Accept-Encoding: identity\r\n" in prom.heads[0]


def test_the_librarys_own_adapter_with_its_retries_is_replaced_by_the_bounded_one() -> None:
    client = reader("http://127.0.0.1:9")
    assert isinstance(client.client, PrometheusConnect)
    for url in ("http://127.0.0.1:9/api/v1/query_range", "http://elsewhere:80/", "https://elsewhere/"):
        assert client.session.get_adapter(url) is client.adapter
    assert client.adapter.max_retries.total == 0 and client.session.max_redirects == 0 and not client.session.trust_env


# --- StreamedCap ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content_length", [True, False])
def test_a_huge_answer_is_refused_past_the_cap_without_being_read_whole(content_length: bool) -> None:
    total = 64 << 20
    with HostileServer(endless_answer(total_bytes=total, content_length=content_length)) as prom:
        tracemalloc.start()
        try:
            caught = refusal(prom.url, ReadLimits(query_s=10.0))
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        time.sleep(0.2)
    assert caught.reason is PrometheusFailure.TOO_LARGE
    assert peak_bytes < 8 << 20, f"the read held {peak_bytes / 2**20:.1f} MiB"
    assert prom.sent_bytes < total // 2, "the client read on past the cap"


# --- OneDeadline ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_too", [False, True])
def test_a_server_dripping_a_byte_at_a_time_is_cut_at_the_query_deadline(head_too: bool) -> None:
    # Each byte comes well inside requests' per-read timeout: only the total deadline ends this read.
    with HostileServer(drip_answer(every_s=0.05, head_too=head_too)) as prom:
        started = time.monotonic()
        caught = refusal(prom.url, ReadLimits(query_s=0.5))
        took_s = time.monotonic() - started
    assert caught.reason is PrometheusFailure.TIMEOUT
    assert took_s < 8.0, f"the read took {took_s:.1f} s against a 0.5 s deadline"


def test_a_resolver_that_hangs_ends_at_the_querys_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    def hanging(*args: Any, **kwargs: Any) -> list[Any]:
        time.sleep(3.0)
        return []
    monkeypatch.setattr(prometheus_reader.socket, "getaddrinfo", hanging)
    started = time.monotonic()
    caught = refusal("http://prometheus.ml.svc:9090", ReadLimits(query_s=0.5))
    # Normally the resolver's wait is what ends it ("not resolved"); on a loaded machine the half second can pass before
    # the resolve starts, and the query's own deadline ends it: both are the query's one deadline, never the 3 s hang.
    assert caught.reason is PrometheusFailure.TIMEOUT
    assert "not resolved within 0.5 s" in str(caught) or str(caught) == "no whole answer within 0.5 s"
    assert time.monotonic() - started < 2.5


# --- one wording: the same failure reads the same here and in the operator's conditions -------------------------------

def operator_refusal(url: str, limits: ReadLimits = FAST) -> PrometheusAnswerError:
    with pytest.raises(PrometheusAnswerError) as caught:
        BoundedPrometheus(parse_prometheus_url(url), limits=limits).range_query("up", start_s=END_S - 120, end_s=END_S, step_s=60)
    return caught.value


def test_a_refused_connection_is_named_alike_by_both_clients() -> None:
    with socket.socket() as probe:       # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    mine, operators = refusal(url), operator_refusal(url)
    assert (mine.reason, str(mine)) == (operators.reason, str(operators))
    assert mine.reason is PrometheusFailure.UNAVAILABLE
    assert str(mine).startswith(f"cannot connect to 127.0.0.1:{port}: ConnectionRefusedError: ") and "[Errno" not in str(mine)


@pytest.mark.parametrize(("outcome", "reason", "message"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), PrometheusFailure.UNAVAILABLE,
     "cannot resolve prometheus.ml.svc: Name or service not known"),
    (OSError("resolver says: secret-token-42"), PrometheusFailure.UNAVAILABLE, "cannot resolve prometheus.ml.svc: OSError"),
    ([], PrometheusFailure.UNAVAILABLE, "prometheus.ml.svc resolves to no address"),   # was PrometheusAddressRefused in the operator
])
def test_a_name_that_does_not_resolve_is_named_alike_by_both_clients(monkeypatch: pytest.MonkeyPatch, outcome: Any,
                                                                     reason: PrometheusFailure, message: str) -> None:
    def resolving(*args: Any, **kwargs: Any) -> list[Any]:
        if isinstance(outcome, BaseException):
            raise outcome
        return list(outcome)
    monkeypatch.setattr(socket, "getaddrinfo", resolving)
    for caught in (refusal("http://prometheus.ml.svc:9090"), operator_refusal("http://prometheus.ml.svc:9090")):
        assert (caught.reason, str(caught)) == (reason, message)


@pytest.mark.parametrize(("answer", "reason", "message"), [
    (drip_answer(every_s=0.05), PrometheusFailure.TIMEOUT, "no whole answer within 0.5 s"),
    (json_answer(GOOD[:40], length=200), PrometheusFailure.INVALID,
     "HTTP 200 with a body that is not Prometheus JSON (the body ended before its length or its last chunk (truncated))"),
])
def test_a_cut_or_truncated_answer_is_named_alike_by_both_clients(answer: Answer, reason: PrometheusFailure, message: str) -> None:
    limits = ReadLimits(query_s=0.5)
    with HostileServer(answer) as prom:
        for caught in (refusal(prom.url, limits), operator_refusal(prom.url, limits)):
            assert (caught.reason, str(caught)) == (reason, message)


@pytest.mark.parametrize(("answer", "reason", "message"), [
    # over the cap: by its Content-Length before a byte of the body is read, and without one as the read passes it
    (endless_answer(total_bytes=2 << 20), PrometheusFailure.TOO_LARGE, "an answer over 1048576 bytes"),
    (endless_answer(total_bytes=2 << 20, content_length=False), PrometheusFailure.TOO_LARGE, "an answer over 1048576 bytes"),
    (json_answer(GOOD, extra_headers="Content-Encoding: gzip\r\n"), PrometheusFailure.INVALID,
     "HTTP 200 with a body that is not Prometheus JSON (a compressed body (identity was asked for))"),
    (redirect_answer("http://127.0.0.1:9/steal", status=307), PrometheusFailure.REDIRECT_REFUSED,
     "HTTP 307: a redirect, which is never followed"),
    (json_answer(b"upstream secret-token-42 failed", status=503), PrometheusFailure.UNAVAILABLE, "HTTP 503"),
])
def test_a_body_refused_by_status_encoding_or_size_is_named_alike_by_both_clients(answer: Answer, reason: PrometheusFailure,
                                                                                 message: str) -> None:
    with HostileServer(answer) as prom:
        for caught in (refusal(prom.url), operator_refusal(prom.url)):
            assert (caught.reason, str(caught)) == (reason, message)
        assert len(prom.heads) == 2, "each client asked once"


# --- NoRedirect, NoRetry, OneUrl --------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_its_target_never_called(status: int) -> None:
    with HostileServer(json_answer(GOOD)) as other, HostileServer(redirect_answer(f"{other.url}/api/v1/query_range?query=up", status=status)) as prom:
        caught = refusal(prom.url)
    assert caught.reason is PrometheusFailure.REDIRECT_REFUSED and f"HTTP {status}" in str(caught)
    assert other.heads == [] and other.url not in str(caught) and len(prom.heads) == 1


@pytest.mark.parametrize("status", [500, 503, 429, 404])
def test_an_error_status_is_asked_once_and_named_by_its_code_never_its_body(status: int) -> None:
    # The library retries 408/429/5xx three times with backoff and puts the body in its exception by default.
    secret = b'{"status":"error","error":"internal: password=hunter2 at db.internal:5432"}'
    with HostileServer(json_answer(secret, status=status)) as prom:
        caught = refusal(prom.url)
    assert caught.reason is PrometheusFailure.UNAVAILABLE and str(caught) == f"HTTP {status}"
    assert len(prom.heads) == 1 and "hunter2" not in str(caught)


def test_no_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    with HostileServer(json_answer(GOOD)) as proxy, HostileServer(json_answer(GOOD)) as prom:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert read(prom.url)[0]["values"][0][1] == "7"
    assert proxy.heads == [] and len(prom.heads) == 1


def test_a_request_for_another_url_is_refused_before_anything_is_sent() -> None:
    with HostileServer(json_answer(GOOD)) as prom:
        client = reader(prom.url)
        with pytest.raises(PrometheusAnswerError) as caught:
            client.session.get(f"{prom.url}/api/v1/admin/tsdb/snapshot")
        with pytest.raises(PrometheusAnswerError):
            client.session.get("http://127.0.0.2:9/api/v1/query_range")
    assert caught.value.reason is PrometheusFailure.ADDRESS_REFUSED and prom.heads == []


# --- HeadReader: the one bound the library cannot keep ----------------------------------------------------------------

def _plain_requests_status(url: str) -> tuple[int, int]:
    """What requests alone makes of an answer: its status and the bytes of its headers."""
    answer = requests.get(f"{url}/api/v1/query_range?query=up", timeout=5.0)
    return answer.status_code, sum(len(k) + len(v) for k, v in answer.headers.items())


@pytest.mark.parametrize(("interim", "headers", "plain", "bounded"), [
    (b"HTTP/1.1 100 Continue\r\n\r\n" * 50, "", 200, "more than 8 interim"),       # any number of 100s skipped
    (b"", "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(90)), 200, "headers over 32768 bytes"),   # 90 KiB of headers
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "", None, "HTTP 101"),
])
def test_requests_alone_leaves_interim_heads_and_header_bytes_unbounded_which_the_head_reader_bounds(
        interim: bytes, headers: str, plain: int | None, bounded: str) -> None:
    raw = interim + f"HTTP/1.1 200 OK\r\n{headers}Content-Length: {len(GOOD)}\r\n\r\n".encode() + GOOD
    with HostileServer(raw_answer(raw)) as prom:
        if plain is not None:
            status, header_bytes = _plain_requests_status(prom.url)
            assert status == plain and (header_bytes > 32 << 10) == bool(headers)
        caught = refusal(prom.url)
    assert bounded in str(caught) and caught.reason in (PrometheusFailure.INVALID, PrometheusFailure.TOO_LARGE)


def test_a_100_continue_before_the_answer_is_skipped() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX-Note: still here\r\n\r\n"
    with HostileServer(raw_answer(interim + b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(GOOD) + GOOD)) as prom:
        assert read(prom.url)[0]["values"][0][1] == "7"


def test_an_answer_in_one_byte_chunks_is_refused_after_the_piece_bound() -> None:
    body = b" " * 65_536 + GOOD
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    with HostileServer(raw_answer(head + b"".join(b"1\r\n%s\r\n" % body[i:i + 1] for i in range(len(body))) + b"0\r\n\r\n")) as prom:
        caught = refusal(prom.url)
    assert caught.reason is PrometheusFailure.INVALID and "more than 4096 pieces" in str(caught)


# --- CheckedFirst -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "why"), [
    (matrix("7").replace(b'"7"', b"NaN"), "a bare NaN"),             # a value written as JSON's non-standard NaN
    (matrix("7").replace(b"1700000000", b"NaN", 1), "a bare NaN"),
    (matrix("7").replace(b"1700000000", b"1e999", 1), "too large for a float"),
    (matrix("7").replace(b"1700000000", b"-Infinity", 1), "a bare -Infinity"),
    (matrix("7").replace(b"1700000000", b"1" + b"0" * 5000, 1), "more than 40 digits"),
    (b'{"status":"success","data":{"resultType":"matrix","result":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}}", "nested deeper"),
    (b"<html>502 Bad Gateway</html>", "not JSON"),
    (b'{"status":"success","data":{"resultType":"matrix","result":["\xff"]}}', "not UTF-8"),
    (b'{"status":"success","data":{"resultType":"vector","result":[]}}', "not a range vector"),
    (b'{"status":"success","data":{}}', "no data.result"),
])
def test_an_answer_that_is_not_finite_prometheus_json_is_refused_before_the_library_parses_it(body: bytes, why: str) -> None:
    with HostileServer(json_answer(body)) as prom:
        caught = refusal(prom.url)
    assert caught.reason is PrometheusFailure.INVALID and why in str(caught), str(caught)


def test_a_truncated_or_compressed_body_is_invalid() -> None:
    with HostileServer(json_answer(GOOD[:40], length=200)) as prom:
        assert "truncated" in str(refusal(prom.url))
    with HostileServer(json_answer(GOOD, extra_headers="Content-Encoding: gzip\r\n")) as prom:
        assert "compressed" in str(refusal(prom.url))


def test_prometheus_nan_and_inf_strings_are_no_data_and_no_nan_reaches_a_sample() -> None:
    query = Query(Figure.TTFT, ("ttft",), 1e3)
    with HostileServer(json_answer(matrix("NaN", "+Inf", "0.25", "-Inf"))) as prom:
        client = reader(prom.url)
        samples = fetch_history(client, [query], start_s=END_S - 240, end_s=END_S, step_s=60)
    assert [(s.at_s, s.ttft_ms) for s in samples] == [(END_S - 120, 250.0)]


# --- the command line ------------------------------------------------------------------------------------------------

SPEC = ("model: meta-llama/Llama-3.1-8B-Instruct\nengine: {name: vllm, version: '0.11.0'}\nhardware: {gpu: h100_sxm, maxGPUs: 2}\n"
        "workload: {arrivalRate: 2, inputTokens: 1000, outputTokens: 200}\nslo: {ttftMs: {p95: 1000}, tpotMs: {p95: 50}}\n"
        "layout: {kind: replicas, replicas: 2, tp: 1}\n")


@pytest.mark.parametrize(("answer", "reason"), [
    (endless_answer(total_bytes=8 << 20), "PrometheusAnswerTooLarge"),
    (redirect_answer("http://127.0.0.1:9/steal"), "PrometheusRedirectRefused"),
    (raw_answer(b"HTTP/1.1 100 Continue\r\n\r\n" * 50 + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"), "PrometheusAnswerInvalid"),
    (raw_answer(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 40_000 + b"\r\n\r\n"), "PrometheusAnswerTooLarge"),
    (json_answer(matrix("7").replace(b"1700000000", b"NaN", 1)), "PrometheusAnswerInvalid"),
    (json_answer(b"[" * 50_000 + b"]" * 50_000), "PrometheusAnswerInvalid"),
    (json_answer(b"not json at all: secret-token-42"), "PrometheusAnswerInvalid"),
    (json_answer(b"upstream secret-token-42 failed", status=502), "MetricsUnavailable"),
])
def test_calibrate_names_each_hostile_answer_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                       answer: Answer, reason: str) -> None:
    spec, out = tmp_path / "spec.yaml", tmp_path / "cal.yaml"
    spec.write_text(SPEC)
    with HostileServer(answer) as prom:
        code = main(["calibrate", "--prometheus", prom.url, "--since", "1h", "--spec", str(spec), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--prometheus" in err and reason in err and prom.url in err, err
    assert "secret-token-42" not in err and "Traceback" not in err and not out.exists()
    assert len(prom.heads) == 1, "the first failure ends the read: no retry, no further query"


def test_the_reader_connects_to_every_address_of_the_name_until_one_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    with HostileServer(json_answer(GOOD)) as prom:
        port = int(prom.url.rsplit(":", 1)[1])

        real = socket.getaddrinfo

        def two(host: str, p: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
            if host != "prometheus.ml.svc":      # urllib3's create_connection, given an address
                return real(host, p, *args, **kwargs)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.3", 1)), (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))]
        monkeypatch.setattr(prometheus_reader.socket, "getaddrinfo", two)
        monkeypatch.setattr(prometheus_reader.urllib3.util.connection, "create_connection",
                            _only_port(port, prometheus_reader.urllib3.util.connection.create_connection))
        assert read(f"http://prometheus.ml.svc:{port}")[0]["values"][0][1] == "7"
    assert b"Host: prometheus.ml.svc:%d\r\n" % port in prom.heads[0]


def _only_port(port: int, connect: Any) -> Any:
    def refusing(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        if address[0] != "127.0.0.1":
            raise ConnectionRefusedError(111, "refused")
        return connect(address, *args, **kwargs)
    return refusing
