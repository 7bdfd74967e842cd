"""The operator image as `make image` builds it (tools/image/build.sh: the Dockerfile with podman), run by a real
container runtime the way the chart runs it: as uid 65532 on a read-only root file system with only /tmp writable,
no network. Its console scripts answer (`servingtopology-operator --help` accepts every flag the chart passes,
`servingtopology plan --json` plans an example as the source tree does), and its file system holds the installed
distribution with its licence and nothing of the build: no CA bundle the build was given, no sources, tests or .git,
no wheels, pip or build caches, no compiler. tests/test_image.py checks the Dockerfile itself without a runtime."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .kubetools import REPO_ROOT

# The real node's network namespace, containerd and kubelet, and the project's podman store: one worker runs these
# modules, one after another (e2e/conftest.py).
pytestmark = pytest.mark.xdist_group("real-node")

PODMAN = REPO_ROOT / "tools" / "image" / "podman.sh"
BUILD = REPO_ROOT / "tools" / "image" / "build.sh"
EXAMPLE = "servingtopology.yaml"
# The limits runc may set here (it can lower a limit, never raise one), as build.sh builds with.
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000")
# The chart's securityContext: a non-root numeric user, read-only root, /tmp an emptyDir (a tmpfs here).
AS_THE_CHART_RUNS_IT = ("--user", "65532:65532", "--read-only", "--tmpfs", "/tmp", "--network", "none")


@pytest.fixture(scope="module")
def image() -> str:
    """The image build.sh makes (a no-op when it is built for these sources)."""
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800, cwd=REPO_ROOT)
    assert done.returncode == 0, f"make image failed:\n{done.stderr[-4000:]}"
    return done.stdout.strip().splitlines()[-1]


def _run(image: str, *args: str, entrypoint: str | None = None, volumes: tuple[str, ...] = ()) -> str:
    command = [str(PODMAN), "run", "--rm", *LIMITS, *AS_THE_CHART_RUNS_IT]
    for volume in volumes:
        command += ["--volume", volume]
    if entrypoint:
        command += ["--entrypoint", entrypoint]
    done = subprocess.run([*command, image, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args} in the image: rc {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_operator_entrypoint_accepts_every_flag_the_chart_passes_as_uid_65532_on_a_read_only_root(
        image: str) -> None:
    deployment = (REPO_ROOT / "charts" / "servingtopology" / "templates" / "deployment.yaml").read_text()
    chart_flags = set(re.findall(r"(--[a-z][a-z0-9-]+)=", deployment))
    assert len(chart_flags) >= 10, chart_flags
    usage = _run(image, "--help")  # the image's ENTRYPOINT: servingtopology-operator
    assert "servingtopology-operator" in usage
    missing = sorted(flag for flag in chart_flags if flag not in usage)
    assert not missing, f"the chart passes flags the image's operator does not know: {missing}"
    assert _run(image, "-u", entrypoint="id").strip() == "65532"


def test_the_image_runs_as_its_numeric_non_root_user_without_being_told(image: str) -> None:
    done = subprocess.run([str(PODMAN), "run", "--rm", *LIMITS, "--network", "none", "--entrypoint", "id", image],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"uid=65532\b.*gid=65532\b", done.stdout), done.stdout


def _plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    """What a plan decides, without the funnel's timings."""
    return {"candidates_total": plan["candidates_total"], "best": plan["best"]["label"],
            "layout": plan["best"]["layout_spec"], "reasons": plan["reasons"],
            "funnel": [(s["stage"], s["admitted"], s["rejected"]) for s in plan["funnel"]]}


def test_plan_in_the_image_plans_an_example_as_the_source_tree_does(image: str) -> None:
    out = _run(image, "plan", "--json", f"/examples/{EXAMPLE}", entrypoint="servingtopology",
               volumes=(f"{REPO_ROOT / 'examples'}:/examples:ro",))
    in_image = json.loads(out)
    local = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "servingtopology"), "plan", "--json",
                            str(REPO_ROOT / "examples" / EXAMPLE)], capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr[-3000:]
    assert in_image["candidates_total"] > 0 and in_image["best"]["gpus"] > 0
    assert _plan_summary(in_image) == _plan_summary(json.loads(local.stdout))


@dataclass(frozen=True, slots=True)
class _Entry:
    path: str  # without the leading "/"
    is_file: bool
    content: bytes  # regular files only


