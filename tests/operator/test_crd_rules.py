"""What the CRD tells and enforces: a description on every field, a bound on every number, string, list and map (the
pydantic models' own), CEL rules the operator's validation agrees with, and object names that always fit.

The real API server's verdict on the same cases is e2e/test_crd_admission.py; here the schema itself, the operator's
side of each rule, and the derived names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from cases import blueprint, decision
from fake_cluster import FakeCluster
from test_reconcile import PD, ScriptedPlanner, cond, run, topology

from e2e.admission_cases import REFUSED, Case, mutated, valid_topology
from servingtopology.operator.api.crd import build_crd
from servingtopology.operator.api.resource import check_resource_name, parse_topology_spec
from servingtopology.operator.render.manifests import MAX_LWS_NAME, build_workloads, derived_name, object_name, router_account
from servingtopology.planner.layout import Engine, Layout, Parallelism, RoleLayout
from servingtopology.spec import MAX_NUM_SEQS, SpecError

ROOT_SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = ROOT_SCHEMA["properties"]["spec"]
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# Nodes that hold a value the schema cannot type, each validated elsewhere:
# a token count or a length distribution (Kubernetes schemas have no int-or-object; CEL cannot see an untyped
# node, so the operator's pydantic model bounds them: at most 10M tokens, 10,000 empirical values); and core/v1
# objects passed through as they are (the API server validates them in the pods the operator applies).
OPEN_NODES = {"spec.workload.inputTokens", "spec.workload.outputTokens"}
OPEN_K8S_OBJECTS = ("valueFrom", "envFrom[]", "securityContext", "ports[]", "initContainers[]", "volumes[]", "affinity")


def _nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def _fields(root: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named property under `root` (list items and map values are described by their field)."""
    for where, node in _nodes(root, path):
        if not where.endswith(("[]", "{}")):
            yield where, node


def test_every_field_of_spec_and_status_has_a_description() -> None:
    # issue #16: `kubectl explain servingtopology.spec` showed <no description> for 70 of 102 fields.
    missing = [p for root in ("spec", "status") for p, node in _fields(ROOT_SCHEMA["properties"][root], root)
               if not str(node.get("description", "")).strip()]
    assert missing == []


def test_descriptions_say_the_allowed_values_the_range_and_the_default() -> None:
    props = SPEC_SCHEMA["properties"]
    assert props["objective"]["description"].endswith("Allowed: goodput-per-gpu, min-gpus. Default: goodput-per-gpu.")
    assert "Range: 0 to 1. Default: 0." in props["workload"]["properties"]["prefixShare"]["description"]
    assert "Range: more than 0, at most 100,000." in props["workload"]["properties"]["arrivalRate"]["description"]
    assert "requests per second" in props["workload"]["properties"]["arrivalRate"]["description"]
    assert "Default: 5m." in props["policy"]["properties"]["replanInterval"]["description"]
    assert "in ms" in props["slo"]["properties"]["ttftMs"]["description"]


def test_precision_has_no_schema_default_so_a_checkpoint_keeps_its_own() -> None:
    # An API-server default of bf16 would be stored in every resource and read as "the user asked for bf16", so an
    # FP8 or NVFP4 checkpoint would be served in bf16 (serving_precision reads an unset precision as the checkpoint's).
    assert "default" not in SPEC_SCHEMA["properties"]["precision"]
    assert "precision" not in parse_topology_spec(valid_topology()["spec"]).model_fields_set


def _unbounded(node: dict[str, Any]) -> list[str]:
    kind, missing = node.get("type"), []
    if kind in ("integer", "number"):
        missing += [k for k in ("minimum", "maximum") if k not in node]
    if kind == "string" and "enum" not in node and "maxLength" not in node:
        missing.append("maxLength")
    if kind == "array" and "maxItems" not in node:
        missing.append("maxItems")
    if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
        missing.append("maxProperties")
    return missing


