"""The replan loop in the operator's terms: the loop's memory as status.replan, the spec's policy as planner values,
one replan interval worded as conditions, Events and status.observed (`replan`), one transition step per reconcile
(`transition_step`), and the proposal a replan shows.

The decisions are the planner's: planner/live/loop.py `step` runs the whole ladder of one interval (observe, calibrate,
drift, the load to plan for, decide, the move) and returns typed effects (planner/live/effects.py); this module calls it
once per interval and words each effect. Called by the reconcile (operator/live_replan.py, operator/reconcile.py). Pure
functions over values: the metrics fetch happens before (`fetch_sample`, operator/live_replan.py), the Conditions and
Events it returns are written by the caller, and its memory is a JSON dict kept in status.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from servingtopology.operator.api.resource import (
    CalibrationState,
    CalibrationStatus,
    ConditionType,
    ObservedStatus,
    PlanStatus,
    PolicySpec,
    ProposalStatus,
    duration_s,
)
from servingtopology.operator.live.metrics import MetricsSource, MetricsUnavailable
from servingtopology.operator.live.readout import ms_text
from servingtopology.operator.plan_status import ArgsOf, interval_band, predicted, proposal_status, queueing_note, timestamp
from servingtopology.operator.replan_status import Unreadable, validate_replan_status
from servingtopology.planner.layout import Engine, Layout
from servingtopology.planner.live.calibration import (
    LiveCalibration,
    LiveFit,
    LivePoint,
    PointPredictor,
    analytic_point,
    combined,
    residual_percent,
)
from servingtopology.planner.live.drift import DriftPolicy, DriftState
from servingtopology.planner.live.effects import (
    AwaitingMetrics,
    CalibrationChanged,
    DriftAssessed,
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
)
from servingtopology.planner.live.error_bars import LEVEL, Interval
from servingtopology.planner.live.error_gate import GAIN_WITHIN_ERROR, widening
from servingtopology.planner.live.loop import LoopStep, NoSample, step
from servingtopology.planner.live.memory import LoopMemory
from servingtopology.planner.live.observe import MetricSample, Observation
from servingtopology.planner.live.policy import ReplanPolicy
from servingtopology.planner.live.replan_decision import Predictor, capacity_of
from servingtopology.planner.live.transition import (
    Action,
    Budget,
    ClusterView,
    Phase,
    Step,
    TransitionState,
    layout_from_state,
    layout_to_state,
    next_step,
    serving_capacity_rps,
)
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.planner.search.decide import predict_layout
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

__all__ = [
    "ReplanPolicy", "ReplanMemory", "ReplanStatusError", "read_replan_status", "Verdict", "ConditionNote", "EventNote", "ReplanOutcome",
    "policy_from_spec", "fetch_sample", "replan", "transition_step", "observed_status", "Predictor",
    "METRICS_GRACE_MIN_S", "metrics_grace", "FloorCheck", "serving_floor", "after_transition", "proposal_from_replan",
    "calibration_status",
]

Planner = Callable[[Problem], Decision]


def policy_from_spec(policy: PolicySpec, *, persist_intervals: int = 3) -> ReplanPolicy:
    """The spec's policy block as planner values (durations in seconds)."""
    drift = DriftPolicy(persist_intervals=persist_intervals, cooldown_s=float(duration_s(policy.cooldown)),
                        min_improvement=policy.minImprovement)
    return ReplanPolicy(mode=policy.mode, interval_s=float(duration_s(policy.replanInterval)), drift=drift,
                        max_surge_gpus=policy.maxSurgeGPUs, capacity_drop=policy.capacityDrop,
                        error_gate=policy.gainWithinError)


def _workload_dict(w: Workload) -> dict[str, Any]:
    def dist(d: LengthDist) -> dict[str, Any]:
        return {"kind": d.kind.value, "mean": d.mean, "low": d.low, "high": d.high, "sigma": d.sigma, "values": list(d.values)}

    return {"input": dist(w.input_tokens), "output": dist(w.output_tokens), "rate": w.arrival_rate_rps, "prefix": w.prefix_share,
            "cv": w.arrival_cv}


