"""A deployment's metrics history: the operator's own queries asked as range queries, one MetricSample per step.

Called by servingtopology/cli/calibrate_prometheus.py (`calibrate --prometheus URL --since 24h`). The PromQL is
operator/live/metrics.py's `build_queries` (asked with a rate window of one step, so the steps' intervals do not
overlap), each value is read by its `figure_value` (units, NaNIsNoData, FigureRange), the HTTP is the bounded client's
(operator/live/prometheus_http.py `range_query`). Must not fit or decide anything.

Rules it names:
- FirstAnswerPerStep: as `PrometheusMetrics.fetch_sample` keeps a figure's first expression with a finite answer, each
  step keeps the first expression that has a finite value at that step (a release's old metric name fills the steps
  the new one lacks).
- OneSeriesPerFigure: every query aggregates to one series (sum, max, a quantile over `sum by (le)`); the first series
  of an answer is the figure, as the instant read takes the first sample.
- BoundedHistory: at most MAX_STEPS steps per query (Prometheus itself refuses over 11,000 points a series), each answer
  within the client's answer cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from servingtopology.operator.live.metrics import Query, figure_value
from servingtopology.planner.live.observe import MetricSample

__all__ = ["RangeClient", "fetch_history", "MAX_STEPS"]

MAX_STEPS = 2000


class RangeClient(Protocol):
    def range_query(self, query: str, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]: ...


def fetch_history(client: RangeClient, queries: Sequence[Query], *, start_s: float, end_s: float, step_s: float) -> list[MetricSample]:
    """One MetricSample per step from `start_s` to `end_s` that has any figure, oldest first, each over the `step_s`
    before it. ValueError when the range holds more than MAX_STEPS steps or is empty; whatever the client raises
    (PrometheusAnswerError) and MetricsUnavailable (FigureRange) otherwise."""
    if not (step_s > 0 and end_s > start_s):
        raise ValueError("the history needs a positive step and an end after its start")
    if (end_s - start_s) / step_s > MAX_STEPS:
        raise ValueError(f"{(end_s - start_s) / step_s:.0f} steps; at most {MAX_STEPS} (a longer step, or a shorter history)")
    figures: dict[float, dict[str, float]] = {}
    for query in queries:
        for expr in query.exprs:
            series = client.range_query(expr, start_s=start_s, end_s=end_s, step_s=step_s)
            if not series:
                continue
            for at, text in series[0]["values"]:      # OneSeriesPerFigure
                at_s = float(at)
                step = figures.setdefault(at_s, {})
                if query.figure.value in step:         # FirstAnswerPerStep
                    continue
                value = figure_value(text, query)
                if value is not None:
                    step[query.figure.value] = value
    return [MetricSample(at_s=at_s, interval_s=step_s, **values) for at_s, values in sorted(figures.items()) if values]
