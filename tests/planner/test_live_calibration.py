"""The operator's own calibration (planner/live/calibration.py): the minimum points, the bound on points and factors,
age decay, and the factors a Problem carries (applied once, per thread)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism
from servingtopology.planner.live.calibration import (
    HALF_LIFE_S,
    MAX_LIVE_POINTS,
    MIN_LIVE_POINTS,
    CalibrationState,
    LiveCalibration,
    LivePoint,
    add_point,
    analytic_point,
    as_deployment_calibration,
    combined,
    refit,
)
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.deployment_fit import MAX_FACTOR, problem_factors
from servingtopology.planner.perf.step import perf_params
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import predict_layout
from servingtopology.planner.workload import LengthDist, Slo, Workload

PROBLEM = Problem(model=resolve_model("llama-3.1-8b"), gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16,
                  max_gpus=8, workload=Workload(LengthDist.fixed(2048), LengthDist.fixed(256), arrival_rate_rps=28.0),
                  slo=Slo(ttft_ms=500.0, tpot_ms=40.0))
LAYOUT = Layout.replicas(2, Parallelism(pp=2))


def measured(rate: float, at_s: float, *, ttft_x: float, tpot_x: float) -> LivePoint:
    """A point measured `ttft_x` / `tpot_x` times the model's own figures at `rate`."""
    w = replace(PROBLEM.workload, arrival_rate_rps=rate)
    ttft, tpot = analytic_point(replace(PROBLEM, workload=w), LAYOUT)
    return LivePoint(at_s, LAYOUT, w, ttft * ttft_x, tpot * tpot_x)


def collect(n: int, *, ttft_x: float = 1.2, tpot_x: float = 1.3, step_s: float = 10.0) -> list[LiveCalibration]:
    cal, out = LiveCalibration(), []
    for i in range(n):
        cal = refit(add_point(cal, measured(24.0 + i, i * step_s, ttft_x=ttft_x, tpot_x=tpot_x)), PROBLEM, now_s=i * step_s)
        out.append(cal)
    return out


def test_nothing_is_fitted_below_the_minimum_points_then_the_fit_reproduces_the_measurements():
    cals = collect(MIN_LIVE_POINTS + 2)
    for cal in cals[:MIN_LIVE_POINTS - 1]:
        assert cal.state is CalibrationState.COLLECTING and cal.factors == () and cal.fit is None
        assert as_deployment_calibration(cal, PROBLEM, now_s=0.0) is None
    cal = cals[-1]
    assert cal.state is CalibrationState.APPLIED and cal.fit is not None and cal.fit.points_used == MIN_LIVE_POINTS + 2
    assert cal.fit.residual_before["tpot"] > 0.2 and cal.fit.residual_after["tpot"] < 0.03
    assert cal.fit.residual_after["ttft"] < 0.5 * cal.fit.residual_before["ttft"]
    # The calibrated model predicts the running layout about 30 % slower per token, as measured.
    raw = predict_layout(PROBLEM, LAYOUT).prediction
    calibrated = predict_layout(replace(PROBLEM, factors=cal.factors), LAYOUT).prediction
    assert calibrated.tpot_ms / raw.tpot_ms == pytest.approx(1.3, rel=0.03)
    assert calibrated.capacity_rps < raw.capacity_rps   # slower steps carry less: the factors act on the whole model
    dc = as_deployment_calibration(cal, PROBLEM, now_s=40.0)
    assert dc is not None and dc.points_used == MIN_LIVE_POINTS + 2 and dc.own_half_width["tpot"] < 0.1


def test_a_deployment_far_from_the_model_stops_at_the_factor_bound_and_says_so():
    cal = collect(4, tpot_x=10.0)[-1]
    assert cal.fit is not None and all(1.0 / MAX_FACTOR - 1e-9 <= f <= MAX_FACTOR + 1e-9 for f in cal.fit.factors.values())
    assert cal.fit.at_bound and "bound" in cal.message()


