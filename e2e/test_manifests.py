"""`servingtopology plan --manifests DIR` (issue 29): the objects the operator would apply, written by the CLI from the
operator's own planner and builders, are accepted by the real API server (`kubectl apply --dry-run=server`), and are
the objects the operator applies for the same resource (names, replicas, engine commands); and the ServingTopology
the chart's NOTES show is one the API server admits.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .kubetools import REPO_ROOT, tool
from .processes import wait_until
from .stack import Operator

CLI = str(Path(sys.executable).with_name("servingtopology"))


def _in_namespace(example: str, namespace: str, folder: Path) -> tuple[Path, dict[str, Any]]:
    (obj,) = [d for d in yaml.safe_load_all((REPO_ROOT / "examples" / example).read_text()) if d]
    obj["metadata"]["namespace"] = namespace
    obj["spec"].pop("metrics", None)   # planned from spec.workload alone, as the CLI plans it
    path = folder / example
    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path, obj


def _workload_fields(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree between the CLI's file and the operator's applied object."""
    spec = obj.get("spec") or {}
    containers = (((spec.get("template") or {}).get("spec") or {}).get("containers")) or []
    return (obj["kind"], obj["metadata"]["name"], spec.get("replicas"),
            [(c["name"], c.get("command"), c.get("args")) for c in containers])


@pytest.mark.parametrize("example", ["vllm-replicas.yaml", "vllm-pinned-pd.yaml"])
def test_plan_manifests_are_accepted_by_the_api_server_and_are_what_the_operator_applies(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str, tmp_path: Path, example: str) -> None:
    path, obj = _in_namespace(example, namespace, tmp_path)
    out = tmp_path / "manifests"
    done = subprocess.run([CLI, "plan", str(path), "--manifests", str(out), "--no-progress"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(out.glob("*.yaml"))
    written = [yaml.safe_load(f.read_text()) for f in files]
    assert written and all(o["metadata"]["namespace"] == namespace and "ownerReferences" not in o["metadata"] for o in written)
    kinds = {o["kind"] for o in written}
    assert "Deployment" in kinds and "Service" in kinds, kinds
    # The real API server validates every object (schemas, defaults, admission) without storing any.
    dry = cluster.kubectl("apply", "--dry-run=server", "-f", str(out), check=False)
    assert dry.returncode == 0, dry.stderr
    accepted = re.findall(r"^(\S+) created \(server dry run\)$", dry.stdout, re.M)
    assert len(accepted) == len(files), dry.stdout
    assert not kube.items("deployments", namespace)   # a dry run stores nothing

    # The operator, given the same resource, applies the same objects.
    cluster.kubectl("apply", "-f", str(path))
    name = obj["metadata"]["name"]

    def applied() -> list[dict[str, Any]]:
        found = []
        for kind in sorted({o["kind"] for o in written}):
            found += [{**o, "kind": kind} for o in kube.items(kind.lower() + "s", namespace, selector=f"app.kubernetes.io/instance={name}")]
        return found

    wait_until(lambda: len(applied()) >= len(written), timeout_s=180, what="the operator's objects", on_timeout=operator.log_tail)
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in applied()}
    for o in written:
        mine = by_name.get((o["kind"], o["metadata"]["name"]))
        assert mine is not None, (o["kind"], o["metadata"]["name"], sorted(by_name))
        assert _workload_fields(mine) == _workload_fields(o)
        assert mine["metadata"]["ownerReferences"][0]["name"] == name
    print(f"\nplan --manifests {example}: {len(files)} objects ({', '.join(f.name for f in files)}), all accepted by "
          "kube-apiserver --dry-run=server and equal to what the operator applied")


def test_the_resource_the_chart_notes_show_is_admitted(cluster: LocalCluster, operator: Operator, namespace: str) -> None:
    done = subprocess.run([str(tool("helm")), "install", "stopo", str(REPO_ROOT / "charts" / "servingtopology"), "--dry-run=client",
                           "--namespace", "stopo-system"], capture_output=True, text=True, timeout=120, check=True)
    notes = done.stdout.split("NOTES:", 1)[1]
    text = re.search(r"<<'YAML'\n(.*?)\n\s*YAML", notes, re.S).group(1)  # type: ignore[union-attr]
    example = yaml.safe_load(text)
    example["metadata"]["namespace"] = namespace
    dry = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(example), check=False)
    assert dry.returncode == 0 and "created (server dry run)" in dry.stdout, dry.stderr
