"""The operator image's Dockerfile builds the package the Helm chart runs, checked without a container engine:
the Dockerfile is parsed (stages, base, user, entrypoint, what it installs), the chart's command and image tag are
compared with pyproject.toml, and the wheel the build stage makes is built here and opened."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _args() -> dict[str, str]:
    """ARG defaults (global and per stage; names are unique in this Dockerfile)."""
    return dict(a.split("=", 1) for w, a in _instructions() if w == "ARG" and "=" in a)


def _resolve(text: str) -> str:
    args = _args()
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def test_the_image_is_multi_stage_on_a_pinned_base_and_runs_as_non_root() -> None:
    stages = _stages()
    assert len(stages) >= 2, "a build stage and a runtime stage"
    for stage in stages:
        base = _resolve(stage[0][1].split()[0])
        _, _, tag = base.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), f"base {base!r} is not pinned to a release"
    runtime = stages[-1]
    users = [a for w, a in runtime if w == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users  # numeric, so runAsNonRoot can verify it
    chart_values = yaml.safe_load((ROOT / "charts" / "servingtopology" / "values.yaml").read_text())
    assert int(uid) == chart_values["podSecurityContext"]["runAsUser"]
    assert not [a for w, a in runtime if w in ("COPY", "ADD") and "--from" not in a], "the runtime stage copies no sources"


def test_the_runtime_installs_this_distribution_at_the_pyproject_version_and_no_dev_extras() -> None:
    runtime = _stages()[-1]
    runs = " ".join(_resolve(a) for w, a in runtime if w == "RUN")
    assert f"servingtopology=={VERSION}" in runs, runs
    assert "--no-index" in runs and "[dev]" not in runs
    build_runs = " ".join(a for w, a in _stages()[0] if w == "RUN")
    assert "pip wheel" in build_runs and "[dev]" not in build_runs
    copied = {shlex.split(a)[0].rstrip("/") for w, a in _stages()[0] if w == "COPY"} | {
        p for w, a in _stages()[0] if w == "COPY" for p in shlex.split(a)[:-1]}
    for folder in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        assert folder in {c.rstrip("/") for c in copied}, f"the build stage does not copy {folder}/"


def test_the_entrypoint_is_the_console_script_the_chart_runs_at_the_chart_version() -> None:
    entry = [a for w, a in _stages()[-1] if w == "ENTRYPOINT"][-1]
    command = yaml.safe_load(entry)
    assert command[0] in PYPROJECT["project"]["scripts"], command
    deployment = (ROOT / "charts" / "servingtopology" / "templates" / "deployment.yaml").read_text()
    assert f'command: ["{command[0]}"]' in deployment
    chart = yaml.safe_load((ROOT / "charts" / "servingtopology" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "servingtopology" / "values.yaml").read_text())
    assert chart["appVersion"] == VERSION == _args()["VERSION"]
    assert values["image"]["tag"] in ("", VERSION)  # empty: the chart's appVersion
    assert "image.tag | default .Chart.AppVersion" in deployment


def test_the_build_stage_wheel_carries_the_operator_and_its_entry_point(tmp_path: Path) -> None:
    # What `pip wheel .` makes in the build stage (without isolation: no index is needed here).
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--wheel-dir", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob(f"servingtopology-{VERSION}-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        entry_points = whl.read(f"servingtopology-{VERSION}.dist-info/entry_points.txt").decode()
    assert "servingtopology-operator = servingtopology.operator.entry.main:main" in entry_points
    for module in ("servingtopology/operator/entry/main.py", "servingtopology/operator/cluster/capacity.py", "servingtopology/operator/api/crd.py",
                   "servingtopology/operator/render/manifests.py", "servingtopology/operator/live/metrics.py", "servingtopology/operator/reconcile.py",
                   "servingtopology/planner/engines/command.py", "servingtopology/planner/search/decide.py", "servingtopology/planner/data/gpus.toml"):
        assert module in names, module


def test_the_build_context_is_what_the_build_stage_copies_and_build_sh_digests() -> None:
    # .dockerignore leaves everything out and lets in only the build stage's COPY sources (a checkout's caches, .git,
    # tests and virtual environment never reach the builder); tools/image/build.sh keys its cache on those files.
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", "the build context is an allow-list"
    let_in = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = {p.rstrip("/") for w, a in _stages()[0] if w == "COPY" and "--from" not in a for p in shlex.split(a)[:-1]}
    assert let_in == copied, (let_in, copied)
    for name in copied:
        assert (ROOT / name).exists(), name
    build_sh = (ROOT / "tools" / "image" / "build.sh").read_text()
    find_line = next(ln for ln in build_sh.splitlines() if ln.strip().startswith("find Dockerfile"))
    assert copied | {"Dockerfile", ".dockerignore", "tools/image"} <= set(find_line.split()), find_line


def test_a_proxy_ca_reaches_pip_only_as_a_build_secret_of_the_wheel_step() -> None:
    # Behind a proxy that re-signs TLS the build needs its CA bundle; a file copied in or an ENV pointing at one would
    # stay in the image (and a secret in a layer of the build stage would stay in the builder's cache).
    for stage in _stages():
        for word, args in stage:
            assert not (word in ("COPY", "ADD") and re.search(r"\.(crt|pem)\b|ca-certificates", args)), args
            if word in ("ENV", "ARG"):
                assert not re.search(r"PIP_CERT|SSL_CERT|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE", args), args
    secret_runs = [a for stage in _stages() for w, a in stage if w == "RUN" and "type=secret" in a]
    assert len(secret_runs) == 1 and "pip wheel" in secret_runs[0], secret_runs
    assert "id=ca" in secret_runs[0] and "PIP_CERT=/run/secrets/ca" in secret_runs[0]
