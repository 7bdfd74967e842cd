"""The source tree as tools see it: one import style, and the repository root usable on sys.path.

`operator/` is mapped to `servingtopology.operator`; a tool or a shell with the repository root on sys.path
(`PYTHONPATH=.`) would otherwise import it as the standard library's `operator` and crash at start.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELATIVE = re.compile(r"^\s*from \.+[\w.]* import ", re.M)


def test_repository_root_on_sys_path_starts_and_imports_the_package() -> None:
    code = (
        "import operator, collections, servingtopology.operator.reconcile as r, servingtopology.planner.funnel;"
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
