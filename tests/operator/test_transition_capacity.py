"""OneCapacityModel: a transition a spec edit asks for is started on the capacity model every one of its steps is then
judged by (the spec's problem with the live calibration's factors, operator/replan.py `transition_problem`).

An e2e run found the split: a blocked Pinned move 4×TP1 → 2×TP2 (8192/1024 tokens, no surge) started once the measured
load fell to 2.75 req/s, judged without the live factors (2×TP1 carries 2.94 req/s), while every step was judged with
them (weights ×1.8: less than the floor), so it stalled at 3×TP1 until its ready timeout."""

from __future__ import annotations

import pytest

from servingtopology.operator.api.resource import Mode
from servingtopology.operator.replan import ReplanMemory, ReplanPolicy, transition_problem
from servingtopology.operator.rollout import start_for_change
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism
from servingtopology.planner.live.calibration import LiveCalibration, LiveFit
from servingtopology.planner.live.drift import DriftPolicy
from servingtopology.planner.live.replan_decision import capacity_of
from servingtopology.planner.live.transition import Budget, Phase, StartVerdict, run_ideal
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.problem import Problem
from servingtopology.planner.workload import LengthDist, Slo, Workload

CURRENT, TARGET = Layout.replicas(4, Parallelism()), Layout.replicas(2, Parallelism(tp=2))
POLICY = ReplanPolicy(mode=Mode.PINNED, interval_s=10.0, drift=DriftPolicy(persist_intervals=3, cooldown_s=10.0), max_surge_gpus=0)
# The factors that run's self-calibration had applied.
FIT = LiveFit(factors={"weights": 1.835, "gemm": 1.086}, residual_before={"ttft": 0.19, "tpot": 0.46},
              residual_after={"ttft": 0.06, "tpot": 0.09}, own_half_width={"ttft": 0.09, "tpot": 0.12}, at_bound=(),
              fitted_at_s=0.0, points_used=6)


def problem(rate_rps: float) -> Problem:
    return Problem(model=resolve_model("llama-3.1-8b"), gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16,
                   max_gpus=4, workload=Workload(LengthDist.fixed(8192), LengthDist.fixed(1024), arrival_rate_rps=rate_rps),
                   slo=Slo(ttft_ms=1000.0, tpot_ms=50.0))


@pytest.mark.parametrize("calibrated", [False, True])
@pytest.mark.parametrize("rate_rps", [2.0, 2.75, 3.0])
def test_a_started_change_can_finish_under_the_model_its_steps_are_judged_by(rate_rps: float, calibrated: bool) -> None:
    memory = ReplanMemory(calibration=LiveCalibration(fit=FIT)) if calibrated else ReplanMemory()
    spec = problem(rate_rps)
    started = start_for_change(memory, problem=spec, current=CURRENT, target=TARGET, running="s0", policy=POLICY, now_s=0.0)
    if not started.started:
        assert started.verdict is StartVerdict.FLOOR_WOULD_DROP, started.message
        return
    state = started.memory.transition
    assert state is not None
    steps = run_ideal(state, budget=Budget(max_gpus=4, surge_gpus=0, floor_rps=started.memory.transition_floor_rps),
                      capacity=capacity_of(transition_problem(started.memory, spec)), now_s=0.0)
    assert steps[-1].state.phase is Phase.DONE, [s.message for s in steps]


def test_the_calibrated_model_refuses_at_the_start_what_it_would_stall_on() -> None:
    # At 2.75 req/s the uncalibrated model keeps the floor (2×TP1 carries 2.94), the calibrated one does not.
    plain = start_for_change(ReplanMemory(), problem=problem(2.75), current=CURRENT, target=TARGET, running="s0", policy=POLICY, now_s=0.0)
    calibrated = start_for_change(ReplanMemory(calibration=LiveCalibration(fit=FIT)), problem=problem(2.75), current=CURRENT,
                                  target=TARGET, running="s0", policy=POLICY, now_s=0.0)
    assert plain.started and not calibrated.started
    assert calibrated.verdict is StartVerdict.FLOOR_WOULD_DROP and "keeps the serving floor of 2.75 req/s" in calibrated.message
