"""planner.perf.deployment_fit / deployment_points / error_bars: a deployment's bounded correction and its intervals (issue #27)."""

from __future__ import annotations

import math

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.fidelity.deployment_points import closed_loop_fn, predictor
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism
from servingtopology.planner.live import error_bars
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.deployment_fit import (
    MAX_FACTOR,
    CalibrationRefused,
    Deployment,
    DeploymentCalibration,
    Point,
    age_weights,
    fit,
    refuse_other,
    with_factors,
)
from servingtopology.planner.perf.step import perf_params, step_time_s

MODEL = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
GPU = resolve_gpu("h100")
LAYOUT = Layout.replicas(1, Parallelism(tp=1), EngineKnobs(), Precision.BF16)
DEP = Deployment(MODEL.name, GPU.id, "vllm", "0.11.0", "nvlink", LAYOUT.label)


def _measured(truth: dict[str, float], clients: tuple[int, ...] = (4, 16, 64)) -> list[Point]:
    """Points 'measured' on a deployment whose terms really are `truth` × the model's."""
    out = []
    for n in clients:
        probe = Point(1.0, 1.0, n, "concurrency", 1000, 200, 10 * n)
        with with_factors(truth):
            ttft, tpot = closed_loop_fn(probe, model=MODEL, gpu=GPU, engine=Engine.VLLM, layout=LAYOUT)()
        out.append(Point(ttft, tpot, n, "concurrency", 1000, 200, 10 * n, source="synthetic", row=f"clients={n}"))
    return out


def _fns(points: list[Point]) -> list:  # type: ignore[type-arg]
    return [closed_loop_fn(p, model=MODEL, gpu=GPU, engine=Engine.VLLM, layout=LAYOUT) for p in points]


def test_step_terms_scale_the_step_time_and_nothing_else_when_one() -> None:
    kw = dict(precision=Precision.BF16, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1, pp=1, dp=1, prefill_tokens=0.0,
              prefill_pairs=0.0, decode_tokens=32.0, decode_context_tokens=32 * 1500.0)
    base = float(step_time_s(MODEL, GPU, **kw))  # type: ignore[arg-type]
    with with_factors({t: 1.0 for t in ("gemm", "weights", "attention", "communication", "overhead")}):
        same = float(step_time_s(MODEL, GPU, **kw))  # type: ignore[arg-type]
    with with_factors({"weights": 1.5, "attention": 1.5, "overhead": 1.5, "gemm": 1.5}):
        slower = float(step_time_s(MODEL, GPU, **kw))  # type: ignore[arg-type]
    assert same == base
    assert slower == pytest.approx(1.5 * base, rel=1e-6)
    before = perf_params().ttft_overhead_s
    with with_factors({"request_overhead": 2.0}) as p:
        assert p.ttft_overhead_s == pytest.approx(2.0 * before) and perf_params() is p
    assert perf_params().ttft_overhead_s == before  # restored on leaving


def test_fit_brings_the_model_onto_a_deployment_that_differs_from_it() -> None:
    points = _measured({"overhead": 1.3, "gemm": 1.15, "request_overhead": 1.5})
    cal = fit(DEP, points, predictor(_fns(points)))
    assert cal.residual_before["ttft"] > 0.05 and cal.residual_before["tpot"] > 0.05
    assert cal.residual_after["ttft"] < 0.02 and cal.residual_after["tpot"] < 0.02
    assert cal.points_used == 3 and not cal.at_bound
    assert all(1 / MAX_FACTOR <= f <= MAX_FACTOR for f in cal.factors.values())
    # A load level the fit did not see is predicted as the deployment runs, not as the model did.
    held = _measured({"overhead": 1.3, "gemm": 1.15, "request_overhead": 1.5}, clients=(32,))[0]
    raw = closed_loop_fn(held, model=MODEL, gpu=GPU, engine=Engine.VLLM, layout=LAYOUT)()
    with cal.applied():
        calibrated = closed_loop_fn(held, model=MODEL, gpu=GPU, engine=Engine.VLLM, layout=LAYOUT)()
    assert abs(calibrated[1] / held.tpot_ms - 1) < 0.02 < abs(raw[1] / held.tpot_ms - 1)
    assert abs(calibrated[0] / held.ttft_ms - 1) < abs(raw[0] / held.ttft_ms - 1)


def test_factors_stay_within_their_bound_and_say_so() -> None:
    points = _measured({"weights": 2.0, "gemm": 2.0, "attention": 2.0, "overhead": 2.0})
    points = [Point(p.ttft_ms * 3, p.tpot_ms * 3, p.load, p.load_kind, p.input_tokens, p.output_tokens, p.requests) for p in points]
    cal = fit(DEP, points, predictor(_fns(points)))
    assert cal.at_bound
    assert max(cal.factors.values()) <= MAX_FACTOR + 1e-9


