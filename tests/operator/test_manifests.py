"""The manifest builders: golden YAML per engine × layout shape, and the invariants every plan keeps."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest
import yaml
from cases import BLUEPRINTS, blueprint
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.operator.render.manifests import (
    ENTRY_LABEL,
    SERVING_LABEL,
    SET_LABEL,
    build_leader_worker_set,
    build_topology,
    build_workloads,
    multinode_roles,
)
from servingtopology.planner.layout import Engine, Layout, LayoutKind, Parallelism, Role, RoleLayout


def render(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, allow_unicode=True, width=120)


@pytest.mark.parametrize("name", sorted(BLUEPRINTS))
def test_workloads_match_their_golden_yaml(name: str, golden: Callable[[str, str], None]) -> None:
    golden(f"{name}.yaml", render(build_workloads(BLUEPRINTS[name])))


@pytest.mark.parametrize("name", sorted(BLUEPRINTS))
def test_gpu_requests_add_up_to_the_layout(name: str) -> None:
    bp = BLUEPRINTS[name]
    total = 0
    for obj in build_workloads(bp):
        if obj["kind"] == "Deployment":
            gpus = obj["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu", "0")
            total += obj["spec"]["replicas"] * int(gpus)
        elif obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            per_pod = int(lwt["leaderTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            total += obj["spec"]["replicas"] * lwt["size"] * per_pod
    assert total == bp.layout.gpus


@pytest.mark.parametrize("name", sorted(BLUEPRINTS))
def test_every_object_is_owned_by_the_topology_and_labelled(name: str) -> None:
    for obj in build_workloads(BLUEPRINTS[name]):
        meta = obj["metadata"]
        assert meta["ownerReferences"][0]["uid"] == BLUEPRINTS[name].uid
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/instance"] == "llama"
        assert meta["labels"]["servingtopology.io/role"]


@pytest.mark.parametrize("name", sorted(BLUEPRINTS))
def test_object_names_are_unique_per_kind(name: str) -> None:
    keys = Counter((o["kind"], o["metadata"]["name"]) for o in build_workloads(BLUEPRINTS[name]))
    assert max(keys.values()) == 1


def test_pd_layouts_get_a_router_that_selects_serving_pods_of_each_role() -> None:
    objects = build_workloads(BLUEPRINTS["vllm-pd-2p3d-tp4"])
    bp = BLUEPRINTS["vllm-pd-2p3d-tp4"]
    router = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == f"llama-{bp.set}-router")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--vllm-pd-disaggregation" in args
    prefill_at = args.index("--prefill-selector")
    assert "servingtopology.io/role=prefill" in args[prefill_at + 1: args.index("--decode-selector")]
    assert f"{SET_LABEL}={bp.set}" in args[prefill_at + 1: args.index("--decode-selector")]   # pairs within its own set
    assert f"{SERVING_LABEL}=true" in args
    entry = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "llama")
    assert entry["spec"]["selector"] == {"app.kubernetes.io/instance": "llama", ENTRY_LABEL: "true", SET_LABEL: bp.set}
    assert router["spec"]["template"]["metadata"]["labels"][ENTRY_LABEL] == "true"


def test_vllm_pd_engines_carry_the_nixl_connector_and_the_pod_ip() -> None:
    objects = build_workloads(BLUEPRINTS["vllm-pd-2p3d-tp4"])
    prefill = next(o for o in objects if o["metadata"]["name"].endswith("-prefill") and o["kind"] == "Deployment")
    c = prefill["spec"]["template"]["spec"]["containers"][0]
    config = c["args"][c["args"].index("--kv-transfer-config") + 1]
    assert '"kv_connector":"NixlConnector"' in config
    assert {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]


def test_sglang_dp_attention_counts_tp_over_all_ranks_and_scales_the_running_requests() -> None:
    objects = build_workloads(BLUEPRINTS["sglang-replicas-tp2dp4-ep"])
    args = objects[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(itertools.pairwise(args))
    # SGLang 0.5.23 spells attention DP --attn-dp-size (--dp-size --enable-dp-attention is deprecated) and, with
    # it, reports gauges from the first rank only unless every scheduler is asked to.
    assert flags["--tp-size"] == "8" and flags["--attn-dp-size"] == "4"
    assert "--enable-dp-attention" not in args and "--dp-size" not in args
    assert "--enable-metrics-for-all-schedulers" in args
    assert flags["--max-running-requests"] == str(256 * 4)
    assert flags["--model-path"] == "Qwen/Qwen3-30B-A3B" and "--enable-metrics" in args


def test_sglang_prefill_advertises_its_bootstrap_port() -> None:
    objects = build_workloads(BLUEPRINTS["sglang-pd-1p2d-mixed"])
    prefill = next(o for o in objects if o["metadata"]["name"].endswith("-prefill") and o["kind"] == "Deployment")
    tmpl = prefill["spec"]["template"]
    args = tmpl["spec"]["containers"][0]["args"]
    assert args[args.index("--disaggregation-mode") + 1] == "prefill"
    assert args[args.index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert tmpl["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "8998"


def test_instances_wider_than_a_node_become_leader_worker_sets_with_headless_workers() -> None:
    bp = BLUEPRINTS["vllm-0.33-multinode-tp8pp2"]
    assert multinode_roles(bp) == (Role.AGGREGATED,)
    lws = build_leader_worker_set(bp, Role.AGGREGATED)
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "--headless" in worker["args"] and "readinessProbe" not in worker
    assert lwt["workerTemplate"]["metadata"]["labels"][SERVING_LABEL] == "false"


def test_vllm_0_11_has_no_multinode_flags_so_its_instances_span_nodes_through_ray() -> None:
    # vLLM 0.11.0's parser has no --nnodes/--node-rank/--master-addr (planner/data/engine_caps/vllm-0.11.0.json):
    # the leader starts the Ray head and serves with the Ray executor, workers only join Ray.
    lwt = build_leader_worker_set(BLUEPRINTS["vllm-multinode-tp8pp2"], Role.AGGREGATED)["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"] == ["/bin/sh", "-c"] and "--nnodes" not in leader["args"][0]
    assert "leader --ray_cluster_size=$(LWS_GROUP_SIZE)" in leader["args"][0]
    assert "--distributed-executor-backend ray" in leader["args"][0] and "exec vllm serve" in leader["args"][0]
    assert "worker --ray_address=$(LWS_LEADER_ADDRESS)" in worker["args"][0] and "vllm serve" not in worker["args"][0]


def test_pd_routers_run_their_own_images_and_export_metrics() -> None:
    for name, image, command in (("vllm-pd-2p3d-tp4", "vllm/vllm-router:", ["vllm-router"]), ("sglang-pd-1p2d-mixed", "lightseekorg/smg:", ["smg", "launch"])):
        router = next(o for o in build_workloads(BLUEPRINTS[name]) if o["metadata"]["name"].endswith("-router") and o["kind"] == "Deployment")
        c = router["spec"]["template"]["spec"]["containers"][0]
        assert c["image"].startswith(image) and c["command"] == command
        assert c["args"][c["args"].index("--prometheus-port") + 1] == "29000"
        assert router["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "29000"


def test_an_instance_that_does_not_split_over_whole_nodes_is_refused() -> None:
    bp = blueprint(Engine.VLLM, Layout.replicas(1, Parallelism(tp=3, pp=3)), gpus_per_node=8)  # 9 GPUs over 2 nodes
    with pytest.raises(ValueError, match="do not split evenly"):
        build_workloads(bp)


def test_extra_args_come_last_so_they_override_generated_flags() -> None:
    objects = build_workloads(BLUEPRINTS["vllm-replicas-fp8-placement"])
    args = objects[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--max-model-len", "16384"]
    assert args[args.index("--quantization") + 1] == "fp8"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"


def test_replicas_layouts_have_no_router() -> None:
    for name, bp in BLUEPRINTS.items():
        has_router = any(o["metadata"]["name"] == f"llama-{bp.set}-router" for o in build_workloads(bp))
        assert has_router == (bp.layout.kind is LayoutKind.PD), name


_par = st.builds(Parallelism, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]))
_role = st.builds(RoleLayout, count=st.integers(1, 6), parallelism=_par)
_layouts = st.one_of(st.builds(Layout.replicas, st.integers(1, 8), _par), st.builds(Layout.pd, _role, _role))


@settings(max_examples=60, deadline=None)
@given(layout=_layouts, engine=st.sampled_from(list(Engine)))
def test_any_layout_renders_its_gpus_exactly_and_names_each_object_once(layout: Layout, engine: Engine) -> None:
    bp = blueprint(engine, layout, gpus_per_node=8)
    objects = build_workloads(bp)
    gpus = 0
    for obj in objects:
        if obj["kind"] == "Deployment" and not obj["metadata"]["name"].endswith("-router"):
            limit = obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            gpus += obj["spec"]["replicas"] * int(limit)
        elif obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            gpus += obj["spec"]["replicas"] * lwt["size"] * int(lwt["leaderTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == layout.gpus
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)


def test_two_sets_side_by_side_keep_their_own_objects_and_share_the_entry_service() -> None:
    old = BLUEPRINTS["vllm-replicas-4xtp2"]
    new = BLUEPRINTS["vllm-pd-2p3d-tp4"]
    assert old.set != new.set
    both = build_topology([old, new], serving=(old.set, new.set))
    names = [(o["kind"], o["metadata"]["name"]) for o in both]
    assert len(set(names)) == len(names)
    assert ("Deployment", f"llama-{old.set}-aggregated") in names and ("Deployment", f"llama-{new.set}-prefill") in names
    entry = next(o for o in both if o["kind"] == "Service" and o["metadata"]["name"] == "llama")
    # Both sets take traffic: the selector names no set; aggregated engines and the PD router both carry the entry label.
    assert entry["spec"]["selector"] == {"app.kubernetes.io/instance": "llama", ENTRY_LABEL: "true"}
    assert entry["spec"]["ports"][0]["targetPort"] == "http"
    only_new = build_topology([old, new], serving=(new.set,))
    entry = next(o for o in only_new if o["kind"] == "Service" and o["metadata"]["name"] == "llama")
    assert entry["spec"]["selector"][SET_LABEL] == new.set


def test_routing_changes_only_the_entry_service_never_a_pod_template() -> None:
    old, new = BLUEPRINTS["vllm-replicas-4xtp2"], BLUEPRINTS["vllm-pd-2p3d-tp4"]
    first = {(o["kind"], o["metadata"]["name"]): o for o in build_topology([old, new], serving=(old.set,))}
    second = {(o["kind"], o["metadata"]["name"]): o for o in build_topology([old, new], serving=(old.set, new.set))}
    changed = [k for k in first if first[k] != second[k]]
    assert changed == [("Service", "llama")]


def test_two_sets_with_one_name_are_refused() -> None:
    bp = BLUEPRINTS["vllm-replicas-4xtp2"]
    with pytest.raises(ValueError, match="distinct sets"):
        build_topology([bp, bp], serving=(bp.set,))


def test_a_data_parallel_instance_over_two_nodes_comes_from_the_planner_and_starts_on_both():
    # DeepSeek-V3 FP8 as TP2 × DP8 × EP on two 8-GPU H200 nodes: one LeaderWorkerSet group of two pods, 8 GPUs each.
    for name in ("sglang-multinode-tp2dp8-ep", "vllm-0.33-multinode-tp2dp8-ep"):
        bp = BLUEPRINTS[name]
        assert bp.layout.label == "1×TP2·DP8·EP" and multinode_roles(bp) == (Role.AGGREGATED,)
        lws = build_leader_worker_set(bp, Role.AGGREGATED)["spec"]
        assert lws["leaderWorkerTemplate"]["size"] == 2
        args = lws["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
        flags = dict(itertools.pairwise(args))
        if bp.engine is Engine.SGLANG:
            assert flags["--tp-size"] == "16" and flags["--attn-dp-size"] == "8" and flags["--nnodes"] == "2"
        else:
            assert flags["--tensor-parallel-size"] == "2" and flags["--data-parallel-size"] == "8" and flags["--nnodes"] == "2"


def test_vllm_0_11_starts_data_parallel_ranks_over_nodes_with_rays_dp_backend():
    bp = blueprint(Engine.VLLM, Layout.replicas(1, Parallelism(tp=2, dp=8, ep=True)), model="deepseek-ai/DeepSeek-V3")
    lwt = build_leader_worker_set(bp, Role.AGGREGATED)["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]["args"][0]
    assert "--distributed-executor-backend ray" in leader and "--data-parallel-backend ray" in leader
