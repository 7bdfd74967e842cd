"""Layouts whose roles run on different GPU kinds, rendered: each role's pods select their kind's nodes by the product
label, hold their own GPUs, carry the NIC the plan assumed, and run the same PD flags as a one-kind layout; the plan in
status names each role's kind and reads back to the same layout and set."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from cases import blueprint, decision, prediction
from fake_cluster import FakeCluster
from test_capacity import node, pod
from test_reconcile import T0, topology

from servingtopology.operator.cluster.capacity import gpu_for_product
from servingtopology.operator.plan_status import layout_from_plan, plan_status
from servingtopology.operator.reconcile import reconcile
from servingtopology.operator.render.manifests import (
    GPU_KIND_LABEL,
    KV_LINK_ANNOTATION,
    NIC_ANNOTATION,
    ROLE_LABEL,
    SET_LABEL,
    build_topology,
    build_workloads,
    kv_link_gbit,
    role_node_selector,
)
from servingtopology.operator.render.sets import on_kind, parts_rendering
from servingtopology.planner.hardware import PRODUCT_LABEL, gpu_catalog, product_label
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.live.transition import in_place, set_name
from servingtopology.planner.problem import Candidate, Decision, Problem

MIXED = Layout.pd(RoleLayout(1, Parallelism(tp=2), gpu="h100_sxm"), RoleLayout(2, Parallelism(tp=1), gpu="a100_sxm"))
ONE_KIND = Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(2, Parallelism(tp=1)))


def _templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The engine pod template of each role (Deployments only)."""
    return {o["metadata"]["labels"][ROLE_LABEL]: o["spec"]["template"] for o in objects
            if o["kind"] == "Deployment" and o["metadata"]["labels"][ROLE_LABEL] in ("prefill", "decode")}


