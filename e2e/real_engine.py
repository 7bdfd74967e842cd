"""The real vLLM CPU engine behind a ServingTopology's rendered pod: the one launcher the real-engine scenarios share.

Used by e2e/test_real_engine.py (the metrics contract) and e2e/test_calibrate_real_client.py (a real benchmark client
calibrating a resource). A pinned one-replica layout of the tiny Llama (e2e/engine/tiny_model.py: random weights, a
locally trained tokenizer; nothing downloaded) is applied with the model given through `modelConfigMap` +
`modelSource`; the emulator fleet's real-engine rule makes the pod run `vllm serve` from the container's own command
and arguments (vLLM's CPU build from PyPI; the executable, the model folder and the pod's host/port mapped onto this
machine, see servingtopology/emulator/real_engine.py). The fixtures `engine_python` and `tiny_model` are in conftest.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import pod_ready, topology
from .processes import ComponentDied, wait_until
from .stack import Emulator, Operator

MODEL_IN_IMAGE = "/models/tiny-llama"   # what the pod's arguments name (spec.modelSource)
SERVED_NAME = "tiny-llama"
CONFIG_MAP = "tiny-llama-config"        # the tiny model's config.json (spec.modelConfigMap)
ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"
ENGINE_START_TIMEOUT_S = 420            # 33 s unloaded with --enforce-eager; the machine is shared
# Engine environment knobs for vLLM's CPU build (documented in vllm/envs.py): the CPU platform chosen outright,
# a small KV cache (GiB), no thread pinning on a shared machine, no hub access, no usage reporting.
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    "OMP_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class RealEngine:
    """A real vLLM serving a resource's pod: where it answers, the pod and its engine container, the engine's log."""

    address: str
    pod: dict[str, Any]
    container: dict[str, Any]
    log: Path
    started_s: float          # seconds from the fleet starting it to /health answering


def tiny_llama_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` (objects.topology's) retargeted at the tiny Llama served by vLLM 0.32's CPU build."""
    del spec["model"]
    spec |= {"modelConfigMap": {"name": CONFIG_MAP}, "modelSource": MODEL_IN_IMAGE, "servedModelName": SERVED_NAME}
    # vLLM's CPU build as a user would run it on a CPU node, through the spec's own override path (extraArgs come
    # last; argparse keeps the last value): CUDA graphs off, and a KV block of 32 because the planner renders the
    # GPU default 16, which the CPU attention backend refuses at start-up ("No common block size for 16
    # (CPU_ATTN: [MultipleOf(32)])").
    spec["engine"] = {"name": "vllm", "image": ENGINE_IMAGE, "extraArgs": ["--enforce-eager", "--block-size", "32"]}
    return spec


def serve_tiny_llama(cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str, *,
                     engine_python: Path, tiny_model: Path, name: str = "tiny", **topology_args: Any) -> RealEngine:
    """Apply a Pinned 1×TP1 ServingTopology of the tiny Llama in `namespace` and wait until the real vLLM the fleet
    starts for its pod answers /health."""
    config_json = (tiny_model / "config.json").read_text()
    cluster.kubectl("create", "configmap", CONFIG_MAP, "-n", namespace, f"--from-literal=config.json={config_json}")
    emulator.set_real_engine({
        "namespace": namespace, "commands": {"vllm": str(engine_python.with_name("vllm"))},
        "paths": {MODEL_IN_IMAGE: str(tiny_model)}, "env": ENGINE_ENV, "logDir": str(cluster.supervisor.log_dir),
    })
    args = {"mode": "Pinned", "max_gpus": 1, "arrival_rate": 2, "input_tokens": 16, "output_tokens": 8, "replan_interval": "10s"}
    obj = topology(name, namespace, prometheus_url=cluster.prometheus_url, **(args | topology_args))
    tiny_llama_spec(obj["spec"])["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))

    def pods() -> list[dict[str, Any]]:
        return kube.items("pods", namespace, selector=f"app.kubernetes.io/instance={name}")

    wait_until(lambda: bool(pods()) and all(pod_ready(p) for p in pods()), timeout_s=180, what="the engine pod Ready",
               on_timeout=operator.log_tail)
    pod = pods()[0]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")

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
    took = time.monotonic() - started
    print(f"\nreal vLLM healthy {took:.0f} s after the fleet started it")
    return RealEngine(address, pod, container, engine_log, took)
