"""kopf wiring of ServingPools: an index of ServingTopologies (their labels, annotations and spec) fed by their watch
events, and one pool pass (operator/pool_pass.py) per pool on create, update, resume and the timer.

Registered by operator/runtime/main.py beside the ServingTopology handlers. The pass runs on the Runtime's threads;
its status goes through kopf's patch, its Events through the Cluster seam. Owns no planning.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Mapping
from typing import Any

import kopf

from servingtopology.operator.api.crd import PLURAL, VERSION
from servingtopology.operator.api.pool import POOL_LABEL, POOL_PLURAL
from servingtopology.operator.api.resource import GROUP
from servingtopology.operator.pool_pass import pool_pass
from servingtopology.operator.runtime.handlers import Runtime
from servingtopology.operator.runtime.kopf_compat import timer_without_finalizer

__all__ = ["TopologyIndex", "register_pool"]


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
                self._items[key] = {"metadata": {"name": key[1], "namespace": key[0], "labels": dict(meta.get("labels") or {}),
                                                 "annotations": dict(meta.get("annotations") or {})},
                                    "spec": body.get("spec")}

    def members(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        with self._lock:
            return [b for (ns, _), b in sorted(self._items.items()) if ns == namespace and b["metadata"]["labels"].get(POOL_LABEL) == pool]


def register_pool(registry: kopf.OperatorRegistry, runtime: Runtime, *, timer_interval_s: float) -> TopologyIndex:
    """Register the ServingPool handlers and the topology index on `registry`."""
    index = TopologyIndex()

    @kopf.on.event(GROUP, VERSION, PLURAL, id="pool-index", registry=registry)
    def topology_seen(type: str | None, body: Mapping[str, Any], **_: Any) -> None:
        index.seen(type, body)

    def run(body: Mapping[str, Any], patch: Any) -> None:
        meta = body.get("metadata") or {}
        members = index.members(str(meta.get("namespace", "")), str(meta.get("name", "")))
        result = pool_pass(body, members, runtime.cluster.list_nodes() or [], now=runtime.clock())
        patch.status.update(result.status)
        for type_, reason, message in result.events:
            runtime.cluster.record_event(body, type=type_, reason=reason, message=message, now=runtime.clock())

    async def handler(body: Mapping[str, Any], patch: Any, **_: Any) -> None:
        ctx = contextvars.copy_context()
        await asyncio.get_running_loop().run_in_executor(runtime.executor, ctx.run, lambda: run(body, patch))

    for trigger, on in (("create", kopf.on.create), ("resume", kopf.on.resume)):
        on(GROUP, VERSION, POOL_PLURAL, id=f"pool-{trigger}", registry=registry)(handler)
    kopf.on.update(GROUP, VERSION, POOL_PLURAL, id="pool-update", field="spec", registry=registry)(handler)
    kopf.timer(GROUP, VERSION, POOL_PLURAL, id="pool-timer", interval=timer_interval_s, initial_delay=timer_interval_s,
               registry=registry)(handler)
    timer_without_finalizer(registry, "pool-timer")   # a pool owns nothing to clean up: no finalizer
    return index
