"""Drift triggers (persistence, hysteresis, cooldown) and the minImprovement gate (the operator's calibration: test_live_calibration)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.layout import Engine, Layout, Parallelism
from servingtopology.planner.live.drift import (
    DriftPolicy,
    DriftState,
    Trigger,
    assess_drift,
    rebaseline,
    workload_shift,
    worth_switching,
)
from servingtopology.planner.live.observe import ObservedSlo
from servingtopology.planner.problem import Candidate, Prediction
from servingtopology.planner.workload import LengthDist, Objective, Slo, Workload

POLICY = DriftPolicy(persist_intervals=3, enter_shift=0.25, exit_shift=0.10, cooldown_s=600.0)
SLO = Slo(ttft_ms=1000.0, tpot_ms=50.0)
ASSUMED = Workload(LengthDist.fixed(1000), LengthDist.fixed(200), arrival_rate_rps=4.0, prefix_share=0.2)


def wl(rate: float = 1.0, inp: float = 1.0, out: float = 1.0, prefix: float = 0.0) -> Workload:
    """The assumed workload scaled by the given factors (prefix: added to the share)."""
    return Workload(LengthDist.fixed(round(1000 * inp)), LengthDist.fixed(round(200 * out)), arrival_rate_rps=4.0 * rate,
                    prefix_share=min(max(0.2 + prefix, 0.0), 1.0))


def slo_at(ratio: float) -> ObservedSlo:
    return ObservedSlo(ttft_ms=SLO.ttft_ms * ratio, tpot_ms=SLO.tpot_ms * ratio, e2e_ms=None, samples=3)


def run(series, *, state=None, t0: float = 0.0, dt: float = 60.0, capacity: float | None = 100.0, confidence: float = 0.9):
    """Feed (workload, slo ratio) intervals; return the verdicts."""
    state = state or DriftState()
    out = []
    for i, (w, ratio) in enumerate(series):
        v = assess_drift(state, shift=workload_shift(ASSUMED, w), observed_slo=slo_at(ratio), slo=SLO,
                         observed_rate_rps=w.arrival_rate_rps or 0.0, capacity_rps=capacity, confidence=confidence,
                         now_s=t0 + i * dt, policy=POLICY)
        out.append(v)
        state = v.state
    return out


noise = st.floats(-0.15, 0.15)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(noise, noise, noise, st.floats(-0.05, 0.05), st.floats(0.3, 0.85)), min_size=10, max_size=60))
def test_noise_inside_the_enter_threshold_never_triggers_a_replan(series):
    verdicts = run([(wl(1 + a, 1 + b, 1 + c, d), r) for a, b, c, d, r in series])
    assert not any(v.replan for v in verdicts)
    assert not any(v.state.detected for v in verdicts)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), noise, st.floats(1.3, 3.0)), min_size=10, max_size=60))
def test_spikes_shorter_than_the_persistence_never_trigger_a_replan(raw):
    # Spikes (rate ×1.3..3 and latency over the SLO) in runs of at most two intervals.
    series, run_len = [], 0
    for spike, jitter, big in raw:
        spike = spike and run_len < POLICY.persist_intervals - 1
        run_len = run_len + 1 if spike else 0
        series.append((wl(big), 1.2) if spike else (wl(1 + jitter), 0.5))
    assert not any(v.replan for v in run(series))


@settings(max_examples=60, deadline=None)
@given(before=st.lists(noise, min_size=3, max_size=20), after=st.lists(noise, min_size=3, max_size=10),
       factor=st.sampled_from([0.5, 1.5, 2.0, 4.0]), which=st.sampled_from(["rate", "inp", "out"]))
def test_a_sustained_shift_triggers_once_it_has_lasted_the_persistence(before, after, factor, which):
    calm = [(wl(1 + n), 0.5) for n in before]
    shifted = [(wl(**{which: factor * (1 + n / 3)}), 0.5) for n in after]
    verdicts = run(calm + shifted)
    first = next(i for i, v in enumerate(verdicts) if v.replan)
    assert first == len(calm) + POLICY.persist_intervals - 1
    assert verdicts[first].state.trigger is Trigger.WORKLOAD_SHIFT


def test_a_latency_breach_and_an_overload_are_triggers_too():
    breach = run([(wl(), 1.2)] * 3)
    assert breach[-1].replan and breach[-1].state.trigger is Trigger.SLO_BREACH
    over = run([(wl(1.1), 0.5)] * 3, capacity=4.0)
    assert over[-1].replan and over[-1].state.trigger is Trigger.OVER_CAPACITY


def test_drift_detected_holds_in_the_hysteresis_band_and_clears_after_calm_intervals():
    verdicts = run([(wl(2.0), 0.5)] * 3 + [(wl(1.18), 0.5)] * 5 + [(wl(1.02), 0.5)] * 3)
    detected = [v.state.detected for v in verdicts]
    assert detected == [False, False, True] + [True] * 5 + [True, True, False]
    assert [v.replan for v in verdicts[3:]] == [False] * 8  # the band is not hot: no replans there


def test_after_a_change_the_cooldown_holds_off_new_replans():
    state = rebaseline(run([(wl(2.0), 0.5)] * 3)[-1].state, now_s=120.0, changed=True)
    assert state.streak == 0 and not state.detected and state.last_change_s == 120.0
    later = run([(wl(3.0), 0.5)] * 12, state=state, t0=180.0, dt=60.0)
    first = next(i for i, v in enumerate(later) if v.replan)
    assert 180.0 + first * 60.0 - 120.0 >= POLICY.cooldown_s
    assert "cooldown" in later[3].message


def test_intervals_with_low_confidence_are_not_counted():
    verdicts = run([(wl(2.0), 0.5)] * 5, confidence=0.2)
    assert not any(v.replan or v.hot for v in verdicts)
    assert verdicts[-1].state == DriftState()


def test_the_drift_state_survives_a_status_round_trip():
    state = run([(wl(2.0), 1.2)] * 4)[-1].state
    assert DriftState.from_dict(state.to_dict()) == state
    assert DriftState.from_dict({}) == DriftState()


def cand(n: int, per_gpu: float, meets: bool = True, tp: int = 1) -> Candidate:
    pred = Prediction(ttft_ms=100, tpot_ms=20, throughput_tok_s=1, capacity_rps=per_gpu * n * tp, goodput_rps=1, goodput_per_gpu=per_gpu,
                      tokens_per_s_per_user=50, kv_pool_tokens=1, max_request_tokens=1, meets_slo=meets)
    return Candidate(Layout.replicas(n, Parallelism(tp=tp)), pred, per_gpu)


# (current, best, objective, switch?) — one row per rule of the gate
GATE = [
    (None, cand(2, 1.0), Objective.GOODPUT_PER_GPU, True),                          # nothing runs yet
    (cand(2, 1.0), cand(2, 1.0), Objective.GOODPUT_PER_GPU, False),                 # already the best
    (cand(2, 1.0, meets=False), cand(4, 0.9), Objective.GOODPUT_PER_GPU, True),     # current misses the SLO
    (cand(2, 1.0, meets=False), cand(4, 0.9, meets=False), Objective.GOODPUT_PER_GPU, False),  # nothing meets it
    (cand(2, 1.0), cand(1, 1.05, tp=2), Objective.GOODPUT_PER_GPU, False),          # 5 % is under minImprovement
    (cand(2, 1.0), cand(1, 1.2, tp=2), Objective.GOODPUT_PER_GPU, True),            # 20 % is over it
    (cand(4, 1.0), cand(3, 1.0), Objective.MIN_GPUS, True),                         # a third fewer GPUs
    (cand(10, 1.0), cand(1, 1.0, tp=8), Objective.MIN_GPUS, True),                  # 10 → 8 GPUs is 25 %
    (cand(9, 1.0), cand(1, 1.0, tp=8), Objective.MIN_GPUS, False),                  # 9 → 8 GPUs is 12.5 % < 20 %
]


@pytest.mark.parametrize(("current", "best", "objective", "switch"), GATE)
def test_a_new_plan_must_beat_the_current_one_by_min_improvement(current, best, objective, switch):
    ok, why = worth_switching(current, best, objective=objective, min_improvement=0.2 if objective is Objective.MIN_GPUS else 0.1, engine=Engine.VLLM)
    assert ok is switch, why
    assert why


def test_shift_reports_its_dominant_part():
    s = workload_shift(ASSUMED, wl(inp=16.0))
    assert s.input_tokens == pytest.approx(15.0) and "prompt" in s.dominant
    assert math.isinf(workload_shift(Workload(LengthDist.fixed(10), LengthDist.fixed(10), arrival_rate_rps=0.0), ASSUMED).rate)


def test_a_fixed_prompt_read_through_1_2_5_histogram_buckets_is_not_a_tail_shift():
    from servingtopology.planner.live.observe import length_dist

    assumed = Workload(LengthDist.fixed(2048), LengthDist.fixed(256), arrival_rate_rps=4.0)
    # Every request 2,048 tokens: histogram_quantile(0.99) over the (2000, 5000] bucket reads 2000 + 0.99 x 3000.
    steady = Workload(length_dist(2048.0, 4970.0), length_dist(256.0, 495.0), arrival_rate_rps=4.0)
    shift = workload_shift(assumed, steady)
    assert shift.input_tail == 0.0 and shift.magnitude < POLICY.enter_shift, shift
    # A real rise of the tail (some prompts at 8k: p99 in the (5000, 10000] bucket) is still seen.
    longer = Workload(length_dist(2400.0, 9950.0), length_dist(256.0, 495.0), arrival_rate_rps=4.0)
    assert workload_shift(assumed, longer).input_tail > 2.0


def test_one_episode_gives_one_warning_even_while_queued_requests_drain_after_the_change():
    verdicts = run([(wl(3.0), 2.0)] * 3)
    assert [v.new_episode for v in verdicts] == [False, False, True]
    state = rebaseline(verdicts[-1].state, now_s=180.0, changed=True)
    # After the change the backlog drains: latency still over the SLO for a while, then calm.
    draining = run([(wl(1.0), 1.5)] * 4 + [(wl(1.0), 0.5)] * 3, state=state, t0=240.0)
    assert any(v.state.detected for v in draining[:4])
    assert not any(v.new_episode for v in draining)
    assert not draining[-1].state.episode
    # A later, separate drift is a new episode with its own Warning.
    again = run([(wl(3.0), 2.0)] * 3, state=draining[-1].state, t0=2000.0)
    assert [v.new_episode for v in again] == [False, False, True]
    assert DriftState.from_dict(again[-1].state.to_dict()) == again[-1].state


def test_figures_are_phrased_for_people_never_as_a_negative_better():
    ok, why = worth_switching(cand(2, 1.0), cand(1, 0.97, tp=2), objective=Objective.GOODPUT_PER_GPU, min_improvement=0.1, engine=Engine.VLLM)
    assert not ok and "3 % worse" in why and "-" not in why.replace("goodput-per-gpu", ""), why
    ok, why = worth_switching(cand(2, 1.0), cand(1, 1.05, tp=2), objective=Objective.GOODPUT_PER_GPU, min_improvement=0.1, engine=Engine.VLLM)
    assert not ok and "only 5 % better" in why, why
    assert workload_shift(ASSUMED, wl(rate=7.5)).dominant == "arrival rate 650 % higher"
    (v,) = run([(wl(1.0), 1.2)])
    assert "20 % over its SLO" in v.message, v.message


def test_a_long_predicted_ttft_is_said_to_be_queueing_in_the_change_message():
    from servingtopology.operator.api.resource import Predicted
    from servingtopology.operator.plan_status import queueing_note

    overloaded = Predicted(ttftMs=328_000.0, tpotMs=30.0, throughputTokS=1.0, capacityRps=12.0, goodputRps=1.0, meetsSlo=False)
    note = queueing_note(overloaded, load_rps=30.0, layout="1×TP1")
    assert note is not None and "1×TP1's TTFT of 328s is time spent queueing" in note and "12 req/s" in note and "30 req/s" in note
    assert queueing_note(overloaded, load_rps=10.0, layout="1×TP1") is None
