"""The operator's own Prometheus metrics: reconciles, plans, decisions, errors, applied objects, pass and plan time,
and per ServingTopology the plan (layout, P:D instances, GPUs), its predicted and measured TTFT/TPOT, the prediction
error and the transition phase, which the chart's Grafana dashboard draws.

Created once by operator/entry/main.py (one registry per operator process, served on its own port) and fed by the kopf
handlers after each reconcile (`observe`, then `record` with the status the pass staged). Not the engines' metrics
(those are read from Prometheus by the live-replanning code); this module never decides anything.

Per-resource series are labelled `topology_namespace` and `topology`, never `namespace`: a Prometheus scraping the
operator through a ServiceMonitor or pod annotations sets `namespace` to the operator pod's own namespace and would
rename ours to `exported_namespace`. The engines' series carry the resource as `namespace` and
`servingtopology_io_topology` (the chart's PodMonitor relabelings).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from servingtopology.operator.reconcile import Outcome
from servingtopology.planner.live.transition import Phase

__all__ = ["OperatorMetrics", "new_metrics", "serve_metrics", "TOPOLOGY_LABELS", "TRANSITION_PHASES"]

TOPOLOGY_LABELS = ("topology_namespace", "topology")
TRANSITION_PHASES = tuple(p.value for p in Phase)   # Progressing, Draining, Done, Failed
ROLES = ("aggregated", "prefill", "decode", "router")
FIGURES = ("ttft", "tpot")
CONDITION_STATUS = {"True": 1.0, "False": 0.0, "Unknown": -1.0}

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class OperatorMetrics:
    registry: CollectorRegistry
    reconciles: Counter
    plans: Counter
    decisions: Counter
    errors: Counter
    applied_objects: Counter
    pruned_objects: Counter
    reconcile_seconds: Histogram
    plan_seconds: Histogram
    plan_info: Gauge
    plan_gpus: Gauge
    plan_instances: Gauge
    predicted_ttft_seconds: Gauge
    predicted_tpot_seconds: Gauge
    observed_ttft_seconds: Gauge
    observed_tpot_seconds: Gauge
    observed_request_rate: Gauge
    prediction_error: Gauge
    slo_ttft_seconds: Gauge
    slo_tpot_seconds: Gauge
    transition_phase: Gauge
    transitions: Counter
    condition: Gauge
    # Per resource: the label sets written last (to remove stale ones) and the transition starts already counted.
    _written: dict[tuple[str, str], list[tuple[Gauge, tuple[str, ...]]]] = field(default_factory=dict)
    _started: dict[tuple[str, str], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, outcome: Outcome, *, mode: str, trigger: str, seconds: float) -> None:
        """Count one finished reconcile pass."""
        self.reconciles.labels(trigger=trigger, result="error" if outcome.error else "ok").inc()
        self.reconcile_seconds.observe(seconds)
        if outcome.decided:
            self.plans.labels(mode=mode).inc()
            action = "proposed" if mode == "DryRun" else ("applied" if outcome.applied else "kept")
            self.decisions.labels(action=action).inc()
        if outcome.error:
            self.errors.labels(reason=outcome.error).inc()
        self.applied_objects.inc(len(outcome.applied))
        self.pruned_objects.inc(len(outcome.pruned))

    def failed(self, reason: str, *, trigger: str) -> None:
        """Count a pass that raised (API failure or a bug caught at the handler boundary)."""
        self.reconciles.labels(trigger=trigger, result="error").inc()
        self.errors.labels(reason=reason).inc()

    def timed(self, planner: Callable[[_T], _R]) -> Callable[[_T], _R]:
        """`planner`, observing each call's duration in servingtopology_plan_seconds (failed calls too)."""
        def timed_planner(problem: _T) -> _R:
            started = time.monotonic()
            try:
                return planner(problem)
            finally:
                self.plan_seconds.observe(time.monotonic() - started)
        return timed_planner

    def record(self, *, namespace: str, name: str, status: Mapping[str, Any], spec: Mapping[str, Any] | None = None) -> None:
        """Set one ServingTopology's gauges from the status a pass staged (camelCase, as written to the API) and its
        spec's SLO (the dashboard's SLO lines).

        A figure the status does not hold (no plan yet, no measurement) has no series rather than a stale one.
        """
        key = (namespace, name)
        rows: list[tuple[Gauge, tuple[str, ...], float]] = []
        slo = (spec or {}).get("slo") or {}
        for figure, gauge in (("ttft", self.slo_ttft_seconds), ("tpot", self.slo_tpot_seconds)):
            bounds = slo.get(f"{figure}Ms") or {}
            for percentile, bound_ms in (bounds.items() if isinstance(bounds, Mapping) else ()):
                if isinstance(bound_ms, int | float) and str(percentile).startswith("p"):
                    rows.append((gauge, (*key, str(percentile)[1:]), float(bound_ms) / 1000.0))
        plan = status.get("plan") or {}
        observed = status.get("observed") or {}
        if plan:
            rows.append((self.plan_info, (*key, str(plan.get("layout", "")), str(plan.get("kind", "")), str(plan.get("pd", "-"))), 1.0))
            rows.append((self.plan_gpus, key, float(plan.get("gpus") or 0)))
            counts = {r.get("role"): float(r.get("replicas") or 0) for r in plan.get("roles") or []}
            rows += [(self.plan_instances, (*key, role), counts[role]) for role in ROLES if role in counts]
            predicted = plan.get("predicted") or {}
            if predicted.get("ttftMs") is not None:
                rows.append((self.predicted_ttft_seconds, key, float(predicted["ttftMs"]) / 1000.0))
            if predicted.get("tpotMs") is not None:
                rows.append((self.predicted_tpot_seconds, key, float(predicted["tpotMs"]) / 1000.0))
        for figure, gauge in (("ttft", self.observed_ttft_seconds), ("tpot", self.observed_tpot_seconds)):
            measured = observed.get(f"{figure}Ms", observed.get(f"{figure}MsP95"))   # the old name: status before the rename
            if measured is not None:
                rows.append((gauge, key, float(measured) / 1000.0))
        if observed.get("arrivalRateRps") is not None:
            rows.append((self.observed_request_rate, key, float(observed["arrivalRateRps"])))
        for figure in FIGURES:
            if observed.get(f"{figure}Error") is not None:
                rows.append((self.prediction_error, (*key, figure), float(observed[f"{figure}Error"])))
        for cond in status.get("conditions") or []:
            if cond.get("type") and cond.get("status") in CONDITION_STATUS:
                rows.append((self.condition, (*key, str(cond["type"]), str(cond.get("reason", ""))), CONDITION_STATUS[cond["status"]]))
        transition = (status.get("replan") or {}).get("transition") or {}
        phase = transition.get("phase")
        if phase in TRANSITION_PHASES:
            rows += [(self.transition_phase, (*key, p), 1.0 if p == phase else 0.0) for p in TRANSITION_PHASES]
        with self._lock:
            started = transition.get("startedS")
            if phase in (Phase.PROGRESSING, Phase.DRAINING) and started is not None and self._started.get(key) != started:
                self._started[key] = float(started)
                self.transitions.labels(*key).inc()   # a resumed transition counts again after an operator restart
            fresh = [(gauge, labels) for gauge, labels, _ in rows]
            for gauge, labels in self._written.get(key, []):
                if (gauge, labels) not in fresh:
                    _remove(gauge, labels)
            for gauge, labels, value in rows:
                gauge.labels(*labels).set(value)
            self._written[key] = fresh

    def forget(self, *, namespace: str, name: str) -> None:
        """Drop a deleted ServingTopology's series."""
        key = (namespace, name)
        with self._lock:
            for gauge, labels in self._written.pop(key, []):
                _remove(gauge, labels)
            self._started.pop(key, None)
            _remove(self.transitions, key)


