"""The kopf wiring: one reconcile for create, update, resume and a timer on ServingTopology, kopf's storage,
peering and probes; each outcome becomes a status patch, metrics, log lines for its decisions, and a requeue when
the pass asks for one.

Called by operator/entry/main.py (`register`). Thin on purpose: the logic is operator/reconcile.py; the only broad
`except` of the operator is here. The timer is the heartbeat of live replanning (metrics are fetched once
spec.policy.replanInterval has passed, a transition advances one step a pass): keep it under the shortest interval.

What this layer guarantees, whatever a resource holds:
- a pass never waits on a plan: plans run in operator/cluster/plan_worker.py's children; a pass whose plan is not done is
  requeued (status `Planned=Unknown, Planning`), so other resources' passes go on;
- each pass reads the object again under its lock, so a queued pass with a stale copy does not plan twice;
- every failure ends in a condition (`Reconciled=False` with the reason) and a retry with capped exponential back-off,
  logged once at WARNING/ERROR and then at DEBUG; kopf's routine success lines are DEBUG, decisions INFO;
- no finalizer: kopf's timer would put one on every object (kopf issue #833); deletion does not wait on the operator
  (owner references garbage-collect the workloads). The timer is re-registered without it by operator/entry/kopf_compat.py
  (kopf has no public switch; the adapter fails at start-up if kopf changes), and the timer of a deleted object is
  stopped by kopf itself through the timer's public `when=` filter, False once the DELETED event was seen;
- liveness fails when no pass completed for `stall_s` while resources exist.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from servingtopology.operator.api.crd import PLURAL, VERSION
from servingtopology.operator.api.resource import Condition, ConditionType, TopologyStatus
from servingtopology.operator.cluster.cluster import Cluster, ClusterError, ObjectRef
from servingtopology.operator.cluster.plan_worker import PlanPending
from servingtopology.operator.entry.kopf_compat import timer_without_finalizer
from servingtopology.operator.entry.kopf_storage import CompactDiffBaseStorage, GenerationProgressStorage
from servingtopology.operator.entry.telemetry import OperatorMetrics
from servingtopology.operator.live.url_policy import UrlAllowList
from servingtopology.operator.live_replan import MetricsFactory, pooled_prometheus
from servingtopology.operator.pass_context import PassState
from servingtopology.operator.plan_status import set_condition, timestamp
from servingtopology.operator.reconcile import Outcome, Planner, reconcile
from servingtopology.operator.render.manifests import API_VERSION, GROUP, KIND
from servingtopology.operator.render.tenancy import STRICT, TenancyPolicy
from servingtopology.operator.replan import Predictor
from servingtopology.planner.search.decide import predict_layout

__all__ = ["Runtime", "register", "TRIGGERS", "Requeue", "requeue_delay_s", "retry_delay_s", "QuietRequeues", "QUIET_REQUEUES",
           "RETRY_DELAY_S", "RETRY_CAP_S", "RETRY_MARK", "PLAN_WAIT_S", "MIN_REQUEUE_S", "plan_finished",
           "DECISIONS_LOGGER", "QUIET_RETRIES", "KOPF_API_LOGGER"]

TRIGGERS = ("create", "update", "resume", "timer")
RETRY_DELAY_S = 15.0
RETRY_CAP_S = 300.0
MIN_REQUEUE_S = 1.0
REQUEUE_MESSAGE = "requeue: the pass asked to run again in"
RETRY_MARK = "retry #"
PLAN_WAIT_S = 60.0      # a handler waits this long for a plan on the event loop, then requeues (the timer comes too)
STAGED_TRUST_S = 60.0   # a staged status stands in for the stored one until it is written, at most this long
PLAN_WAITS = 4          # a pass may need a plan within the free GPUs and then one within the spec's budget
DECISIONS_LOGGER = "servingtopology.operator.decisions"
LOG = logging.getLogger(DECISIONS_LOGGER)


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


def retry_delay_s(failures: int, *, base_s: float = RETRY_DELAY_S, cap_s: float = RETRY_CAP_S) -> float:
    """Exponential back-off for the `failures`-th failed pass in a row: 15, 30, 60, ... at most 300 s."""
    return float(min(base_s * 2 ** max(0, failures - 1), cap_s))


_ROUTINE = re.compile(r"^(Timer|Handler) '[^']*' succeeded\.?$|^(Creation|Updating|Resuming|Deletion) is processed: ")


class QuietRequeues(logging.Filter):
    """Demote kopf's routine lines on its object logger to DEBUG: a requeue's "failed temporarily", the retries of a
    failure this operator already logged (they carry RETRY_MARK), and "Timer/Handler ... succeeded".

    kopf logs every TemporaryError at ERROR, and its poster turns that into an Error Event on the ServingTopology;
    a routine requeue is neither, and a failure is logged once by the Runtime with its condition. Handler success
    is logged at INFO by kopf on every timer tick (299 of 330 lines in a run); the decisions are logged instead.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            text = record.getMessage()
            if REQUEUE_MESSAGE in text or RETRY_MARK in text or _ROUTINE.search(text):
                record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


