"""Decisions that respect the model's error (issue #27): a move only when its gain exceeds the combined uncertainty,
and after a move, whether the measured result hit the predicted interval.

Beside planner.live.drift (which says when to replan and by how much a new plan is better): `gate_move` says whether that
gain is larger than what the before and after predictions' intervals (planner.live.error_bars) can tell apart, and names
the decision `GainWithinError` when it is not; `judge_move` compares the figures measured after a move with the
interval predicted for them (hit or miss, by how much); every miss recorded on a deployment (DeploymentCalibration.misses)
widens its intervals by 1.5× (at most 4×), so the next move needs a larger gain. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servingtopology.planner.layout import Layout
from servingtopology.planner.live.error_bars import Interval, combined_uncertainty, figure_intervals, widened
from servingtopology.planner.perf.deployment_fit import DeploymentCalibration
from servingtopology.planner.problem import Problem

__all__ = ["GAIN_WITHIN_ERROR", "MOVE_HIT", "MOVE_MISS", "GateVerdict", "gate_move", "MoveJudgement", "judge_move", "shown_intervals",
           "widening"]

GAIN_WITHIN_ERROR = "GainWithinError"
MOVE_HIT = "PredictionHit"
MOVE_MISS = "PredictionMissed"


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """`move`: the gain clears the combined uncertainty. `needed`: that uncertainty as a relative gain."""

    move: bool
    gain: float
    needed: float
    before: Interval
    after: Interval
    reason: str
    message: str


def widening(misses: int) -> float:
    """The factor repeated misses put on a deployment's interval half-widths (1.5 per miss, at most 4)."""
    return float(min(1.5 ** max(misses, 0), 4.0))


def shown_intervals(problem: Problem, layout: Layout, *, ttft_ms: float, tpot_ms: float, misses: int,
                    calibration: DeploymentCalibration | None = None) -> dict[str, Interval]:
    """IntervalsShown: a prediction's nominal intervals ("ttft", "tpot"; error_bars.figure_intervals, narrowed by the
    deployment's `calibration` of that layout) widened by `widening(misses)` as the gate widens them: what status, the
    Events and the proposals show, for a live replan's move and a spec edit's plan alike."""
    factor = widening(misses)
    ivs = figure_intervals(problem, layout, ttft_ms=ttft_ms, tpot_ms=tpot_ms, calibration=calibration)
    return {m: widened(iv, factor) for m, iv in ivs.items()}


def gate_move(gain: float, before: Interval, after: Interval, *, misses: int = 0, what: str = "the objective") -> GateVerdict:
    """Whether a predicted relative `gain` (0.25 = 25 % better) of `after` over `before` exceeds the combined
    uncertainty of the two predictions (their log half-widths in quadrature, each widened by the deployment's misses)."""
    w = widening(misses)
    hb, ha = before.half_width_log * w, after.half_width_log * w
    needed = combined_uncertainty(hb, ha) if math.isfinite(hb) and math.isfinite(ha) else 0.0
    both = (f"before {before.text()}, after {after.text()} (nominal 80 % intervals"
            + (f", widened ×{w:.2f} by {misses} missed moves" if misses else "") + ")")
    if gain > needed:
        return GateVerdict(True, gain, needed, before, after, "GainExceedsError",
                           f"{gain:.0%} better on {what}, beyond the combined uncertainty {needed:.0%}: {both}")
    return GateVerdict(False, gain, needed, before, after, GAIN_WITHIN_ERROR,
                       f"{gain:.0%} better on {what} is within the combined uncertainty {needed:.0%} of the predictions: {both}; "
                       "nothing changes")


@dataclass(frozen=True, slots=True)
class MoveJudgement:
    hit: bool
    reason: str
    error: float            # measured / predicted − 1
    message: str


def judge_move(metric: str, measured: float, predicted: Interval) -> MoveJudgement:
    """After a move: the measured figure against the interval predicted for it (a hit lies within it)."""
    if not (math.isfinite(measured) and measured > 0 and math.isfinite(predicted.value) and predicted.value > 0):
        return MoveJudgement(True, MOVE_HIT, 0.0, f"{metric}: nothing measured to judge the move by")
    err = measured / predicted.value - 1.0
    inside = predicted.low <= measured <= predicted.high if math.isfinite(predicted.low) else True
    text = f"{metric} measured {measured:.1f} ms against {predicted.text()} ms predicted ({err:+.0%})"
    return MoveJudgement(inside, MOVE_HIT if inside else MOVE_MISS, err, text + ("" if inside else ": outside the interval, a miss"))
