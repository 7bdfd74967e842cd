"""Progress of the CLI's long stages on a terminal: the funnel's stages, stage 6's simulations in `plan`, the points
of `sweep`, the requests of one `simulate` run. Called by those commands; a bar is drawn on stderr only when it is a terminal and never with --json or
--no-progress (QuietOffTerminal), so pipes, files and JSON readers see nothing of it. Owns no planning logic.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from servingtopology.planner.layout import Layout
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import SimFigures, Simulate

__all__ = ["wanted", "StageBar"]


def wanted(args: argparse.Namespace) -> bool:
    """Whether to draw progress: stderr is a terminal, and neither --json nor --no-progress was given."""
    return not getattr(args, "json", False) and not getattr(args, "no_progress", False) and sys.stderr.isatty()


class StageBar:
    """One tqdm bar on stderr that moves through named stages: `stage(name, total)` starts one, `step(note)` counts one
    unit of it; a disabled bar does nothing."""

    def __init__(self, *, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=0, file=sys.stderr, leave=False, dynamic_ncols=True)
        self._name = ""

    def stage(self, name: str, total: int | None, *, unit: str) -> None:
        """Start stage `name` of `total` units (None: a count without an end)."""
        if self._bar is None or name == self._name:
            return
        self._name = name
        self._bar.reset(total=total)
        self._bar.unit = unit
        self._bar.set_description(name)

    def at(self, done: int, note: str = "") -> None:
        """Show `done` units of the stage done."""
        if self._bar is None:
            return
        self._bar.n = done
        self._bar.set_postfix_str(note, refresh=False)
        self._bar.refresh()

    def step(self, note: str = "") -> None:
        """Count one unit of the stage, with a note (what is being worked on)."""
        if self._bar is not None:
            self.at(self._bar.n + 1, note)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def requests(self, name: str, total: int, *, note: str = "") -> Callable[[int], None] | None:
        """A simulator's progress callback (planner.sim `simulate(progress=)`) showing stage `name` as requests finished of
        `total`; None on a disabled bar, so the simulator does not even count."""
        if self._bar is None:
            return None
        # Drawn at once, at 0: the simulator first reports after 1 % of the requests finish, which for long prompts on a
        # queueing layout is minutes into the run.
        self.stage(name, total, unit="request")
        self.at(0, note)

        def finished(done: int) -> None:
            self.stage(name, total, unit="request")
            self.at(done, note)
        return finished

    def simulating(self, simulate: Simulate, *, name: str = "stage 6 simulation") -> Simulate:
        """`simulate` counting each candidate it simulates on this bar (stage 6 of `plan`: up to search.topK of them)."""
        def run(problem: Problem, layout: Layout) -> SimFigures:
            self.stage(name, problem.search.top_k, unit="layout")
            self.at(self._bar.n if self._bar is not None else 0, layout.label_for(problem.engine))
            figures = simulate(problem, layout)
            self.step(layout.label_for(problem.engine))
            return figures
        return run
