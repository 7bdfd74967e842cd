"""The replan loop as one pure function: one call per replan interval (`step`) takes the memory of earlier intervals,
the interval's metric sample (or why there is none), the time and the spec's problem, and returns the new memory with
the interval's typed effects (planner/live/effects.py) and the figures it read and predicted.

Called by the operator (operator/replan.py `replan`), which fetches the sample before, turns the effects into
conditions, Events and status after, and keeps the memory in status.replan. Must not: read metrics, a cluster or the
clock, word an Event, or start a transition's first step (operator/replan.py `transition_step` takes the steps).

The ladder, in this order, each rung able to end the interval:
1. the sample: none (MetricsGrace: AwaitingMetrics; else MetricsMissing, once per outage) or one more in the window;
2. observe the window (TooLittleData below observe's minimums);
3. calibrate on a steady interval (SteadyPoints: CalibrationChanged) and judge a gated move's result (MoveJudged);
4. held: Pinned, a transition in progress, or the caller's observe-only reason (Held);
5. drift (DriftAssessed); nothing more unless it asks for a replan;
6. the load to plan for (`load_to_plan`, OnsetExcluded), then `plan` (ReplanInfeasible);
7. the move (planner/live/replan_decision.py `choose_move`): GainWithinError, PlanKept, Proposed, TransitionBlocked or
   TransitionStarted, the shown intervals beside (IntervalsShown).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from servingtopology.planner.errors import Infeasible, InsufficientData
from servingtopology.planner.layout import Layout
from servingtopology.planner.live.calibration import (
    LivePoint,
    PointPredictor,
    add_point,
    analytic_point,
    as_deployment_calibration,
    combined,
    refit,
)
from servingtopology.planner.live.drift import assess_drift, rebaseline, workload_shift
from servingtopology.planner.live.effects import (
    AwaitingMetrics,
    CalibrationChanged,
    DriftAssessed,
    Effect,
    GainWithinError,
    Held,
    MetricsFlowing,
    MetricsMissing,
    MoveJudged,
    PlanKept,
    Proposed,
    ReplanInfeasible,
    TooLittleData,
    TransitionBlocked,
    TransitionStarted,
    Verdict,
    verdict_of,
)
from servingtopology.planner.live.error_bars import Interval
from servingtopology.planner.live.error_gate import judge_move, shown_intervals
from servingtopology.planner.live.memory import LoopMemory
from servingtopology.planner.live.observe import MIN_SAMPLES, MetricSample, Observation, observe, observe_slo
from servingtopology.planner.live.policy import Mode, ReplanPolicy
from servingtopology.planner.live.replan_decision import CalibrationOf, Move, Predictor, choose_move
from servingtopology.planner.perf.deployment_fit import DeploymentCalibration
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.planner.search.decide import predict_layout
from servingtopology.planner.workload import Workload

__all__ = ["Plan", "NoSample", "LoopStep", "step", "load_to_plan", "intervals_shown"]

Plan = Callable[[Problem], Decision]
M = TypeVar("M", bound=LoopMemory)


@dataclass(frozen=True, slots=True)
class NoSample:
    """Why an interval has no sample: the failed read or empty answer (`why`), the failure's name (`reason`), and, while
    metrics cannot exist yet (the caller's MetricsGrace), why that is not news (`grace`)."""

    why: str
    reason: str = "MetricsUnavailable"
    grace: str | None = None


@dataclass(frozen=True, slots=True)
class LoopStep(Generic[M]):
    """One interval's result: the new memory, the effects in ladder order, and the figures behind them.

    `running_by_spec` is the running layout at the observed workload as the spec's model predicts it (the spec's factors,
    none of the live fit's: status.observed's error); `before` the running layout with the live fit, once a decision is
    made at the load `after` was chosen for (`load_rps`, SameLoadFigures); `intervals` the nominal intervals of `before`'s
    and `after`'s TTFT and TPOT ("before"/"after" → "ttft"/"tpot")."""

    memory: M
    effects: tuple[Effect, ...]
    observation: Observation | None = None
    running_by_spec: Candidate | None = None
    before: Candidate | None = None
    decision: Decision | None = None
    after: Candidate | None = None
    load_rps: float | None = None
    intervals: Mapping[str, Mapping[str, Interval]] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.effects)


def load_to_plan(window: tuple[MetricSample, ...], *, persist_intervals: int, observation: Observation) -> Workload:
    """The workload a replan plans for: that of the intervals that made the trigger persist, less the first (OnsetExcluded).

    The whole window mixes in the old traffic. The first interval of the streak is, by construction, the one the change
    began in (the interval before it was calm or not counted), so it holds part old traffic and part new: a step from
    idle to 25 req/s, read with it, was planned for as 23.5 req/s (an e2e run on the emulator). The streak's later
    intervals are the new traffic's own. With fewer than two of them (persist_intervals ≤ 2) or too little data in
    them, the whole streak's workload; with too little there, the whole window's (`observation`'s)."""
    n = persist_intervals
    for recent in ((window[-(n - 1):],) if n >= 3 else ()) + (window[-n:],):
        try:
            return observe(recent, min_samples=len(recent)).workload.workload
        except InsufficientData:
            continue
    return observation.workload.workload


