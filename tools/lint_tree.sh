#!/usr/bin/env bash
# Lay out the installed package `servingtopology` as links under DIR (default build/lint), for the tools that read a
# package from a folder: mypy and import-linter (grimp). pyproject's package-dir maps planner/ to servingtopology.planner
# and operator/ to servingtopology.operator; neither tool follows that mapping (nor the editable install's finder), so
# without this tree they see servingtopology.planner as missing (mypy: Any) and planner/ and operator/ as unconnected.
# Run by `make lint`; the tree holds links only, so an edit in the working tree is seen at once.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build/lint}"
rm -rf "$dir"
mkdir -p "$dir/servingtopology"
for entry in servingtopology/*; do
  case "$entry" in
    */__pycache__) ;;
    *) ln -s "$PWD/$entry" "$dir/servingtopology/" ;;
  esac
done
ln -s "$PWD/planner" "$dir/servingtopology/planner"
ln -s "$PWD/operator" "$dir/servingtopology/operator"