def test_only_the_newest_points_are_kept():
    cal = collect(MAX_LIVE_POINTS + 3)[-1]
    assert len(cal.points) == MAX_LIVE_POINTS and cal.points[0].at_s == 30.0


def test_old_points_weigh_less_than_new_ones():
    # Four points an old layout of the world measured 1.6× slow, then four measured as modelled: the fit follows the new.
    old = [measured(24.0 + i, i * 10.0, ttft_x=1.0, tpot_x=1.6) for i in range(4)]
    new = [measured(24.0 + i, 6 * HALF_LIFE_S + i * 10.0, ttft_x=1.0, tpot_x=1.0) for i in range(4)]
    cal = LiveCalibration()
    for p in (*old, *new):
        cal = add_point(cal, p)
    cal = refit(cal, PROBLEM, now_s=6 * HALF_LIFE_S + 40.0)
    tpot = predict_layout(replace(PROBLEM, factors=cal.factors), LAYOUT).prediction.tpot_ms
    assert tpot == pytest.approx(predict_layout(PROBLEM, LAYOUT).prediction.tpot_ms, rel=0.05)


def test_a_point_without_figures_is_not_added():
    point = measured(24.0, 0.0, ttft_x=1.0, tpot_x=1.0)
    assert add_point(LiveCalibration(), replace(point, tpot_ms=float("nan"))) == LiveCalibration()
    assert add_point(LiveCalibration(), replace(point, workload=replace(point.workload, arrival_rate_rps=0.0))) == LiveCalibration()


def test_a_problems_factors_apply_once_and_only_in_their_own_thread():
    factors = (("weights", 1.5),)
    base = perf_params()
    with problem_factors(factors):
        inner = perf_params()
        with problem_factors(factors):          # decide predicting its current layout: not applied twice
            assert perf_params() == inner
            assert predict_layout(replace(PROBLEM, factors=factors), LAYOUT) == predict_layout(replace(PROBLEM, factors=factors), LAYOUT)
        with pytest.raises(ValueError, match="compound"), problem_factors((("weights", 1.2),)):
            pass
        seen = []
        thread = threading.Thread(target=lambda: seen.append(analytic_point(PROBLEM, LAYOUT)))
        thread.start()
        thread.join()
    assert perf_params() == base
    assert seen == [analytic_point(PROBLEM, LAYOUT)]   # the other thread saw the model's own figures
    slow = analytic_point(replace(PROBLEM, factors=factors), LAYOUT)
    assert slow[1] > seen[0][1] * 1.1   # weight streaming is most of the measured GEMMs' decode time, not all the step's
    with pytest.raises(ValueError, match="unknown calibration terms"), problem_factors((("nic", 1.2),)):
        pass


def test_a_spec_calibration_is_the_base_the_live_fit_corrects():
    # StartsFromSpec: points measured as the spec's calibrated model predicts them leave nothing for the live fit.
    base = (("weights", 1.3),)
    calibrated = replace(PROBLEM, factors=base)
    cal = LiveCalibration()
    for i in range(4):
        w = replace(PROBLEM.workload, arrival_rate_rps=24.0 + i)
        ttft, tpot = analytic_point(replace(calibrated, workload=w), LAYOUT)
        cal = add_point(cal, LivePoint(i * 10.0, LAYOUT, w, ttft, tpot))
    cal = refit(cal, calibrated, now_s=40.0)
    assert cal.fit is not None and cal.fit.residual_before["tpot"] < 0.01
    assert all(abs(f - 1.0) < 0.02 for f in cal.fit.factors.values()), cal.fit.factors
    assert dict(combined(base, cal.factors)).get("weights") == pytest.approx(1.3, rel=0.02)
    # Without the base the same points need the weights term: what the spec's file said, found again.
    alone = refit(cal, PROBLEM, now_s=40.0)
    assert alone.fit is not None and alone.fit.factors["weights"] > 1.15
    assert combined((("weights", 1.3),), (("weights", 1 / 1.3), ("gemm", 1.1))) == (("gemm", 1.1),)
