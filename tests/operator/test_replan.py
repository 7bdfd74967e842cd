"""The replan loop as the operator words it, with a fake planner and predictor: the conditions, Events, status.observed,
status.proposal and status.calibration of metrics down, thin data, steady traffic, DryRun, Auto, minImprovement,
infeasible and blocked replans, calibration and the error gate, and the memory kept in status. The loop's decisions
themselves are tests/planner/live/test_loop.py's."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from servingtopology.cli.calibration_io import prediction_intervals
from servingtopology.operator.api.resource import ConditionType, Mode, PolicySpec
from servingtopology.operator.live.readout import ms_text
from servingtopology.operator.replan import (
    ReplanMemory,
    ReplanStatusError,
    Verdict,
    calibration_status,
    policy_from_spec,
    proposal_from_replan,
    replan,
    transition_step,
)
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role
from servingtopology.planner.live.calibration import MAX_LIVE_POINTS, CalibrationState
from servingtopology.planner.live.transition import Action, ClusterView, Phase
from servingtopology.planner.live.transition import Mode as TransitionMode
from servingtopology.planner.perf.deployment_fit import MAX_FACTOR
from tests.planner.live.loop_fakes import (
    ONE,
    PREDICTED_TTFT_MS,
    PROBLEM,
    fake_planner,
    fake_point,
    fake_predict,
    infeasible_planner,
    policy,
    refusing_planner,
    sample,
)
from tests.planner.live.loop_fakes import gainful_planner as _gainful_planner
from tests.planner.live.loop_fakes import predict_knobs as _predict_knobs


def feed(samples, *, memory=None, planner=fake_planner, pol=None, current=ONE, errors=None, problem=PROBLEM):
    """Run replan over a list of samples (None = metrics down); return the outcomes."""
    memory = memory or ReplanMemory()
    pol = pol or policy()
    outs = []
    for i, s in enumerate(samples):
        at = s.at_s if s is not None else 60.0 * (i + 1)
        out = replan(problem=problem, current=current, memory=memory, sample=s, metrics_error=(errors or {}).get(i), policy=pol,
                     now_s=at, planner=planner, predict=fake_predict, at="2026-11-30T12:00:00Z", calibrate=fake_point)
        memory = out.memory
        outs.append(out)
    return outs


def cond(out, kind):
    return next(c for c in out.conditions if c.type is kind)


def test_metrics_down_keep_everything_with_one_event_per_outage_and_no_replans():
    down = "Prometheus query failed: ConnectionError: refused"
    samples = [sample(60.0 * i) for i in range(1, 5)] + [None] * 4 + [sample(60.0 * i) for i in range(9, 11)]
    outs = feed(samples, planner=refusing_planner, errors={4: down, 5: down, 6: down})
    assert all(o.verdict is Verdict.KEEP for o in outs)
    warnings = [e for o in outs for e in o.events if e.reason == "MetricsUnavailable"]
    assert len(warnings) == 1 and down in warnings[0].message
    assert cond(outs[5], ConditionType.METRICS_AVAILABLE).status is False
    assert cond(outs[7], ConditionType.METRICS_AVAILABLE).reason == "MetricsUnavailable"   # empty: no series at all
    assert [e.reason for e in outs[8].events] == ["MetricsAvailable"]
    assert cond(outs[8], ConditionType.METRICS_AVAILABLE).status is True
    assert outs[7].memory.samples == outs[3].memory.samples   # an outage adds nothing to the window


def test_thin_data_waits_without_planning():
    outs = feed([sample(60.0), sample(120.0)], planner=refusing_planner)
    assert all(o.verdict is Verdict.KEEP for o in outs)
    c = cond(outs[-1], ConditionType.DRIFT_DETECTED)
    assert c.status is None and c.reason == "InsufficientData"


def test_steady_traffic_never_calls_the_planner_and_reports_what_it_sees():
    outs = feed([sample(60.0 * i, rate=4.0 + 0.2 * (-1) ** i) for i in range(1, 13)], planner=refusing_planner)
    assert all(o.verdict is Verdict.KEEP for o in outs)
    obs = outs[-1].observed
    assert obs is not None and obs.arrivalRateRps == pytest.approx(4.0, abs=0.2) and obs.inputTokensMean == 1000.0
    assert cond(outs[-1], ConditionType.DRIFT_DETECTED).status is False


def test_dry_run_proposes_once_with_before_and_after_figures():
    samples = [sample(60.0 * i) for i in range(1, 5)] + [sample(60.0 * i, rate=9.0) for i in range(5, 13)]
    outs = feed(samples)
    proposed = [(i, o) for i, o in enumerate(outs) if o.verdict is Verdict.PROPOSE]
    assert len(proposed) == 1
    i, out = proposed[0]
    assert i == 6   # the third interval at 9 req/s
    assert out.after is not None and out.after.layout.label == "2×TP1"
    assert out.message.startswith("would change 1×TP1 → 2×TP1 at 9 req/s: p95 TTFT 100ms→100ms, TPOT 20ms→20ms, GPUs 1→2, "
                                  "nominal 80% intervals TTFT [")
    assert "], because 1×TP1 misses" in out.message
    assert out.load_rps == 9.0 and out.before is not None and out.before.layout.label == "1×TP1"
    assert [e.reason for e in out.events] == ["DriftDetected", "PlanProposed"]
    assert cond(out, ConditionType.DRIFT_DETECTED).reason == "WorkloadShift"


def test_a_proposal_and_its_event_carry_each_predictions_interval_as_plan_prints_it():
    samples = [sample(60.0 * i) for i in range(1, 5)] + [sample(60.0 * i, rate=9.0) for i in range(5, 8)]
    out = feed(samples)[-1]
    assert out.verdict is Verdict.PROPOSE and out.after is not None and out.before is not None
    problem = replace(PROBLEM, workload=replace(PROBLEM.workload, arrival_rate_rps=9.0))
    for key, c in (("after", out.after), ("before", out.before)):
        # The same intervals `plan` and `simulate` print (servingtopology/cli/calibration_io.py), uncalibrated so far.
        cli = prediction_intervals(problem, c.layout, c.prediction.ttft_ms, c.prediction.tpot_ms, None)
        for m in ("ttft", "tpot"):
            iv = out.intervals[key][m]
            assert iv.low < iv.value < iv.high and not iv.calibrated
            assert (iv.low, iv.high) == pytest.approx((cli[f"{m}_ms"]["low"], cli[f"{m}_ms"]["high"]), abs=1e-3)
    (event,) = [e for e in out.events if e.reason == "PlanProposed"]
    after, before = out.intervals["after"], out.intervals["before"]
    assert (f"GPUs 1→2, nominal 80% intervals TTFT [{ms_text(before['ttft'].low)}, {ms_text(before['ttft'].high)}]→"
            f"[{ms_text(after['ttft'].low)}, {ms_text(after['ttft'].high)}], TPOT [") in event.message
    proposal = proposal_from_replan(out, engine=Engine.VLLM, current=None, args_of=lambda role, rl: (1, ()), now=datetime(2026, 11, 30, tzinfo=UTC),
                                    generation=1, percentile="p95")
    assert proposal.predicted is not None and proposal.predicted.tpotInterval is not None and proposal.before is not None
    assert proposal.predicted.tpotInterval.low == pytest.approx(after["tpot"].low, abs=1e-3) and proposal.predicted.tpotInterval.level == 0.8
    assert proposal.before.ttftInterval is not None and proposal.before.ttftInterval.high == pytest.approx(before["ttft"].high, abs=1e-3)


def test_status_calibration_counts_the_missed_moves_and_the_widening_they_put_on_the_next_bar():
    # The widening itself: tests/planner/live/test_loop.py (the intervals narrow once calibrated, widen 1.5× per miss).
    shown = calibration_status(ReplanMemory(misses=2).calibration, misses=2)
    assert shown is not None and shown.missedMoves == 2 and shown.intervalWidening == pytest.approx(2.25)
    assert shown.state.value == "Collecting" and shown.pointsUsed == 0
    assert calibration_status(ReplanMemory().calibration) is None   # nothing to show before a point or a miss


def test_a_blocked_move_is_one_warning_naming_the_change_and_the_closest_miss():
    samples = [sample(60.0 * i) for i in range(1, 5)] + [sample(60.0 * i, rate=9.0) for i in range(5, 8)]
    out = feed(samples, pol=replace(policy(Mode.AUTO), max_surge_gpus=0), problem=replace(PROBLEM, max_gpus=1))[-1]
    (event,) = [e for e in out.events if e.reason == "TransitionBlocked"]
    assert event.type == "Warning" and event.message.startswith("would change 1×TP1 → 2×TP1 at 9 req/s: p95 TTFT 100ms→100ms")
    assert event.message.endswith(f", but {out.message}") and out.message and out.verdict is Verdict.KEEP

def test_auto_starts_one_transition_and_replans_nothing_while_it_runs():
    samples = [sample(60.0 * i) for i in range(1, 5)] + [sample(60.0 * i, rate=9.0) for i in range(5, 16)]
    outs = feed(samples, pol=policy(Mode.AUTO))
    started = [o for o in outs if o.verdict is Verdict.TRANSITION]
    assert len(started) == 1
    mem = started[0].memory
    assert mem.transition is not None and mem.transition.mode is TransitionMode.IN_PLACE
    assert mem.transition_floor_rps == pytest.approx(min(9.0, mem.transition_floor_rps))
    assert all("transition is in progress" in o.message for o in outs[outs.index(started[0]) + 1:])
    # One step per reconcile against the cluster until done.
    name = mem.transition.from_set
    step_mem, step, events = transition_step(mem, ClusterView(ready={name: {Role.AGGREGATED: 1}}), problem=PROBLEM, policy=policy(Mode.AUTO),
                                             now_s=1000.0)
    assert step is not None and step.action is Action.SCALE and step.layout is not None and step.layout.label == "2×TP1"
    assert [e.reason for e in events] == ["TransitionScale"]
    done_mem, done, _ = transition_step(step_mem, ClusterView(ready={name: {Role.AGGREGATED: 2}}), problem=PROBLEM,
                                        policy=policy(Mode.AUTO), now_s=1015.0)
    assert done is not None and done.action is Action.DONE and done_mem.transition is not None
    assert done_mem.transition.phase is Phase.DONE and not done_mem.transitioning
    assert transition_step(done_mem, ClusterView(ready={}), problem=PROBLEM, policy=policy(Mode.AUTO), now_s=1030.0)[1] is None


def test_a_gain_under_min_improvement_keeps_the_plan_and_adopts_the_observed_workload():
    # 4 → 4.6 req/s with the threshold at 10 %: a shift, but one replica still carries it and the planner agrees.
    samples = [sample(60.0 * i, rate=4.6) for i in range(1, 8)]
    outs = feed(samples, pol=policy(enter_shift=0.1))
    kept = [o for o in outs if any(e.reason == "PlanKept" for e in o.events)]
    assert len(kept) == 1 and kept[0].verdict is Verdict.KEEP
    assert kept[0].memory.assumed is not None and kept[0].memory.assumed.arrival_rate_rps == pytest.approx(4.6)


def test_an_infeasible_replan_keeps_the_running_layout_and_says_why():
    samples = [sample(60.0 * i, rate=60.0) for i in range(1, 7)]
    outs = feed(samples, planner=infeasible_planner)
    warnings = [e for o in outs for e in o.events if e.reason == "ReplanInfeasible"]
    assert len(warnings) == 1 and "40% short" in warnings[0].message and "keeping 1×TP1" in warnings[0].message
    assert all(o.verdict is Verdict.KEEP for o in outs)


def test_steady_intervals_calibrate_the_model_only_from_the_minimum_points_and_report_its_error():
    outs = feed([sample(60.0 * i, ttft_ms=200.0, tpot_ms=20.0) for i in range(1, 12)], planner=refusing_planner)
    # An observation needs 3 intervals; the first two steady ones only collect (MinimumPoints: 3), the model's own
    # figures are used meanwhile.
    assert outs[3].memory.calibration.state is CalibrationState.COLLECTING and outs[3].memory.calibration.factors == ()
    assert len(outs[3].memory.calibration.points) == 2 and outs[3].before is not None
    assert outs[3].before.prediction.ttft_ms == PREDICTED_TTFT_MS
    assert all(o.memory.calibration.state is CalibrationState.APPLIED for o in outs[4:])
    cal = outs[-1].memory.calibration
    factors = dict(cal.factors)
    # TTFT measured twice the model's: the request-overhead term carries it up to its bound of 2; TPOT matches: no weights term.
    assert 1.5 < factors["request_overhead"] <= MAX_FACTOR and "weights" not in factors
    assert cal.fit is not None and cal.fit.residual_after["ttft"] < 0.5 * cal.fit.residual_before["ttft"]
    assert len(cal.points) == MAX_LIVE_POINTS           # BoundedPoints: 9 steady intervals, the newest 8 kept
    assert outs[2].observed is not None and outs[2].observed.ttftError == pytest.approx(1.0)   # the uncalibrated model's error
    assert outs[-1].before is not None and outs[-1].before.prediction.ttft_ms == pytest.approx(PREDICTED_TTFT_MS * factors["request_overhead"])
    shown = calibration_status(cal)
    assert shown is not None and shown.state.value == "Applied" and shown.pointsUsed == 8 and shown.minimumPoints == 3
    assert shown.residualPercent is not None and shown.uncalibratedResidualPercent is not None
    assert shown.uncalibratedResidualPercent["ttft"] == pytest.approx(100.0, abs=1.0)
    assert shown.residualPercent["ttft"] < 50.0 and shown.corrections["request_overhead"] == pytest.approx(factors["request_overhead"], abs=1e-3)


def test_the_memory_survives_status_as_json_and_garbage_is_named_not_dropped():
    samples = [sample(60.0 * i) for i in range(1, 4)] + [sample(60.0 * i, rate=9.0) for i in range(4, 8)]
    mem = feed(samples, pol=policy(Mode.AUTO))[-1].memory
    assert mem.transition is not None
    back = ReplanMemory.from_dict(json.loads(json.dumps(mem.to_dict())))
    assert back == mem
    with pytest.raises(ReplanStatusError, match=r"status.replan.samples\[0\].bogus"):
        ReplanMemory.from_dict({"samples": [{"bogus": 1}]})
    assert ReplanMemory.from_dict(None) == ReplanMemory()
    assert back.due(mem.last_fetch_s + 60.0, 60.0) and not back.due(mem.last_fetch_s + 30.0, 60.0)


def test_the_spec_policy_becomes_seconds_and_fractions():
    p = policy_from_spec(PolicySpec(mode=Mode.AUTO, replanInterval="2m", cooldown="1h", minImprovement=0.2, maxSurgeGPUs=4))
    assert (p.interval_s, p.drift.cooldown_s, p.drift.min_improvement, p.max_surge_gpus, p.mode) == (120.0, 3600.0, 0.2, 4, Mode.AUTO)


def _gated(gain: float, misses: int = 0):  # type: ignore[no-untyped-def]
    pol = replace(policy(Mode.AUTO, enter_shift=0.1), error_gate=True, error_misses=misses)
    planner = _gainful_planner(gain)
    memory, outs = ReplanMemory(), []
    for i in range(1, 8):
        out = replan(problem=PROBLEM, current=ONE, memory=memory, sample=sample(60.0 * i, rate=4.6), metrics_error=None, policy=pol,
                     now_s=60.0 * i, planner=planner, predict=_predict_knobs(planner), at="2026-12-03T12:00:00Z")
        memory = out.memory
        outs.append(out)
    return outs


def _bar(misses: int = 0) -> float:
    """The combined uncertainty the gate asks of 1×TP1 → 2×TP1 here (their TPOT classes in the shipped interval table)."""
    from servingtopology.planner.live import error_bars

    def h(kind: str, tpot: float) -> float:
        return error_bars.half_width("tpot", engine="vllm", kind=kind, clients=4.6 * (0.1 + 200 * tpot / 1e3))[0]
    return math.expm1(math.hypot(h("single-gpu", 20.0), h("single-gpu", 20.0 / 1.2)) * 1.5**misses)


def test_a_gain_within_the_combined_error_changes_nothing_and_posts_one_gain_within_error_event():
    outs = _gated(0.2)
    events = [e for o in outs for e in o.events if e.reason == "GainWithinError"]
    assert len(events) == 1
    assert all(o.verdict is Verdict.KEEP and o.memory.transition is None for o in outs)
    msg = events[0].message
    assert f"20% better on goodput-per-gpu is within the combined uncertainty {_bar():.0%}" in msg
    assert msg.count("[") == 4 and "before 20.0 [" in msg and "after 16.7 [" in msg and "nothing changes" in msg
    assert "; nominal 80% intervals TTFT [" in msg and "TPOT [" not in msg   # TPOT's are the gate's, quoted once


def test_the_gate_is_the_spec_policy_s():
    assert policy_from_spec(PolicySpec(gainWithinError=True)).error_gate
    assert not policy_from_spec(PolicySpec()).error_gate


def test_after_a_move_the_measured_result_is_judged_in_status_and_a_miss_raises_the_next_bar():
    from servingtopology.operator.replan import after_transition

    gain = 2 * _bar()
    planner = _gainful_planner(gain)
    started = next(o for o in _gated(gain) if o.verdict is Verdict.TRANSITION)
    move = started.memory.move
    assert move is not None and move["layout"] == "2×TP1" and move["tpotMs"]["low"] < move["tpotMs"]["value"] < move["tpotMs"]["high"]
    mem = after_transition(started.memory, now_s=1000.0)
    pol = replace(policy(Mode.AUTO, enter_shift=0.1), error_gate=True)
    two = Layout.replicas(2, Parallelism())
    outs = []
    for i in range(1, 9):   # the new layout runs at 2.5 times the TPOT predicted for it (judged on 3 intervals after it settled)
        out = replan(problem=PROBLEM, current=two, memory=mem, sample=sample(1000.0 + 60.0 * i, rate=4.6, tpot_ms=2.5 * move["tpotMs"]["value"]),
                     metrics_error=None, policy=pol, now_s=1000.0 + 60.0 * i, planner=planner, predict=_predict_knobs(planner),
                     at="2026-12-03T12:00:00Z")
        mem = out.memory
        outs.append(out)
    judged = [e for o in outs for e in o.events if e.reason in ("PredictionHit", "PredictionMissed")]
    assert [e.reason for e in judged] == ["PredictionMissed"]
    assert "outside the interval" in judged[0].message and "+150%" in judged[0].message
    assert mem.misses == 1 and mem.move is not None and mem.move["hit"] is False
    back = ReplanMemory.from_dict(json.loads(json.dumps(mem.to_dict())))
    assert back.misses == 1 and back.move == mem.move
    # The recorded miss widens the intervals of the next decision: a gain that cleared the bar before no longer does.
    from servingtopology.planner.live.replan_decision import error_gate

    c1 = fake_predict(PROBLEM, ONE)
    c2 = planner(replace(PROBLEM, current=ONE)).best
    assert error_gate(PROBLEM, c1, c2, misses=pol.error_misses).move
    assert not error_gate(PROBLEM, c1, c2, misses=pol.error_misses + back.misses + 1).move
