"""Objects the operator would apply but does not own are left alone: nothing of that pass is applied or pruned, and
a Conflict condition names them (server-side apply with force used to take them over, and garbage collection
then deleted them with the resource)."""

from __future__ import annotations

import copy
from typing import Any

from fake_cluster import FakeCluster
from test_reconcile import PD8, REPLICAS, R, ScriptedPlanner, cond, decision, run, topology

from servingtopology.operator.cluster.cluster import ObjectRef
from servingtopology.operator.render.manifests import MANAGED_BY, TOPOLOGY_LABEL

ENTRY = ObjectRef("v1", "Service", "default", "llama-8b")


def _their_service(**meta: Any) -> dict[str, Any]:
    """Someone else's Service that happens to be named like the resource."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama-8b", "namespace": "default", "generation": 1, **meta},
            "spec": {"selector": {"app": "their-app"}, "ports": [{"port": 80}]}}


def test_an_existing_service_named_like_the_resource_is_left_alone_and_named_in_a_conflict() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    cluster.objects[ENTRY] = _their_service()
    theirs = copy.deepcopy(cluster.objects[ENTRY])
    out = run(obj, cluster, planner)
    assert cluster.objects == {ENTRY: theirs}          # no Deployment either: no partial apply
    assert out.applied == () and out.error == "ObjectNotOwned"
    conflict = cond(obj, "Conflict")
    assert (conflict["status"], conflict["reason"]) == ("True", "ObjectNotOwned")
    assert "Service/llama-8b (no owner)" in conflict["message"] and "nothing was applied" in conflict["message"]
    assert cond(obj, "Ready")["status"] == "False" and cond(obj, "Ready")["reason"] == "ObjectNotOwned"
    assert [e.reason for e in cluster.events].count("ObjectNotOwned") == 1
    run(obj, cluster, planner, minutes=1)
    assert [e.reason for e in cluster.events].count("ObjectNotOwned") == 1   # once, not every pass
    assert cluster.objects == {ENTRY: theirs}


def test_once_the_foreign_object_is_gone_the_plan_is_applied_and_the_conflict_clears() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    cluster.objects[ENTRY] = _their_service()
    run(obj, cluster, planner)
    del cluster.objects[ENTRY]
    run(obj, cluster, planner, minutes=1)
    assert cluster.kinds() == [f"Deployment/llama-8b-{R}-aggregated", "Service/llama-8b"]
    assert cond(obj, "Conflict")["status"] == "False" and cond(obj, "Ready")["status"] == "True"


def test_another_topologys_router_account_is_not_taken_over() -> None:
    obj, cluster = topology(pinned={"kind": "pd", "prefill": {"count": 1, "tp": 2}, "decode": {"count": 3, "tp": 2}}), FakeCluster()
    obj["spec"]["policy"]["mode"] = "Pinned"
    account = ObjectRef("v1", "ServiceAccount", "default", "llama-8b-router")
    owner = {"apiVersion": "servingtopology.io/v1alpha1", "kind": "ServingTopology", "name": "other", "uid": "uid-other"}
    cluster.objects[account] = {"apiVersion": "v1", "kind": "ServiceAccount",
                                "metadata": {"name": "llama-8b-router", "namespace": "default", "generation": 1,
                                             "ownerReferences": [owner]}}
    run(obj, cluster, ScriptedPlanner(decision(PD8)))
    assert list(cluster.objects) == [account] and cluster.objects[account]["metadata"]["ownerReferences"] == [owner]
    assert "ServiceAccount/llama-8b-router (ServingTopology/other)" in cond(obj, "Conflict")["message"]


def test_a_running_plan_is_kept_whole_when_its_entry_service_is_replaced_by_someone_elses() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    cluster.objects[ENTRY] = _their_service()
    before = copy.deepcopy(cluster.objects)
    out = run(obj, cluster, planner, minutes=1)
    assert cluster.objects == before and out.applied == () and out.pruned == ()
    assert cond(obj, "Conflict")["status"] == "True" and cond(obj, "Ready")["status"] == "True"   # the engines still run


def test_pruning_deletes_only_what_carries_this_resources_owner_reference() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    # Someone's Deployment that carries the topology's labels (copied from a manifest) but no owner reference.
    stray = ObjectRef("apps/v1", "Deployment", "default", "llama-8b-copy")
    labels = {TOPOLOGY_LABEL: "llama-8b", "app.kubernetes.io/managed-by": MANAGED_BY}
    cluster.objects[stray] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama-8b-copy",
                              "namespace": "default", "labels": labels, "generation": 1}, "spec": {"replicas": 0, "template": {}}}
    out = run(obj, cluster, planner, minutes=1)
    assert stray in cluster.objects and out.pruned == ()


def test_a_steady_pass_lists_its_objects_once_and_reads_none_of_them_again() -> None:
    # The ownership check, the readiness summary and pruning share the pass's one LIST (per kind) of the objects
    # with this resource's labels; an object is read on its own only when it is not in that list or this pass changed it.
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(PD8))
    run(obj, cluster, planner)
    first = list(cluster.reads)
    managed = [r for r in cluster.objects if r.kind != "ServingTopology"]
    assert len(managed) >= 5 and set(first) <= set(managed)
    # Created this pass: each read once before (absent), and a workload once more after for its readiness.
    assert all(first.count(r) == (2 if r.kind == "Deployment" else 1) for r in managed), first
    cluster.reads.clear()
    lists = cluster.lists
    for minute in (1, 2, 3):
        run(obj, cluster, planner, minutes=minute)
    assert cluster.reads == [] and cluster.lists - lists == 3, (cluster.reads, cluster.lists - lists)
    assert cond(obj, "Ready")["status"] == "True"


def test_an_object_this_pass_changed_is_read_again_for_its_readiness() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    cluster.ready = False                       # the scaled Deployment's pods are not ready yet
    obj["spec"]["podTemplate"] = {"metadata": {"annotations": {"team": "a"}}}
    obj["metadata"]["generation"] += 1
    cluster.reads.clear()
    run(obj, cluster, planner, minutes=1)
    changed = [r for r in cluster.reads if r.kind == "Deployment"]
    assert changed and cond(obj, "Ready")["status"] == "False", (cluster.reads, cond(obj, "Ready"))
