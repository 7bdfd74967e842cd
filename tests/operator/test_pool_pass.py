"""The ServingPool: its CRD is the generated one, and a pass plans the labelled members on the nodes' GPUs by kind."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from servingtopology.operator.api.pool import POOL_CRD_PATHS, POOL_LABEL, PRIORITY_ANNOTATION, render_pool_crd_yaml
from servingtopology.operator.pool_pass import pool_pass
from servingtopology.operator.runtime.pool_handlers import TopologyIndex

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_the_committed_servingpool_crd_is_the_generated_one() -> None:
    for rel in POOL_CRD_PATHS:
        assert (ROOT / rel).read_text() == render_pool_crd_yaml(), f"{rel}: run python -m servingtopology.operator.api.pool --write"


def _node(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]}, "spec": {}}


NODES = [_node("h1", "NVIDIA-H100-80GB-HBM3", 8), _node("a1", "NVIDIA-A100-SXM4-80GB", 8), _node("a2", "NVIDIA-A100-SXM4-80GB", 8)]


def _member(name: str, rate: float, *, priority: int = 0, max_gpus: int = 16) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {POOL_LABEL: "fleet"}, "annotations": {PRIORITY_ANNOTATION: str(priority)}},
            "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
                     "hardware": {"gpu": "h100_sxm", "maxGPUs": max_gpus},
                     "workload": {"arrivalRate": rate, "inputTokens": 1024, "outputTokens": 128},
                     "slo": {"ttftMs": {"p95": 800}, "tpotMs": {"p95": 50}}}}


def _pool(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"inventory": [{"kind": "h100", "gpu": "h100_sxm", "pricePerHour": 2.99},
                                          {"kind": "a100", "gpu": "a100_sxm", "pricePerHour": 1.6, "maxGPUs": 12}]}
    spec.update(over)
    return {"metadata": {"name": "fleet", "namespace": "ns", "generation": 3}, "spec": spec, "status": {}}


def test_a_pass_plans_every_member_on_the_nodes_gpus_and_proposes_once() -> None:
    first = pool_pass(_pool(), [_member("chat", 10.0, priority=2), _member("batch", 4.0)], NODES, now=NOW)
    assert first.status["inventory"] == {"h100": 8, "a100": 12}          # allocatable by product, capped per kind
    assert first.status["conditions"][0]["reason"] == "PoolPlanned"
    rows = {m["name"]: m for m in first.status["members"]}
    assert rows["chat"]["met"] and rows["batch"]["met"]
    for kind, count in first.status["inventory"].items():
        assert sum(m["gpus"].get(kind, 0) for m in rows.values()) + first.status["idle"][kind] == count
    (event,) = first.events
    assert event[1] == "PoolProposal" and "chat:" in event[2] and "$" in event[2]
    again = pool_pass({**_pool(), "status": first.status}, [_member("chat", 10.0, priority=2), _member("batch", 4.0)], NODES, now=NOW)
    assert again.events == []                                             # nothing changed: no new Event
    gone = pool_pass({**_pool(), "status": first.status}, [_member("chat", 10.0, priority=2)], NODES, now=NOW)
    (event,) = gone.events
    assert "batch:" in event[2] and "left the pool" in event[2]


def test_a_member_whose_model_fits_no_kind_is_named_on_the_pool() -> None:
    big = _member("huge", 1.0)
    big["spec"]["model"] = "meta-llama/Llama-3.1-405B"
    big["spec"]["hardware"]["maxGPUs"] = 4
    out = pool_pass(_pool(), [big], NODES, now=NOW)
    cond = out.status["conditions"][0]
    assert cond["status"] == "False" and cond["reason"] == "InvalidSpec" and "member huge" in cond["message"]


@pytest.mark.parametrize(("spec", "field"), [
    ({"inventory": [{"kind": "h100", "gpu": "h100_sxm"}]}, "spec.inventory.0.pricePerHour"),   # a missing price
    ({"objective": "max-goodput"}, "spec.budgetPerHour"),
])
def test_a_bad_pool_spec_is_an_invalidspec_condition_naming_the_field(spec: dict[str, Any], field: str) -> None:
    out = pool_pass(_pool(**spec), [_member("chat", 1.0)], NODES, now=NOW)
    cond = out.status["conditions"][0]
    assert cond["reason"] == "InvalidSpec" and field in cond["message"]


def test_the_index_keeps_labelled_topologies_of_the_namespace_and_drops_deleted_ones() -> None:
    index = TopologyIndex()
    index.seen("ADDED", _member("chat", 1.0))
    other = _member("elsewhere", 1.0)
    other["metadata"]["namespace"] = "other"
    index.seen("ADDED", other)
    index.seen("ADDED", {"metadata": {"name": "solo", "namespace": "ns", "labels": {}}, "spec": {}})
    assert [m["metadata"]["name"] for m in index.members("ns", "fleet")] == ["chat"]
    index.seen("DELETED", _member("chat", 1.0))
    assert index.members("ns", "fleet") == []