def _workload_from(d: Mapping[str, Any]) -> Workload:
    def dist(x: Mapping[str, Any]) -> LengthDist:
        return LengthDist(LengthKind(x["kind"]), float(x["mean"]), int(x["low"]), int(x["high"]), float(x["sigma"]), tuple(x["values"]))

    return Workload(dist(d["input"]), dist(d["output"]), arrival_rate_rps=d["rate"], prefix_share=float(d["prefix"]), arrival_cv=float(d["cv"]))


def _per_metric(m: Mapping[str, float]) -> dict[str, float]:
    return {k: round(float(m[k]), 6) for k in ("ttft", "tpot")}


def _calibration_dict(cal: LiveCalibration) -> dict[str, Any]:
    """status.replan.calibration: the points (workload and layout each) and the last fit."""
    f = cal.fit
    return {"points": [{"atS": p.at_s, "ttftMs": round(p.ttft_ms, 4), "tpotMs": round(p.tpot_ms, 4), "workload": _workload_dict(p.workload),
                        "layout": layout_to_state(p.layout)} for p in cal.points],
            "fit": None if f is None else {"factors": {t: round(v, 6) for t, v in f.factors.items()},
                                           "residualBefore": _per_metric(f.residual_before), "residualAfter": _per_metric(f.residual_after),
                                           "ownHalfWidth": _per_metric(f.own_half_width), "atBound": list(f.at_bound),
                                           "fittedAtS": f.fitted_at_s, "pointsUsed": f.points_used},
            "minPoints": cal.min_points}


def _calibration_from(d: Mapping[str, Any]) -> LiveCalibration:
    points = tuple(LivePoint(float(p["atS"]), layout_from_state(p["layout"]), _workload_from(p["workload"]), float(p["ttftMs"]),
                             float(p["tpotMs"])) for p in d.get("points") or ())
    f = d.get("fit")
    fit = None if not f else LiveFit(dict(f["factors"]), dict(f["residualBefore"]), dict(f["residualAfter"]), dict(f["ownHalfWidth"]),
                                     tuple(f["atBound"]), float(f["fittedAtS"]), int(f["pointsUsed"]))
    return LiveCalibration(points, fit, int(d.get("minPoints") or LiveCalibration().min_points))


def calibration_status(cal: LiveCalibration, *, misses: int = 0) -> CalibrationStatus | None:
    """status.calibration: the operator's own calibration as people read it, with the moves that missed their interval
    and the widening they put on the next move's bar (None before its first point or miss)."""
    f = cal.fit
    if f is None and not cal.points and not misses:
        return None
    status = CalibrationStatus(state=CalibrationState(cal.state.value), pointsUsed=len(cal.points), minimumPoints=cal.min_points,
                               message=cal.message(), missedMoves=misses, intervalWidening=round(widening(misses), 4))
    if f is None:
        return status
    return status.model_copy(update={
        "corrections": {t: round(v, 3) for t, v in sorted(f.factors.items())}, "atBound": list(f.at_bound),
        "residualPercent": residual_percent(f.residual_after), "uncalibratedResidualPercent": residual_percent(f.residual_before),
        "fittedAt": timestamp(datetime.fromtimestamp(f.fitted_at_s, tz=UTC))})


