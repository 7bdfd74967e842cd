"""The planner's exception tree; every error the planner raises on purpose is one of these.

    PlannerError
     ├── InvalidSpec        the input names something unknown or impossible (permanent)
     ├── Infeasible         the input is valid but no layout meets it (says which stage, closest miss)
     │    └── PinRefused    the pinned layout fails a check the search applies (names the stage, the field and the figures)
     └── InsufficientData   observations too thin to act on (retry later)

The CLI maps InvalidSpec to exit code 2; the operator maps it to Ready=False, reason=InvalidSpec.
Infeasible carries an `InfeasibleAdvice` (its values are here, the lowest module; planner.search.advice computes them).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from servingtopology.planner.figure_text import gpus_text, ms_text, rps_text  # formatting only: imports nothing of the planner
from servingtopology.planner.slo import SLO_MARGIN as SLO_MARGIN_ADVICE  # slo imports only the workload values: no cycle

__all__ = ["did_you_mean", "PlannerError", "InvalidSpec", "Infeasible", "PinRefused", "InsufficientData", "InfeasibleAdvice", "ClosestLayout"]


def did_you_mean(word: str, allowed: Iterable[str]) -> str:
    """` (did you mean 'x'?)` naming the allowed word closest to `word` (difflib, case-insensitive), or '' when none
    is close: an unknown id or field is most often a typo of a known one (DidYouMean)."""
    by_lower = {a.lower(): a for a in allowed}
    hit = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[hit[0]]!r}?)" if hit else ""


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class InvalidSpec(PlannerError):
    """A field names something unknown or impossible; `field` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Infeasible(PlannerError):
    """No candidate survived; `stage` removed the last ones, `closest_miss` says by how much, `advice` (planner.search.advice)
    what would make it feasible; the message carries all three, so a condition built from str(error) does too."""

    def __init__(self, stage: str, closest_miss: str, *, funnel: tuple[object, ...] = (), advice: InfeasibleAdvice | None = None) -> None:
        message = f"no feasible layout: the last candidates were removed by stage '{stage}'; closest miss: {closest_miss}"
        if advice is not None:
            message += "; to make it feasible: " + "; ".join(advice.lines())
        super().__init__(message)
        self.stage = stage
        self.closest_miss = closest_miss
        self.funnel = funnel  # the FunnelStage rows, so a caller can still print the table
        self.advice = advice


class PinRefused(Infeasible):
    """A pinned layout the search would have removed at `stage` (a role's rank pool shorter than what it must hold):
    valid input that cannot run, so the CLI exits 1 and the operator applies nothing. `field` names the role."""

    def __init__(self, stage: str, field: str, message: str) -> None:
        super().__init__(stage, f"{field}: {message}")
        self.args = (f"the pinned layout cannot run (the search's stage '{stage}' refuses it): {field}: {message}",)
        self.field = field
        self.message = message


class InsufficientData(PlannerError):
    """Observations are too few or too noisy to estimate a workload from."""


@dataclass(frozen=True, slots=True)
class ClosestLayout:
    """The candidate nearest to passing, with its predicted figures at the problem's load (ms, req/s)."""

    label: str
    gpus: int
    ttft_ms: float
    tpot_ms: float
    capacity_rps: float        # the load at which it saturates (queueing grows without bound beyond)


@dataclass(frozen=True, slots=True)
class InfeasibleAdvice:
    """What would make the problem feasible; None where that lever alone does not (or was not searched)."""

    load_rps: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    ttft_percentile: float
    tpot_percentile: float
    budget_gpus: int
    gpu: str
    closest: ClosestLayout | None    # the nearest miss that carries the load, else the nearest (saturated)
    min_gpus: int | None             # the smallest budget of this GPU with a feasible layout
    searched_gpus: int               # the largest budget the GPU search tried
    min_gpus_layout: str | None      # the best layout the funnel admits at min_gpus (its analytical proxy)
    feasible_load_rps: float | None  # the largest load the nearest layouts carry within the SLOs
    feasible_load_layout: str | None
    needed_ttft_ms: float | None     # the SLOs the closest layout meets at this load (with the funnel's margin)
    needed_tpot_ms: float | None
    floors: tuple[str, ...] = ()     # each SLO under its physical floor on this GPU kind (planner.search.limits.floor_lines)

    def lines(self) -> tuple[str, ...]:
        """The advice as sentences, most direct first: an SLO under its physical floor before anything else."""
        out = [f"no layout of {self.gpu} can meet it: {line}" for line in self.floors]
        if self.min_gpus is not None:
            out.append(f"needs ≥ {gpus_text(self.min_gpus)} of this kind ({self.gpu}; budget {self.budget_gpus}): "
                       f"{self.min_gpus_layout} is feasible at {self.min_gpus}")
        else:
            out.append(f"more {self.gpu} GPUs alone do not help: no layout up to {gpus_text(self.searched_gpus)} is feasible")
        c = self.closest
        if c is not None:
            if self.needed_ttft_ms is not None and self.needed_tpot_ms is not None:
                # The SLOs to set, each from the closest layout's own predicted figure (the one the closest miss states)
                # times the planning margin, and only for the SLOs it misses.
                loosen = [f"p{pct:g} {name} ≤ {ms_text(need)} ms (its {ms_text(need / SLO_MARGIN_ADVICE)} ms with the "
                          f"{SLO_MARGIN_ADVICE - 1:.0%} planning margin; now {slo:g})"
                          for name, pct, need, slo in (("TTFT", self.ttft_percentile, self.needed_ttft_ms, self.slo_ttft_ms),
                                                       ("TPOT", self.tpot_percentile, self.needed_tpot_ms, self.slo_tpot_ms))
                          if need > slo]
                if loosen:
                    out.append(f"the closest layout ({c.label}, {gpus_text(c.gpus)}) passes at {self.load_rps:g} req/s with "
                               + " and ".join(loosen))
            else:
                out.append(f"the closest layout ({c.label}, {gpus_text(c.gpus)}) saturates at {rps_text(c.capacity_rps)} req/s, below the load of "
                           f"{self.load_rps:g} req/s, so no SLO is met at this load")
        if self.feasible_load_rps is not None and self.feasible_load_rps > 0:
            out.append(f"feasible at ≤ {self.feasible_load_rps:.3g} req/s ({self.feasible_load_layout} meets both SLOs up to that load)")
        elif c is not None:
            out.append("no lighter load helps: the nearest layouts miss the SLOs even when idle")
        return tuple(out)