def test_every_number_string_list_and_map_of_the_spec_is_bounded() -> None:
    # issue #17: maxNumSeqs 20000000 and 400-digit durations were admitted; one pass took 133 s and 1.66 GB.
    problems, open_nodes = [], set()
    for path, node in _nodes(SPEC_SCHEMA, "spec"):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            open_nodes.add(path)
            continue
        problems += [f"{path}: no {what}" for what in _unbounded(node)]
    assert problems == []
    assert {p for p in open_nodes if not p.endswith(OPEN_K8S_OBJECTS)} == OPEN_NODES


def _leaves(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Scalar fields reachable through objects only (no list or map in the way)."""
    for name, child in node.get("properties", {}).items():
        if child.get("type") == "object" and "properties" in child:
            yield from _leaves(child, f"{path}.{name}")
        elif child.get("type") in ("integer", "number", "string"):
            yield f"{path}.{name}", child


# Fields that only mean something beside another (the value past the bound is refused either way; these need a
# sibling for the object to be reachable at all).
_CONTEXT = {"spec.pinned": (("spec.policy.mode", "Pinned"),),
            "spec.modelConfigMap": (("spec.model", None), ("spec.modelSource", "meta-llama/Llama-3.1-8B-Instruct"))}


def _past_the_bound_cases() -> list[tuple[str, Any]]:
    cases: list[tuple[str, Any]] = []
    for path, node in _leaves(SPEC_SCHEMA, "spec"):
        if "maximum" in node:
            over = node["maximum"] * 2 + 1
            cases.append((path, int(over) if node["type"] == "integer" else float(over)))
        if "maxLength" in node:
            cases.append((path, "a" * (node["maxLength"] + 1)))
    return cases


@pytest.mark.parametrize(("path", "value"), _past_the_bound_cases(), ids=lambda v: v if isinstance(v, str) and len(v) < 80 else "")
def test_the_operator_refuses_every_value_past_the_crds_bound(path: str, value: Any) -> None:
    # One source: the CRD's maximum and maxLength are the pydantic models' own, so a value the API server refuses is
    # one the operator (and the CLI's spec validation, the same models) refuses too, naming the same field.
    context = next((c for prefix, c in _CONTEXT.items() if path.startswith(prefix + ".")), ())
    obj = mutated(valid_topology(), (*context, (path, value)))
    with pytest.raises(SpecError) as refused:
        parse_topology_spec(obj["spec"])
    assert any(field.startswith(path) for field, _ in refused.value.errors), refused.value.errors


def test_the_bounds_are_the_clis_spec_bounds() -> None:
    pinned = SPEC_SCHEMA["properties"]["pinned"]["properties"]
    assert pinned["engineArgs"]["properties"]["maxNumSeqs"]["maximum"] == MAX_NUM_SEQS
    duration = SPEC_SCHEMA["properties"]["policy"]["properties"]["replanInterval"]
    assert duration["maxLength"] <= 7 and duration["x-kubernetes-validations"]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_the_operator_refuses_every_spec_the_crd_refuses(case: Case) -> None:
    # The API server's verdict on these is e2e/test_crd_admission.py; the operator must agree, naming the field.
    obj = mutated(valid_topology(), case.changes)
    with pytest.raises(SpecError) as refused:
        check_resource_name(obj["metadata"]["name"])
        parse_topology_spec(obj["spec"])
    fields = [field for field, _ in refused.value.errors]
    wanted = case.field.replace("[", ".").replace("]", "")
    assert any(f == wanted or f.startswith(wanted + ".") for f in fields), fields


def test_every_cel_rule_names_a_field_in_its_message() -> None:
    rules = [(p, r) for p, node in _nodes(ROOT_SCHEMA, "") for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 12
    for path, rule in rules:
        assert rule["message"] and len(rule["rule"]) < 600, (path, rule)  # the API server estimates each rule's cost
    root_messages = [r["message"] for r in ROOT_SCHEMA["x-kubernetes-validations"]]
    assert all("metadata.name" in m for m in root_messages)
    spec_messages = " ".join(r["message"] for r in SPEC_SCHEMA["x-kubernetes-validations"])
    assert {"spec.model", "spec.modelConfigMap", "spec.modelSource", "spec.policy.mode", "spec.pinned"} <= set(
        re.findall(r"spec\.[A-Za-z.]+[A-Za-z]", spec_messages))


# ---- names -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 20, 40, 47, 48, 55, 62, 63])
def test_every_derived_name_fits_a_dns_label_for_every_allowed_resource_name(length: int) -> None:
    # issue #17: names of 48-63 characters made `<name>-<set>-prefill` longer than 63 once a PD plan was chosen.
    name = ("l" + "lama-" * 13)[:length].rstrip("-") or "l"
    check_resource_name(name)
    bp = replace(blueprint(Engine.VLLM, Layout.pd(RoleLayout(2, Parallelism(tp=4)), RoleLayout(3, Parallelism(tp=16)))), name=name)
    objects = build_workloads(bp)
    assert {o["kind"] for o in objects} >= {"Deployment", "LeaderWorkerSet", "Service", "ServiceAccount", "Role", "RoleBinding"}
    for obj in objects:
        meta = obj["metadata"]
        limit = MAX_LWS_NAME if obj["kind"] == "LeaderWorkerSet" else 63
        assert len(meta["name"]) <= limit and DNS_1035.match(meta["name"]), meta["name"]
        assert all(len(v) <= 63 for v in meta["labels"].values()), meta["labels"]
        template = obj.get("spec", {}).get("template") or obj.get("spec", {}).get("leaderWorkerTemplate", {}).get("leaderTemplate")
        if template:
            assert all(len(v) <= 63 for v in template["metadata"]["labels"].values())
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)


def test_short_names_keep_their_plain_form_and_long_ones_a_stable_distinct_hash() -> None:
    assert derived_name("llama", "s1a2b3c-prefill") == "llama-s1a2b3c-prefill"
    long_a, long_b = "a" * 60 + "xyz", "a" * 60 + "xyw"
    name_a, name_b = derived_name(long_a, "s1a2b3c-prefill"), derived_name(long_b, "s1a2b3c-prefill")
    assert len(name_a) == len(name_b) == 63 and name_a.endswith("-s1a2b3c-prefill")
    assert name_a != name_b and name_a == derived_name(long_a, "s1a2b3c-prefill")
    bp = replace(blueprint(Engine.VLLM, Layout.replicas(1, Parallelism(tp=1))), name="b" * 63)
    assert len(router_account(bp)) == 63 and router_account(bp).endswith("-router")
    assert len(object_name(bp, "aggregated", limit=MAX_LWS_NAME)) == MAX_LWS_NAME


def test_a_63_character_resource_with_a_pd_plan_applies_objects_that_all_fit() -> None:
    obj, cluster = topology(), FakeCluster()
    obj["metadata"]["name"] = "m" * 63
    run(obj, cluster, ScriptedPlanner(decision(PD)))
    assert cond(obj, "Ready")["reason"] != "InvalidSpec"
    names = [ref.name for ref in cluster.objects]
    assert any(n.endswith("-prefill") for n in names) and all(len(n) <= 63 and DNS_1035.match(n) for n in names), names


@pytest.mark.parametrize("name", ["llama.v2", "8b-llama", "l" * 64])
def test_a_resource_admitted_with_a_name_no_service_can_take_is_invalid_and_applies_nothing(name: str) -> None:
    # Resources created before the CRD's name rule: the operator refuses them in status instead of failing to apply.
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(PD))
    obj["metadata"]["name"] = name
    run(obj, cluster, planner)
    ready = cond(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec") and "metadata.name" in ready["message"]
    assert cluster.objects == {} and planner.problems == []
