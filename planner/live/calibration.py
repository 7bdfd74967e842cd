"""The operator's own calibration of a running deployment (issue #27): the TTFT and TPOT it measures at the observed load
become points of planner.perf.deployment_fit, fitted into the bounded factors a Problem carries (`Problem.factors`).

Called by the replan loop (planner/live/loop.py `step`) once per steady replan interval (`add_point`, then `refit`); its state is a small frozen
value the operator keeps in status.replan.calibration and shows as status.calibration. Pure: time is an argument, the
predictor of a point is given (the analytical model by default, as the operator predicts the running layout).

Rules it names:
- MinimumPoints: nothing is fitted on fewer than MIN_LIVE_POINTS points (state Collecting, no factors applied); the fit
  itself refuses fewer (deployment_fit `TooFewPoints`).
- BoundedPoints: at most MAX_LIVE_POINTS points are kept, the newest; a point older than MAX_AGE_S is dropped.
- AgeDecay: a point weighs half as much every HALF_LIFE_S (deployment_fit.age_weights).
- NarrowMeasuredOnly: the fit's residuals narrow the intervals of the layouts it has points of only
  (`as_deployment_calibration`).
- BoundedFactors: every factor within deployment_fit's [1 / MAX_FACTOR, MAX_FACTOR] (a correction, not a refit), and
  only LIVE_TERMS fitted.
The measured figures are the SLO percentiles the operator reads (status.observed), predicted at those percentiles.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servingtopology.planner.layout import Engine, Layout
from servingtopology.planner.perf.deployment_fit import (
    MAX_FACTOR,
    TERMS,
    Deployment,
    DeploymentCalibration,
    Point,
    Source,
    fit,
)
from servingtopology.planner.perf.deployment_fit import problem_factors as apply_factors
from servingtopology.planner.perf.predict import delivery_ms, predict_figures
from servingtopology.planner.problem import Problem
from servingtopology.planner.workload import Workload

__all__ = ["LIVE_TERMS", "MIN_LIVE_POINTS", "MAX_LIVE_POINTS", "HALF_LIFE_S", "MAX_AGE_S", "CalibrationState", "LivePoint", "LiveFit",
           "LiveCalibration", "PointPredictor", "analytic_point", "add_point", "refit", "fit_points", "combined",
           "deployment_of", "as_deployment_calibration", "residual_percent"]

MIN_LIVE_POINTS = 3          # MinimumPoints: steady intervals measured before anything is fitted
MAX_LIVE_POINTS = 8          # BoundedPoints: the newest kept (a refit costs about 100 analytical predictions per point)
HALF_LIFE_S = 3600.0         # AgeDecay: an hour-old interval weighs half as much as the latest
MAX_AGE_S = 24 * 3600.0      # BoundedPoints: older points are dropped

# LiveTerms: what a few steady intervals of one or two layouts can tell apart: the prefill's compute (gemm), the decode's
# weight streaming (weights), the request's fixed first-token overhead and the queueing delay. The other terms
# (attention, communication, per-step overhead, per-prompt-token overhead) stay as modelled: over so few points of
# so few layouts they would trade against these and run to their bounds.
LIVE_TERMS: tuple[str, ...] = ("gemm", "weights", "request_overhead", "queueing")

PointPredictor = Callable[[Problem, Layout], tuple[float, float]]


class CalibrationState(enum.StrEnum):
    COLLECTING = "Collecting"   # fewer points than MIN_LIVE_POINTS: the model's own figures are used
    APPLIED = "Applied"         # fitted: every replan predicts with the factors


@dataclass(frozen=True, slots=True)
class LivePoint:
    """One steady replan interval: the running layout, the observed workload, TTFT and TPOT measured at the SLO
    percentiles (ms), and when (s)."""

    at_s: float
    layout: Layout
    workload: Workload
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True, slots=True)
class LiveFit:
    """The last fit: factors per term (deployment_fit.TERMS), the age-weighted RMS log error per metric before and after,
    the deployment's own 80 % half-width per metric (log), the terms at their bound, when and on how many points."""

    factors: Mapping[str, float]
    residual_before: Mapping[str, float]
    residual_after: Mapping[str, float]
    own_half_width: Mapping[str, float]
    at_bound: tuple[str, ...]
    fitted_at_s: float
    points_used: int


