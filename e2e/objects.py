"""ServingTopology objects the scenarios apply, and the checks they share over the engine pods.

Used by the e2e scenarios only. The sample mirrors examples/servingtopology.yaml, retargeted at the harness:
the fake H100 nodes (their product label and GPU taint) and the harness's Prometheus.
"""

from __future__ import annotations

import copy
from typing import Any

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def topology(name: str, namespace: str, *, prometheus_url: str | None, mode: str = "Auto", max_gpus: int = 8,
             arrival_rate: float = 10.0, input_tokens: int = 2048, output_tokens: int = 256, engine: str = "vllm",
             allowed_layouts: list[str] | None = None, max_surge_gpus: int = 2, replan_interval: str = "10s",
             cooldown: str = "10s", precision: str | None = "bf16") -> dict[str, Any]:
    """A ServingTopology for Llama-3.1-8B on the harness's fake H100 nodes.

    `precision=None` leaves spec.precision out (the checkpoint's own then serves); `prometheus_url=None` leaves
    spec.metrics out (the chart's default Prometheus)."""
    image = "vllm/vllm-openai:v0.11.0" if engine == "vllm" else "lmsysorg/sglang:v0.5.23"
    obj: dict[str, Any] = {
        "apiVersion": "servingtopology.io/v1alpha1",
        "kind": "ServingTopology",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "precision": precision,
            "engine": {"name": engine, "image": image},
            "hardware": {
                "gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": max_gpus,
                "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            "workload": {"arrivalRate": arrival_rate, "inputTokens": input_tokens, "outputTokens": output_tokens},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}},
            "objective": "goodput-per-gpu",
            "policy": {
                "mode": mode, "replanInterval": replan_interval, "cooldown": cooldown, "minImprovement": 0.1,
                "allowedLayouts": allowed_layouts or ["replicas", "pd"], "maxSurgeGPUs": max_surge_gpus,
            },
            "metrics": {"prometheusUrl": prometheus_url, "selector": {"namespace": namespace}},
        },
    }
    if precision is None:
        del obj["spec"]["precision"]
    if prometheus_url is None:
        del obj["spec"]["metrics"]
    return obj


def with_spec(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with the dotted `path` under the object set to `value`."""
    out = copy.deepcopy(obj)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return out


def engine_containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in deployment["spec"]["template"]["spec"]["containers"] if c.get("name") == "engine"]


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def gpus_of(pod: dict[str, Any]) -> int:
    total = 0
    for container in pod["spec"]["containers"]:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(limits.get("nvidia.com/gpu", 0))
    return total
