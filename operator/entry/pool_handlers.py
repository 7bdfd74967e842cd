"""kopf wiring of ServingPools: an index of ServingTopologies (labels, annotations, spec, and the status a pool reads:
observed traffic, plan, proposal, transition) fed by their watch events, and one pool pass (operator/pool_pass.py) per
pool on create, update, resume and the timer.

Registered by operator/entry/main.py beside the ServingTopology handlers. The pass runs on the Runtime's threads;
its status goes through kopf's patch, its Events and (Auto) the members' caps through the Cluster seam. Owns no planning:
the plan runs in the runtime's plan worker (PoolPlanInTheWorker, `pool_planner`), and the handler waits for a pending
plan on the event loop, as the ServingTopology handlers do.

ApiUnavailable: a pass whose Kubernetes API request fails (ClusterError: the API server restarting, a 5xx, a timeout)
sets `Reconciled=False, reason=ApiUnavailable` beside the pool's last Planned condition and runs again after
API_RETRY_S (1, 2, 4, 8, then every 15 s while it fails), logged once at WARNING without a traceback; the next completed
pass drops the condition and logs the recovery. kopf's own back-off for an exception it does not know is 60 s with a
traceback each time, which turned a 14 s API-server restart into a 90 s wait for a pool move.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import kopf

from servingtopology.operator.api.crd import PLURAL, VERSION
from servingtopology.operator.api.pool import ALLOCATION_ANNOTATION, POOL_PLURAL, pool_of
from servingtopology.operator.api.resource import API_VERSION, GROUP, KIND
from servingtopology.operator.cluster.cluster import ClusterError, ObjectRef
from servingtopology.operator.cluster.plan_worker import PlanPending
from servingtopology.operator.entry.handlers import DECISIONS_LOGGER, MIN_REQUEUE_S, PLAN_WAIT_S, RETRY_MARK, Requeue, Runtime, plan_finished
from servingtopology.operator.entry.kopf_compat import timer_without_finalizer
from servingtopology.operator.pool_pass import PoolPlanner, pool_pass
from servingtopology.planner.pool.plan import PoolDecision
from servingtopology.planner.pool.request import PoolRequest, plan_request

__all__ = ["TopologyIndex", "register_pool", "pool_planner", "API_RETRY_S", "api_retry_delay_s", "API_UNAVAILABLE"]

API_RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0)   # ApiUnavailable: the delay after the n-th failed pass in a row, then the last
POOL_PLAN_WAIT_S = 1.0      # a pool pass waits this long for its plan on a thread, then on the event loop (PLAN_WAIT_S)
POOL_PLAN_WAITS = 3         # passes one handler call runs while its plans finish
API_UNAVAILABLE = "ApiUnavailable"
RECONCILED = "Reconciled"
LOG = logging.getLogger(DECISIONS_LOGGER)


def pool_planner(runtime: Runtime) -> PoolPlanner:
    """PoolPlanInTheWorker: the runtime's plan worker when it has one (its children, slots and budget), else in-process."""
    worker = getattr(runtime.planner, "run", None)
    if not callable(worker):
        return plan_request

    def in_worker(request: PoolRequest) -> PoolDecision:
        decision: PoolDecision = worker(plan_request, request, wait_s=POOL_PLAN_WAIT_S)
        return decision
    return in_worker


def api_retry_delay_s(failures: int) -> float:
    """ApiUnavailable's back-off for the `failures`-th failed pass in a row (1, 2, 4, 8, then 15 s)."""
    return API_RETRY_S[min(max(failures, 1), len(API_RETRY_S)) - 1]


def _api_unavailable(previous: Any, message: str, *, now: datetime, generation: int) -> list[dict[str, Any]]:
    """The pool's conditions with `Reconciled=False, ApiUnavailable`: its last Planned condition stays as it was."""
    kept = [dict(c) for c in previous if isinstance(c, Mapping) and c.get("type") != RECONCILED] if isinstance(previous, list) else []
    return [*kept, {"type": RECONCILED, "status": "False", "reason": API_UNAVAILABLE, "message": message[:1024],
                    "observedGeneration": generation, "lastTransitionTime": now.isoformat().replace("+00:00", "Z")}]