QUIET_REQUEUES = QuietRequeues()


class QuietRetries(logging.Filter):
    """kopf's API client logs each retried request at ERROR ("Request attempt #1/9 failed; will retry: ...", e.g.
    "storage is (re)initializing" while the API server starts): WARNING for a retry; ERROR stays for "escalating"."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING and "failed; will retry" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


QUIET_RETRIES = QuietRetries()
KOPF_API_LOGGER = "kopf._cogs.clients.api"


@dataclass
class Runtime:
    """What every handler shares: the cluster seam, the planner, metrics, and one lock per object so a
    timer pass and a change pass of the same ServingTopology never interleave."""

    cluster: Cluster
    planner: Planner
    metrics: OperatorMetrics
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    gpus_per_node_default: int = 8
    # None: no live replanning; the operator's reads run in their own bounded pool (operator/live/metrics_reads.py)
    metrics_source: MetricsFactory | None = field(default_factory=pooled_prometheus)
    predict: Predictor = predict_layout
    prometheus_urls: UrlAllowList | None = None   # the Prometheus URLs resources may name (None: any)
    tenancy: TenancyPolicy = STRICT     # what pod templates and metrics selectors may ask for
    workers: int = 8
    stall_s: float = 360.0          # liveness: no pass completed for this long while resources exist
    monotonic: Callable[[], float] = time.monotonic
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _failures: dict[str, int] = field(default_factory=dict)
    _known: set[str] = field(default_factory=set)
    _gone: set[str] = field(default_factory=set)
    _executor: ThreadPoolExecutor | None = None
    last_pass_s: float = 0.0        # wall time of the last completed pass (the probe's figure)
    # uid -> (resourceVersion the pass read, when, the status it staged): kopf writes a pass's status after the
    # handler returns, so a pass of the same object that runs before that write would read the old status.
    _staged: dict[str, tuple[str | None, float, dict[str, Any]]] = field(default_factory=dict)
    _last_progress: float | None = None

    def _lock(self, uid: str) -> threading.Lock:
        with self._guard:
            self._known.add(uid)
            return self._locks.setdefault(uid, threading.Lock())

    def forget(self, uid: str) -> None:
        with self._guard:
            self._locks.pop(uid, None)
            self._failures.pop(uid, None)
            self._staged.pop(uid, None)
            self._known.discard(uid)
            self._gone.add(uid)

    def gone(self, uid: str) -> bool:
        with self._guard:
            return uid in self._gone

    @property
    def executor(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="reconcile")
            return self._executor

    # --- liveness ---------------------------------------------------------------------------------------------

    def _progressed(self) -> None:
        self._last_progress = self.monotonic()
        self.last_pass_s = time.time()

    def health(self) -> dict[str, float]:
        """The probe's figures; raises when passes stopped completing while resources exist."""
        now = self.monotonic()
        if self._last_progress is None:
            self._last_progress = now    # the clock starts with the operator
        idle = now - self._last_progress
        with self._guard:
            resources = len(self._known)
        if resources and idle > self.stall_s:
            raise kopf.PermanentError(f"no reconcile pass completed for {idle:.0f} s (limit {self.stall_s:g} s) while "
                                      f"{resources} ServingTopologies exist")
        return {"lastPassUnix": self.last_pass_s, "idleSeconds": round(idle, 1), "resources": resources}

    # --- one pass ---------------------------------------------------------------------------------------------

    def _fresh(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The object as the API server has it now (kopf's copy may be a queued, stale one); None when it was
        replaced by another object of the same name."""
        meta = body.get("metadata") or {}
        got = self.cluster.read(ObjectRef(API_VERSION, KIND, str(meta.get("namespace", "")), str(meta.get("name", ""))))
        if got is None:
            return body      # a cluster seam that does not hold the resource (tests) or a read that raced a delete
        if (got.get("metadata") or {}).get("uid") != meta.get("uid"):
            return None
        return got

    def handle(self, body: Mapping[str, Any], patch: Any, logger: logging.Logger | logging.LoggerAdapter[Any], trigger: str) -> Outcome:
        """Run one reconcile and stage its status in kopf's patch; failures become a condition and a retry."""
        meta = body.get("metadata") or {}
        uid, where = str(meta.get("uid", "")), f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        mode = str((body.get("spec") or {}).get("policy", {}).get("mode", "DryRun"))
        started = time.monotonic()
        if self.gone(uid):
            return Outcome({})
        with self._lock(uid):
            recorder = _RecordingCluster(self.cluster)
            current: Mapping[str, Any] = body
            try:
                fresh = self._fresh(body)
                if fresh is None:
                    return Outcome({})
                current = self._with_staged(uid, fresh)
                LOG.debug("%s: %s pass reads version %s (%s)", where, trigger, (fresh.get("metadata") or {}).get("resourceVersion"),
                          "with the status staged before" if current is not fresh else "as stored")
                now = self.clock()
                outcome = reconcile(dict(current), cluster=recorder, planner=self.planner, now=now,
                                    gpus_per_node_default=self.gpus_per_node_default, metrics=self.metrics_source,
                                    predict=self.predict, metrics_allow=self.prometheus_urls,
                                    tenancy=self.tenancy)
            except PlanPending as pending:
                self._progressed()
                self._stage_planning(current, patch, pending)
                raise
            except ClusterError as exc:
                self._progressed()
                self.metrics.failed("ApiError", trigger=trigger)
                raise self._failure(current, patch, uid, where, "ApiError", f"Kubernetes API: {exc}", exc_info=False) from exc
            except Exception as exc:  # the handler boundary: a condition, a count, a retry rather than a crash
                self._progressed()
                self.metrics.failed(type(exc).__name__, trigger=trigger)
                raise self._failure(current, patch, uid, where, "InternalError", f"{type(exc).__name__}: {exc}", exc_info=True) from exc
            finally:
                _log_decisions(where, recorder.events)
                self._remember(uid, current, patch)
            # Staged and remembered under the lock: the object's next pass must see this pass's status.
            self._progressed()
            with self._guard:
                recovered = self._failures.pop(uid, 0)
            if recovered:
                LOG.info("%s: the pass completed again after %d failed passes", where, recovered)
            self.metrics.observe(outcome, mode=mode, trigger=trigger, seconds=time.monotonic() - started)
            written = self.clock()
            status = _written_now(outcome.status, pass_time=now, write_time=written)
            if recovered or _has_failed_condition(status):
                generation = int((current.get("metadata") or {}).get("generation") or 1)
                status["conditions"] = _set_reconciled(status.get("conditions") or [], generation=generation, now=written, failed=None)
            _stage_status(patch, status)
            self._remember(uid, current, patch)
            self.metrics.record(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), status=status,
                                spec=current.get("spec") or {})
        return outcome

    def _with_staged(self, uid: str, fresh: Mapping[str, Any]) -> Mapping[str, Any]:
        """The object with the status the previous pass staged, until the stored status shows it (kopf writes a
        handler's patch after it returns, the object and its status subresource apart)."""
        with self._guard:
            staged = self._staged.get(uid)
        if staged is None or self.monotonic() - staged[1] > STAGED_TRUST_S:
            return fresh
        stored = fresh.get("status") or {}
        if all(stored.get(k) == v for k, v in staged[2].items()):
            with self._guard:
                if self._staged.get(uid) is staged:
                    del self._staged[uid]    # written: the object is the truth again
            return fresh
        return {**fresh, "status": {**stored, **staged[2]}}

    def _remember(self, uid: str, read: Mapping[str, Any], patch: Any) -> None:
        staged = dict(getattr(patch, "status", None) or {})
        if staged:
            version = (read.get("metadata") or {}).get("resourceVersion")
            with self._guard:
                self._staged[uid] = (version, self.monotonic(), staged)

    def _stage_planning(self, body: Mapping[str, Any], patch: Any, pending: PlanPending) -> None:
        """Planned=Unknown while the plan runs in the worker (written only when it changes)."""
        p = PassState(body, self.cluster, self.clock())
        if p.set(ConditionType.PLANNED, None, "Planning", f"generation {p.generation}: {pending}"):
            patch.status["conditions"] = [c.model_dump(mode="json", exclude_none=True) for c in p.conditions]

    def _failure(self, body: Mapping[str, Any], patch: Any, uid: str, where: str, reason: str, message: str, *,
                 exc_info: bool) -> kopf.TemporaryError:
        with self._guard:
            failures = self._failures[uid] = self._failures.get(uid, 0) + 1
        delay = retry_delay_s(failures)
        text = f"{message}; next try in {delay:g} s"
        if failures == 1:
            (LOG.error if reason == "InternalError" else LOG.warning)("%s: pass failed: %s", where, text, exc_info=exc_info)
        else:
            LOG.debug("%s: pass failed again (%d in a row): %s", where, failures, text)
        try:
            raw = body.get("status") or {}
            status = TopologyStatus.model_validate({k: v for k, v in raw.items() if k in TopologyStatus.model_fields})
            conditions = [c.model_dump(mode="json", exclude_none=True) for c in status.conditions]
        except Exception:
            conditions = []
        generation = int((body.get("metadata") or {}).get("generation") or 1)
        patch.status["conditions"] = _set_reconciled(conditions, generation=generation, now=self.clock(), failed=(reason, text[:1024]))
        return kopf.TemporaryError(f"{text} ({RETRY_MARK}{failures})", delay=delay)


class _RecordingCluster:
    """The cluster seam with the pass's Events kept, to log each decision once."""

    def __init__(self, inner: Cluster) -> None:
        self._inner = inner
        self.events: list[tuple[str, str, str]] = []

    def record_event(self, owner: Mapping[str, Any], *, type: str, reason: str, message: str, now: datetime) -> None:
        self._inner.record_event(owner, type=type, reason=reason, message=message, now=now)
        self.events.append((type, reason, message))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _log_decisions(where: str, events: list[tuple[str, str, str]]) -> None:
    """One line per decision the pass made (each has an Event): planned, proposed, transition step, replan verdict,
    applied. Not kopf's object logger: its poster would copy WARNING lines into duplicate Events."""
    for type_, reason, message in events:
        LOG.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s: %s: %s", where, reason, message)


def _written_now(status: dict[str, Any], *, pass_time: datetime, write_time: datetime) -> dict[str, Any]:
    """Conditions that moved in this pass carry the time the status is written, not the pass's start."""
    then, now = timestamp(pass_time), timestamp(write_time)
    if then == now or not status.get("conditions"):
        return dict(status)
    conditions = [dict(c, lastTransitionTime=now) if c.get("lastTransitionTime") == then else c for c in status["conditions"]]
    return {**status, "conditions": conditions}


def _has_failed_condition(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == ConditionType.RECONCILED.value and c.get("status") == "False" for c in status.get("conditions") or [])


def _set_reconciled(conditions: list[dict[str, Any]], *, generation: int, now: datetime, failed: tuple[str, str] | None) -> list[dict[str, Any]]:
    """`Reconciled`: False with the failure's reason and message, True again once a pass completes."""
    parsed = [Condition.model_validate(c) for c in conditions]
    reason, message = failed if failed is not None else ("PassCompleted", "the last pass completed")
    out = set_condition(parsed, ConditionType.RECONCILED, status=failed is None, reason=reason, message=message, now=now, generation=generation)
    return [c.model_dump(mode="json", exclude_none=True) for c in out]


def _stage_status(patch: Any, status: Mapping[str, Any]) -> None:
    for key, value in status.items():
        patch.status[key] = value


async def plan_finished(future: Any, timeout_s: float) -> bool:
    """Whether the worker's future finished (with a plan or an error) within `timeout_s`."""
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout=timeout_s)
    except TimeoutError:
        return False
    except Exception:
        return True      # the pass that follows turns the plan's error into status
    return True


