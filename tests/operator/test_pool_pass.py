"""The ServingPool: its CRD is the generated one, and a pass plans the labelled members on the nodes' GPUs by kind."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from servingtopology.operator.api.pool import (
    ALLOCATION_ANNOTATION,
    POOL_CRD_PATHS,
    POOL_LABEL,
    PRIORITY_ANNOTATION,
    Allocation,
    render_pool_crd_yaml,
)
from servingtopology.operator.entry.pool_handlers import TopologyIndex
from servingtopology.operator.pool_pass import pool_pass

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


def _joined(name: str, rate: float, *, priority: int = 0, max_gpus: int = 16, observed: float | None = None,
            cap: int | None = None, pool_gpus: int | None = None) -> dict[str, Any]:
    """A member that joins with spec.pool (no label), maybe with observed traffic and an Auto cap it has planned under."""
    body = _member(name, rate, max_gpus=max_gpus)
    body["metadata"]["labels"], body["metadata"]["annotations"] = {}, {}
    body["spec"]["pool"] = {"name": "fleet", "priority": priority}
    body["status"] = {}
    if observed is not None:
        body["status"]["observed"] = {"arrivalRateRps": observed}
    if cap is not None:
        body["metadata"]["annotations"][ALLOCATION_ANNOTATION] = Allocation("fleet", "h100", "h100_sxm", cap, "Grow").to_json()
        body["status"]["plan"] = {"poolGPUs": cap if pool_gpus is None else pool_gpus}
    return body


def _pod(member: str, node: str, gpus: int, *, namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": f"{member}-{node}-{gpus}", "namespace": namespace, "labels": {"app.kubernetes.io/instance": member}},
            "spec": {"nodeName": node, "containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}


H100S = [_node("h1", "NVIDIA-H100-80GB-HBM3", 8), _node("h2", "NVIDIA-H100-80GB-HBM3", 8)]


def test_spec_pool_joins_with_its_priority_and_the_index_reads_it_before_the_label() -> None:
    index = TopologyIndex()
    index.seen("ADDED", _joined("chat", 1.0, priority=7))
    labelled_elsewhere = _joined("other", 1.0)
    labelled_elsewhere["spec"]["pool"]["name"] = "another"
    labelled_elsewhere["metadata"]["labels"] = {POOL_LABEL: "fleet"}      # spec.pool wins over the label
    index.seen("ADDED", labelled_elsewhere)
    assert [m["metadata"]["name"] for m in index.members("ns", "fleet")] == ["chat"]
    out = pool_pass(_pool(), index.members("ns", "fleet"), NODES, now=NOW)
    assert [(m["name"], m["priority"]) for m in out.status["members"]] == [("chat", 7)]


def test_a_members_load_is_its_observed_traffic_when_it_has_some_and_the_row_says_which() -> None:
    out = pool_pass(_pool(), [_joined("chat", 1.0, observed=12.0), _joined("batch", 2.0)], NODES, now=NOW)
    rows = {m["name"]: m for m in out.status["members"]}
    assert (rows["chat"]["loadRps"], rows["chat"]["loadSource"]) == (12.0, "observed")
    assert (rows["batch"]["loadRps"], rows["batch"]["loadSource"]) == (2.0, "spec")


def test_gpus_held_by_pods_outside_the_pool_are_not_in_its_inventory() -> None:
    out = pool_pass(_pool(), [_joined("chat", 1.0)], NODES, now=NOW, pods=[_pod("someone-else", "h1", 3, namespace="other")])
    assert out.status["inventory"]["h100"] == 5


def test_dry_run_writes_no_cap() -> None:
    out = pool_pass(_pool(), [_joined("chat", 20.0), _joined("rag", 1.0)], H100S, now=NOW)
    assert out.allocations == () and "move" not in out.status


def _auto(**over: Any) -> dict[str, Any]:
    return _pool(mode="Auto", inventory=[{"kind": "h100", "gpu": "h100_sxm", "pricePerHour": 2.99}], **over)


def test_auto_writes_caps_as_members_hold_them_then_moves_gpus_from_the_donor_to_the_receiver() -> None:
    # chat held 12 and its traffic fell to 2 req/s; rag holds 4 and its traffic rose to 150: rag grows first where the
    # inventory (16) and surge allow, else chat shrinks first; never both over the inventory
    pods = [_pod("chat", "h1", 8), _pod("chat", "h2", 4), _pod("rag", "h2", 4)]
    members = [_joined("chat", 2.0, cap=12, max_gpus=12), _joined("rag", 150.0, cap=4, max_gpus=12)]
    out = pool_pass(_auto(surge=4), members, H100S, now=NOW, pods=pods)
    move = out.status["move"]
    targets = {m["name"]: m["target"] for m in move["members"]}
    assert sum(targets["rag"].values()) > 4 and sum(targets["chat"].values()) < 12, move
    assert move["step"] == "Shrink" and [n for n, _ in out.allocations] == ["chat"]      # 16 are all held: chat shrinks first
    ((_, alloc),) = out.allocations
    assert alloc.max_gpus == targets["chat"]["h100"] and alloc.pool == "fleet" and alloc.step == "Shrink"
    assert [r for _, r, _ in out.events] == ["PoolRebalance", "PoolMoveStep"]
    assert "chat" in out.events[0][2] and "$" in out.events[0][2]
    # chat has not planned under its new cap yet: the pool waits for it
    members[0] = _joined("chat", 2.0, cap=alloc.max_gpus, pool_gpus=12, max_gpus=12)
    wait = pool_pass({**_auto(surge=4), "status": out.status}, members, H100S, now=NOW, pods=pods)
    assert wait.status["move"]["step"] == "Wait" and wait.allocations == () and [r for _, r, _ in wait.events] == []
    # chat moved (its pods hold its new cap): rag grows into the freed GPUs
    members[0] = _joined("chat", 2.0, cap=alloc.max_gpus, max_gpus=12)
    freed = [_pod("chat", "h1", alloc.max_gpus), _pod("rag", "h2", 4)]
    grow = pool_pass({**_auto(surge=4), "status": wait.status}, members, H100S, now=NOW, pods=freed)
    assert grow.status["move"]["step"] == "Grow" and [(n, a.max_gpus) for n, a in grow.allocations] == [("rag", targets["rag"]["h100"])]


def test_auto_grows_the_receiver_before_shrinking_the_donor_when_idle_gpus_and_the_surge_allow() -> None:
    pods = [_pod("chat", "h1", 6), _pod("rag", "h2", 2)]
    members = [_joined("chat", 2.0, cap=6, max_gpus=12), _joined("rag", 150.0, cap=2, max_gpus=12)]
    out = pool_pass(_auto(surge=8), members, H100S, now=NOW, pods=pods)
    assert out.status["move"]["step"] == "Grow" and [n for n, _ in out.allocations] == ["rag"]


def test_an_auto_member_whose_gpu_is_not_in_the_pool_is_skipped_by_name() -> None:
    other = _joined("elsewhere", 1.0)
    other["spec"]["hardware"]["gpu"] = "a100_sxm"
    out = pool_pass(_auto(), [_joined("chat", 1.0), other], H100S, now=NOW)
    assert any(s.startswith("elsewhere:") and "a100_sxm" in s for s in out.status["skipped"])


def test_a_member_whose_plan_failed_under_its_cap_is_not_waited_for_and_what_it_holds_still_counts() -> None:
    # chat was shrunk to a cap of 1 that carries less than its load: its own plan is Infeasible (Planned=False) and it keeps
    # 4; the pool does not wait for it for ever, and rag cannot grow into GPUs chat still holds: Blocked, by name
    chat = _joined("chat", 2.0, cap=1, pool_gpus=4, max_gpus=12)
    chat["status"]["conditions"] = [{"type": "Planned", "status": "False", "reason": "Infeasible"}]
    members = [chat, _joined("rag", 150.0, cap=2, max_gpus=12)]
    pods = [_pod("chat", "h1", 8), _pod("chat", "h2", 4), _pod("rag", "h2", 2)]
    out = pool_pass(_auto(surge=0), members, H100S, now=NOW, pods=pods)
    move = out.status["move"]
    assert not next(m for m in move["members"] if m["name"] == "chat")["moving"]
    assert move["step"] == "Blocked" and "rag" in move["reason"] and "h100" in move["reason"], move
    assert [r for _, r, _ in out.events][-1] == "PoolMoveBlocked"


def test_the_index_keeps_what_a_pool_reads_of_a_members_status_so_its_observed_traffic_reaches_the_plan() -> None:
    index = TopologyIndex()
    body = _joined("chat", 1.0, observed=12.0, cap=2)
    body["status"]["conditions"] = [{"type": "Planned", "status": "True"}]
    body["status"]["history"] = [{"layout": "2×TP1"}]                       # not read by a pool: not kept
    index.seen("MODIFIED", body)
    (kept,) = index.members("ns", "fleet")
    assert set(kept["status"]) == {"observed", "plan", "conditions"} and kept["metadata"]["annotations"]
    row = pool_pass(_pool(), [kept], NODES, now=NOW).status["members"][0]
    assert (row["loadRps"], row["loadSource"]) == (12.0, "observed")


def test_a_member_holds_its_applied_layouts_gpus_before_its_pods_exist() -> None:
    # batch applied 1×TP2 (its Deployment exists, the controller has not created the pods yet) and was capped at 1: it
    # holds 2 above its cap, so it still moves; counted from pods alone it held 0 and the move read Done (e2e pool_auto)
    batch = _joined("batch", 2.0, cap=1, max_gpus=12)
    batch["status"]["plan"].update({"set": "s012617", "gpus": 2})
    out = pool_pass(_auto(surge=0), [batch], H100S, now=NOW, pods=[])
    (row,) = out.status["move"]["members"]
    assert (row["held"], row["moving"]) == ({"h100": 2}, True) and out.status["move"]["step"] != "Done", out.status["move"]
    # once its pods exist they are what it holds (not added to the plan's)
    out = pool_pass(_auto(surge=0), [batch], H100S, now=NOW, pods=[_pod("batch", "h1", 2)])
    assert out.status["move"]["members"][0]["held"] == {"h100": 2}
    # a plan whose workloads are not applied yet (no set) holds nothing
    del batch["status"]["plan"]["set"]
    assert pool_pass(_auto(surge=0), [batch], H100S, now=NOW, pods=[]).status["move"]["members"][0]["held"] == {}
