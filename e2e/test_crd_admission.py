"""The generated CRD in the real API server: installed by the chart (its CEL rules pass the server's compiler and cost
budget), it refuses each spec of e2e/admission_cases.py naming the field, admits the valid one and every example, and
`kubectl explain` finds a description for every field.

Server-side dry runs only: nothing is stored, so the operator never sees these objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .admission_cases import REFUSED, REFUSED_WHEN_PLANNED, Case, mutated, valid_topology
from .cluster import LocalCluster
from .kubetools import REPO_ROOT
from .processes import wait_until
from .stack import Operator

CRD = "servingtopologies.servingtopology.io"
# The examples a user applies with kubectl (the others are CLI plan specs).
EXAMPLES = sorted(p for p in (REPO_ROOT / "examples").glob("*.yaml") if "kind: ServingTopology" in p.read_text())


def _dry_run(cluster: LocalCluster, obj: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input_text=json.dumps(obj), check=False)


def test_the_installed_crd_is_the_generated_one_with_its_cel_rules(cluster: LocalCluster, operator: Operator) -> None:
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established.get("Established") == "True", crd["status"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["x-kubernetes-validations"] and schema["properties"]["spec"]["x-kubernetes-validations"]


def test_the_api_server_admits_the_valid_spec_and_defaults_it(cluster: LocalCluster, operator: Operator, namespace: str) -> None:
    done = _dry_run(cluster, valid_topology(namespace=namespace))
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)["spec"]
    assert spec["objective"] == "goodput-per-gpu" and spec["workload"]["prefixShare"] == 0
    assert "precision" not in spec  # an unset precision stays unset: the checkpoint's own is served


@pytest.mark.parametrize("case", REFUSED + REFUSED_WHEN_PLANNED, ids=lambda c: c.id)
def test_the_api_server_refuses_what_the_operator_would_refuse(cluster: LocalCluster, operator: Operator, namespace: str,
                                                               case: Case) -> None:
    done = _dry_run(cluster, mutated(valid_topology(namespace=namespace), case.changes))
    assert done.returncode != 0, f"{case.id} admitted"
    assert "is invalid" in done.stderr and case.field in done.stderr, done.stderr


def test_a_pin_within_the_budget_is_admitted(cluster: LocalCluster, operator: Operator, namespace: str) -> None:
    for pinned in ({"replicas": 2, "tp": 4}, {"kind": "pd", "prefill": {"count": 1, "tp": 4}, "decode": {"count": 2, "tp": 2}},
                   # SGLang's spelling of DP attention: tp 4, dp 4 is four GPUs, not sixteen (8 in all, the budget)
                   {"replicas": 2, "tp": 4, "dp": 4, "dpAttention": True},
                   {"kind": "pd", "dpAttention": True, "prefill": {"count": 1, "tp": 4, "dp": 4}, "decode": {"count": 1, "tp": 4, "dp": 2}},
                   {"kind": "pd", "prefill": {"count": 1, "tp": 4, "dp": 4, "dpAttention": True}, "decode": {"count": 2, "tp": 2}}):
        obj = mutated(valid_topology(namespace=namespace), (("spec.policy.mode", "Pinned"), ("spec.pinned", pinned)))
        done = _dry_run(cluster, obj)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_admitted(cluster: LocalCluster, operator: Operator, namespace: str, path: Path) -> None:
    topologies = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "ServingTopology"]
    for doc in topologies:
        doc["metadata"]["namespace"] = namespace
        done = _dry_run(cluster, doc)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"


def _object_paths(node: dict[str, Any], path: str) -> list[str]:
    """Every field path whose `kubectl explain` lists child fields (objects, and lists of objects)."""
    item = node.get("items") if isinstance(node.get("items"), dict) else node
    if "properties" not in item:
        return []
    out = [path]
    for name, child in item["properties"].items():
        out += _object_paths(child, f"{path}.{name}")
    return out


def test_kubectl_explain_shows_a_description_for_every_field(cluster: LocalCluster, operator: Operator) -> None:
    # issue #16: `kubectl explain servingtopology.spec` said <no description> for 70 of 102 fields.
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = [p for root in ("spec", "status") for p in _object_paths(schema["properties"][root], f"servingtopologies.{root}")]
    assert len(paths) > 30
    # The API server publishes a new CRD's OpenAPI a moment after it is established.
    wait_until(lambda: "FIELDS:" in cluster.kubectl("explain", "servingtopologies.spec.workload", check=False).stdout,
               timeout_s=60, what="kubectl explain servingtopologies.spec.workload")
    undescribed = []
    for path in paths:
        text = cluster.kubectl("explain", path).stdout
        assert "FIELDS:" in text or "FIELD:" in text, text
        undescribed += [f"{path}: {line.strip()}" for line in text.splitlines() if "<no description>" in line]
    assert undescribed == []
    text = cluster.kubectl("explain", "servingtopologies.spec.workload.arrivalRate").stdout
    assert "requests per second" in text and "100,000" in text