@dataclass(frozen=True, slots=True)
class LiveCalibration:
    points: tuple[LivePoint, ...] = ()
    fit: LiveFit | None = None
    min_points: int = MIN_LIVE_POINTS

    @property
    def state(self) -> CalibrationState:
        return CalibrationState.APPLIED if self.fit is not None else CalibrationState.COLLECTING

    @property
    def factors(self) -> tuple[tuple[str, float], ...]:
        """What a Problem carries (`Problem.factors`): the fitted factors that are not 1, () while collecting."""
        if self.fit is None:
            return ()
        return tuple((t, round(float(f), 6)) for t, f in sorted(self.fit.factors.items()) if round(float(f), 6) != 1.0)

    def message(self) -> str:
        if self.fit is None:
            return (f"collecting: {len(self.points)} of the {self.min_points} steady intervals needed before a correction is "
                    "fitted; predictions are the model's own")
        f = self.fit
        moved = ", ".join(f"{t} ×{v:.2f}" for t, v in sorted(f.factors.items()) if abs(v - 1.0) >= 0.005) or "no term moved"
        return (f"fitted on {f.points_used} steady intervals (minimum {self.min_points}): {moved}; residual TTFT "
                f"{_pct(f.residual_before['ttft'])} → {_pct(f.residual_after['ttft'])}, TPOT {_pct(f.residual_before['tpot'])} → "
                f"{_pct(f.residual_after['tpot'])}" + (f"; at the ×{MAX_FACTOR:g} bound: {', '.join(f.at_bound)}" if f.at_bound else ""))


def _pct(log_error: float) -> str:
    return f"{math.expm1(log_error) * 100:.0f} %"


def analytic_point(problem: Problem, layout: Layout) -> tuple[float, float]:
    """The analytical TTFT and TPOT (ms, at the SLO percentiles) of `layout` at the problem's load, with its factors, as
    the engine's own metrics count them: its TTFT histogram is taken before the first token's delivery to the client
    (`Prediction.engine_ttft_ms`, the figure status.observed sets beside the measured one)."""
    with apply_factors(problem.factors):
        f = predict_figures(problem, [layout], [float(problem.workload.arrival_rate_rps or 0.0)])
        ttft_ms = float(f.ttft_s[0]) * 1e3 - delivery_ms(layout, float(f.tpot_mean_s[0]))
    return ttft_ms, float(f.tpot_s[0]) * 1e3


def add_point(cal: LiveCalibration, point: LivePoint) -> LiveCalibration:
    """The calibration with `point` added (BoundedPoints: the newest MAX_LIVE_POINTS within MAX_AGE_S of it kept); a point
    whose figures are not positive and finite is not added."""
    w = point.workload
    figures = (point.ttft_ms, point.tpot_ms, w.arrival_rate_rps or 0.0, w.input_tokens.expected_tokens, w.output_tokens.expected_tokens)
    if not all(math.isfinite(x) and x > 0 for x in figures):
        return cal
    kept = tuple(p for p in cal.points if point.at_s - p.at_s <= MAX_AGE_S)
    return replace(cal, points=(*kept, point)[-MAX_LIVE_POINTS:])


