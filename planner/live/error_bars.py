"""Error bars: the interval every prediction carries, from the model's measured error on its class (issue #27).

The class of a prediction is (engine, layout kind, load bucket). Its nominal 80 % interval is symmetric in log terms:
[value / e^h, value · e^h]. Each class of data/prediction_intervals.json holds its rows and the 80th percentile q of
|log(measured / predicted)| over its leave-one-model-out rows (benchmarks/interval_coverage.py writes the table with its
provenance). h follows the chain all → engine → engine/kind → engine/kind/bucket, each step pooling the class's own q
with its parent's h as if the parent were PRIOR_ROWS rows: h² = (n·q² + PRIOR_ROWS·h_parent²) / (n + PRIOR_ROWS). So a
class of few rows moves h towards its own error in proportion to its rows instead of being ignored below a cut-off (the
4 PD rows of SGLang's other families said PD errs widely; the old cut-off dropped them, and a DeepSeek PD row got the
error of aggregated TP rows). h is at least the engine's (a class of few rows, or of one family, under-states the error
of a model it never saw); an engine with no rows uses every row. Once a deployment is calibrated (planner.perf.deployment_fit),
h is narrowed towards that deployment's own residual, as if the class were K_PRIOR points and the deployment its n
points: h² = (K·h_class² + n·h_own²) / (K + n), then multiplied by the deployment's widening for repeated misses. Pure
(reads package data only).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from servingtopology.planner.layout import Layout, LayoutKind
from servingtopology.planner.perf.deployment_fit import DeploymentCalibration
from servingtopology.planner.problem import Problem

__all__ = ["LEVEL", "PRIOR_ROWS", "K_PRIOR", "Interval", "interval", "half_width", "layout_kind", "client_bucket", "table",
           "combined_uncertainty", "figure_intervals", "widened"]

LEVEL = 0.8
PRIOR_ROWS = 30
K_PRIOR = 4.0
_CLIENT_BUCKETS = ((16, "1-16"), (64, "17-64"), (256, "65-256"))


def client_bucket(clients: float) -> str:
    """The load bucket of a prediction or a benchmark row: concurrent requests (clients), as lomo_decisions.py buckets them."""
    for hi, name in _CLIENT_BUCKETS:
        if clients <= hi:
            return name
    return ">256"


def layout_kind(layout: Layout) -> str:
    """The layout kind of the residual table: pd, dp-attention, tp+ep, tp (tp·pp > 1) or single-gpu (of the decode or
    aggregated role)."""
    if layout.kind is LayoutKind.PD:
        return "pd"
    par = next(iter(layout.roles.values())).parallelism
    if par.dp > 1:
        return "dp-attention"
    if par.ep:
        return "tp+ep"
    return "tp" if par.tp * par.pp > 1 else "single-gpu"


@cache
def table() -> dict[str, Any]:
    """data/prediction_intervals.json (empty when absent: every interval is then unknown)."""
    path = resources.files("servingtopology.planner").joinpath("data/prediction_intervals.json")
    if not path.is_file():
        return {}
    raw: dict[str, Any] = json.loads(path.read_text())
    return raw


def half_width(metric: str, *, engine: str, kind: str, clients: float, data: dict[str, Any] | None = None) -> tuple[float, str, int]:
    """(h, the finest class that took part, its rows) for `metric` ("ttft" or "tpot"); h = nan when the table has nothing.

    h² = (n·q² + PRIOR_ROWS·h_parent²) / (n + PRIOR_ROWS) down the chain all → engine → engine/kind → engine/kind/bucket
    (a class absent from the table leaves h as it is; the first present starts at its own q), then at least the engine's
    h."""
    classes = (data if data is not None else table()).get("classes", {})
    h, key, rows, engine_h = math.nan, "none", 0, 0.0
    for k in ("all", engine, f"{engine}/{kind}", f"{engine}/{kind}/{client_bucket(clients)}"):
        c = classes.get(k)
        if c is None:
            continue
        n, q = int(c["rows"]), float(c[metric])
        h = q if math.isnan(h) else math.sqrt((n * q * q + PRIOR_ROWS * h * h) / (n + PRIOR_ROWS))
        key, rows = k, n
        if k == engine:
            engine_h = h
    return max(h, engine_h) if not math.isnan(h) else h, key, rows


@dataclass(frozen=True, slots=True)
class Interval:
    """A prediction and its nominal LEVEL interval (ms), the class it came from and whether a deployment's own points
    narrowed it."""

    value: float
    low: float
    high: float
    half_width_log: float
    class_key: str
    rows: int
    calibrated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"value": round(self.value, 3), "low": round(self.low, 3), "high": round(self.high, 3), "level": LEVEL,
                "class": self.class_key, "rows": self.rows, "calibrated": self.calibrated}

    def text(self) -> str:
        return f"{self.value:.1f} [{self.low:.1f}–{self.high:.1f}]"


def interval(metric: str, value: float, *, engine: str, kind: str, clients: float,
             calibration: DeploymentCalibration | None = None, data: dict[str, Any] | None = None) -> Interval:
    """The nominal 80 % interval of a predicted `metric` ("ttft" or "tpot") of `value` ms."""
    h, key, rows = half_width(metric, engine=engine, kind=kind, clients=clients, data=data)
    calibrated = False
    if calibration is not None and math.isfinite(h):
        n = calibration.points_used
        own = float(calibration.own_half_width.get(metric, h))
        h = math.sqrt((K_PRIOR * h * h + n * own * own) / (K_PRIOR + n)) * calibration.widening
        calibrated = True
    if not math.isfinite(h) or not math.isfinite(value):
        return Interval(value, math.nan, math.nan, math.nan, key, rows, calibrated)
    return Interval(value, value * math.exp(-h), value * math.exp(h), h, key, rows, calibrated)


def figure_intervals(problem: Problem, layout: Layout, *, ttft_ms: float, tpot_ms: float,
                     calibration: DeploymentCalibration | None = None) -> dict[str, Interval]:
    """The nominal 80 % intervals of a layout's predicted TTFT and TPOT (ms) at the problem's load ("ttft", "tpot"): the
    class's load bucket from the concurrent requests (the problem's clients, or by Little's law its rate times a
    request's predicted latency). What `plan`, `simulate`, the operator's Events, its proposal and its error gate show."""
    rate = problem.workload.arrival_rate_rps
    if rate is None and problem.workload.concurrency:
        clients = float(problem.workload.concurrency)
    else:
        clients = (rate or 1.0) * (ttft_ms + problem.workload.output_tokens.expected_tokens * tpot_ms) / 1e3
    clients = max(clients, 1.0) if math.isfinite(clients) else 1.0
    kind = layout_kind(layout)
    return {m: interval(m, v, engine=problem.engine.value, kind=kind, clients=clients, calibration=calibration)
            for m, v in (("ttft", ttft_ms), ("tpot", tpot_ms))}


def widened(iv: Interval, factor: float) -> Interval:
    """The interval with its log half-width multiplied by `factor` (a deployment's missed moves, error_gate.widening)."""
    if factor == 1.0 or not math.isfinite(iv.half_width_log):
        return iv
    h = iv.half_width_log * factor
    return Interval(iv.value, iv.value * math.exp(-h), iv.value * math.exp(h), h, iv.class_key, iv.rows, iv.calibrated)


def combined_uncertainty(before_half_log: float, after_half_log: float) -> float:
    """The relative gain an after-prediction must show over a before-prediction to lie outside both intervals'
    combined error (independent errors: the log half-widths add in quadrature), as a fraction (0.2 = 20 %)."""
    return math.expm1(math.hypot(before_half_log, after_half_log))
