"""Hostile Prometheus servers beside healthy tenants, on the session's control plane with the chart-installed operator.

Sixteen tenants name a Prometheus that attacks the operator's metrics path (e2e/hostile_prometheus.py, on loopback,
which the harness's allow-list admits): two endless 400 MB answers (with and without Content-Length), eight servers
dripping one byte every 2 s (twice the operator's metrics readers, as many as its reconcile workers), an
answer nested 100,000 deep, 1e308, a bare NaN, a redirect to a witness server, and the report's two backslash URLs.
Two healthy tenants run beside them. While the hostile ones fail, the scenario checks (each bound generous):
- every hostile tenant ends in MetricsAvailable=False with its named reason, never a traceback;
- no request reaches the witness the redirect names;
- the operator's resident memory stays under 300 MB (sampled every 0.5 s) and /healthz answers 200 throughout;
- an edit of a healthy tenant is planned and applied within EDIT_BOUND_S.
It prints the figures: peak RSS, the edit's time, the bytes the hostile servers managed to send.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .hostile_prometheus import Answer, HostileServer, drip_answer, endless_answer, json_answer, redirect_answer
from .objects import topology
from .processes import http_ok, wait_until
from .stack import Operator

RSS_LIMIT_MB = 300.0
EDIT_BOUND_S = 60.0        # the issue asks 30 s; the bound leaves room for a loaded machine, the figure is printed
HUGE_BYTES = 400 << 20
DRIPS = 8           # twice the operator's metrics readers, as many as its reconcile workers
BACKSLASH_URLS = ("http://evil.example\\x-kube-prometheus-prometheus.ns.svc:9090",
                  "http://prometheus-operated.evil.example\\.svc:9090")


def _vector(value: bytes) -> bytes:
    return b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[%s,"%s"]}]}}' % (b"1700000000", value)


def _deep() -> bytes:
    return b'{"status":"success","data":{"resultType":"vector","result":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"


def _pinned(name: str, namespace: str, url: str, *, replicas: int = 1, max_gpus: int = 1) -> dict[str, Any]:
    obj = topology(name, namespace, prometheus_url=url, mode="Pinned", max_gpus=max_gpus, max_surge_gpus=0,
                   allowed_layouts=["replicas"], replan_interval="10s")
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": replicas, "tp": 1}
    return obj


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


class _Watch:
    """Samples the operator's RSS and /healthz in a thread until stopped."""

    def __init__(self, pid: int, liveness_port: int) -> None:
        self.pid, self.url = pid, f"http://127.0.0.1:{liveness_port}/healthz"
        self.rss_mb: list[float] = []
        self.health: list[bool] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_probe = 0.0
        while not self._stop.is_set():
            self.rss_mb.append(_rss_mb(self.pid))
            if time.monotonic() >= next_probe:
                self.health.append(http_ok(self.url, timeout_s=10.0))
                next_probe = time.monotonic() + 2.0
            self._stop.wait(0.5)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def _reason(kube: Kube, namespace: str, name: str) -> str | None:
    cond = kube.condition(namespace, name, "MetricsAvailable")
    return str(cond.get("reason")) if cond and cond.get("status") == "False" else None