def test_refusals_are_named() -> None:
    one = _measured({}, clients=(8,))
    with pytest.raises(CalibrationRefused) as exc:
        fit(DEP, one, predictor(_fns(one)))
    assert exc.value.reason == "TooFewPoints"
    assert f"{len(one)} measured point; at least" in str(exc.value)   # read '1 measured points'
    bad = [*one, Point(math.nan, 10.0, 16, "concurrency", 1000, 200, 160)]
    with pytest.raises(CalibrationRefused) as exc:
        fit(DEP, bad, predictor(_fns(one)))
    assert exc.value.reason == "NonFinite" and "ttft_ms" in exc.value.field
    with pytest.raises(CalibrationRefused) as exc:
        refuse_other(DEP, Deployment("Qwen/Qwen3-32B", "", ""), field="result.json model_id")
    assert exc.value.reason == "OtherModel"
    with pytest.raises(CalibrationRefused) as exc:
        refuse_other(DEP, Deployment("Llama-3.1-8B-Instruct", "a100_sxm", "vllm"), field="meta.json hardware")
    assert exc.value.reason == "OtherGpu"
    with pytest.raises(CalibrationRefused) as exc:
        refuse_other(DEP, Deployment("", "", "sglang"), field="x")
    assert exc.value.reason == "OtherEngine"
    refuse_other(DEP, Deployment("meta-llama/Llama-3.1-8B-Instruct", "", ""), field="x")  # unknown fields match


def test_old_points_weigh_less() -> None:
    pts = [Point(1, 1, 1, "rate", 1, 1, 1, age_s=0.0), Point(1, 1, 1, "rate", 1, 1, 1, age_s=3600.0)]
    assert list(age_weights(pts, 3600.0)) == [1.0, 0.5]
    # The fit follows the recent point where two disagree.
    recent, old = _measured({"overhead": 1.4}, clients=(8, 32)), _measured({"overhead": 0.7}, clients=(8, 32))
    aged = [*recent, *(Point(p.ttft_ms, p.tpot_ms, p.load, p.load_kind, p.input_tokens, p.output_tokens, p.requests,
                             age_s=30 * 86400.0) for p in old)]
    cal = fit(DEP, aged, predictor(_fns(aged)), half_life_s=86400.0)

    def slowdown(c) -> float:  # what the fitted factors make of the step (most of it overhead and weight streaming)
        return math.log(c.factors["overhead"] * c.factors["weights"] * c.factors["gemm"])

    alone = {name: fit(DEP, pts, predictor(_fns(pts))) for name, pts in (("recent", recent), ("old", old))}
    assert slowdown(alone["recent"]) > 0.05 and slowdown(alone["old"]) < -0.05
    # A month old at a day's half-life: the fit is the recent points' own, not a compromise between the two.
    assert abs(slowdown(cal) - slowdown(alone["recent"])) < 0.1 * abs(slowdown(cal) - slowdown(alone["old"]))


def test_a_calibration_round_trips_and_bad_files_name_the_field() -> None:
    points = _measured({"overhead": 1.2})
    cal = fit(DEP, points, predictor(_fns(points)))
    back = DeploymentCalibration.from_dict(cal.to_dict())
    assert back.factors == pytest.approx(cal.factors, rel=1e-3)
    assert back.deployment == cal.deployment and back.points_used == 3
    raw = cal.to_dict()
    raw["factors"]["gemm"] = 9.0
    with pytest.raises(Exception) as exc:
        DeploymentCalibration.from_dict(raw)
    assert "factors.gemm" in str(exc.value)
    raw = cal.to_dict()
    raw["fit"]["points_used"] = 1
    with pytest.raises(CalibrationRefused) as exc2:
        DeploymentCalibration.from_dict(raw)
    assert exc2.value.reason == "TooFewPoints"


def _pooled(n: int, q: float, parent_h: float) -> float:
    """A class of n rows and 80th percentile q pooled with its parent's h counted as PRIOR_ROWS rows."""
    return math.sqrt((n * q * q + error_bars.PRIOR_ROWS * parent_h * parent_h) / (n + error_bars.PRIOR_ROWS))


