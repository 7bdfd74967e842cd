"""The CRD is generated from the API models: the committed YAML must match, and the schema must be structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from servingtopology.operator.api.crd import CRD_PATHS, build_crd, render_crd_yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rel", CRD_PATHS)
def test_committed_crd_matches_the_api_models(rel: str) -> None:
    path = ROOT / rel
    assert path.read_text() == render_crd_yaml(), (
        f"{rel} drifted from operator/api/resource.py; regenerate with `python -m servingtopology.operator.api.crd --write`")


def _walk(node: dict[str, Any], path: str = "") -> list[str]:
    """Violations of the structural-schema rules Kubernetes enforces on CRDs."""
    problems = []
    if not node.get("type") and not node.get("x-kubernetes-preserve-unknown-fields") and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path or '/'}: no type")
    for bad in ("anyOf", "oneOf", "allOf", "$ref", "$defs", "const", "title"):
        if bad in node:
            problems.append(f"{path}: {bad}")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties beside additionalProperties")
    if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(node.get("exclusiveMinimum"), bool):
        problems.append(f"{path}: numeric exclusiveMinimum")
    for name, child in node.get("properties", {}).items():
        problems += _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        problems += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += _walk(node["additionalProperties"], f"{path}{{}}")
    return problems


def test_the_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []


def test_the_crd_names_group_version_short_name_status_and_printer_columns() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "servingtopologies.servingtopology.io"
    assert spec["scope"] == "Namespaced" and spec["names"]["shortNames"] == ["stopo"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["READY", "REASON", "MODE", "LAYOUT", "P:D", "GPUS", "TTFT", "TPOT", "PHASE", "AGE"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["PROPOSAL", "ERROR"]


def test_every_printer_column_reads_a_field_the_status_schema_has() -> None:
    # A column whose JSONPath names no field prints <none> forever; the API server does not check it.
    version = build_crd()["spec"]["versions"][0]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if not path.startswith(".status.summary."):
            continue
        node = status
        for key in path.removeprefix(".status.").split("."):
            assert key in node.get("properties", {}), (column["name"], path)
            node = node["properties"][key]
        assert node["type"] == "string" and column["type"] == "string", column
    reasons = [c for c in version["additionalPrinterColumns"] if c["name"] == "REASON"]
    assert reasons[0]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'


def test_the_spec_schema_carries_enums_minimums_and_required_fields() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert set(spec["required"]) >= {"engine", "hardware", "workload", "slo"}
    assert props["policy"]["properties"]["mode"]["enum"] == ["Auto", "DryRun", "Pinned"]
    assert props["engine"]["properties"]["name"]["enum"] == ["vllm", "sglang"]
    assert props["hardware"]["properties"]["maxGPUs"]["minimum"] == 1
    assert "image" in props["engine"]["required"]
    assert "layout" not in props and "modelConfig" not in props  # CLI-only fields
    assert props["pinned"]["properties"]["kind"]["enum"] == ["replicas", "pd"]


def test_the_generated_yaml_round_trips() -> None:
    text = render_crd_yaml()
    assert yaml.safe_load(text) == build_crd()


def test_the_api_server_refuses_unbounded_numbers_and_strings() -> None:
    # issue #17: `spec.pinned.engineArgs.maxNumSeqs: 20000000` was admitted (no maximum) and one pass took 1.66 GB.
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    pinned = spec["pinned"]["properties"]
    assert pinned["engineArgs"]["properties"]["maxNumSeqs"]["maximum"] == 65_536
    assert pinned["engineArgs"]["properties"]["maxNumBatchedTokens"]["maximum"] == 2_097_152
    assert all(pinned[k]["maximum"] <= 16_384 for k in ("replicas", "tp", "pp", "dp"))   # spec.MAX_GPUS
    assert pinned["prefill"]["properties"]["count"]["maximum"] == 16_384
    assert spec["simulation"]["properties"]["seed"]["minimum"] == 0
    assert spec["model"]["maxLength"] == 256 and spec["hardware"]["properties"]["gpu"]["maxLength"] == 256


def test_pod_metadata_with_annotations_and_no_labels_passes_the_crds_rule_as_it_passes_the_model() -> None:
    from servingtopology.operator.api.resource import parse_topology_spec

    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    metadata = spec["properties"]["podTemplate"]["properties"]["metadata"]
    rules = [r["rule"] for r in metadata["x-kubernetes-validations"]]
    assert rules and all(r.startswith("!has(self.labels) || ") for r in rules if "self.labels" in r)
    base = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())["spec"]
    parse_topology_spec({**base, "podTemplate": {"metadata": {"annotations": {"a": "b"}}}})


def test_the_generator_refuses_a_cel_rule_that_reads_an_optional_field_without_has() -> None:
    from servingtopology.operator.api.crd import structural_schema

    node = {"type": "object", "properties": {"labels": {"type": "object"}, "name": {"type": "string"}}, "required": ["name"],
            "x-kubernetes-validations": [{"rule": "self.labels.all(k, k != 'x') && self.name != ''", "message": "m"}]}
    with pytest.raises(ValueError, match="labels"):
        structural_schema(node, {})
    guarded = {**node, "x-kubernetes-validations": [{"rule": "!has(self.labels) || self.labels.all(k, k != 'x')", "message": "m"}]}
    assert structural_schema(guarded, {})["x-kubernetes-validations"]