@pytest.mark.e2e_seconds(44)
def test_a_hostile_prometheus_neither_reaches_another_host_nor_holds_the_operator(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    witness = HostileServer(json_answer(_vector(b"1"))).__enter__()
    hostile: dict[str, tuple[Answer, str]] = {
        "huge": (endless_answer(total_bytes=HUGE_BYTES), "PrometheusAnswerTooLarge"),
        "huge-close": (endless_answer(total_bytes=HUGE_BYTES, content_length=False), "PrometheusAnswerTooLarge"),
        "deep": (json_answer(_deep()), "PrometheusAnswerInvalid"),
        "big": (json_answer(_vector(b"1e308")), "PrometheusAnswerInvalid"),
        "nan": (json_answer(_vector(b"1").replace(b"1700000000", b"NaN")), "PrometheusAnswerInvalid"),
        "redirect": (redirect_answer(f"{witness.url}/api/v1/query?query=up"), "PrometheusRedirectRefused"),
        **{f"drip-{i}": (drip_answer(every_s=2.0), "PrometheusTimeout") for i in range(DRIPS)},
    }
    servers = {name: HostileServer(answer).__enter__() for name, (answer, _) in hostile.items()}
    log_from = len(operator.log_tail(10**9))
    try:
        assert operator.child is not None
        with _Watch(operator.child.popen.pid, operator.liveness_port) as watch:
            objects = [_pinned(name, namespace, servers[name].url) for name in hostile]
            objects += [_pinned(f"backslash-{i}", namespace, url) for i, url in enumerate(BACKSLASH_URLS)]
            objects += [_pinned(f"healthy-{i}", namespace, cluster.prometheus_url, max_gpus=2) for i in range(2)]
            cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))
            expected = {name: reason for name, (_, reason) in hostile.items()}
            expected |= {f"backslash-{i}": "PrometheusUrlRefused" for i in range(len(BACKSLASH_URLS))}

            def all_named() -> bool:
                return all(_reason(kube, namespace, name) == reason for name, reason in expected.items())

            # Generous: GPUs an earlier scenario's deleted namespace still holds are freed by the garbage collector.
            wait_until(all_named, timeout_s=420, what="every hostile tenant's named MetricsAvailable=False",
                       interval_s=2.0, on_timeout=lambda: json.dumps({n: _reason(kube, namespace, n) for n in expected})
                       + "\n" + operator.log_tail())
            # A healthy tenant's edit while the hostile ones keep failing.
            edited = "healthy-0"
            wait_until(lambda: (kube.topology(namespace, edited).get("status", {}).get("plan") or {}).get("generation") == 1,
                       timeout_s=180, what="the healthy tenant's first plan", on_timeout=operator.log_tail)
            started = time.monotonic()
            cluster.kubectl("patch", "stopo", edited, "-n", namespace, "--type=merge", "-p",
                            json.dumps({"spec": {"pinned": {"replicas": 2}}}))
            wait_until(lambda: (kube.topology(namespace, edited).get("status", {}).get("plan") or {}).get("generation") == 2,
                       timeout_s=EDIT_BOUND_S * 3, what="the healthy tenant's edit planned", on_timeout=operator.log_tail)
            edit_s = time.monotonic() - started
            # The hostile tenants are still failing, by name, after the edit.
            still = {name: _reason(kube, namespace, name) for name in expected}
        log = operator.log_tail(10**9)[log_from:]
    finally:
        for server in servers.values():
            server.__exit__()
        witness.__exit__()
    peak_mb = max(watch.rss_mb)
    sent_mb = {name: round(servers[name].sent_bytes / 2**20, 1) for name in ("huge", "huge-close")}
    print(f"\noperator RSS peak {peak_mb:.0f} MB (first {watch.rss_mb[0]:.0f} MB, last {watch.rss_mb[-1]:.0f} MB, "
          f"{len(watch.rss_mb)} samples); /healthz {sum(watch.health)}/{len(watch.health)} answered 200; "
          f"healthy edit planned in {edit_s:.1f} s; MiB the huge servers got out: {sent_mb}")
    assert still == expected, still
    assert witness.heads == [], "a request reached the host a redirect named"
    assert peak_mb < RSS_LIMIT_MB, f"operator RSS reached {peak_mb:.0f} MB"
    assert watch.health and all(watch.health), f"/healthz failed {watch.health.count(False)} of {len(watch.health)} times"
    assert edit_s < EDIT_BOUND_S, f"the healthy tenant's edit took {edit_s:.0f} s"
    assert all(size < 64 for size in sent_mb.values()), sent_mb
    assert "Traceback" not in log and "RecursionError" not in log