@dataclass(frozen=True, slots=True)
class ReplanMemory(LoopMemory):
    """The replan loop's memory (planner/live/memory.py `LoopMemory`) as `status.replan` keeps it, a JSON object:
    `to_dict` writes it, `from_dict` reads it strictly. The loop returns the memory it was given, updated, so a pass that
    read a ReplanMemory writes one."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": [{k: v for k, v in dataclasses.asdict(s).items() if v is not None} for s in self.samples],
            "drift": self.drift.to_dict(), "calibration": _calibration_dict(self.calibration),
            "assumed": _workload_dict(self.assumed) if self.assumed else None, "metricsAvailable": self.metrics_available,
            "lastFetchS": self.last_fetch_s, "transition": self.transition.to_dict() if self.transition else None,
            "transitionFloorRps": self.transition_floor_rps, "transitionKeepsServing": self.transition_keeps_serving,
            **({"move": self.move} if self.move is not None else {}), **({"misses": self.misses} if self.misses else {}),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> ReplanMemory:
        """Read status.replan strictly (operator/replan_status.py's schema); raise ReplanStatusError naming the
        fields it cannot read. None or {} is a fresh memory."""
        memory, unreadable = read_replan_status(d)
        if unreadable is not None:
            raise ReplanStatusError(unreadable)
        return memory


class ReplanStatusError(ValueError):
    """status.replan holds something this operator cannot read; `unreadable` names the fields."""

    def __init__(self, unreadable: Unreadable) -> None:
        super().__init__(unreadable.message)
        self.unreadable = unreadable


def read_replan_status(d: Mapping[str, Any] | None) -> tuple[ReplanMemory, Unreadable | None]:
    """Read status.replan section by section: what validates is kept, what does not is left at its default and
    named in the second value (whose `transition` says the running transition could not be read)."""
    if not d:
        return ReplanMemory(), None
    model, unreadable = validate_replan_status(d)
    raw = model.model_dump(mode="json")
    try:
        memory = ReplanMemory(
            samples=tuple(MetricSample(**s) for s in raw["samples"]),
            drift=DriftState.from_dict(raw["drift"]), calibration=_calibration_from(raw["calibration"]),
            assumed=_workload_from(raw["assumed"]) if raw["assumed"] else None, metrics_available=model.metricsAvailable,
            last_fetch_s=model.lastFetchS,
            transition=TransitionState.from_dict(raw["transition"]) if raw["transition"] else None,
            transition_floor_rps=float(model.transitionFloorRps or 0.0),
            # Status written before the flag existed: a floor of zero let serving stop, any other floor did not.
            transition_keeps_serving=(model.transitionKeepsServing if model.transitionKeepsServing is not None
                                      else float(model.transitionFloorRps or 0.0) > 0),
            move={k: v for k, v in raw["move"].items() if v is not None} if raw.get("move") else None, misses=model.misses,
        )
    except (ArithmeticError, KeyError, TypeError, ValueError) as exc:   # values the schema admits but the planner's types refuse
        return ReplanMemory(), Unreadable(tuple(sorted(d)), (f"status.replan: {type(exc).__name__}: {exc}",))
    return memory, unreadable


@dataclass(frozen=True, slots=True)
class ConditionNote:
    type: ConditionType
    status: bool | None
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class EventNote:
    type: str      # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ReplanOutcome:
    verdict: str
    memory: ReplanMemory
    conditions: tuple[ConditionNote, ...] = ()
    events: tuple[EventNote, ...] = ()
    observation: Observation | None = None
    observed: ObservedStatus | None = None
    decision: Decision | None = None
    before: Candidate | None = None          # the running layout at the observed workload (once a decision is made: at `load_rps`)
    after: Candidate | None = None           # the proposed or target layout at the observed workload
    message: str = ""
    load_rps: float | None = None            # the arrival rate `after` (and the decision's current) were predicted at
    # The nominal intervals of `before`'s and `after`'s TTFT and TPOT ("before"/"after" → "ttft"/"tpot"), as the Events quote them.
    intervals: Mapping[str, Mapping[str, Interval]] = field(default_factory=dict)


def fetch_sample(source: MetricsSource, *, at_s: float, interval_s: float) -> tuple[MetricSample | None, str | None]:
    """One sample, or (None, why) when Prometheus cannot answer; the only I/O of replanning."""
    try:
        return source.fetch_sample(at_s=at_s, interval_s=interval_s), None
    except MetricsUnavailable as exc:
        return None, str(exc)


def observed_status(obs: Observation, *, at: str, raw: Candidate | None, ttft_percentile: float | None = None,
                    tpot_percentile: float | None = None) -> ObservedStatus:
    """status.observed: the observed workload and latencies at the SLO percentiles (which it names), with the
    model's error against them (observed/predicted − 1)."""
    w, slo = obs.workload.workload, obs.slo
    p = raw.prediction if raw is not None else None
    # The engine's TTFT histogram is taken before (most of) the first token's delivery to the client: the prediction
    # beside it is the engine's TTFT (Prediction.engine_ttft_ms, what the live calibration fits too). Both errors are of the figures
    # shown, as rounded, so a reader dividing them gets the error printed.
    p_ttft = round(p.engine_ttft_ms, 1) if p is not None else None
    p_tpot = round(p.tpot_ms, 2) if p is not None else None
    ttft_err = round(slo.ttft_ms, 1) / p_ttft - 1.0 if p_ttft is not None and slo.ttft_ms is not None and p_ttft > 0 else None
    tpot_err = round(slo.tpot_ms, 2) / p_tpot - 1.0 if p_tpot is not None and slo.tpot_ms is not None and p_tpot > 0 else None
    return ObservedStatus(at=at, arrivalRateRps=round(w.arrival_rate_rps or 0.0, 4), inputTokensMean=round(w.input_tokens.expected_tokens, 1),
                          outputTokensMean=round(w.output_tokens.expected_tokens, 1), prefixHitRate=round(w.prefix_share, 4),
                          ttftMs=None if slo.ttft_ms is None else round(slo.ttft_ms, 1),
                          ttftPercentile=None if slo.ttft_ms is None else ttft_percentile,
                          tpotMs=None if slo.tpot_ms is None else round(slo.tpot_ms, 2),
                          tpotPercentile=None if slo.tpot_ms is None else tpot_percentile,
                          ttftError=None if ttft_err is None else round(ttft_err, 4), tpotError=None if tpot_err is None else round(tpot_err, 4),
                          predictedTtftMs=p_ttft, predictedTpotMs=p_tpot)


METRICS_GRACE_MIN_S = 60.0   # Prometheus has to discover new pods and scrape them twice before a rate() exists


def metrics_grace(memory: ReplanMemory, *, ready_since_s: float | None, now_s: float, interval_s: float) -> str | None:
    """MetricsGrace: why a failed or empty fetch is not reported as MetricsUnavailable yet; None when it is news.

    - metrics were read or judged missing before (memory.metrics_available is set): an outage is reported at once;
    - the workloads are not Ready: their engines cannot have been scraped yet;
    - Ready for less than max(one replan interval, METRICS_GRACE_MIN_S): Prometheus is still discovering the pods
      and needs two scrapes for a rate.
    """
    if memory.metrics_available is not None:
        return None
    if ready_since_s is None:
        return "the workloads are not Ready yet; metrics are expected once their engines serve"
    grace_s = max(interval_s, METRICS_GRACE_MIN_S)
    waited_s = now_s - ready_since_s
    if waited_s < grace_s:
        return (f"the workloads have been Ready for {max(waited_s, 0.0):.0f} s; metrics are expected within "
                f"{grace_s:.0f} s (one replan interval, at least {METRICS_GRACE_MIN_S:.0f} s)")
    return None


def _bounds(iv: Interval) -> str:
    return f"[{ms_text(iv.low)}, {ms_text(iv.high)}]" if math.isfinite(iv.low) and math.isfinite(iv.high) else "[no interval]"


def _interval_clause(intervals: Mapping[str, Mapping[str, Interval]], metrics: tuple[str, ...] = ("ttft", "tpot")) -> str:
    """`, nominal 80 % intervals TTFT [a, b]→[c, d], TPOT [e, f]→[g, h] (calibrated)`: the change's figures' intervals."""
    after = intervals.get("after")
    if not after:
        return ""
    before = intervals.get("before")
    parts = [f"{m.upper()} " + (f"{_bounds(before[m])}→" if before else "") + _bounds(after[m]) for m in metrics]
    calibrated = any(iv.calibrated for ivs in intervals.values() for iv in ivs.values())
    return f", nominal {LEVEL:.0%} intervals " + ", ".join(parts) + (" (narrowed by this deployment's calibration)" if calibrated else "")


def _change(before: Candidate | None, after: Candidate, pct: float, load_rps: float, *, engine: Engine,
            intervals: Mapping[str, Mapping[str, Interval]] | None = None) -> str:
    """`A → B at 30 req/s: p95 TTFT 208s→247ms, …`: both predicted at the same load (SameLoadFigures).

    The figures are formatted from the values status stores (`predicted` rounds them), so the PlanApplied Event,
    written from status when the transition ends, quotes the same digits (158.54 ms is "159ms" raw but "158ms"
    once stored as 158.5). Layouts in `engine`'s words (EngineNamed: Layout.label_for), as status and the record name them."""
    a = predicted(after.prediction)
    was, now = (before.layout.label_for(engine) if before is not None else ""), after.layout.label_for(engine)
    bars = _interval_clause(intervals or {})
    if before is None:
        return (f"{now} at {load_rps:.3g} req/s: p{pct:g} TTFT {ms_text(a.ttftMs)}, TPOT {ms_text(a.tpotMs)}, "
                f"GPUs {after.layout.gpus}{bars}")
    b = predicted(before.prediction)
    note = queueing_note(b, load_rps=load_rps, layout=was)
    return (f"{was} → {now} at {load_rps:.3g} req/s: p{pct:g} TTFT {ms_text(b.ttftMs)}→{ms_text(a.ttftMs)}, "
            f"TPOT {ms_text(b.tpotMs)}→{ms_text(a.tpotMs)}, GPUs {before.layout.gpus}→{after.layout.gpus}{bars}" + (f"; {note}" if note else ""))


def replan(*, problem: Problem, current: Layout | None, memory: ReplanMemory, sample: MetricSample | None, metrics_error: str | None,
           policy: ReplanPolicy, now_s: float, planner: Planner, predict: Predictor = predict_layout, at: str = "",
           grace: str | None = None, observe_only: str | None = None, metrics_reason: str = "MetricsUnavailable",
           calibrate: PointPredictor | None = analytic_point) -> ReplanOutcome:
    """One replan interval: the planner's loop (planner/live/loop.py `step`) called once, its effects worded as
    conditions, Events and status.observed (`at`: its timestamp). `grace` (from `metrics_grace`) holds back a
    MetricsUnavailable while metrics cannot exist yet; `metrics_reason` names a failed read in the MetricsAvailable
    condition and its Event (operator/live/prometheus_http.py's PrometheusFailure; an empty answer is always
    MetricsUnavailable); the other arguments are `step`'s. Raises only what `planner` raises besides Infeasible."""
    read: MetricSample | NoSample
    if metrics_error is not None or sample is None or sample.empty:
        read = NoSample(metrics_error or "Prometheus returned no engine series for this ServingTopology",
                        metrics_reason if metrics_error is not None else "MetricsUnavailable", grace)
    else:
        read = sample
    result = step(memory, read, now_s=now_s, problem=problem, current=current, policy=policy, plan=planner, predict=predict,
                  calibrate=calibrate, observe_only=observe_only)
    return _worded(result, problem=problem, current=current, at=at)


def _worded(result: LoopStep[ReplanMemory], *, problem: Problem, current: Layout | None, at: str) -> ReplanOutcome:
    """The loop's effects as the conditions, Events and message of a ReplanOutcome, in the order the loop produced them."""
    conds: list[ConditionNote] = []
    events: list[EventNote] = []
    message = ""
    r = result

    def change() -> str:
        assert r.after is not None and r.load_rps is not None
        return _change(r.before, r.after, problem.slo.ttft_percentile, r.load_rps, engine=problem.engine, intervals=r.intervals)

    for e in r.effects:
        match e:
            case AwaitingMetrics():
                conds.append(ConditionNote(ConditionType.METRICS_AVAILABLE, None, "AwaitingMetrics", f"{e.grace} ({e.why})"))
                message = e.why
            case MetricsMissing():
                if e.first:
                    events.append(EventNote("Warning", e.reason, f"{e.why}; keeping the current plan, no replans until metrics return"))
                conds.append(ConditionNote(ConditionType.METRICS_AVAILABLE, False, e.reason, e.why))
                message = e.why
            case MetricsFlowing():
                conds.append(ConditionNote(ConditionType.METRICS_AVAILABLE, True, "MetricsFlowing", "engine metrics are being read"))
                if e.back:
                    events.append(EventNote("Normal", "MetricsAvailable", "engine metrics are back"))
            case TooLittleData():
                conds.append(ConditionNote(ConditionType.DRIFT_DETECTED, None, "InsufficientData", e.why))
                message = e.why
            case CalibrationChanged():
                pass   # status.calibration shows it, from the memory (PassState.outcome)
            case MoveJudged():
                j = e.judgement
                text = f"after the move to {e.layout}: {j.message}" + ("" if j.hit else f"; {e.misses} missed moves widen the next move's bar")
                events.append(EventNote("Normal" if j.hit else "Warning", j.reason, text))
            case Held():
                message = f"observed only: {e.why}"
            case DriftAssessed():
                v = e.verdict
                conds.append(ConditionNote(ConditionType.DRIFT_DETECTED, v.state.detected,
                                           v.state.trigger.value if v.state.trigger else "NoDrift", v.message))
                if v.new_episode:   # one Warning per drift episode (planner/live/drift.py): never again while a fix's queue drains
                    events.append(EventNote("Warning", "DriftDetected", v.message))
                message = v.message
            case ReplanInfeasible():
                events.append(EventNote("Warning", "ReplanInfeasible", f"{e.why}; keeping {current.label_for(problem.engine) if current else 'nothing'}"))
                message = e.why
            case GainWithinError():
                # The gate's message quotes the TPOT intervals it judged by; the TTFT intervals follow (IntervalsShown).
                assert r.before is not None and r.after is not None
                message = (f"kept {r.before.layout.label_for(problem.engine)} over {r.after.layout.label_for(problem.engine)}: {e.why}; "
                           f"{_interval_clause(r.intervals, ('ttft',)).removeprefix(', ')}")
                events.append(EventNote("Normal", GAIN_WITHIN_ERROR, message))
            case PlanKept():
                events.append(EventNote("Normal", "PlanKept", f"{e.drift}; kept {current.label_for(problem.engine) if current else '-'}: {e.why}"))
                message = e.why
            case Proposed():
                message = f"would change {change()}, because {e.why} ({e.drift})"
                events.append(EventNote("Normal", "PlanProposed", message))
            case TransitionBlocked():
                events.append(EventNote("Warning", "TransitionBlocked", f"would change {change()}, but {e.why}"))
                message = e.why
            case TransitionStarted():
                message = f"changing {change()}, because {e.why} ({e.drift}); {e.transition.mode.value} transition"
                events.append(EventNote("Normal", "TransitionStarted", message))
                conds.append(ConditionNote(ConditionType.PROGRESSING, True, "Transition", message))
    observed = None if r.observation is None else observed_status(
        r.observation, at=at, raw=r.running_by_spec, ttft_percentile=problem.slo.ttft_percentile,
        tpot_percentile=problem.slo.tpot_percentile)
    return ReplanOutcome(r.verdict, r.memory, tuple(conds), tuple(events), observation=r.observation, observed=observed,
                         decision=r.decision, before=r.before, after=r.after, message=message, load_rps=r.load_rps,
                         intervals=r.intervals)


def transition_problem(memory: ReplanMemory, problem: Problem) -> Problem:
    """OneCapacityModel: the problem a transition's capacity is judged by, at its start (operator/rollout.py
    `start_for_change`, planner/live/replan_decision.py `choose_move` via the replan's observed problem) and at every step
    (`transition_step`, `serving_floor`): the spec's at the workload the transition was started for, with the
    calibration's factors. A start judged without the live factors once let a spec edit start a move whose every step
    was then judged with them (weights ×1.8: 2×TP1 below the floor) and stalled it (an e2e run)."""
    return replace(problem, workload=memory.assumed or problem.workload, factors=combined(problem.factors, memory.calibration.factors))


@dataclass(frozen=True, slots=True)
class FloorCheck:
    """ServingFloorHeld: whether the ready serving instances of a running transition carry its capacity floor."""

    held: bool
    capacity_rps: float
    floor_rps: float


def serving_floor(memory: ReplanMemory, view: ClusterView, *, problem: Problem) -> FloorCheck | None:
    """ServingFloorHeld for the running transition (None when there is none): the serving sets' ready capacity,
    judged as `next_step` judges it, is above zero and at least the floor fixed when the transition started."""
    state = memory.transition
    if state is None or state.phase in (Phase.DONE, Phase.FAILED):
        return None
    capacity = serving_capacity_rps(state, view, capacity=capacity_of(transition_problem(memory, problem)))
    return FloorCheck(held=capacity > 0 and capacity >= memory.transition_floor_rps - 1e-9, capacity_rps=capacity,
                      floor_rps=memory.transition_floor_rps)


def after_transition(memory: ReplanMemory, *, now_s: float) -> ReplanMemory:
    """PostTransitionWindow: the memory once a transition has ended (done or rolled back).

    The metric window is emptied and the next sample is due one full replan interval later, so its rate window lies
    after the change: no drift is judged, and nothing calibrated, on samples of the layout that no longer runs.
    """
    return replace(memory, transition=None, samples=(), last_fetch_s=now_s)


def transition_step(memory: ReplanMemory, view: ClusterView, *, problem: Problem, policy: ReplanPolicy,
                    now_s: float) -> tuple[ReplanMemory, Step | None, tuple[EventNote, ...]]:
    """The next step of the running transition (None when there is none); the caller executes it and saves the memory.

    `problem` is the spec's: capacity is judged at the workload the transition was started for (memory.assumed),
    with the calibrated corrections; the floor is the one fixed at the start: min(observed load, capacity then).
    """
    state = memory.transition
    if state is None or state.phase in (Phase.DONE, Phase.FAILED):
        return memory, None, ()
    problem = transition_problem(memory, problem)
    budget = Budget(max_gpus=problem.max_gpus, surge_gpus=policy.max_surge_gpus, floor_rps=memory.transition_floor_rps,
                    ready_timeout_s=policy.ready_timeout_s, drain_s=policy.drain_s, keep_serving=memory.transition_keeps_serving)
    step = next_step(state, view, budget=budget, capacity=capacity_of(problem), now_s=now_s)
    events: tuple[EventNote, ...] = ()
    if step.action in (Action.SCALE, Action.ROUTE, Action.DELETE, Action.ROLLBACK):
        kind = "Warning" if step.action is Action.ROLLBACK else "Normal"
        events = (EventNote(kind, f"Transition{step.action.value}", step.message),)
    if step.state.phase is Phase.FAILED:   # `state` is not FAILED here (returned above): this step failed it
        events = (*events, EventNote("Warning", "TransitionFailed", step.state.message))
    return replace(memory, transition=step.state), step, events


def proposal_from_replan(out: ReplanOutcome, *, engine: Engine, current: PlanStatus | None, args_of: ArgsOf, now: datetime, generation: int,
                         percentile: str, set_name: str | None = None) -> ProposalStatus:
    """`status.proposal` for the layout a live replan chose (DryRun: to show it; Auto: the transition's target)."""
    assert out.after is not None
    # replan words it "…, because <why> (<drift>)[; <Mode> transition]"; the proposal keeps "<why> (<drift>)".
    why = re.sub(r"; \w+ transition$", "", out.message.split(", because ", 1)[1]) if ", because " in out.message else ""
    reasons = ([why] if why else []) + list(out.decision.reasons if out.decision is not None else ())
    # SameLoadFigures: out.before is the running layout at the load out.after was chosen for (out.load_rps).
    proposal = proposal_status(out.after, engine=engine, current=current, before=out.before.prediction if out.before is not None else None,
                               args_of=args_of, reasons=reasons, now=now, generation=generation, percentile=percentile,
                               load_rps=out.load_rps)
    update: dict[str, Any] = {"set": set_name} if set_name else {}
    for key, name in (("after", "predicted"), ("before", "before")):   # IntervalsShown: each prediction with its interval
        fig, ivs = getattr(proposal, name), out.intervals.get(key)
        if fig is not None and ivs:
            update[name] = fig.model_copy(update={"ttftInterval": interval_band(ivs["ttft"]), "tpotInterval": interval_band(ivs["tpot"])})
    return proposal.model_copy(update=update) if update else proposal
