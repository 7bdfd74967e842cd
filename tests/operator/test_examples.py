"""The examples render the pods they promise: the gated-model example's engine pods carry the token Secret and the
model-cache claim (golden YAML), and every object, the example's own Secret and PVC included, passes the
Kubernetes schema offline. Every example with a ServingTopology is reconciled with the real planner (its
ConfigMaps in the fake cluster): planned within its SLOs, its budget and its allowed or pinned layout; the
examples together cover vLLM and SGLang, replicas/TP/PD, Pinned, modelConfigMap and the live-replanning demo."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fake_cluster import FakeCluster

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.pass_context import blueprint_for
from servingtopology.operator.reconcile import reconcile
from servingtopology.operator.render.manifests import build_workloads
from servingtopology.planner.layout import Layout, Parallelism
from servingtopology.planner.search.decide import decide

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.37.0"
UID = "0d9c1e4e-5b7a-4c1e-9a57-000000000002"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if d]


def _render(doc: dict[str, Any], layout: Layout) -> list[dict[str, Any]]:
    spec = parse_topology_spec(doc["spec"])
    bp = blueprint_for(spec, layout, name=doc["metadata"]["name"], namespace=doc["metadata"]["namespace"], uid=UID,
                       gpus_per_node=spec.hardware.gpusPerNode or 8)
    return build_workloads(bp)


def test_the_gated_model_example_renders_engine_pods_with_the_token_secret_and_the_cache_claim(
        golden: Callable[[str, str], None]) -> None:
    docs = _docs("gated-llama-hf-cache.yaml")
    secret, claim, topology = (next(d for d in docs if d["kind"] == k) for k in ("Secret", "PersistentVolumeClaim", "ServingTopology"))
    # A fixed layout, so the golden pins the rendering, not the planner's choice.
    objects = _render(topology, Layout.replicas(2, Parallelism(tp=1)))
    golden("example-gated-llama-hf-cache.yaml", yaml.safe_dump_all(objects, sort_keys=False, width=120))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    env = {e["name"]: e for e in engine["env"]} if "env" in engine else {}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "token"}
    assert "token" in secret["stringData"]
    assert env["HF_HOME"]["value"].startswith("/models/")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert {"name": "model-cache", "mountPath": "/models"} in engine["volumeMounts"]
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"  # the operator's /dev/shm is kept beside the template's
    assert engine["resources"]["requests"]["ephemeral-storage"] == "20Gi" and engine["resources"]["requests"]["cpu"]
    for obj in [secret, claim, *objects]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---- every example is a valid resource that the real planner plans -----------------------------------------------

def _example_files() -> list[Path]:
    """The example files that hold a ServingTopology (examples/ also has a CLI planning spec)."""
    return sorted(p for p in (ROOT / "examples").glob("*.yaml") if any(d.get("kind") == "ServingTopology" for d in _docs(p.name)))


def test_the_examples_cover_both_engines_every_layout_kind_pinned_and_a_model_config_map() -> None:
    topologies = [d for p in _example_files() for d in _docs(p.name) if d["kind"] == "ServingTopology"]
    engines = {t["spec"]["engine"]["name"] for t in topologies}
    modes = {t["spec"]["policy"]["mode"] for t in topologies}
    layouts = {k for t in topologies for k in t["spec"]["policy"].get("allowedLayouts", [])} | {
        t["spec"]["pinned"]["kind"] for t in topologies if "pinned" in t["spec"]}
    assert engines == {"vllm", "sglang"} and {"Auto", "DryRun", "Pinned"} <= modes and {"replicas", "pd"} <= layouts
    assert any("modelConfigMap" in t["spec"] and "model" not in t["spec"] for t in topologies)
    demo = next(t for t in topologies if t["metadata"]["name"] == "demo")
    assert demo["spec"]["policy"]["mode"] == "Auto" and demo["spec"]["metrics"]["prometheusUrl"] == "http://127.0.0.1:19090"


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.name)
def test_every_example_is_planned_by_the_real_planner_and_renders_valid_objects(path: Path) -> None:
    docs = _docs(path.name)
    cluster = FakeCluster()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            cluster.config_maps[(doc["metadata"]["namespace"], doc["metadata"]["name"])] = dict(doc["data"])
        if doc["kind"] != "ServingTopology":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for doc in (d for d in docs if d["kind"] == "ServingTopology"):
        obj = copy.deepcopy(doc)
        obj["metadata"] |= {"uid": UID, "generation": 1}
        out = reconcile(obj, cluster=cluster, planner=lambda problem: decide(problem), now=datetime(2026, 1, 1, tzinfo=UTC))
        conditions = {c["type"]: c for c in out.status["conditions"]}
        assert out.error is None, conditions
        planned = out.status["proposal"] if doc["spec"]["policy"]["mode"] == "DryRun" else out.status["plan"]
        assert planned and planned["predicted"]["meetsSlo"], (path.name, conditions)
        if "pinned" in doc["spec"]:
            assert planned["kind"] == doc["spec"]["pinned"]["kind"]
        allowed = doc["spec"]["policy"].get("allowedLayouts")
        assert allowed is None or planned["kind"] in allowed
        assert planned["gpus"] <= doc["spec"]["hardware"]["maxGPUs"]
        for applied in cluster.objects.values():
            kubernetes_validate.validate(applied, K8S_VERSION, strict=True)