def _remove(metric: Gauge | Counter, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)


def new_metrics() -> OperatorMetrics:
    """A fresh registry with every operator metric (no process-wide default registry)."""
    r = CollectorRegistry()
    t = list(TOPOLOGY_LABELS)
    return OperatorMetrics(
        registry=r,
        reconciles=Counter("servingtopology_reconciles", "Reconcile passes", ["trigger", "result"], registry=r),
        plans=Counter("servingtopology_plans", "Planner runs", ["mode"], registry=r),
        decisions=Counter("servingtopology_decisions", "Decisions by action (applied, kept, proposed)", ["action"], registry=r),
        errors=Counter("servingtopology_errors", "Failed passes by reason", ["reason"], registry=r),
        applied_objects=Counter("servingtopology_applied_objects", "Objects created or changed by server-side apply", registry=r),
        pruned_objects=Counter("servingtopology_pruned_objects", "Objects removed because no plan needs them", registry=r),
        reconcile_seconds=Histogram("servingtopology_reconcile_seconds", "Time of one reconcile pass",
                                    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60), registry=r),
        plan_seconds=Histogram("servingtopology_plan_seconds", "Time of one planner run (decide, with the simulator on the top K)",
                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=r),
        plan_info=Gauge("servingtopology_plan_info", "The running plan of a ServingTopology (1): its layout, kind and P:D",
                        [*t, "layout", "kind", "pd"], registry=r),
        plan_gpus=Gauge("servingtopology_plan_gpus", "GPUs the running plan uses", t, registry=r),
        plan_instances=Gauge("servingtopology_plan_instances", "Engine instances of the running plan per role "
                             "(aggregated, prefill, decode)", [*t, "role"], registry=r),
        predicted_ttft_seconds=Gauge("servingtopology_predicted_ttft_seconds", "Predicted TTFT of the running plan "
                                     "at the SLO percentile and the planned load", t, registry=r),
        predicted_tpot_seconds=Gauge("servingtopology_predicted_tpot_seconds", "Predicted TPOT of the running plan "
                                     "at the SLO percentile and the planned load", t, registry=r),
        observed_ttft_seconds=Gauge("servingtopology_observed_ttft_seconds", "p95 TTFT the operator measured over "
                                    "its last replan window (status.observed)", t, registry=r),
        observed_tpot_seconds=Gauge("servingtopology_observed_tpot_seconds", "p95 TPOT the operator measured over "
                                    "its last replan window (status.observed)", t, registry=r),
        observed_request_rate=Gauge("servingtopology_observed_requests_per_second", "Request rate the operator "
                                    "measured (status.observed)", t, registry=r),
        prediction_error=Gauge("servingtopology_prediction_error_ratio", "Measured / predicted - 1 at the running plan "
                               "and the measured load (status.observed.ttftError, tpotError)", [*t, "figure"], registry=r),
        slo_ttft_seconds=Gauge("servingtopology_slo_ttft_seconds", "The ServingTopology's TTFT bound (spec.slo.ttftMs) at "
                               "its percentile", [*t, "percentile"], registry=r),
        slo_tpot_seconds=Gauge("servingtopology_slo_tpot_seconds", "The ServingTopology's TPOT bound (spec.slo.tpotMs) at "
                               "its percentile", [*t, "percentile"], registry=r),
        transition_phase=Gauge("servingtopology_transition_phase", "1 for the phase of the latest transition "
                               "(Progressing, Draining, Done, Failed), 0 for the others", [*t, "phase"], registry=r),
        transitions=Counter("servingtopology_transitions", "Transitions this operator process saw start", t, registry=r),
        condition=Gauge("servingtopology_condition", "Status conditions: 1 True, 0 False, -1 Unknown",
                        [*t, "type", "reason"], registry=r),
    )


def serve_metrics(metrics: OperatorMetrics, port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a background thread."""
    start_http_server(port, addr=addr, registry=metrics.registry)
