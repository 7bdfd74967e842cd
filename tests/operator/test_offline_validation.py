"""Every rendered object passes the Kubernetes 1.37 OpenAPI schemas offline (kubernetes-validate, strict),
and the sample ServingTopology in examples/ passes the generated CRD schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cases import BLUEPRINTS
from test_live_reconcile import run as live_run
from test_live_reconcile import running

from servingtopology.operator.api.crd import build_crd
from servingtopology.operator.render.manifests import LWS_API_VERSION, build_topology, build_workloads

K8S_VERSION = "1.37.0"  # the newest schema set kubernetes-validate 1.37 ships
ROOT = Path(__file__).resolve().parents[2]


def _pod_templates(lws: dict[str, Any]) -> list[dict[str, Any]]:
    """LeaderWorkerSet is a CRD the validator does not know; its pod templates are core PodTemplates."""
    lwt = lws["spec"]["leaderWorkerTemplate"]
    return [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{lws['metadata']['name']}-{part}"},
             "template": lwt[f"{part}Template"]} for part in ("leader", "worker")]


@pytest.mark.parametrize("name", sorted(BLUEPRINTS))
def test_every_rendered_object_passes_the_kubernetes_schema(name: str) -> None:
    for obj in build_workloads(BLUEPRINTS[name]):
        targets = _pod_templates(obj) if obj["apiVersion"] == LWS_API_VERSION else [obj]
        for target in targets:
            kubernetes_validate.validate(target, K8S_VERSION, strict=True)


def test_a_broken_object_is_caught_by_the_validator() -> None:
    obj = build_workloads(BLUEPRINTS["vllm-replicas-4xtp2"])[0]
    obj["spec"]["replicas"] = "four"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_crd_itself_passes_the_apiextensions_schema() -> None:
    kubernetes_validate.validate(build_crd(), K8S_VERSION, strict=True)


def _openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3.0 `nullable` and boolean exclusive bounds to JSON Schema, for jsonschema to check a CR."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # pruning would drop unknown fields; here they are errors
    return out


def _cr_schema() -> dict[str, Any]:
    return _openapi_to_jsonschema(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_pass_the_generated_crd_schema(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "ServingTopology":
            jsonschema.validate(doc, _cr_schema())


def test_the_crd_schema_rejects_an_unknown_mode_and_a_negative_budget() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    doc["spec"]["policy"]["mode"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError, match="Sometimes"):
        jsonschema.validate(doc, _cr_schema())
    doc["spec"]["policy"]["mode"] = "Auto"
    doc["spec"]["hardware"]["maxGPUs"] = -1
    with pytest.raises(jsonschema.ValidationError, match="-1"):
        jsonschema.validate(doc, _cr_schema())


def test_two_sets_side_by_side_pass_the_kubernetes_schema() -> None:
    old, new = BLUEPRINTS["vllm-replicas-4xtp2"], BLUEPRINTS["sglang-pd-1p2d-mixed"]
    for obj in build_topology([old, new], serving=(old.set, new.set)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_status_written_mid_transition_passes_the_generated_crd_schema() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    metrics.rate = 80.0
    for minute in range(5, 12):
        live_run(obj, cluster, planner, metrics, minute)
        if (obj["status"].get("replan") or {}).get("transition"):
            break
    assert obj["status"]["replan"]["transition"] and obj["status"]["proposal"]["set"]
    jsonschema.validate(obj, _cr_schema())
