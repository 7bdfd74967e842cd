"""Seed 000's blocker on a real API server: a pinned PD ServingTopology of GLM-5 NVFP4 on SGLang (its config.json in a
ConfigMap) whose TP4/DP4-attention prefill rank cannot hold the 510,012-token prompt is refused at plan time with
`PinRefused` naming `spec.pinned.prefill`, the prompt and the rank's pool, and nothing is applied: no Deployment, no
pod, no Service, no status.plan, however many passes run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .processes import wait_until
from .stack import Operator

GLM5 = Path(__file__).resolve().parents[1] / "tests" / "planner" / "data" / "model_configs" / "glm-5-nvfp4.json"
PROMPT = 510_012


def _seed000(name: str, namespace: str) -> dict[str, Any]:
    """The seed's deployment as a resource: three TP4/DP4-attention prefill workers (memoryFraction 0.7: a rank pool
    of about 300k tokens, the seed's 328k-token starting point) and one TP8 decoder, 20 B200s, 510,012-token prompts
    under the 524,288-token context cap."""
    return {
        "apiVersion": "servingtopology.io/v1alpha1", "kind": "ServingTopology",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "modelConfigMap": {"name": f"{name}-config"}, "modelSource": "zai-org/GLM-5-NVFP4", "servedModelName": "glm-5",
            "precision": "fp4", "kvCacheDtype": "fp8", "engine": {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23"},
            "hardware": {"gpu": "b200_sxm", "gpusPerNode": 8, "maxGPUs": 24},
            "workload": {"arrivalRate": 0.02, "inputTokens": PROMPT, "outputTokens": 8_192},
            "slo": {"ttftMs": {"p95": 600_000}, "tpotMs": {"p95": 100}},
            "policy": {"mode": "Pinned"},
            "pinned": {"kind": "pd", "dpAttention": True, "engineArgs": {"memoryFraction": 0.6},
                       "prefill": {"count": 3, "tp": 4, "dp": 4, "engineArgs": {"memoryFraction": 0.7}},
                       "decode": {"count": 1, "tp": 8}},
        },
    }


def test_seed000s_pinned_pd_layout_is_pin_refused_by_name_and_nothing_is_applied(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    config = json.loads(GLM5.read_text())
    config["max_position_embeddings"] = 524_288   # the seed's context cap: the prompt fits the context, not the rank
    cluster.kubectl("create", "configmap", "glm5-config", "-n", namespace, f"--from-literal=config.json={json.dumps(config)}")
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_seed000("glm5", namespace)))
    def refused() -> bool:
        cond = kube.condition(namespace, "glm5", "Planned") or {}
        return (cond.get("status"), cond.get("reason")) == ("False", "PinRefused")
    wait_until(refused, timeout_s=180, what="Planned=False PinRefused",
               on_timeout=lambda: json.dumps(kube.topology(namespace, "glm5").get("status", {}), indent=1)[-3000:] + operator.log_tail())
    planned = kube.condition(namespace, "glm5", "Planned") or {}
    message = planned["message"]
    assert "spec.pinned.prefill" in message and f"{PROMPT:,}" in message and "KV tokens" in message, message
    assert "nothing was applied" in message, message
    ready = kube.condition(namespace, "glm5", "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "PinRefused"), ready
    events = kube.events(namespace, reason="PinRefused")
    assert events and "spec.pinned.prefill" in (events[0].get("message") or events[0].get("note") or ""), events
    time.sleep(20)   # more passes (the operator's timer and requeues) still apply nothing
    for kind in ("deployments", "pods", "services"):
        assert not kube.items(kind, namespace), f"nothing may be applied for a refused pin: {kind} exist"
    assert kube.topology(namespace, "glm5").get("status", {}).get("plan") is None
    assert len(kube.events(namespace, reason="PinRefused")) == 1
