"""A ServingTopology in a ServingPool: spec.pool names the pool (PoolMember condition), and an Auto pool's cap is planned
within, a new cap moving the member through its own transition as a spec change would."""

from __future__ import annotations

import json
from typing import Any

from cases import decision
from fake_cluster import FakeCluster
from test_reconcile import ScriptedPlanner, cond, reasons, run, settle, topology

from servingtopology.operator.api.pool import ALLOCATION_ANNOTATION, Allocation
from servingtopology.operator.cluster.cluster import ObjectRef
from servingtopology.planner.layout import Layout, Parallelism

FOUR, TWO = Layout.replicas(4, Parallelism(tp=1)), Layout.replicas(2, Parallelism(tp=1))
POOL_REF = ObjectRef("servingtopology.io/v1alpha1", "ServingPool", "default", "fleet")


def _with_pool(cluster: FakeCluster) -> None:
    cluster.objects[POOL_REF] = {"apiVersion": POOL_REF.api_version, "kind": "ServingPool",
                                 "metadata": {"name": "fleet", "namespace": "default", "generation": 1}, "spec": {}}


def _member(**pool: Any) -> dict[str, Any]:
    obj = topology("Auto", pool={"name": "fleet", "priority": 3, **pool})
    obj["metadata"]["namespace"] = "default"
    return obj


def _cap(obj: dict[str, Any], gpus: int, *, pool: str = "fleet", gpu: str = "h100_sxm") -> None:
    obj["metadata"].setdefault("annotations", {})[ALLOCATION_ANNOTATION] = Allocation(pool, "h100", gpu, gpus, "Grow").to_json()


def test_a_member_naming_a_pool_that_does_not_exist_is_told_so_and_plans_alone() -> None:
    obj, cluster, planner = _member(), FakeCluster(), ScriptedPlanner(decision(FOUR))
    run(obj, cluster, planner)
    member = cond(obj, "PoolMember")
    assert (member["status"], member["reason"]) == ("False", "PoolNotFound") and "default/fleet" in member["message"]
    assert planner.problems[-1].max_gpus == 8 and obj["status"]["plan"]["layout"] == "4×TP1"   # alone, within maxGPUs
    run(obj, cluster, planner, minutes=1)
    assert reasons(cluster).count("PoolNotFound") == 1                                        # one Warning, not one a pass


def test_a_pool_in_another_namespace_is_refused_by_name() -> None:
    obj, cluster = _member(namespace="other"), FakeCluster()
    _with_pool(cluster)
    run(obj, cluster, ScriptedPlanner(decision(FOUR)))
    member = cond(obj, "PoolMember")
    assert (member["status"], member["reason"]) == ("False", "PoolInOtherNamespace") and "'other'" in member["message"]


def test_the_pools_cap_is_planned_within_and_a_smaller_cap_moves_the_member_down_through_a_transition() -> None:
    obj, cluster = _member(), FakeCluster()
    _with_pool(cluster)
    _cap(obj, 4)
    planner = ScriptedPlanner(decision(FOUR), decision(TWO))
    run(obj, cluster, planner)
    assert planner.problems[0].max_gpus == 4 and obj["status"]["plan"]["poolGPUs"] == 4
    assert (cond(obj, "PoolMember")["status"], cond(obj, "PoolMember")["reason"]) == ("True", "PoolAssigned")
    run(obj, cluster, planner, minutes=1)
    assert len(planner.problems) == 1                     # the same cap: nothing planned again
    _cap(obj, 2)                                          # the pool shrinks this donor: no spec edit, no new generation
    outs = settle(obj, cluster, planner, minutes=2)
    assert planner.problems[1].max_gpus == 2
    assert obj["status"]["plan"]["layout"] == "2×TP1" and obj["status"]["plan"]["poolGPUs"] == 2
    assert obj["metadata"]["generation"] == 1 and any(o.pruned or o.applied for o in outs)
    assert cluster.gpus_held("default") == 2


def test_an_allocation_of_another_pool_or_gpu_is_ignored_and_named() -> None:
    for kwargs, words in (({"pool": "other"}, "ServingPool 'other'"), ({"gpu": "a100_sxm"}, "a100_sxm")):
        obj, cluster = _member(), FakeCluster()
        _with_pool(cluster)
        _cap(obj, 2, **kwargs)
        planner = ScriptedPlanner(decision(FOUR))
        run(obj, cluster, planner)
        member = cond(obj, "PoolMember")
        assert member["reason"] == "AllocationIgnored" and words in member["message"] and planner.problems[0].max_gpus == 8


def test_an_unreadable_allocation_is_named_and_ignored() -> None:
    obj, cluster = _member(), FakeCluster()
    _with_pool(cluster)
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: json.dumps({"pool": "fleet"})}
    planner = ScriptedPlanner(decision(FOUR))
    run(obj, cluster, planner)
    assert cond(obj, "PoolMember")["reason"] == "AllocationIgnored" and planner.problems[0].max_gpus == 8


def test_a_shape_change_under_a_smaller_cap_waits_without_surge_and_runs_within_the_surge_the_pool_grants() -> None:
    tp2, tp1 = Layout.replicas(1, Parallelism(tp=2)), Layout.replicas(1, Parallelism(tp=1))
    obj, cluster = _member(), FakeCluster()
    _with_pool(cluster)
    planner = ScriptedPlanner(decision(tp2), decision(tp1))
    run(obj, cluster, planner)                               # alone: 1×TP2 on 2 GPUs
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: Allocation("fleet", "h100", "h100_sxm", 1, "Shrink").to_json()}
    run(obj, cluster, planner, minutes=1)
    assert cond(obj, "Planned")["reason"] == "TransitionBlocked" and cluster.gpus_held("default") == 2   # its own surge is not used
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: Allocation("fleet", "h100", "h100_sxm", 1, "Shrink", 2).to_json()}
    peak = 0
    for i in range(40):
        run(obj, cluster, planner, minutes=2 + i)
        peak = max(peak, cluster.gpus_held("default"))
        if obj["status"]["plan"]["layout"] == "1×TP1" and not (obj["status"].get("replan") or {}).get("transition"):
            break
    assert obj["status"]["plan"]["layout"] == "1×TP1" and cluster.gpus_held("default") == 1
    assert peak <= 1 + 2                                      # the cap plus the surge granted, never more