@pytest.mark.parametrize("gpu_id", sorted(gpu_catalog()))
def test_every_catalog_gpu_with_a_label_value_maps_back_to_itself_through_the_product_rule(gpu_id: str) -> None:
    gpu = gpu_catalog()[gpu_id]
    value = product_label(gpu)
    if value is None:   # e.g. 'NVIDIA GB200 (NVL72)': parentheses are no label value
        assert any(c in gpu.name for c in "()"), gpu.name
        return
    assert len(value) <= 63 and " " not in value
    found = gpu_for_product(value)
    assert found is not None and found.id == gpu_id


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_prefill_and_decode_select_their_own_kinds_and_keep_the_one_kind_pd_flags(engine: Engine) -> None:
    mixed = _templates(build_workloads(blueprint(engine, MIXED, gpu_id="h100_sxm", node_selector={"pool": "serving"})))
    plain = _templates(build_workloads(blueprint(engine, ONE_KIND, gpu_id="h100_sxm", node_selector={"pool": "serving"})))
    assert mixed["prefill"]["spec"]["nodeSelector"] == {PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", "pool": "serving"}
    assert mixed["decode"]["spec"]["nodeSelector"] == {PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", "pool": "serving"}
    assert mixed["prefill"]["metadata"]["labels"][GPU_KIND_LABEL] == "h100_sxm"
    assert mixed["decode"]["metadata"]["labels"][GPU_KIND_LABEL] == "a100_sxm"
    for role, gpus in (("prefill", "2"), ("decode", "1")):
        c = mixed[role]["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
        # the same engine command as the one-kind layout: the KV connector / disaggregation flags come from one place
        assert c["args"] == plain[role]["spec"]["containers"][0]["args"]
        assert c["command"] == plain[role]["spec"]["containers"][0]["command"]
    # a one-kind layout is placed as it always was: only the spec's selector, no kind label, no NIC annotations
    assert plain["decode"]["spec"]["nodeSelector"] == {"pool": "serving"}
    assert GPU_KIND_LABEL not in plain["decode"]["metadata"]["labels"]
    assert NIC_ANNOTATION not in plain["decode"]["metadata"]["annotations"]


def test_the_kv_link_is_the_slower_nic_and_the_spec_override_counts_on_its_own_kind() -> None:
    bp = blueprint(Engine.VLLM, MIXED, gpu_id="h100_sxm")
    assert kv_link_gbit(bp) == 200.0        # H100 400 Gb/s, A100 200 Gb/s per GPU (catalog)
    t = _templates(build_workloads(bp))
    assert t["prefill"]["metadata"]["annotations"][NIC_ANNOTATION] == "400"
    assert t["decode"]["metadata"]["annotations"][NIC_ANNOTATION] == "200"
    assert {t[r]["metadata"]["annotations"][KV_LINK_ANNOTATION] for r in t} == {"200"}
    slow = blueprint(Engine.VLLM, MIXED, gpu_id="h100_sxm", nic_gbit={"h100_sxm": 25.0})
    assert kv_link_gbit(slow) == 25.0
    assert kv_link_gbit(blueprint(Engine.VLLM, ONE_KIND, gpu_id="h100_sxm")) is None


def test_a_role_on_the_specs_kind_counts_the_specs_node_size_and_another_kind_its_catalog_node() -> None:
    wide = Layout.pd(RoleLayout(1, Parallelism(tp=8), gpu="h100_sxm"), RoleLayout(1, Parallelism(tp=8), gpu="a100_sxm"))
    objects = build_workloads(blueprint(Engine.VLLM, wide, gpu_id="h100_sxm", gpus_per_node=4,
                                        image="vllm/vllm-openai:v0.33.0"))
    kinds = {o["metadata"]["labels"][ROLE_LABEL]: o["kind"] for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet")
             and o["metadata"]["labels"][ROLE_LABEL] in ("prefill", "decode")}
    # TP8 prefill over 4-GPU H100 nodes (the spec's gpusPerNode) spans two: a LeaderWorkerSet; TP8 decode fits one 8-GPU A100 node
    assert kinds == {"prefill": "LeaderWorkerSet", "decode": "Deployment"}
    lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert worker["spec"]["nodeSelector"][PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_a_kind_no_label_value_can_name_is_refused_at_render() -> None:
    gb = Layout.pd(RoleLayout(1, Parallelism(tp=2), gpu="h100_sxm"), RoleLayout(1, Parallelism(tp=2), gpu="gb200"))
    bp = blueprint(Engine.VLLM, gb, gpu_id="h100_sxm")
    with pytest.raises(ValueError, match=r"gb200.*no nvidia\.com/gpu\.product value"):
        role_node_selector(bp, gb.roles[Role.DECODE])


def test_the_plan_in_status_names_each_roles_kind_and_reads_back_to_the_same_layout_and_set() -> None:
    bp = blueprint(Engine.VLLM, MIXED, gpu_id="h100_sxm")
    plan = plan_status(Candidate(MIXED, prediction(200.0, 20.0), score=1.0), engine=Engine.VLLM, args_of=lambda role, rl: (1, ()), reasons=["pinned"],
                       now=datetime(2026, 1, 1, tzinfo=UTC), generation=1)
    assert {r.role: r.gpu for r in plan.roles} == {"prefill": "h100_sxm", "decode": "a100_sxm"}
    assert plan.layout == "1P(TP2)·2D(TP1)@h100_sxm→a100_sxm"
    back = layout_from_plan(plan)
    assert back == MIXED and set_name(back) == bp.set
    # a one-kind plan's roles name no kind, and its set keeps the name it had before kinds existed
    plain = plan_status(Candidate(ONE_KIND, prediction(200.0, 20.0), score=1.0), engine=Engine.VLLM, args_of=lambda role, rl: (1, ()), reasons=[],
                        now=datetime(2026, 1, 1, tzinfo=UTC), generation=1)
    assert all(r.gpu is None for r in plain.roles)
    assert set_name(ONE_KIND) == "s59dce9"   # the name this layout's set had before roles could name kinds
    assert set_name(ONE_KIND) != set_name(MIXED)
    assert not in_place(ONE_KIND, MIXED), "moving a role to another kind is a new set, never an in-place rescale"


def _pinned_mixed() -> dict[str, Any]:
    return topology("Pinned", pinned={"kind": "pd", "prefill": {"count": 1, "tp": 2}, "decode": {"count": 2, "tp": 1, "gpu": "A100"}})


def _pin_planner() -> Any:
    def plan(problem: Problem) -> Decision:
        assert problem.pinned is not None
        return decision(problem.pinned)
    return plan


def test_a_pinned_mixed_kind_topology_reconciles_each_role_onto_its_kind_and_names_the_kinds_in_status() -> None:
    a100 = "NVIDIA-A100-SXM4-80GB"
    cluster = FakeCluster(nodes=[node("h0"), node("a0", product=a100)], other_pods=[pod("a0", 6)])   # 2 A100 GPUs free
    obj = _pinned_mixed()
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=_pin_planner(), now=T0)
    assert out.error is None, out.status["conditions"]
    deployments = {o["metadata"]["labels"][ROLE_LABEL]: o for o in cluster.objects.values() if o["kind"] == "Deployment"}
    selectors = {r: d["spec"]["template"]["spec"]["nodeSelector"][PRODUCT_LABEL] for r, d in deployments.items() if r != "router"}
    # the example's hardware.nodeSelector names the H100 product: the decode role's kind replaces it
    assert selectors == {"prefill": "NVIDIA-H100-80GB-HBM3", "decode": a100}
    plan = out.status["plan"]
    assert {r["role"]: r["gpu"] for r in plan["roles"]} == {"prefill": "h100_sxm", "decode": "a100_sxm"}
    assert plan["layout"] == "1P(TP2)·2D(TP1)@h100_sxm→a100_sxm"
    fits = next(c for c in out.status["conditions"] if c["type"] == "InsufficientCapacity")
    assert fits["status"] == "False" and "2 of 8 a100_sxm GPUs free" in fits["message"], fits


def test_a_mixed_kind_plan_short_of_one_kind_names_that_kinds_shortfall_and_applies_nothing() -> None:
    cluster = FakeCluster(nodes=[node("h0"), node("a0", product="NVIDIA-A100-SXM4-80GB")], other_pods=[pod("a0", 7)])   # 1 A100 free
    out = reconcile(copy.deepcopy(_pinned_mixed()), cluster=cluster, planner=_pin_planner(), now=T0)
    assert out.error == "InsufficientCapacity" and not cluster.objects
    short = next(c for c in out.status["conditions"] if c["type"] == "InsufficientCapacity")["message"]
    assert "1 a100_sxm GPUs are missing" in short and "h100_sxm GPUs are missing" not in short, short


def test_replicas_on_two_kinds_run_as_two_sets_behind_the_one_entry_service() -> None:
    parts = [on_kind(Layout.replicas(3, Parallelism(tp=1)), "h100_sxm"), on_kind(Layout.replicas(2, Parallelism(tp=1)), "a100_sxm")]
    rendering = parts_rendering(parts, lambda lay, s: blueprint(Engine.VLLM, lay, gpu_id="h100_sxm", set_name=s))
    objects = build_topology(rendering.sets, serving=rendering.serving)
    engines = [o for o in objects if o["kind"] == "Deployment"]
    assert [(o["spec"]["replicas"], o["spec"]["template"]["spec"]["nodeSelector"][PRODUCT_LABEL]) for o in engines] == [
        (3, "NVIDIA-H100-80GB-HBM3"), (2, "NVIDIA-A100-SXM4-80GB")]
    assert len({o["metadata"]["labels"][SET_LABEL] for o in engines}) == 2
    services = [o for o in objects if o["kind"] == "Service"]
    assert len(services) == 1
    selector = services[0]["spec"]["selector"]
    assert SET_LABEL not in selector
    for o in engines:   # the one Service selects the pods of both sets
        labels = o["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
    with pytest.raises(ValueError, match="names its GPU kind"):
        parts_rendering([Layout.replicas(3, Parallelism(tp=1))], lambda lay, s: blueprint(Engine.VLLM, lay, set_name=s))
