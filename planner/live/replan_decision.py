"""The replan decision: once drift asked for a replan and `decide` answered, whether the running layout should move,
and how: keep it, propose the new one, or start a transition to it that holds the serving floor.

Beside drift.py (which says when to replan) and transition.py (which moves one step at a time). Called by the
replan loop (planner/live/loop.py `step`), which turns the returned ReplanChoice into the memory and the effects the
operator words (operator/replan.py `replan`). Pure: time is an argument, predictions come from the `predict` given.

Rules it names:
- PreferInPlace: a new layout of the running kind and per-role parallelism keeps the running engine knobs when that
  still meets the SLO, so replica counts change in place without restarting an engine (`prefer_in_place`).
- WorthSwitching: the move must beat the running layout by `min_improvement` (drift.py `worth_switching`).
- GainWithinError (spec.policy.gainWithinError): a move made for its gain must also clear the combined uncertainty of
  the before and after predictions (error_gate.py `gate_move`, over error_bars.py's TPOT intervals), else it is kept.
- ServingFloor: a transition starts only if every step keeps min(observed load, running capacity) served within
  the GPU budget and surge (transition.py `start_transition`); otherwise the move is Blocked.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.layout import Layout, LayoutKind
from servingtopology.planner.live import error_bars
from servingtopology.planner.live.drift import improvement, worth_switching
from servingtopology.planner.live.error_bars import Interval
from servingtopology.planner.live.error_gate import GateVerdict, gate_move
from servingtopology.planner.live.transition import Budget, Capacity, TransitionState, in_place, layout_to_state, start_transition
from servingtopology.planner.perf.deployment_fit import DeploymentCalibration, problem_factors
from servingtopology.planner.perf.predict import slo_capacity_rps
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.planner.search.pd_ratio import rescale_pd

__all__ = ["Predictor", "CalibrationOf", "Move", "ReplanChoice", "capacity_of", "prefer_in_place", "error_gate", "choose_move"]

Predictor = Callable[[Problem, Layout], Candidate]


class Move(enum.StrEnum):
    """What a replan does with the layout `decide` chose."""

    KEEP = "Keep"              # not worth switching: the running layout stays
    WITHIN_ERROR = "GainWithinError"  # worth it by the figures, but the gain is within their uncertainty: kept
    PROPOSE = "Propose"        # worth it, shown only (DryRun, or nothing runs yet)
    BLOCKED = "Blocked"        # worth it, but no transition holds the serving floor within the budget
    TRANSITION = "Transition"  # worth it: a transition starts


@dataclass(frozen=True, slots=True)
class ReplanChoice:
    """The replan's effect for the operator to execute. `before` is the running layout predicted at the load `after`
    was chosen for (`load_rps`, SameLoadFigures); `why` is worth_switching's reason (with the error gate's when it
    cleared it), for WITHIN_ERROR the gate's, for BLOCKED the closest miss."""

    move: Move
    after: Candidate
    before: Candidate | None
    why: str
    load_rps: float
    transition: TransitionState | None = None   # TRANSITION: the declared transition
    floor_rps: float | None = None              # TRANSITION: the serving floor it holds at every step
    gate: GateVerdict | None = None             # the error gate's verdict, when it judged the move


def capacity_of(problem: Problem) -> Capacity:
    """The transition planner's capacity function: each layout's SLO capacity at the problem's workload, with its factors
    (memoised per call site)."""
    cache: dict[str, float] = {}

    def capacity(layout: Layout) -> float:
        key = json.dumps(layout_to_state(layout), sort_keys=True)
        if key not in cache:
            with problem_factors(problem.factors):
                cache[key] = float(slo_capacity_rps(problem, [layout])[0])
        return cache[key]

    return capacity


def prefer_in_place(problem: Problem, current: Layout | None, best: Candidate, predict: Predictor) -> Candidate:
    """PreferInPlace: when `best` has the running kind and per-role parallelism but other engine knobs, keep the running
    knobs if that still meets the SLO: replica counts then change in place, without restarting a single engine."""
    if current is None or best.layout.kind is not current.kind or best.layout.roles.keys() != current.roles.keys():
        return best
    if any(best.layout.roles[r].parallelism != current.roles[r].parallelism for r in current.roles) or in_place(current, best.layout):
        return best
    roles = {r: replace(rl, knobs=current.roles[r].knobs) for r, rl in best.layout.roles.items()}
    candidate = Layout(best.layout.kind, roles, current.precision)
    if candidate.kind is LayoutKind.PD:  # the running roles at the counts the P:D decision picks for this load
        rescaled, ratio = rescale_pd(problem, candidate)
        candidate = rescaled if ratio.meets_slo else candidate
    kept = predict(problem, candidate)
    return replace(kept, why="the running engine arguments, scaled in place") if kept.prediction.meets_slo else best