def combined(base: Sequence[tuple[str, float]], live: Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """StartsFromSpec: the factors a replan predicts with: the spec's (`base`) times the live fit's, term by term (each
    bounded by its own fit, so the product is within [1 / MAX_FACTOR², MAX_FACTOR²]); terms at 1 left out."""
    out = dict(base)
    for t, f in live:
        out[t] = out.get(t, 1.0) * f
    return tuple((t, round(float(f), 6)) for t, f in sorted(out.items()) if round(float(f), 6) != 1.0)


def deployment_of(problem: Problem) -> Deployment:
    return Deployment(problem.model.name, problem.gpu.id, problem.engine.value, problem.engine_version,
                      problem.gpu.scaleup_link.value)


def _fit_points(points: Sequence[LivePoint], now_s: float, engine: Engine, source: str = "operator") -> list[Point]:
    """The points as deployment_fit reads them, each row naming its layout in `engine`'s words (Layout.label_for)."""
    return [Point(p.ttft_ms, p.tpot_ms, float(p.workload.arrival_rate_rps or 0.0), "rate", p.workload.input_tokens.expected_tokens,
                  p.workload.output_tokens.expected_tokens, 1, age_s=max(now_s - p.at_s, 0.0), source=source,
                  row=f"{p.layout.label_for(engine)} at {p.at_s:.0f} s") for p in points]


def refit(cal: LiveCalibration, problem: Problem, *, now_s: float, predict: PointPredictor = analytic_point) -> LiveCalibration:
    """Fit the factors to the points (MinimumPoints: none below `min_points`, the fit dropped). `problem` is the spec's
    (model, GPU, engine); each point is predicted at its own workload and layout. StartsFromSpec: the problem's own
    factors (a `calibrate` file the spec names) are the base the live factors multiply (`combined`), so a deployment
    calibrated by its users' benchmark client starts from that, and its live points correct what is left."""
    if len(cal.points) < cal.min_points:
        return replace(cal, fit=None)
    dc = fit_points(cal.points, problem, deployment=deployment_of(problem), now_s=now_s, min_points=cal.min_points, predict=predict)
    return replace(cal, fit=LiveFit({t: float(dc.factors.get(t, 1.0)) for t in TERMS}, dict(dc.residual_before),
                                    dict(dc.residual_after), dict(dc.own_half_width), dc.at_bound, now_s, len(cal.points)))


def fit_points(points: Sequence[LivePoint], problem: Problem, *, deployment: Deployment, now_s: float,
               half_life_s: float = HALF_LIFE_S, min_points: int = MIN_LIVE_POINTS, predict: PointPredictor = analytic_point,
               sources: Sequence[Source] = (), source: str = "operator") -> DeploymentCalibration:
    """The bounded LIVE_TERMS factors that make `predict` reproduce `points`, each at its own workload and layout, on
    top of the problem's own factors (StartsFromSpec): the operator's refit, and `calibrate --prometheus` on a
    deployment's history (AgeDecay with its own `half_life_s`; `source` names where the points came from).
    Raises deployment_fit's refusals (TooFewPoints, NonFinite)."""
    base = replace(problem, current=None, pinned=None)

    def predict_all(factors: Mapping[str, float]) -> Any:
        trial = combined(problem.factors, tuple((t, float(f)) for t, f in factors.items()))
        return np.array([predict(replace(base, workload=p.workload, factors=trial), p.layout) for p in points], dtype=float)

    return fit(deployment, _fit_points(points, now_s, problem.engine, source), predict_all, half_life_s=half_life_s, min_points=min_points,
               terms=LIVE_TERMS, sources=sources)


def as_deployment_calibration(cal: LiveCalibration, problem: Problem, *, now_s: float,
                              layout: Layout | None = None) -> DeploymentCalibration | None:
    """The fit as a DeploymentCalibration (planner.live.error_bars narrows an interval with it); None while collecting.

    NarrowMeasuredOnly: with `layout`, None as well when no point measured that layout: the deployment's own residuals
    say how well the model fits the layouts it ran, not one it never ran (a move's target keeps its class's interval)."""
    f = cal.fit
    if f is None or (layout is not None and all(p.layout != layout for p in cal.points)):
        return None
    return DeploymentCalibration(deployment_of(problem), dict(f.factors), tuple(_fit_points(cal.points, now_s, problem.engine)), cal.min_points, HALF_LIFE_S,
                                 dict(f.residual_before), dict(f.residual_after), dict(f.own_half_width), f.at_bound)


def residual_percent(log_errors: Mapping[str, float], metrics: Sequence[str] = ("ttft", "tpot")) -> dict[str, float]:
    """RMS log errors as the percentages people read (e^x − 1)."""
    return {m: round(math.expm1(float(log_errors[m])) * 100.0, 1) for m in metrics if m in log_errors}
