"""GPU capacity: nodes' products mapped to catalog GPUs, other pods' GPUs counted, pods packed per node, and a
reconcile that plans within what is free or says how many GPUs of which kind are missing, applying nothing."""

from __future__ import annotations

from typing import Any

import pytest
from cases import decision
from fake_cluster import FakeCluster
from test_reconcile import REPLICAS, cond, reasons, run, topology

from servingtopology.operator.cluster.capacity import gpu_for_product, layout_pod_gpus, read_capacity, unplaced_gpus
from servingtopology.planner.errors import Infeasible
from servingtopology.planner.layout import Layout, Parallelism
from servingtopology.planner.problem import Decision, Problem

H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, *, gpus: int = 8, product: str = H100, ready: bool = True, unschedulable: bool = False,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, **(labels or {})}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "128"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(node_name: str, gpus: int, *, uid: str = "", phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid or node_name}", "namespace": "other", "uid": uid or f"u-{node_name}-{gpus}"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


@pytest.mark.parametrize(("product", "gpu_id"), [
    ("NVIDIA-H100-80GB-HBM3", "h100_sxm"),      # GPU feature discovery's spelling of the NVML name
    ("NVIDIA-A100-SXM4-80GB", "a100_sxm"),
    ("NVIDIA-H200", "h200_sxm"),
    ("NVIDIA-L40S", "l40s"),
    ("NVIDIA-H100-80GB-HBM3-SHARED", None),     # time-sliced: not whole GPUs
    ("NVIDIA-Tesla-T4", None),                  # not in the catalog: reported, never guessed
])
def test_node_products_map_to_catalog_gpus_by_their_nvml_names(product: str, gpu_id: str | None) -> None:
    gpu = gpu_for_product(product)
    assert (gpu.id if gpu else None) == gpu_id


def test_free_gpus_count_other_tenants_and_skip_own_finished_and_unusable() -> None:
    nodes = [node("n0"), node("n1"), node("n2", ready=False), node("n3", unschedulable=True), node("n4", product="NVIDIA-Tesla-T4"),
             node("n5", labels={"pool": "other"}), node("cpu", gpus=0)]
    pods = [pod("n0", 6), pod("n1", 2, uid="mine"), pod("n1", 4, phase="Succeeded"), pod("n1", 1)]
    cap = read_capacity(nodes, pods, node_selector={}, own={"mine"})
    assert {n.name: n.free for n in cap.of("h100_sxm")} == {"n0": 2, "n1": 7, "n5": 8}
    assert cap.free("h100_sxm") == 17 and cap.allocatable("h100_sxm") == 24
    assert cap.unknown_products == ("NVIDIA-Tesla-T4",)
    selected = read_capacity(nodes, pods, node_selector={"pool": "other"}, own=set())
    assert [n.name for n in selected.nodes] == ["n5"]


@pytest.mark.parametrize(("pods", "free", "missing"), [
    ([8, 8], [8, 8], 0),          # one TP8 pod per node
    ([8], [4, 4], 8),             # 8 GPUs free in total, but no node has 8: a TP8 pod cannot start
    ([4, 2, 2], [4, 4], 0),       # packed: 4 | 2+2
    ([2, 2, 2, 2, 2], [8], 2),    # one pod too many
])
def test_pods_are_packed_node_by_node(pods: list[int], free: list[int], missing: int) -> None:
    assert unplaced_gpus(pods, free) == missing


def test_a_multi_node_instance_is_one_pod_per_node() -> None:
    assert layout_pod_gpus(Layout.replicas(2, Parallelism(tp=8, pp=2)), gpus_per_node=8) == [8, 8, 8, 8]


class BudgetPlanner:
    """Plans `layout` when the budget holds it, else raises Infeasible (as the funnel's budget stage would)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.budgets: list[int] = []

    def __call__(self, problem: Problem) -> Decision:
        self.budgets.append(problem.max_gpus)
        if problem.max_gpus < self.layout.gpus:
            raise Infeasible("budget", f"{self.layout.gpus} GPUs needed, {problem.max_gpus} allowed")
        return decision(self.layout)


def test_without_enough_free_gpus_nothing_is_applied_and_the_shortfall_is_named_until_gpus_free_up() -> None:
    cluster = FakeCluster(nodes=[node("n0"), node("n1")], other_pods=[pod("n0", 8), pod("n1", 4)])
    planner = BudgetPlanner(REPLICAS)   # 4×TP2: 8 GPUs
    obj = topology()
    out = run(obj, cluster, planner)
    assert out.error == "InsufficientCapacity" and not cluster.objects and not out.applied
    assert planner.budgets[0] == 4      # planned within the 4 free GPUs first
    message = cond(obj, "InsufficientCapacity")["message"]
    assert cond(obj, "InsufficientCapacity")["status"] == "True"
    assert "4 h100_sxm GPUs are missing" in message and "4 of 16 h100_sxm GPUs free" in message, message
    assert cond(obj, "Ready")["status"] == "False" and "InsufficientCapacity" in reasons(cluster)
    run(obj, cluster, planner, minutes=1)
    assert reasons(cluster).count("InsufficientCapacity") == 1   # said once, not every pass

    cluster.other_pods = [pod("n0", 8)]   # the other tenant's job ends
    out = run(obj, cluster, planner, minutes=2)
    assert out.error is None and cluster.objects
    assert cond(obj, "InsufficientCapacity")["status"] == "False"


def test_a_plan_within_the_budget_that_cannot_be_packed_names_the_pods_gpus() -> None:
    tp8 = Layout.replicas(1, Parallelism(tp=8))
    cluster = FakeCluster(nodes=[node("n0"), node("n1")], other_pods=[pod("n0", 4), pod("n1", 4)])   # 8 free, 4 + 4
    obj = topology()
    out = run(obj, cluster, BudgetPlanner(tp8))
    assert out.error == "InsufficientCapacity" and not cluster.objects
    assert "8 h100_sxm GPUs are missing" in cond(obj, "InsufficientCapacity")["message"]


def test_unknown_products_are_named_in_the_condition() -> None:
    cluster = FakeCluster(nodes=[node("n0"), node("t4", product="NVIDIA-Tesla-T4")])
    obj = topology()
    obj["spec"]["hardware"].pop("nodeSelector")
    run(obj, cluster, BudgetPlanner(REPLICAS))
    assert "NVIDIA-Tesla-T4" in cond(obj, "InsufficientCapacity")["message"]