CalibrationOf = Callable[[Layout], DeploymentCalibration | None]


def error_gate(problem: Problem, before: Candidate | None, after: Candidate, *, misses: int,
               calibration: CalibrationOf | None = None) -> GateVerdict | None:
    """GainWithinError: whether a move made for its gain clears the combined uncertainty of the before and after
    predictions (error_gate.py; TPOT intervals of error_bars.py: the step time that sets both the capacity and the
    latency of a layout), narrowed by the deployment's own calibration of that layout (`calibration`, when it has one),
    widened for each recorded miss.
    None: no gate (nothing runs, or the running layout misses the SLO and the move is needed whatever its gain)."""
    if before is None or not before.prediction.meets_slo:
        return None
    gain = improvement(before, after, objective=problem.objective)

    def iv(c: Candidate) -> Interval:
        return error_bars.figure_intervals(problem, c.layout, ttft_ms=c.prediction.ttft_ms, tpot_ms=c.prediction.tpot_ms,
                                           calibration=calibration(c.layout) if calibration is not None else None)["tpot"]
    return gate_move(gain, iv(before), iv(after), misses=misses, what=problem.objective.value)


def choose_move(observed: Problem, current: Layout | None, decision: Decision, *, predict: Predictor, min_improvement: float,
                propose_only: bool, surge_gpus: int, ready_timeout_s: float, drain_s: float, now_s: float,
                gain_within_error: bool = False, error_misses: int = 0, calibration: CalibrationOf | None = None) -> ReplanChoice:
    """The move for `decision` (made for `observed`: the spec's problem at the observed workload, calibrated).

    `propose_only` (DryRun) never starts a transition; neither does a replan with nothing running.
    `gain_within_error` (spec.policy.gainWithinError) gates a worthwhile move on its uncertainty (`error_gate`), the
    intervals widened for `error_misses` recorded misses and narrowed by the deployment's own calibration of each layout
    (`calibration`: a layout's, or None). The
    observed problem's factors (its calibration) apply to every prediction made here, the capacities included."""
    with problem_factors(observed.factors):
        return _choose_move(observed, current, decision, predict=predict, min_improvement=min_improvement, propose_only=propose_only,
                            surge_gpus=surge_gpus, ready_timeout_s=ready_timeout_s, drain_s=drain_s, now_s=now_s,
                            gain_within_error=gain_within_error, error_misses=error_misses, calibration=calibration)


def _choose_move(observed: Problem, current: Layout | None, decision: Decision, *, predict: Predictor, min_improvement: float,
                 propose_only: bool, surge_gpus: int, ready_timeout_s: float, drain_s: float, now_s: float,
                 gain_within_error: bool, error_misses: int, calibration: CalibrationOf | None) -> ReplanChoice:
    before = decision.current or (predict(observed, current) if current is not None else None)
    load_rps = observed.workload.arrival_rate_rps or 0.0
    after = prefer_in_place(observed, current, decision.best, predict)
    switch, why = worth_switching(before, after, objective=observed.objective, min_improvement=min_improvement,
                                  engine=observed.engine)
    gate = error_gate(observed, before, after, misses=error_misses, calibration=calibration) if switch and gain_within_error else None
    if gate is not None and not gate.move:
        return ReplanChoice(Move.WITHIN_ERROR, after, before, gate.message, load_rps, gate=gate)
    if gate is not None:
        why = f"{why}; {gate.message}"
    if not switch:
        return ReplanChoice(Move.KEEP, after, before, why, load_rps)
    if propose_only or current is None:
        return ReplanChoice(Move.PROPOSE, after, before, why, load_rps, gate=gate)
    capacity = capacity_of(observed)
    budget = Budget(max_gpus=observed.max_gpus, surge_gpus=surge_gpus, floor_rps=min(load_rps, capacity(current)),
                    ready_timeout_s=ready_timeout_s, drain_s=drain_s)
    try:
        state = start_transition(current, after.layout, budget=budget, capacity=capacity, now_s=now_s, engine=observed.engine)
    except Infeasible as exc:
        return ReplanChoice(Move.BLOCKED, after, before, exc.closest_miss, load_rps, gate=gate)
    return ReplanChoice(Move.TRANSITION, after, before, why, load_rps, transition=state, floor_rps=budget.floor_rps, gate=gate)
