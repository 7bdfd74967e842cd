"""Prometheus over TLS with a private CA, on the session's control plane with the chart-installed operator.

A second real Prometheus (the harness's configuration: the same PodMonitor jobs, scraping the same engine pods) serves
its API over https only, from `--web.config.file` with a tls_server_config holding a serving certificate for
127.0.0.1 signed by a CA made for the scenario (e2e/pki.py), and asking every client for a certificate of that CA
(client_auth_type RequireAndVerifyClientCert). Three resources name it:
- `trusted`: spec.metrics.tls.ca from a ConfigMap holding that CA, cert and key from a kubernetes.io/tls Secret carrying
  the operator's opt-in label: MetricsAvailable=True, and the figures it read (status.observed) are the emulator's
  traffic;
- `other-ca`: the same URL with a CA that signed nothing of it: MetricsAvailable=False PrometheusCertificateUntrusted;
- `no-client-cert`: the right CA, no client certificate: MetricsAvailable=False PrometheusTLSFailed.
Then `servingtopology calibrate --prometheus` reads the same Prometheus's history of `trusted` (over https, with
--prometheus-ca and --topology, the operator's series) and writes a calibration `plan --calibration` takes.
It prints how long each step took and the fitted factors.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from servingtopology.operator.live.metrics import build_queries, topology_matchers
from servingtopology.planner.layout import Engine

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .pki import ServingPki, make_serving_pki
from .processes import wait_until
from .stack import Emulator, Operator

# The CLI's spec of the deployment the resources pin (objects.topology's model, engine and GPU; the emulator's traffic).
CLI_SPEC = ("model: meta-llama/Llama-3.1-8B-Instruct\nprecision: bf16\nengine: {name: vllm, version: '0.11.0'}\n"
            "hardware: {gpu: h100_sxm, maxGPUs: 1}\nworkload: {arrivalRate: 2, inputTokens: 1000, outputTokens: 200}\n"
            "slo: {ttftMs: {p95: 1000}, tpotMs: {p95: 50}}\nlayout: {kind: replicas, replicas: 1, tp: 1}\n")


def _pinned(name: str, namespace: str, url: str, config_map: str, *, client: bool = True) -> dict[str, Any]:
    obj = topology(name, namespace, prometheus_url=url, mode="Pinned", max_gpus=1, max_surge_gpus=0, arrival_rate=2,
                   input_tokens=1000, output_tokens=200, allowed_layouts=["replicas"], replan_interval="10s", cooldown="10m")
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    obj["spec"]["metrics"]["tls"] = {"ca": {"configMap": {"name": config_map, "key": "ca.crt"}}}
    if client:
        obj["spec"]["metrics"]["tls"] |= {"cert": {"secret": {"name": "prometheus-client", "key": "tls.crt"}},
                                          "key": {"secret": {"name": "prometheus-client", "key": "tls.key"}}}
    return obj


def _calibrate(url: str, pki: ServingPki, namespace: str, work: Path) -> subprocess.CompletedProcess[str]:
    spec = work / "spec.yaml"
    spec.write_text(CLI_SPEC)
    return subprocess.run([sys.executable, "-m", "servingtopology", "calibrate", "--prometheus", url, "--prometheus-ca", str(pki.ca_crt),
                           "--prometheus-cert", str(pki.client_crt), "--prometheus-key", str(pki.client_key),
                           "--since", "4m", "--step", "1m", "--topology", f"{namespace}/trusted", "--spec", str(spec),
                           "--out", str(work / "cal.yaml"), "--json"], capture_output=True, text=True, timeout=120, check=False, cwd=work)


def _record(url: str, pki: ServingPki, namespace: str, result: dict[str, Any], path: Path) -> None:
    """The real Prometheus's answers to the range queries calibrate asked (the operator's queries for `trusted`), kept
    in the work folder: tests/data/prometheus_history is made from them (the namespace written as NAMESPACE)."""
    queries = build_queries(Engine.VLLM, matchers=topology_matchers(namespace=namespace, name="trusted"), window_s=60)
    window = result["window_s"]
    end_s = result["end_s"]
    params = {"start": f"{end_s - 4 * 60 + window:.3f}", "end": f"{end_s:.3f}", "step": f"{window:g}"}
    trusting = ssl.create_default_context(cafile=str(pki.ca_crt))
    trusting.load_cert_chain(pki.client_crt, pki.client_key)
    answers = {}
    for expr in (e for q in queries for e in q.exprs):
        query = urllib.parse.urlencode({"query": expr, **params})
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{query}", context=trusting, timeout=30) as response:
            answers[expr.replace(namespace, "NAMESPACE")] = json.loads(response.read())
    path.write_text(json.dumps({"params": params, "answers": answers}, indent=1))


@pytest.mark.e2e_seconds(104)
def test_the_operator_reads_a_prometheus_served_over_tls_with_a_private_ca_and_refuses_another_ca(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    pki = make_serving_pki(cluster.work_dir / f"pki-{namespace}")
    child, url = cluster.start_tls_prometheus(pki, name=f"prometheus-tls-{namespace}", client_certificates=True)
    try:
        for name, ca in (("prometheus-ca", pki.ca_crt), ("unrelated-ca", pki.other_ca_crt)):
            cluster.kubectl("create", "configmap", name, "-n", namespace, f"--from-file=ca.crt={ca}")
        cluster.kubectl("create", "secret", "tls", "prometheus-client", "-n", namespace, f"--cert={pki.client_crt}",
                        f"--key={pki.client_key}")
        cluster.kubectl("label", "secret", "prometheus-client", "-n", namespace, "servingtopology.io/metrics-token=true")
        trusted = _pinned("trusted", namespace, url, "prometheus-ca")
        other = _pinned("other-ca", namespace, url, "unrelated-ca")
        anonymous = _pinned("no-client-cert", namespace, url, "prometheus-ca", client=False)
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all([trusted, other, anonymous]))
        refused = kube.wait_condition(namespace, "other-ca", "MetricsAvailable", "False", timeout_s=240, log=operator.log_tail)
        refused_s = time.monotonic() - started
        no_cert = kube.wait_condition(namespace, "no-client-cert", "MetricsAvailable", "False", timeout_s=240, log=operator.log_tail)
        flowing = kube.wait_condition(namespace, "trusted", "MetricsAvailable", "True", timeout_s=300, log=operator.log_tail)
        flowing_s = time.monotonic() - started

        def observed() -> dict[str, Any]:
            return dict(kube.topology(namespace, "trusted").get("status", {}).get("observed") or {})

        wait_until(lambda: (observed().get("arrivalRateRps") or 0) > 0, timeout_s=180,
                   what="figures read over https in status.observed", on_timeout=operator.log_tail)
        figures = observed()
        other_now = kube.condition(namespace, "other-ca", "MetricsAvailable") or {}
        # calibrate from the same Prometheus's history of `trusted`, once it holds a few minutes of its traffic.
        work = cluster.work_dir / f"calibrate-{namespace}"
        work.mkdir(exist_ok=True)
        runs: list[subprocess.CompletedProcess[str]] = []

        def fitted() -> bool:
            runs.append(_calibrate(url, pki, namespace, work))
            return runs[-1].returncode == 0

        wait_until(fitted, timeout_s=300, interval_s=20.0, what="calibrate --prometheus fitting the history",
                   on_timeout=lambda: runs[-1].stderr[-2000:] if runs else "")
        calibrated_s = time.monotonic() - started
        result = json.loads(runs[-1].stdout)
        _record(url, pki, namespace, result, work / "recorded-answers.json")
        plan = subprocess.run([sys.executable, "-m", "servingtopology", "plan", str(work / "spec.yaml"), "--calibration",
                               str(work / "cal.yaml"), "--no-simulate"], capture_output=True, text=True, timeout=120, check=False, cwd=work)
    finally:
        cluster.supervisor.stop(child)
    print(f"calibrate --prometheus after {calibrated_s:.0f} s ({len(runs)} tries): {result['fit']['points_used']} points of "
          f"{result['windows']} windows, factors {result['factors']}, RMS log error TTFT {result['fit']['residual_before']['ttft']:.3f} "
          f"→ {result['fit']['residual_after']['ttft']:.3f}, TPOT {result['fit']['residual_before']['tpot']:.3f} → "
          f"{result['fit']['residual_after']['tpot']:.3f}")
    assert result["fit"]["points_used"] >= 2 and result["window_s"] == 60
    assert all(p["source"] == url for p in result["points"]) and all(0 < p["load"] < 8 for p in result["points"])
    assert result["deployment"]["model"] and result["deployment"]["release"] == "0.11.0"
    assert plan.returncode == 0 and "calibrated" in plan.stdout, plan.stdout[-2000:] + plan.stderr[-2000:]
    print(f"\nover https with the private CA: MetricsAvailable=True after {flowing_s:.0f} s ({flowing.get('reason')}), "
          f"observed {figures.get('arrivalRateRps')} req/s; with another CA: {refused.get('reason')} after {refused_s:.0f} s: "
          f"{refused.get('message', '')[:200]}")
    print(f"without a client certificate: {no_cert.get('reason')}: {no_cert.get('message', '')[:200]}")
    assert no_cert["reason"] == "PrometheusTLSFailed" and "client certificate" in no_cert["message"], no_cert
    assert refused["reason"] == "PrometheusCertificateUntrusted", refused
    assert "spec.metrics.tls.ca" in refused["message"] and "Traceback" not in refused["message"]
    assert other_now.get("reason") == "PrometheusCertificateUntrusted", other_now
    assert 0.5 < float(figures["arrivalRateRps"]) < 8.0, figures      # the emulator's 2 req/s, as Prometheus rates it
