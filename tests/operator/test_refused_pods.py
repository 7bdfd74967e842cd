"""Pods the cluster refuses to create (Pod Security admission, a quota) are named in status: Ready=False PodsRefused with
the controller's FailedCreate message, not "RollingOut 0/1" for ever with no reason."""

from __future__ import annotations

from fake_cluster import FakeCluster
from test_tenancy import REPLICAS, cond, run, topology

from servingtopology.operator.reconcile import refused_pods
from servingtopology.planner.live.transition import set_name

POD_SECURITY = ('pods "llama-8b-x-aggregated-5d9f-abcde" is forbidden: violates PodSecurity "restricted:latest": '
                'runAsNonRoot != true (pod or container "engine" must set securityContext.runAsNonRoot=true)')


def test_pods_refused_by_pod_security_are_named_in_ready_and_progressing() -> None:
    name = f"llama-8b-{set_name(REPLICAS)}-aggregated"
    obj, cluster = topology(), FakeCluster(refused={name: POD_SECURITY})
    run(obj, cluster)
    ready, progressing = cond(obj, "Ready"), cond(obj, "Progressing")
    assert (ready["status"], ready["reason"]) == ("False", "PodsRefused")
    assert f"Deployment/{name}: FailedCreate" in ready["message"] and "violates PodSecurity" in ready["message"]
    assert (progressing["status"], progressing["reason"]) == ("False", "PodsRefused")
    assert [e.reason for e in cluster.events].count("PodsRefused") == 1
    run(obj, cluster)                                   # no second Event while nothing changes
    assert [e.reason for e in cluster.events].count("PodsRefused") == 1
    cluster.refused.clear()                             # the namespace's policy is relaxed: the pods come up
    run(obj, cluster)
    assert cond(obj, "Ready")["reason"] == "WorkloadsReady"


def test_a_replica_failure_that_is_not_true_is_not_a_refusal() -> None:
    deployment = {"kind": "Deployment", "metadata": {"name": "d"},
                  "status": {"conditions": [{"type": "ReplicaFailure", "status": "False"}, {"type": "Available", "status": "False"}]}}
    assert refused_pods(deployment) == []