def test_intervals_come_from_the_class_and_narrow_once_calibrated_and_widen_on_misses() -> None:
    data = {"classes": {"all": {"rows": 500, "ttft": 0.6, "tpot": 0.25}, "vllm": {"rows": 400, "ttft": 0.4, "tpot": 0.2},
                        "vllm/tp/1-16": {"rows": 50, "ttft": 0.5, "tpot": 0.1}, "vllm/single-gpu": {"rows": 10, "ttft": 0.9, "tpot": 0.9}}}
    engine_ttft, engine_tpot = _pooled(400, 0.4, 0.6), _pooled(400, 0.2, 0.25)
    iv = error_bars.interval("ttft", 100.0, engine="vllm", kind="tp", clients=8, data=data)
    h = _pooled(50, 0.5, engine_ttft)   # no vllm/tp class: the bucket pools with the engine's h
    assert iv.class_key == "vllm/tp/1-16" and iv.high == pytest.approx(100 * math.exp(h)) and iv.low == pytest.approx(100 * math.exp(-h))
    # Never narrower than the engine's own error.
    assert error_bars.interval("tpot", 10.0, engine="vllm", kind="tp", clients=8, data=data).half_width_log == pytest.approx(engine_tpot)
    # A class of few rows moves h towards its own error in proportion to its rows; it is not dropped below a cut-off.
    few = error_bars.interval("tpot", 10.0, engine="vllm", kind="single-gpu", clients=8, data=data)
    assert few.class_key == "vllm/single-gpu" and few.half_width_log == pytest.approx(_pooled(10, 0.9, engine_tpot))
    assert engine_tpot < few.half_width_log < 0.9
    more = {"classes": {**data["classes"], "vllm/single-gpu": {"rows": 100, "ttft": 0.9, "tpot": 0.9}}}
    assert few.half_width_log < error_bars.interval("tpot", 10.0, engine="vllm", kind="single-gpu", clients=8, data=more).half_width_log
    assert error_bars.interval("tpot", 10.0, engine="trtllm", kind="tp", clients=8, data=data).class_key == "all"
    assert math.isnan(error_bars.interval("tpot", 10.0, engine="vllm", kind="tp", clients=8, data={}).half_width_log)
    points = _measured({"overhead": 1.2})
    cal = fit(DEP, points, predictor(_fns(points)))
    narrowed = error_bars.interval("ttft", 100.0, engine="vllm", kind="tp", clients=8, calibration=cal, data=data)
    assert narrowed.calibrated and narrowed.half_width_log < iv.half_width_log
    missed = error_bars.interval("ttft", 100.0, engine="vllm", kind="tp", clients=8, calibration=cal.with_miss().with_miss(), data=data)
    assert missed.half_width_log == pytest.approx(narrowed.half_width_log * 1.5**2)
    assert error_bars.combined_uncertainty(0.3, 0.4) == pytest.approx(math.expm1(0.5))


def test_the_shipped_interval_table_has_both_engines_and_its_provenance() -> None:
    t = error_bars.table()
    assert {"vllm", "sglang", "all"} <= set(t["classes"])
    assert t["provenance"]["rows"] > 1000 and t["level"] == 0.8
    assert set(t["coverage_out_of_fold"]["by_engine"]) == {"vllm", "sglang"}


def test_a_gain_within_the_combined_error_moves_nothing_and_misses_raise_the_bar() -> None:
    from servingtopology.planner.live.error_gate import GAIN_WITHIN_ERROR, MOVE_MISS, gate_move, judge_move

    data = {"classes": {"vllm": {"rows": 400, "ttft": 0.4, "tpot": 0.2}}}
    before = error_bars.interval("tpot", 20.0, engine="vllm", kind="tp", clients=8, data=data)
    after = error_bars.interval("tpot", 16.0, engine="vllm", kind="tp", clients=8, data=data)
    needed = math.expm1(math.hypot(0.2, 0.2))   # 32.7 %
    small = gate_move(0.25, before, after, what="goodput per GPU")
    assert not small.move and small.reason == GAIN_WITHIN_ERROR and small.needed == pytest.approx(needed)
    assert "16.0 [" in small.message and "20.0 [" in small.message and "nothing changes" in small.message
    big = gate_move(0.40, before, after)
    assert big.move and big.reason == "GainExceedsError"
    # Two misses widen both intervals by 1.5² = 2.25: the same 40 % no longer clears the bar.
    raised = gate_move(0.40, before, after, misses=2)
    assert not raised.move and raised.needed == pytest.approx(math.expm1(math.hypot(0.45, 0.45)))
    hit = judge_move("p95 TPOT", 17.0, after)
    miss = judge_move("p95 TPOT", 30.0, after)
    assert hit.hit and not miss.hit and miss.reason == MOVE_MISS and miss.error == pytest.approx(30 / 16 - 1)
    assert "outside the interval" in miss.message


def test_a_point_whose_weight_underflows_leaves_the_residuals_finite() -> None:
    # 3e8 s is 3,472 one-day half-lives: its weight is 0.0 in floating point. Before, every residual was NaN (0 / 0).
    pts = [Point(100.0, 20.0, 1, "rate", 100, 10, 10, age_s=0.0), Point(110.0, 21.0, 2, "rate", 100, 10, 10, age_s=0.0),
           Point(120.0, 22.0, 3, "rate", 100, 10, 10, age_s=3e8)]

    def predict(f: dict[str, float]) -> list[list[float]]:
        return [[90.0 * f.get("overhead", 1.0), 18.0 * f.get("weights", 1.0)]] * 3
    cal = fit(DEP, pts, predict, half_life_s=86400.0, min_points=3)   # type: ignore[arg-type]
    for figures in (cal.residual_before, cal.residual_after, cal.own_half_width):
        assert all(math.isfinite(v) and v > 0 for v in figures.values()), figures
    # Points all equally old weigh alike (counted from the newest), not all 0 with a NaN sum.
    ancient = [Point(p.ttft_ms, p.tpot_ms, p.load, p.load_kind, p.input_tokens, p.output_tokens, p.requests, age_s=3e8) for p in pts]
    assert list(age_weights(ancient, 86400.0)) == [1.0, 1.0, 1.0]
    assert all(math.isfinite(v) for v in fit(DEP, ancient, predict, half_life_s=86400.0, min_points=3).residual_before.values())  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec):
        fit(DEP, pts, predict, half_life_s=math.nan, min_points=3)   # type: ignore[arg-type]
