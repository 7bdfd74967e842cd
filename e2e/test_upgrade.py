"""docs/upgrading.md against the real API server and the real Helm: `helm upgrade` leaves a changed CRD in crds/
untouched, a plain server-side apply of it conflicts with Helm's field ownership, and the documented command
(`kubectl apply --server-side --force-conflicts --field-manager=servingtopology-crds -f charts/servingtopology/crds/`)
updates it while the existing ServingTopology objects stay."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .kubetools import REPO_ROOT, tool
from .objects import topology
from .stack import CHART, OPERATOR_NAMESPACE, RELEASE, Operator

CRD = "servingtopologies.servingtopology.io"
DOC = REPO_ROOT / "docs" / "upgrading.md"
# The commands of docs/upgrading.md, with the chart folder as the only thing a test may swap.
APPLY_CRDS = "kubectl apply --server-side --force-conflicts --field-manager=servingtopology-crds -f charts/servingtopology/crds/"
WAIT_CRD = "kubectl wait --for condition=established --timeout=60s crd/servingtopologies.servingtopology.io"
HELM_UPGRADE = "helm upgrade stopo charts/servingtopology -n servingtopology-system --reuse-values"


def _run(cluster: LocalCluster, command: str, chart: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One documented command, with this cluster's kubeconfig, release name and a chart folder."""
    words = command.replace("charts/servingtopology", str(chart)).split()
    if words[0] == "helm":
        words = [str(tool("helm")), *words[1:]]
        words[2] = RELEASE
        words[words.index("-n") + 1] = OPERATOR_NAMESPACE
    else:
        words = [str(tool("kubectl")), *words[1:]]
    done = subprocess.run([*words, f"--kubeconfig={cluster.kubeconfig}"], capture_output=True, text=True, timeout=180)
    assert not check or done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done


def _description(cluster: LocalCluster) -> str:
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    return str(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("description", ""))


def test_the_docs_name_the_commands_this_test_runs() -> None:
    text = DOC.read_text()
    for command in (APPLY_CRDS, WAIT_CRD, HELM_UPGRADE):
        assert command in text, command
    assert "docs/upgrading.md" in (REPO_ROOT / "README.md").read_text()


def test_the_documented_crd_upgrade_updates_the_crd_that_helm_upgrade_leaves_alone(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str, tmp_path: Path) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(
        topology("kept", namespace, prometheus_url=cluster.prometheus_url, mode="DryRun")))
    kube.wait_condition(namespace, "kept", "Planned", "True", timeout_s=120, log=operator.log_tail)
    original = _description(cluster)
    newer = tmp_path / "servingtopology"
    shutil.copytree(CHART, newer)
    marker = f"upgraded {uuid.uuid4().hex[:8]}"
    path = newer / "crds" / "servingtopology.yaml"
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = marker
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    try:
        _run(cluster, HELM_UPGRADE, newer)
        assert _description(cluster) == original, "helm upgrade changed the CRD"
        plain = _run(cluster, APPLY_CRDS.replace("--force-conflicts ", ""), newer, check=False)
        assert plain.returncode != 0 and "conflict" in plain.stderr.lower(), plain.stdout + plain.stderr
        _run(cluster, APPLY_CRDS, newer)
        _run(cluster, WAIT_CRD, newer)
        assert _description(cluster) == marker
        assert kube.topology(namespace, "kept")["status"]["proposal"], "the existing ServingTopology lost its status"
    finally:
        _run(cluster, APPLY_CRDS, CHART)
        _run(cluster, HELM_UPGRADE, CHART)
    assert _description(cluster) == original
