"""planner/ stays pure: no I/O libraries, no clock, no environment (an AST check beside import-linter)."""

import ast
from pathlib import Path

PLANNER = Path(__file__).resolve().parents[2] / "planner"
FORBIDDEN_MODULES = {"kubernetes", "kopf", "prometheus_api_client", "asyncio", "socket", "urllib", "http", "requests", "pydantic",
                     "yaml", "time", "datetime", "subprocess", "random"}
FORBIDDEN_CALLS = {("os", "environ"), ("os", "getenv"), ("time", "time"), ("time", "perf_counter"), ("time", "monotonic")}


def _modules():
    return sorted(PLANNER.rglob("*.py"))


def test_planner_imports_nothing_impure():
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
    assert offenders == []


def test_planner_never_reads_the_clock_or_the_environment():
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) in FORBIDDEN_CALLS:
                offenders.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                offenders.append(f"{path.name}:{node.lineno} open()")
    assert offenders == []


def test_operator_is_never_importable_on_its_own():
    import operator

    assert hasattr(operator, "itemgetter")  # the stdlib module, not ours
