"""Mixed GPU kinds on a real API server and scheduler: kwok nodes of two kinds (the harness's H100 nodes and an A100 node
added here).

1. A Pinned ServingTopology whose prefill runs on H100 and decode on A100 (spec.pinned.decode.gpu) reconciles through
   the operator: its prefill pods land on H100 nodes, its decode pods on the A100 node, status.plan names each role's
   kind, and it turns Ready.
2. A member's replicas on both kinds, rendered by the operator's builders (operator/render/sets.py `parts_rendering`) and
   applied as they are: two workload sets, each scheduled on its kind, and the one entry Service selects the pods of
   both sets.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from servingtopology.operator.render.manifests import ROLE_LABEL, SET_LABEL, Blueprint, build_topology
from servingtopology.operator.render.sets import on_kind, parts_rendering
from servingtopology.planner.layout import Engine, Layout, Parallelism

from .cluster import LocalCluster, NodePool
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .stack import Operator

A100_NODE = NodePool(count=1, gpus_per_node=8, gpu_product="NVIDIA-A100-SXM4-80GB", name_prefix="a100-mix-node")


def _node_products(cluster: LocalCluster) -> dict[str, str]:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product", "") for n in nodes}


def _placed(kube: Kube, namespace: str, selector: str) -> list[tuple[str, str]]:
    """(role or set, node) of every bound pod matching `selector`."""
    return [(p["metadata"]["labels"].get(ROLE_LABEL, ""), p["spec"].get("nodeName", "")) for p in kube.items("pods", namespace, selector=selector)]


def test_prefill_and_decode_run_on_their_kinds_and_one_service_selects_replicas_on_two_kinds(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    cluster.create_gpu_nodes(A100_NODE)
    try:
        obj = topology("mixed", namespace, prometheus_url=None, mode="Pinned", max_gpus=8)
        # vLLM 0.11 (the image) refuses decode TP below prefill TP over NIXL: TP1 on both sides
        obj["spec"]["pinned"] = {"kind": "pd", "prefill": {"count": 1, "tp": 1}, "decode": {"count": 2, "tp": 1, "gpu": "a100_sxm"}}
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))
        kube.wait_condition(namespace, "mixed", "Ready", "True", timeout_s=150, log=operator.log_tail)
        products = _node_products(cluster)
        engines = [(role, products[node]) for role, node in _placed(kube, namespace, "app.kubernetes.io/instance=mixed")
                   if role in ("prefill", "decode")]
        assert sorted(engines) == [("decode", "NVIDIA-A100-SXM4-80GB"), ("decode", "NVIDIA-A100-SXM4-80GB"),
                                   ("prefill", "NVIDIA-H100-80GB-HBM3")], engines
        status = json.loads(cluster.kubectl("get", "stopo", "mixed", "-n", namespace, "-o", "json").stdout)["status"]
        assert {r["role"]: r.get("gpu") for r in status["plan"]["roles"]} == {"prefill": "h100_sxm", "decode": "a100_sxm"}
        assert status["plan"]["layout"] == "1P(TP1)·2D(TP1)@h100_sxm→a100_sxm"
        cluster.kubectl("delete", "stopo", "mixed", "-n", namespace, "--wait=true", "--timeout=60s")

        # replicas of one member on both kinds, as the builders render them, behind one Service
        parts = [on_kind(Layout.replicas(2, Parallelism(tp=1)), "h100_sxm"), on_kind(Layout.replicas(1, Parallelism(tp=1)), "a100_sxm")]
        rendering = parts_rendering(parts, lambda lay, s: Blueprint(
            name="split", namespace=namespace, uid="", engine=Engine.VLLM, image="vllm/vllm-openai:v0.11.0",
            model="meta-llama/Llama-3.1-8B-Instruct", served_model_name="meta-llama/Llama-3.1-8B-Instruct", layout=lay,
            gpus_per_node=8, set_name=s, gpu_id="h100_sxm",
            tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)))
        objects: list[dict[str, Any]] = build_topology(rendering.sets, serving=rendering.serving)
        for o in objects:   # applied by hand here: no owner (the garbage collector would remove objects of a missing one)
            o["metadata"].pop("ownerReferences", None)
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))
        sets = {bp.set: bp.layout.roles for bp in rendering.sets}
        assert len(sets) == 2

        def pods_by_set() -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for p in kube.items("pods", namespace, selector="app.kubernetes.io/instance=split"):
                if p["spec"].get("nodeName"):
                    out.setdefault(p["metadata"]["labels"][SET_LABEL], []).append(p)
            return out

        wait_until(lambda: sum(len(v) for v in pods_by_set().values()) == 3, timeout_s=90, what="3 pods of two sets bound",
                   on_timeout=lambda: json.dumps({k: len(v) for k, v in pods_by_set().items()}))
        placed = {s: sorted(products[p["spec"]["nodeName"]] for p in pods) for s, pods in pods_by_set().items()}
        assert sorted(placed.values()) == [["NVIDIA-A100-SXM4-80GB"], ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3"]], placed
        # The Service's selector as the API server stores it, asked of the API server: kube-proxy's endpoints are the Ready
        # pods it selects. (kwok pods have loopback IPs, which the EndpointSlice controller refuses to publish: the selector is
        # the check here, as e2e/invariants.py reads a Service's routes.)
        service = json.loads(cluster.kubectl("get", "service", "split", "-n", namespace, "-o", "json").stdout)
        selector = ",".join(f"{k}={v}" for k, v in sorted(service["spec"]["selector"].items()))
        selected = {p["metadata"]["name"] for p in kube.items("pods", namespace, selector=selector)}
        assert selected == {p["metadata"]["name"] for pods in pods_by_set().values() for p in pods}, (selector, selected)
        assert {s for s, pods in pods_by_set().items() if any(p["metadata"]["name"] in selected for p in pods)} == set(sets)
    finally:
        cluster.kubectl("delete", "deployments,services", "-n", namespace, "-l", "app.kubernetes.io/instance=split", "--wait=false",
                        check=False)
        cluster.kubectl("delete", "node", f"{A100_NODE.name_prefix}-0", "--wait=false", check=False)