def intervals_shown(problem: Problem, before: Candidate | None, after: Candidate, *, calibration: CalibrationOf,
                    misses: int) -> dict[str, dict[str, Interval]]:
    """IntervalsShown for the before and after predictions of a replan (planner/live/error_gate.py `shown_intervals`,
    narrowed by the deployment's own calibration of the layouts it measured)."""
    def of(c: Candidate) -> dict[str, Interval]:
        return shown_intervals(problem, c.layout, ttft_ms=c.prediction.ttft_ms, tpot_ms=c.prediction.tpot_ms, misses=misses,
                               calibration=calibration(c.layout))
    return {"after": of(after), **({"before": of(before)} if before is not None else {})}


def _moved_layout_tpot(mem: M, window: tuple[MetricSample, ...], now_s: float) -> tuple[M, float | None]:
    """JudgedOnTheMovedLayout: the TPOT a gated move is judged by, measured only in intervals that began after the moved
    layout ran settled (no transition), never averaged with the intervals before the move (an in-place 6→3 scale-down
    judged on a window holding the 6 replicas' intervals read 27.9 ms where the 3 replicas measured over 33 ms: an e2e
    run). The first call with the layout settled stamps `settledAtS`; the judgement waits for MIN_SAMPLES intervals after it
    (None until then)."""
    assert mem.move is not None
    if mem.transitioning:
        return mem, None
    settled = mem.move.get("settledAtS")
    if settled is None:
        return replace(mem, move={**mem.move, "settledAtS": now_s}), None
    after = [s for s in window if s.at_s - s.interval_s >= float(settled) - 1e-6]
    if len(after) < MIN_SAMPLES:
        return mem, None
    try:
        return mem, observe_slo(after).tpot_ms
    except InsufficientData:
        return mem, None


def _judge_move(mem: M, measured_tpot_ms: float) -> tuple[M, MoveJudged]:
    """A gated move's TPOT measured on the settled moved layout (`_moved_layout_tpot`) against the interval predicted for it (hit or miss,
    by how much; planner/live/error_gate.py `judge_move`). A miss is counted: it widens the intervals of the next move's bar."""
    assert mem.move is not None
    t = mem.move["tpotMs"]
    j = judge_move("TPOT", measured_tpot_ms, Interval(t["value"], t["low"], t["high"], 0.0, "move", 0))
    move = {**mem.move, "measuredTpotMs": round(measured_tpot_ms, 3), "errorPercent": round(j.error * 100.0, 1), "hit": j.hit}
    misses = mem.misses + (0 if j.hit else 1)
    return replace(mem, move=move, misses=misses), MoveJudged(str(mem.move["layout"]), j, misses)


