#!/usr/bin/env bash
# Builds the guidellm environment that tools/calibration/gen_fixtures.sh runs to write the guidellm report fixture of
# `servingtopology calibrate` (tests/data/calibration/). guidellm from PyPI, in its own venv outside the repository
# (its dependencies, transformers and datasets among them, are not the project's). Idempotent: a stamp keyed on the
# pinned version makes a second run a no-op.
#
#   bash tools/calibration/guidellm_env.sh      # prints the venv's guidellm on its last line
set -euo pipefail

GUIDELLM_VERSION=0.8.1
PY=${PY:-python3}
ROOT=${STOPO_GUIDELLM_ROOT:-$HOME/.cache/servingtopology/guidellm}
VENV=$ROOT/venv
STAMP=$VENV/.stopo-stamp
KEY="guidellm==$GUIDELLM_VERSION python=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x "$VENV/bin/guidellm" ]; then
    echo "guidellm environment up to date ($KEY)"
    echo "$VENV/bin/guidellm"
    exit 0
fi
echo "building the guidellm environment in $VENV ($KEY)"
rm -rf "$VENV"
mkdir -p "$ROOT"
cd "$ROOT"   # out of the repository: its operator/ package would shadow the standard library's `operator`
$PY -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check install --quiet --upgrade pip
"$VENV/bin/python" -m pip --disable-pip-version-check install --quiet "guidellm==$GUIDELLM_VERSION"
echo "$KEY" > "$STAMP"
echo "$VENV/bin/guidellm"