def _exported(image: str) -> Iterator[_Entry]:
    """Every entry of the image's file system (podman export of a created container)."""
    created = subprocess.run([str(PODMAN), "create", *LIMITS, image], capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    container = created.stdout.strip().splitlines()[-1]
    try:
        export = subprocess.Popen([str(PODMAN), "export", container], stdout=subprocess.PIPE)
        assert export.stdout is not None
        with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
            for member in tar:
                data = b""
                if member.isfile():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    data = extracted.read()
                yield _Entry(member.name.lstrip("./"), member.isfile(), data)
        assert export.wait(timeout=120) == 0
    finally:
        subprocess.run([str(PODMAN), "rm", "-f", container], capture_output=True, timeout=120)


def _certificates(pem: str) -> set[str]:
    """The base64 bodies of the PEM certificates in a bundle, one string each."""
    return {"".join(body.split()) for body in
            re.findall(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", pem, re.S)}


def test_the_image_holds_the_installed_distribution_and_nothing_of_the_build(image: str) -> None:
    build_ca = Path(os.environ.get("BUILD_CA", "/etc/ssl/certs/ca-certificates.crt"))
    ca_digest = hashlib.sha256(build_ca.read_bytes()).hexdigest() if build_ca.is_file() else None
    # The build's own certificate authorities (a proxy's): in the bundle it was given, not among Debian's.
    shipped = set().union(*(_certificates(p.read_text()) for p in Path("/usr/share/ca-certificates").rglob("*.crt")))
    extra = _certificates(build_ca.read_text()) - shipped if build_ca.is_file() else set()
    # A line of each extra certificate as PEM wraps it (64 characters), and each as DER.
    extra_markers = [body[64:128].encode() for body in extra] + [
        base64.b64decode(body)[:200] for body in extra]
    # The project's files that are not the installed package (tests, harness, tools, docs, build files), by content:
    # a copy anywhere is found, and another package's tests/__init__.py is not mistaken for ours.
    outside_the_package = subprocess.run(
        ["git", "ls-files", "tests", "e2e", "benchmarks", "tools", "docs", ".ci", "examples", "charts", "crds",
         "pyproject.toml", "Makefile", "Dockerfile", ".dockerignore"],
        capture_output=True, text=True, cwd=REPO_ROOT, check=True).stdout.splitlines()
    project_digests = {hashlib.sha256(data).hexdigest(): name for name in outside_the_package
                       if len(data := (REPO_ROOT / name).read_bytes()) >= 200}
    compilers = re.compile(r"^usr/(local/)?bin/(cc|c\+\+|gcc|g\+\+|clang|x86_64-linux-gnu-gcc(-\d+)?|ld|as|make)$")
    build_leftovers = re.compile(r"(^|/)(\.git|\.cache/pip|servingtopology\.egg-info)(/|$)|\.whl$|"
                                 r"^(src|wheels|run/secrets|root/\.cache)(/|$)|^tmp/.")
    # The wheels a base's Python keeps for `python -m venv` (ensurepip's pip and setuptools) are the base's, not the
    # build's: Debian's in usr/share/python-wheels, the upstream build's in ensurepip/_bundled.
    base_wheels = re.compile(r"^usr/share/python-wheels/[^/]+\.whl$|/ensurepip/_bundled/[^/]+\.whl$")

    found: dict[str, list[str]] = {"compiler": [], "build leftover": [], "project source or test": [],
                                   "build CA": []}
    paths = set()
    for entry in _exported(image):
        paths.add(entry.path)
        if compilers.match(entry.path):
            found["compiler"].append(entry.path)
        if build_leftovers.search(entry.path) and not base_wheels.search(entry.path):
            found["build leftover"].append(entry.path)
        digest = hashlib.sha256(entry.content).hexdigest() if entry.is_file else ""
        if digest in project_digests:
            found["project source or test"].append(f"{entry.path} (= {project_digests[digest]})")
        if entry.is_file and (digest == ca_digest or any(m in entry.content for m in extra_markers)):
            found["build CA"].append(entry.path)
    assert not any(found.values()), {k: v[:20] for k, v in found.items() if v}

    # Wherever the base's Python installs (/usr/local in python:3.11-slim, /opt/venv in the Debian-built base).
    (site,) = {p.removesuffix("/servingtopology/operator/entry/main.py") for p in paths
               if p.endswith("/site-packages/servingtopology/operator/entry/main.py")}
    bin_dir = site.split("/lib/python3")[0] + "/bin"
    for needed in (f"{bin_dir}/servingtopology-operator", f"{bin_dir}/servingtopology",
                   f"{site}/servingtopology/planner/data/gpus.toml",
                   f"{site}/servingtopology-{_version()}.dist-info/licenses/LICENSE"):
        assert needed in paths, f"{needed} is not in the image"


def _version() -> str:
    match = re.search(r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    assert match
    return match.group(1)
