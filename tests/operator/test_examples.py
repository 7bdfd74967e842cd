"""The examples render the pods they promise: the gated-model example's engine pods carry the token Secret and the
model-cache claim (golden YAML), and every object, the example's own Secret and PVC included, passes the
Kubernetes schema offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from servingtopology.operator.api import parse_topology_spec
from servingtopology.operator.manifests import build_workloads
from servingtopology.operator.pass_context import blueprint_for
from servingtopology.planner.layout import Layout, Parallelism

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
