"""The kopf wiring: one reconcile for create, update, resume and a timer on ServingTopology, kopf's storage,
peering and probes; each outcome becomes a status patch, metrics, and a requeue when the pass asks for one.

Called by operator/main.py (`register`). Thin on purpose: the logic is operator/reconcile.py; the only broad
`except` of the operator is here. The timer is the heartbeat of live replanning (metrics are fetched once
spec.policy.replanInterval has passed, a transition advances one step a pass): keep it under the shortest interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from ..planner.decide import predict_layout
from .cluster import Cluster, ClusterError
from .crd import PLURAL, VERSION
from .live import MetricsFactory, prometheus_source
from .manifests import GROUP
from .reconcile import Outcome, Planner, reconcile
from .replan import Predictor
from .telemetry import OperatorMetrics
from .url_policy import UrlAllowList

__all__ = ["Runtime", "register", "TRIGGERS", "Requeue", "requeue_delay_s", "QuietRequeues", "QUIET_REQUEUES"]

TRIGGERS = ("create", "update", "resume", "timer")
RETRY_DELAY_S = 15.0
MIN_REQUEUE_S = 1.0
REQUEUE_MESSAGE = "requeue: the pass asked to run again in"


class Requeue(kopf.TemporaryError):
    """Not a failure: the pass succeeded, its status is staged, and it wants another pass after `delay` seconds.

    kopf has no public "run again later" for a handler that succeeded; TemporaryError with a delay is its
    documented way to schedule a handler again (docs.kopf.dev, Error handling: Temporary errors). For a
    change handler kopf re-runs it after the delay; for the timer the delay replaces the interval once.
    """

    def __init__(self, delay_s: float) -> None:
        super().__init__(f"{REQUEUE_MESSAGE} {delay_s:g} s", delay=delay_s)


def requeue_delay_s(outcome: Outcome, *, heartbeat_s: float) -> float | None:
    """The delay to ask kopf for, or None when the timer (every `heartbeat_s`) comes back soon enough anyway.

    A delay is never below MIN_REQUEUE_S, so a pass that asks for 0 s does not spin.
    """
    wanted = outcome.requeue_after_s
    if wanted is None or wanted >= heartbeat_s:
        return None
    return max(wanted, MIN_REQUEUE_S)


class QuietRequeues(logging.Filter):
    """Demote kopf's "failed temporarily" line for a Requeue to DEBUG on its object logger.

    kopf logs every TemporaryError at ERROR, and its poster turns that into an Error Event on the
    ServingTopology; a routine requeue is neither. Other records pass unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and REQUEUE_MESSAGE in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


QUIET_REQUEUES = QuietRequeues()


@dataclass
class Runtime:
    """What every handler shares: the cluster seam, the planner, metrics, and one lock per object so a
    timer pass and a change pass of the same ServingTopology never interleave."""

    cluster: Cluster
    planner: Planner
    metrics: OperatorMetrics
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    gpus_per_node_default: int = 8
    metrics_source: MetricsFactory | None = prometheus_source   # None: no live replanning
    predict: Predictor = predict_layout
    prometheus_urls: UrlAllowList | None = None   # the Prometheus URLs resources may name (None: any)
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    last_pass_s: float = 0.0

    def _lock(self, uid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uid, threading.Lock())

    def forget(self, uid: str) -> None:
        with self._guard:
            self._locks.pop(uid, None)

    def handle(self, body: Mapping[str, Any], patch: Any, logger: logging.Logger | logging.LoggerAdapter[Any], trigger: str) -> Outcome:
        """Run one reconcile and stage its status in kopf's patch; transient failures are retried."""
        uid = str(body.get("metadata", {}).get("uid", ""))
        mode = str((body.get("spec") or {}).get("policy", {}).get("mode", "DryRun"))
        started = time.monotonic()
        with self._lock(uid):
            try:
                outcome = reconcile(dict(body), cluster=self.cluster, planner=self.planner, now=self.clock(),
                                    gpus_per_node_default=self.gpus_per_node_default, metrics=self.metrics_source,
                                    predict=self.predict, metrics_allow=self.prometheus_urls)
            except ClusterError as exc:
                self.metrics.failed("ApiError", trigger=trigger)
                raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=RETRY_DELAY_S) from exc
            except Exception as exc:  # the handler boundary: log, count, retry later rather than crash the operator
                logger.exception("reconcile failed")
                self.metrics.failed(type(exc).__name__, trigger=trigger)
                raise kopf.TemporaryError(f"{type(exc).__name__}: {exc}", delay=RETRY_DELAY_S * 4) from exc
        self.last_pass_s = time.time()
        self.metrics.observe(outcome, mode=mode, trigger=trigger, seconds=time.monotonic() - started)
        meta = body.get("metadata", {})
        self.metrics.record(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), status=outcome.status)
        _stage_status(patch, outcome)
        if outcome.applied or outcome.pruned:
            logger.info("applied %s; pruned %s", ", ".join(outcome.applied) or "-", ", ".join(outcome.pruned) or "-")
        return outcome


def _stage_status(patch: Any, outcome: Outcome) -> None:
    for key, value in outcome.status.items():
        patch.status[key] = value


def register(registry: kopf.OperatorRegistry, runtime: Runtime, *, timer_interval_s: float, peering_name: str,
             clusterwide: bool) -> None:
    """Register the handlers, startup settings and probes on `registry`."""
    g, v, p = GROUP, VERSION, PLURAL

    def make(trigger: str) -> Callable[..., None]:
        def handler(body: Mapping[str, Any], patch: Any, logger: logging.Logger, **_: Any) -> None:
            outcome = runtime.handle(body, patch, logger, trigger)
            # Every trigger's next pass is at the latest the next timer tick; ask kopf only for sooner ones.
            delay_s = requeue_delay_s(outcome, heartbeat_s=timer_interval_s)
            if delay_s is not None:
                raise Requeue(delay_s)
        handler.__name__ = f"reconcile_on_{trigger}"
        return handler

    kopf.on.create(g, v, p, id="reconcile-create", registry=registry)(make("create"))
    kopf.on.update(g, v, p, id="reconcile-update", field="spec", registry=registry)(make("update"))
    kopf.on.resume(g, v, p, id="reconcile-resume", registry=registry)(make("resume"))
    kopf.timer(g, v, p, id="reconcile-timer", interval=timer_interval_s, initial_delay=timer_interval_s,
               registry=registry)(make("timer"))

    @kopf.on.delete(g, v, p, id="forget", optional=True, registry=registry)
    def forget(body: Mapping[str, Any], **_: Any) -> None:
        # Workloads carry owner references: the garbage collector removes them. Only drop our lock.
        runtime.forget(str(body.get("metadata", {}).get("uid", "")))
        runtime.metrics.forget(namespace=str(body.get("metadata", {}).get("namespace", "")), name=str(body.get("metadata", {}).get("name", "")))

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Keep kopf's bookkeeping in annotations: the CRD's structural schema would prune status.kopf.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"kopf.{GROUP}")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=f"kopf.{GROUP}")
        settings.peering.name = peering_name
        settings.peering.clusterwide = clusterwide
        settings.peering.stealth = True
        settings.posting.level = logging.WARNING  # our Events are explicit; kopf's own only for problems
        logging.getLogger("kopf.objects").addFilter(QUIET_REQUEUES)   # a requeue is neither an error log nor an Event
        settings.execution.max_workers = 4

    @kopf.on.probe(id="lastReconcile", registry=registry)
    def last_reconcile(**_: Any) -> float:
        return runtime.last_pass_s
