"""The operator's own Prometheus metrics: reconciles, plans, decisions, errors, applied objects, pass time.

Created once by operator/main.py (one registry per operator process, served on its own port) and fed by
the kopf handlers after each reconcile. Not the engines' metrics (those are read from Prometheus by the
live-replanning code); this module never decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from .reconcile import Outcome

__all__ = ["OperatorMetrics", "new_metrics", "serve_metrics"]


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


def new_metrics() -> OperatorMetrics:
    """A fresh registry with every operator metric (no process-wide default registry)."""
    r = CollectorRegistry()
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
    )


def serve_metrics(metrics: OperatorMetrics, port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a background thread."""
    start_http_server(port, addr=addr, registry=metrics.registry)