def _in_thread(runtime: Runtime, fn: Callable[[], Any]) -> Awaitable[Any]:
    """Run a pass on the runtime's own threads, with kopf's context (its object logger posts through it)."""
    ctx = contextvars.copy_context()
    return asyncio.get_running_loop().run_in_executor(runtime.executor, ctx.run, fn)


def register(registry: kopf.OperatorRegistry, runtime: Runtime, *, timer_interval_s: float, peering_name: str,
             clusterwide: bool) -> None:
    """Register the handlers, startup settings and probes on `registry`."""
    g, v, p = GROUP, VERSION, PLURAL

    def make(trigger: str) -> Callable[..., Awaitable[None]]:
        def run(body: Mapping[str, Any], patch: Any, logger: logging.Logger) -> None:
            outcome = runtime.handle(body, patch, logger, trigger)
            # Every trigger's next pass is at the latest the next timer tick; ask kopf only for sooner ones.
            delay_s = requeue_delay_s(outcome, heartbeat_s=timer_interval_s)
            if delay_s is not None:
                raise Requeue(delay_s)

        async def handler(body: Mapping[str, Any], patch: Any, logger: logging.Logger, **kwargs: Any) -> None:
            if runtime.gone(_uid(body)):
                return      # a pass queued before the DELETED event; kopf stops the timer on that event (`alive`)
            for _ in range(PLAN_WAITS):
                try:
                    await _in_thread(runtime, lambda: run(body, patch, logger))
                    return
                except PlanPending as pending:
                    # The plan runs in the worker: wait for it here, on the event loop, holding no thread (other
                    # resources' passes go on), then run the pass again; it finds the plan done.
                    if pending.future is None or not await plan_finished(pending.future, PLAN_WAIT_S):
                        raise Requeue(pending.retry_after_s) from None
            raise Requeue(MIN_REQUEUE_S)
        handler.__name__ = f"reconcile_on_{trigger}"
        return handler

    kopf.on.create(g, v, p, id="reconcile-create", registry=registry)(make("create"))
    # Any change of the essence kopf keeps (operator/entry/kopf_storage.py: spec, labels, annotations, and the generation,
    # so an edit that reverts a change still pending is a change): an approval, a pool's cap are handled as they arrive.
    kopf.on.update(g, v, p, id="reconcile-update", registry=registry)(make("update"))
    kopf.on.resume(g, v, p, id="reconcile-resume", registry=registry)(make("resume"))
    def alive(body: Mapping[str, Any], **_: Any) -> bool:
        # kopf re-evaluates a timer's filter on every watch event and stops the timer when it turns False: after the
        # DELETED event (`forget` runs before kopf matches the timers), the object's timer ends without a finalizer.
        return not runtime.gone(_uid(body))

    kopf.timer(g, v, p, id="reconcile-timer", interval=timer_interval_s, initial_delay=timer_interval_s, when=alive,
               registry=registry)(make("timer"))
    timer_without_finalizer(registry, "reconcile-timer")

    @kopf.on.event(g, v, p, id="forget", registry=registry)
    def forget(type: str | None, body: Mapping[str, Any], **_: Any) -> None:
        # Workloads carry owner references: the garbage collector removes them. Drop our state; the timer stops.
        if type == "DELETED":
            meta = body.get("metadata", {})
            runtime.forget(str(meta.get("uid", "")))
            runtime.metrics.forget(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")))

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Keep kopf's bookkeeping in annotations: the CRD's structural schema would prune status.kopf. The diff base is
        # a compact record (operator/entry/kopf_storage.py): a verbatim spec above 256 KiB breaks the annotation limit.
        # Handler progress (a requeue's or a back-off's delay) holds for its generation only: an edit is handled at once.
        settings.persistence.progress_storage = GenerationProgressStorage(prefix=f"kopf.{GROUP}")
        settings.persistence.diffbase_storage = CompactDiffBaseStorage(prefix=f"kopf.{GROUP}")
        settings.peering.name = peering_name
        settings.peering.clusterwide = clusterwide
        settings.peering.stealth = True
        settings.posting.level = logging.WARNING  # our Events are explicit; kopf's own only for problems
        logging.getLogger("kopf.objects").addFilter(QUIET_REQUEUES)   # a requeue is neither an error log nor an Event
        logging.getLogger(KOPF_API_LOGGER).addFilter(QUIET_RETRIES)   # a retried request is not an error
        settings.execution.max_workers = runtime.workers

    @kopf.on.probe(id="lastReconcile", errors=kopf.ErrorsMode.PERMANENT, registry=registry)
    def last_reconcile(**_: Any) -> dict[str, float]:
        # A raising probe makes kopf's /healthz answer 500 (kopf runs probes as activities: ActivityError).
        return runtime.health()


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid", ""))