def step(memory: M, sample: MetricSample | NoSample, *, now_s: float, problem: Problem, current: Layout | None,
         policy: ReplanPolicy, plan: Plan, predict: Predictor = predict_layout, calibrate: PointPredictor | None = analytic_point,
         observe_only: str | None = None) -> LoopStep[M]:
    """One replan interval: the ladder of the module's docstring over `memory` and `sample`.

    `problem` is the spec's (its workload is what the first plan assumed); `current` the running layout (None: nothing
    runs, so nothing is calibrated and a move is only proposed); `plan` is `decide` or the caller's stand-in for it;
    `calibrate` predicts a calibration point (None: no live calibration); `observe_only` (why) reads and records the
    figures and decides nothing, as under Pinned or during a transition. Raises only what `plan` raises besides
    Infeasible (InvalidSpec and the like: the caller's)."""
    if isinstance(sample, NoSample):
        if sample.grace is not None:
            return LoopStep(replace(memory, last_fetch_s=now_s), (AwaitingMetrics(sample.why, sample.grace),))
        gone = MetricsMissing(sample.why, sample.reason, first=memory.metrics_available is not False)
        return LoopStep(replace(memory, metrics_available=False, last_fetch_s=now_s), (gone,))
    effects: list[Effect] = [MetricsFlowing(back=memory.metrics_available is False)]
    window = (*memory.samples, sample)[-policy.window_intervals:]
    mem = replace(memory, samples=window, metrics_available=True, last_fetch_s=now_s)
    try:
        obs = observe(window)
    except InsufficientData as exc:
        return LoopStep(mem, (*effects, TooLittleData(str(exc))))
    # `raw`: the running layout as the spec's model predicts it (its own factors only, none of the live fit's).
    observed = replace(problem, workload=obs.workload.workload, current=current)
    raw = predict(observed, current) if current is not None else None
    cal = mem.calibration
    # SteadyPoints: calibrate only in steady state: an overloaded, queueing or shifting deployment says nothing about the
    # model's error (its latencies are the queue's). Steady: no transition, no drift streak, confident figures, the load
    # under the running layout's capacity and the measured latencies within the SLO.
    steady = (raw is not None and not mem.transitioning and mem.drift.streak == 0 and obs.workload.confidence >= policy.drift.min_confidence
              and (obs.workload.workload.arrival_rate_rps or 0.0) < raw.prediction.capacity_rps)
    within_slo = (obs.slo.ttft_ms is not None and obs.slo.tpot_ms is not None and obs.slo.ttft_ms <= problem.slo.ttft_ms
                  and obs.slo.tpot_ms <= problem.slo.tpot_ms)
    if current is not None and steady and within_slo and calibrate is not None and obs.slo.ttft_ms is not None and obs.slo.tpot_ms is not None:
        point = LivePoint(now_s, current, obs.workload.workload, obs.slo.ttft_ms, obs.slo.tpot_ms)
        cal = refit(add_point(cal, point), problem, now_s=now_s, predict=calibrate)
        effects.append(CalibrationChanged(point, cal))
    mem = replace(mem, calibration=cal)
    if mem.move is not None and mem.move.get("hit") is None and current is not None and mem.move.get("layout") == current.label_for(problem.engine):
        mem, measured = _moved_layout_tpot(mem, window, now_s)
        if steady and measured is not None:
            mem, judged = _judge_move(mem, measured)
            effects.append(judged)
    observed = replace(observed, factors=combined(problem.factors, cal.factors))   # StartsFromSpec (planner/live/calibration.py)
    before = predict(observed, current) if current is not None else None

    def done(m: M, *last: Effect) -> LoopStep[M]:
        return LoopStep(m, (*effects, *last), observation=obs, running_by_spec=raw, before=before)

    held = ("policy.mode is Pinned" if policy.mode is Mode.PINNED else "a transition is in progress" if mem.transitioning
            else observe_only)
    if held:
        return done(mem, Held(held))
    assumed = mem.assumed or problem.workload
    verdict = assess_drift(mem.drift, shift=workload_shift(assumed, obs.workload.workload), observed_slo=obs.slo, slo=problem.slo,
                           observed_rate_rps=obs.workload.workload.arrival_rate_rps or 0.0,
                           capacity_rps=before.prediction.capacity_rps if before is not None else None,
                           confidence=obs.workload.confidence, now_s=now_s, policy=policy.drift)
    mem = replace(mem, drift=verdict.state)
    st = verdict.state
    effects.append(DriftAssessed(verdict))
    if not verdict.replan:
        return done(mem)
    observed = replace(observed, workload=load_to_plan(window, persist_intervals=policy.drift.persist_intervals, observation=obs))
    try:
        decision = plan(observed)
    except Infeasible as exc:
        return done(replace(mem, drift=rebaseline(st, now_s=now_s, changed=False)), ReplanInfeasible(str(exc)))

    # SameLoadFigures: choice.before is the running layout at the load the planner chose `after` for, never at another.
    def calibration(layout: Layout) -> DeploymentCalibration | None:   # NarrowMeasuredOnly (planner/live/calibration.py)
        return as_deployment_calibration(cal, problem, now_s=now_s, layout=layout)
    misses = policy.error_misses + mem.misses
    choice = choose_move(observed, current, decision, predict=predict, min_improvement=policy.drift.min_improvement,
                         propose_only=policy.mode is Mode.DRY_RUN, surge_gpus=policy.max_surge_gpus,
                         ready_timeout_s=policy.ready_timeout_s, drain_s=policy.drain_s, now_s=now_s,
                         gain_within_error=policy.error_gate, error_misses=misses, calibration=calibration)
    after, why, gate = choice.after, choice.why, choice.gate
    shown = intervals_shown(observed, choice.before, after, calibration=calibration, misses=misses)

    def decided(m: M, last: Effect) -> LoopStep[M]:
        return LoopStep(m, (*effects, last), observation=obs, running_by_spec=raw, before=choice.before, decision=decision,
                        after=after, load_rps=choice.load_rps, intervals=shown)
    if choice.move is Move.WITHIN_ERROR:
        assert choice.before is not None   # the gate judges a move from a running layout only
        mem = replace(mem, drift=rebaseline(st, now_s=now_s, changed=False), assumed=observed.workload)
        return decided(mem, GainWithinError(why))
    if choice.move is Move.KEEP:
        mem = replace(mem, drift=rebaseline(st, now_s=now_s, changed=False), assumed=observed.workload)
        return decided(mem, PlanKept(why, verdict.message))
    if choice.move is Move.PROPOSE:
        mem = replace(mem, drift=rebaseline(st, now_s=now_s, changed=True), assumed=observed.workload)
        return decided(mem, Proposed(why, verdict.message))
    if choice.move is Move.BLOCKED or choice.transition is None or choice.floor_rps is None:
        return decided(replace(mem, drift=rebaseline(st, now_s=now_s, changed=False)), TransitionBlocked(why))
    mem = replace(mem, drift=rebaseline(st, now_s=now_s, changed=True), assumed=observed.workload, transition=choice.transition,
                  transition_floor_rps=choice.floor_rps, transition_keeps_serving=True,
                  move=({"layout": after.layout.label_for(problem.engine),
                         "tpotMs": {"value": gate.after.value, "low": gate.after.low, "high": gate.after.high}}
                        if gate is not None else mem.move))
    return decided(mem, TransitionStarted(why, verdict.message, choice.transition, choice.floor_rps))
