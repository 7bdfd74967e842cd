"""Fixtures of the operator tests: golden-file comparison (regenerate with UPDATE_GOLDENS=1) and a pinned calibration.

The operator's scenarios (3×TP1 at 40 req/s, a second set at 80 req/s, ...) exercise its mechanics with the real
planner. They were written against one calibration of the performance model, so every test here runs with
that calibration pinned (tests/data/scenario_perf_params.json: planner/data/perf_params.json at commit 491d294); a refit
of the shipped parameters then cannot silently turn a surge scenario into an in-place one (tests/test_replan_loop.py
pins it too). The planner's own tests and the e2e scenarios run with the shipped parameters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servingtopology.planner.perf.step import PerfParams, load_params, pinned_params

GOLDEN_DIR = Path(__file__).parent / "golden"
SCENARIO_PARAMS = load_params(json.loads((Path(__file__).parents[1] / "data" / "scenario_perf_params.json").read_text()))


@pytest.fixture(autouse=True)
def scenario_calibration() -> Iterator[PerfParams]:
    """Run each operator test with the calibration its scenarios were written against."""
    with pinned_params(SCENARIO_PARAMS) as p:
        yield p


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """Compare text with tests/operator/golden/<name>; UPDATE_GOLDENS=1 rewrites the file instead."""

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if os.environ.get("UPDATE_GOLDENS") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"missing golden {path}; run with UPDATE_GOLDENS=1 to create it"
        assert text == path.read_text(), f"{name} drifted from its golden file; if intended, rerun with UPDATE_GOLDENS=1"

    return check