class TopologyIndex:
    """The ServingTopologies the watch has shown, by (namespace, name): what a pool pass needs of its members."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], dict[str, Any]] = {}

    def seen(self, event: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        with self._lock:
            if event == "DELETED" or meta.get("deletionTimestamp"):
                self._items.pop(key, None)
            else:
                status = body.get("status") or {}
                self._items[key] = {"metadata": {"name": key[1], "namespace": key[0], "labels": dict(meta.get("labels") or {}),
                                                 "annotations": dict(meta.get("annotations") or {})},
                                    "spec": body.get("spec"),
                                    "status": {k: status.get(k) for k in ("observed", "plan", "proposal", "replan", "conditions")
                                               if status.get(k)}}

    def members(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        """The namespace's ServingTopologies that name `pool` (spec.pool, or the label of before it)."""
        with self._lock:
            items = sorted(self._items.items())
        out = []
        for (ns, _), b in items:
            named = pool_of(b["spec"] if isinstance(b["spec"], Mapping) else None, b["metadata"])
            if ns == namespace and named is not None and named.pool == pool:
                out.append(b)
        return out


def register_pool(registry: kopf.OperatorRegistry, runtime: Runtime, *, timer_interval_s: float) -> TopologyIndex:
    """Register the ServingPool handlers and the topology index on `registry`."""
    index = TopologyIndex()

    @kopf.on.event(GROUP, VERSION, PLURAL, id="pool-index", registry=registry)
    def topology_seen(type: str | None, body: Mapping[str, Any], **_: Any) -> None:
        index.seen(type, body)

    plan = pool_planner(runtime)

    def run(body: Mapping[str, Any], patch: Any) -> None:
        meta = body.get("metadata") or {}
        members = index.members(str(meta.get("namespace", "")), str(meta.get("name", "")))
        namespace = str(meta.get("namespace", ""))
        result = pool_pass(body, members, runtime.cluster.list_nodes() or [], now=runtime.clock(), pods=runtime.cluster.list_all_pods(),
                           plan=plan)
        for member, allocation in result.allocations:
            runtime.cluster.annotate(ObjectRef(API_VERSION, KIND, namespace, member), {ALLOCATION_ANNOTATION: allocation.to_json()})
        patch.status.update(result.status)
        for type_, reason, message in result.events:
            runtime.cluster.record_event(body, type=type_, reason=reason, message=message, now=runtime.clock())

    failures: dict[str, int] = {}      # pool uid -> failed passes in a row (read and written on the event loop only)

    async def handler(body: Mapping[str, Any], patch: Any, **_: Any) -> None:
        meta = body.get("metadata") or {}
        uid, where = str(meta.get("uid", "")), f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        ctx = contextvars.copy_context()
        try:
            for _attempt in range(POOL_PLAN_WAITS):
                try:
                    await asyncio.get_running_loop().run_in_executor(runtime.executor, ctx.run, lambda: run(body, patch))
                    break
                except PlanPending as pending:
                    # The plan runs in the worker: wait for it here holding no thread, then run the pass again.
                    if pending.future is None or not await plan_finished(pending.future, PLAN_WAIT_S):
                        raise Requeue(pending.retry_after_s) from None
            else:
                raise Requeue(MIN_REQUEUE_S)
        except ClusterError as exc:
            n = failures[uid] = failures.get(uid, 0) + 1
            delay_s = api_retry_delay_s(n)
            text = f"Kubernetes API: {exc}; next try in {delay_s:g} s"
            (LOG.warning if n == 1 else LOG.debug)("pool %s: pass failed (%d in a row): %s", where, n, text)
            patch.status["conditions"] = _api_unavailable((body.get("status") or {}).get("conditions"), text, now=runtime.clock(),
                                                          generation=int(meta.get("generation") or 0))
            raise kopf.TemporaryError(f"{text} ({RETRY_MARK}{n})", delay=delay_s) from None
        recovered = failures.pop(uid, 0)
        if recovered:
            LOG.info("pool %s: the pass completed again after %d failed passes", where, recovered)

    for trigger, on in (("create", kopf.on.create), ("resume", kopf.on.resume)):
        on(GROUP, VERSION, POOL_PLURAL, id=f"pool-{trigger}", registry=registry)(handler)
    kopf.on.update(GROUP, VERSION, POOL_PLURAL, id="pool-update", field="spec", registry=registry)(handler)
    kopf.timer(GROUP, VERSION, POOL_PLURAL, id="pool-timer", interval=timer_interval_s, initial_delay=timer_interval_s,
               registry=registry)(handler)
    timer_without_finalizer(registry, "pool-timer")   # a pool owns nothing to clean up: no finalizer
    return index
