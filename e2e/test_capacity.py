"""GPU capacity on a real API server: two ServingTopologies compete for the 32 fake GPUs of the kwok nodes; the
second gets `InsufficientCapacity` naming the missing GPUs and creates no pods (none Pending); deleting the first
frees its GPUs and the second converges."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import gpus_of, pod_ready, topology
from .processes import wait_until
from .stack import Operator


def _pinned(name: str, namespace: str, *, prometheus_url: str, replicas: int) -> dict[str, Any]:
    obj = topology(name, namespace, prometheus_url=prometheus_url, mode="Pinned", max_gpus=replicas * 8)
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": replicas, "tp": 8}
    return obj


def _gpus_held(cluster: LocalCluster, *, namespace: str | None = None) -> int:
    scope = ["-n", namespace] if namespace else ["-A"]
    pods = json.loads(cluster.kubectl("get", "pods", *scope, "-o", "json").stdout)["items"]
    return sum(gpus_of(p) for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed"))


def test_a_topology_that_does_not_fit_gets_insufficient_capacity_and_no_pods_until_gpus_free_up(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    total = cluster.node_pool.count * cluster.node_pool.gpus_per_node
    assert total == 32
    # Earlier scenarios' namespaces are deleted without waiting: start from a cluster whose GPUs are all free.
    wait_until(lambda: _gpus_held(cluster) == 0, timeout_s=180, what="every GPU free before the scenario")
    other = f"{namespace}-b"
    cluster.kubectl("create", "namespace", other)
    try:
        first = _pinned("first", namespace, prometheus_url=cluster.prometheus_url, replicas=3)     # 24 of 32 GPUs
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(first))
        kube.wait_condition(namespace, "first", "Ready", "True", timeout_s=180, log=operator.log_tail)
        assert _gpus_held(cluster, namespace=namespace) == 24

        second = _pinned("second", other, prometheus_url=cluster.prometheus_url, replicas=2)       # 16 more: 8 missing
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(second))
        cond = kube.wait_condition(other, "second", "InsufficientCapacity", "True", timeout_s=120, log=operator.log_tail)
        assert re.search(r"\b8 h100_sxm GPUs are missing", cond["message"]), cond["message"]
        events = kube.events(other, reason="InsufficientCapacity")
        assert events and "8 h100_sxm GPUs are missing" in (events[0].get("message") or events[0].get("note") or ""), events
        assert kube.condition(other, "second", "Ready")["status"] == "False"
        assert not kube.items("pods", other), "nothing may be applied (no Pending pods) when the plan cannot fit"
        assert not kube.items("deployments", other)

        cluster.kubectl("delete", "stopo", "first", "-n", namespace, "--wait=true", "--timeout=60s")
        kube.wait_condition(other, "second", "Ready", "True", timeout_s=240, log=operator.log_tail)
        assert kube.condition(other, "second", "InsufficientCapacity")["status"] == "False"
        pods = kube.items("pods", other)
        assert len(pods) == 2 and all(pod_ready(p) for p in pods)
        assert _gpus_held(cluster, namespace=other) == 16
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
