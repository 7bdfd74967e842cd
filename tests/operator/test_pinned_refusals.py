"""Pinned mode holds `spec.pinned` to the planner's own shape and budget rules: a pin the search would never
offer is refused with Ready=False/InvalidSpec naming spec.pinned, and nothing is applied."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from fake_cluster import FakeCluster
from test_capacity import node, pod
from test_reconcile import ROOT

from servingtopology.operator.reconcile import reconcile
from servingtopology.planner.search.decide import decide

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _pinned(pinned: dict[str, Any], **hardware: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    obj["metadata"] |= {"uid": "uid-1", "generation": 1}
    obj["spec"]["policy"]["mode"] = "Pinned"
    obj["spec"]["pinned"] = pinned
    obj["spec"]["hardware"] |= hardware
    return obj


@pytest.mark.parametrize(("pinned", "hardware", "words"), [
    # 4×TP8 is 32 GPUs against maxGPUs 8 (went Ready before)
    ({"kind": "replicas", "replicas": 4, "tp": 8}, {}, ["spec.pinned", "32 GPUs", "budget of 8", "spec.hardware.maxGPUs"]),
    # TP48 on a 32-head model (the API model caps tp at 64, so TP1000 no longer parses; TP48 was accepted too)
    ({"kind": "replicas", "replicas": 1, "tp": 48}, {"maxGPUs": 64, "allowCrossNodeTP": True},
     ["spec.pinned", "TP does not divide the attention heads"]),
    # 5 stages on 3-GPU nodes: pods of 3 and 2 (retried forever without a condition before)
    ({"kind": "replicas", "replicas": 1, "pp": 5}, {"gpusPerNode": 3}, ["spec.pinned", "equal pods"]),
    # 64 stages of a 32-layer model
    ({"kind": "replicas", "replicas": 1, "pp": 64}, {"maxGPUs": 64}, ["spec.pinned", "PP exceeds the layers"]),
    # vLLM refuses max_num_batched_tokens below max_num_seqs at start-up: the pods would crash-loop behind Planned=True
    ({"kind": "replicas", "replicas": 1, "tp": 1, "engineArgs": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}}, {},
     ["spec.pinned.engineArgs.maxNumBatchedTokens", "maxNumSeqs 512", "must be greater than or equal to max_num_seqs (512)"]),
    # a PD pin names its role
    ({"kind": "pd", "prefill": {"count": 1, "tp": 2}, "decode": {"count": 1, "tp": 3}}, {}, ["spec.pinned.decode", "attention heads"]),
])
def test_a_pin_the_planner_would_never_choose_is_refused_naming_spec_pinned(pinned: dict[str, Any], hardware: dict[str, Any],
                                                                           words: list[str]) -> None:
    obj, cluster = _pinned(pinned, **hardware), FakeCluster()
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=T0)
    ready = next(c for c in out.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
    assert all(w in ready["message"] for w in words), ready["message"]
    assert cluster.objects == {} and out.error == "InvalidSpec"
    assert [e.reason for e in cluster.events] == ["InvalidSpec"]


def test_a_pin_within_the_rules_still_goes_ahead() -> None:
    obj, cluster = _pinned({"kind": "replicas", "replicas": 2, "tp": 4}), FakeCluster()
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=T0)
    assert out.status["plan"]["layout"] == "2×TP4" and out.error is None and cluster.objects


def test_a_pin_within_the_budget_but_over_the_free_gpus_is_insufficient_capacity_not_a_failed_pass() -> None:
    # decide() refuses a pin over the budget it is given; planning within the free GPUs must not turn that into a
    # failed pass (the e2e capacity scenario: 2×TP8 pinned with 8 GPUs free).
    obj, cluster = _pinned({"kind": "replicas", "replicas": 2, "tp": 8}, maxGPUs=16), FakeCluster(
        nodes=[node("n0"), node("n1")], other_pods=[pod("n0", 8)])
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=T0)
    assert out.error == "InsufficientCapacity" and cluster.objects == {}
    message = next(c for c in out.status["conditions"] if c["type"] == "InsufficientCapacity")["message"]
    assert "8 h100_sxm GPUs are missing" in message, message


GLM5 = ROOT / "tests" / "planner" / "data" / "model_configs" / "glm-5-nvfp4.json"
SEED000_PROMPT = 510_012


def seed000(namespace: str, *, prefill_fraction: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Seed 000's deployment as a resource, and its ConfigMap's data: GLM-5 NVFP4 (its config.json, context capped at
    524,288 tokens) on SGLang, pinned PD with three TP4/DP4-attention prefill workers and one TP8 decoder (20 B200s),
    510,012-token prompts."""
    config = json.loads(GLM5.read_text())
    config["max_position_embeddings"] = 524_288
    obj = {
        "apiVersion": "servingtopology.io/v1alpha1", "kind": "ServingTopology",
        "metadata": {"name": "glm5", "namespace": namespace},
        "spec": {
            "modelConfigMap": {"name": "glm5-config"}, "modelSource": "zai-org/GLM-5-NVFP4", "servedModelName": "glm-5",
            "precision": "fp4", "kvCacheDtype": "fp8", "engine": {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23"},
            "hardware": {"gpu": "b200_sxm", "gpusPerNode": 8, "maxGPUs": 24},
            "workload": {"arrivalRate": 0.02, "inputTokens": SEED000_PROMPT, "outputTokens": 8_192},
            "slo": {"ttftMs": {"p95": 600_000}, "tpotMs": {"p95": 100}},
            "policy": {"mode": "Pinned"},
            "pinned": {"kind": "pd", "dpAttention": True, "engineArgs": {"memoryFraction": 0.6},
                       "prefill": {"count": 3, "tp": 4, "dp": 4, "engineArgs": {"memoryFraction": prefill_fraction}},
                       "decode": {"count": 1, "tp": 8}},
        },
    }
    return obj, {"config.json": json.dumps(config)}


@pytest.mark.parametrize("prefill_fraction", [
    0.6,   # the seed's memoryFraction: the prefill rank keeps no KV pool at all
    0.7,   # a pool of about 300k tokens per rank, short of the 510,012-token prompt (the seed's 328k-token pool)
])
def test_seed000s_pinned_pd_layout_whose_prefill_rank_cannot_hold_the_prompt_is_pin_refused_naming_spec_pinned_prefill(
        prefill_fraction: float) -> None:
    obj, data = seed000("default", prefill_fraction=prefill_fraction)
    obj["metadata"] |= {"uid": "uid-1", "generation": 1}
    cluster = FakeCluster()
    cluster.config_maps[("default", "glm5-config")] = data
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=T0)
    conditions = {c["type"]: c for c in out.status["conditions"]}
    for kind in ("Ready", "Planned"):
        assert (conditions[kind]["status"], conditions[kind]["reason"]) == ("False", "PinRefused"), conditions[kind]
    message = conditions["Planned"]["message"]
    assert "spec.pinned.prefill" in message and f"{SEED000_PROMPT:,}" in message and "nothing was applied" in message, message
    assert cluster.objects == {} and out.error == "PinRefused" and out.status.get("plan") is None
    assert [e.reason for e in cluster.events] == ["PinRefused"]
