"""The source tree as tools see it: one import style, and the repository root usable on sys.path.

`operator/` is mapped to `servingtopology.operator`; a tool or a shell with the repository root on sys.path
(`PYTHONPATH=.`) would otherwise import it as the standard library's `operator` and crash at start.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELATIVE = re.compile(r"^\s*from \.+[\w.]* import ", re.M)


def test_repository_root_on_sys_path_starts_and_imports_the_package() -> None:
    code = (
        "import operator, collections, servingtopology.operator.reconcile as r, servingtopology.planner.search.funnel;"
        "print(operator.add(2, 3), operator.__file__.endswith('operator.py'), r.__name__)"
    )
    for cwd in (ROOT, ROOT.parent):
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=cwd, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["5", "True", "servingtopology.operator.reconcile"]


def test_one_import_style_absolute_from_servingtopology() -> None:
    relative = []
    for top in ("planner", "operator", "servingtopology"):
        for path in (ROOT / top).rglob("*.py"):
            if RELATIVE.search(path.read_text()):
                relative.append(str(path.relative_to(ROOT)))
    assert relative == [], f"relative imports (write `from servingtopology.… import`): {relative}"


def test_every_top_level_operator_module_sits_in_the_rooms_contracts() -> None:
    # import-linter's layers contract only constrains the modules it names: a new module directly under operator/
    # that is not named would escape both the rooms' layering and the rules on where kopf and kubernetes may be imported.
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    rooms = next(c for c in cfg if c["type"] == "layers" and c.get("containers") == ["servingtopology.operator"])
    reconcile_layer = {name.strip() for name in next(layer for layer in rooms["layers"] if "reconcile" in layer.split(" : ")).split(":")}
    rooms_named = {name.strip() for layer in rooms["layers"] for name in layer.replace("|", ":").split(":")} - reconcile_layer
    kept_out = [c for c in cfg if c["type"] == "forbidden" and "servingtopology.operator.api" in c["source_modules"]]
    assert {m for c in kept_out for m in c["forbidden_modules"]} >= {"kopf", "kubernetes", "prometheus_client"}
    for path in sorted((ROOT / "operator").glob("*.py")):
        if path.stem == "__init__":
            continue
        assert path.stem in reconcile_layer, f"operator/{path.name}: name it in the rooms layers contract (pyproject.toml)"
        for contract in kept_out:
            assert f"servingtopology.operator.{path.stem}" in contract["source_modules"], \
                f"operator/{path.name}: add it to the source_modules of {contract['name']!r} (pyproject.toml)"
    for path in (ROOT / "operator").iterdir():
        if path.is_dir() and path.name != "__pycache__":
            assert path.name in rooms_named, f"operator/{path.name}/: a room the contracts do not know"
    assert rooms_named == {"entry", "cluster", "render", "live", "api"}



CYCLES = r"""
import sys
import grimp
sys.path.insert(0, sys.argv[1])
graph = grimp.build_graph("servingtopology", include_external_packages=False, cache_dir=None)
edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
index, low, on, stack, cycles = {}, {}, set(), [], []
def visit(v):  # Tarjan's strongly connected components, iterative enough for ~200 modules
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in sorted(edges[v]):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        part = []
        while True:
            w = stack.pop(); on.discard(w); part.append(w)
            if w == v:
                break
        if len(part) > 1:
            cycles.append(sorted(part))
sys.setrecursionlimit(10_000)
for m in sorted(edges):
    if m not in index:
        visit(m)
print(len(edges), cycles)
"""


def test_no_module_level_import_circle_in_the_whole_package(tmp_path: Path) -> None:
    # import-linter's acyclic contract looks inside each room; this looks across all of them (the operator's top layer
    # and runtime may import each other by contract, so a circle there would pass the contracts). Annotation-only
    # (TYPE_CHECKING) imports count: grimp reads them.
    subprocess.run(["bash", str(ROOT / "tools" / "lint_tree.sh"), str(tmp_path / "tree")], cwd=ROOT, check=True, timeout=60)
    out = subprocess.run([sys.executable, "-c", CYCLES, str(tmp_path / "tree")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    count, cycles = out.stdout.split(" ", 1)
    assert int(count) > 100, out.stdout  # the whole package was read, planner/ and operator/ included
    assert cycles.strip() == "[]", f"import circles: {cycles}"
