"""The ServingPool handlers' kopf wiring: a pass whose API requests fail sets ApiUnavailable beside the pool's last
Planned condition and asks kopf to run it again after a bounded back-off (1, 2, 4, 8, then 15 s), logged once without a
traceback; the next completed pass plans the pool again and drops the condition. The pool's plan runs in the plan
worker's child under its budget (PlanBudgetExceeded named in Planned), and a pool plans at most MAX_POOL_MEMBERS."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from fake_cluster import FakeCluster
from test_handlers import Patch, runtime
from test_pool_pass import NODES, NOW, _member, _pool

from servingtopology.operator.cluster.cluster import ClusterError
from servingtopology.operator.cluster.plan_worker import PlanBudget, PlanPending, PlanWorker
from servingtopology.operator.entry.handlers import DECISIONS_LOGGER, Runtime
from servingtopology.operator.entry.pool_handlers import API_RETRY_S, register_pool
from servingtopology.operator.entry.telemetry import new_metrics
from servingtopology.operator.pool_pass import MAX_POOL_MEMBERS, pool_pass


class Outage(FakeCluster):
    """A cluster seam whose API server is down while `down` is set: every list fails as KubeCluster's does."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.nodes = NODES

    def list_nodes(self) -> list[Any] | None:
        if self.down:
            raise ClusterError("discovery: HTTPSConnectionPool(host='127.0.0.1'): connection refused")
        return super().list_nodes()


def pool_timer(cluster: Outage) -> Any:
    """The registered pool timer, callable like kopf calls it, and the index it reads members from."""
    registry = kopf.OperatorRegistry()
    index = register_pool(registry, runtime(cluster), timer_interval_s=30)
    for member in (_member("chat", 10.0, priority=2), _member("batch", 4.0)):
        index.seen("ADDED", member)
    fn = next(h.fn for h in registry._spawning.get_all_handlers() if h.id == "pool-timer")
    return lambda body, patch: asyncio.run(fn(body=body, patch=patch, logger=logging.getLogger("test")))


def test_an_api_outage_is_a_condition_and_a_bounded_back_off_not_kopfs_60_s_and_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Outage()
    timer = pool_timer(cluster)
    body = _pool()
    body["metadata"]["uid"] = "pool-uid"
    patch = Patch()
    timer(body, patch)
    planned = patch.status["conditions"]
    assert [c["reason"] for c in planned] == ["PoolPlanned"]
    body["status"] = patch.status

    cluster.down = True
    delays = []
    with caplog.at_level(logging.DEBUG, logger=DECISIONS_LOGGER):
        for _ in range(7):
            patch = Patch()
            with pytest.raises(kopf.TemporaryError) as raised:
                timer(body, patch)
            delays.append(raised.value.delay)
            conditions = {c["type"]: c for c in patch.status["conditions"]}
            assert conditions["Planned"] == planned[0]                  # the last plan's condition stays as it was
            assert (conditions["Reconciled"]["status"], conditions["Reconciled"]["reason"]) == ("False", "ApiUnavailable")
            assert "connection refused" in conditions["Reconciled"]["message"]
    assert delays == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0] and max(delays) == API_RETRY_S[-1]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and loud[0].exc_info is None, [r.getMessage() for r in loud]

    cluster.down = False
    patch = Patch()
    with caplog.at_level(logging.INFO, logger=DECISIONS_LOGGER):
        timer(body, patch)
    assert [c["type"] for c in patch.status["conditions"]] == ["Planned"]
    assert any("completed again after 7 failed passes" in r.getMessage() for r in caplog.records)
    cluster.down = True
    with pytest.raises(kopf.TemporaryError) as raised:   # a new outage starts the back-off again
        timer(body, Patch())
    assert raised.value.delay == 1.0


def worker_timer(worker: PlanWorker) -> Any:
    """The pool timer of a runtime whose planner is `worker` (the operator's plan worker)."""
    cluster = Outage()
    registry = kopf.OperatorRegistry()
    rt = Runtime(cluster=cluster, planner=worker, metrics=new_metrics(), metrics_source=None)
    index = register_pool(registry, rt, timer_interval_s=30)
    for member in (_member("chat", 10.0, priority=2), _member("batch", 4.0)):
        index.seen("ADDED", member)
    fn = next(h.fn for h in registry._spawning.get_all_handlers() if h.id == "pool-timer")
    return lambda body, patch: asyncio.run(fn(body=body, patch=patch, logger=logging.getLogger("test")))


def test_a_pools_plan_runs_in_the_plan_workers_child_not_on_the_reconcile_threads() -> None:
    worker = PlanWorker(budget=PlanBudget(wall_s=120.0, memory_mib=512), slots=1)
    try:
        patch = Patch()
        worker_timer(worker)(_pool(), patch)
    finally:
        worker.close()
    assert patch.status["conditions"][0]["reason"] == "PoolPlanned", patch.status["conditions"]
    assert {m["name"] for m in patch.status["members"]} == {"chat", "batch"}
    assert worker.plans_started == 1 and worker.plans_cpu_s > 0      # the options and the allocation, in the child


def test_a_pools_plan_over_the_plan_budget_is_stopped_and_named_with_one_warning() -> None:
    worker = PlanWorker(budget=PlanBudget(wall_s=0.001, memory_mib=512), slots=1)
    try:
        patch = Patch()
        worker_timer(worker)(_pool(), patch)
    finally:
        worker.close()
    planned = patch.status["conditions"][0]
    assert (planned["type"], planned["status"], planned["reason"]) == ("Planned", "False", "PlanBudgetExceeded"), planned
    assert "planning 2 members on 2 kinds took > 0.001 s" in planned["message"] and "Fewer members" in planned["message"]


def test_a_pool_of_more_members_than_the_bound_is_refused_by_name_and_not_planned() -> None:
    members = [_member(f"m{i:02d}", 1.0) for i in range(MAX_POOL_MEMBERS + 1)]

    def never(request: Any) -> Any:
        raise AssertionError("planned a pool over the member bound")

    first = pool_pass(_pool(), members, NODES, now=NOW, plan=never)
    planned = first.status["conditions"][0]
    assert (planned["status"], planned["reason"]) == ("False", "TooManyMembers")
    assert f"{MAX_POOL_MEMBERS + 1} ServingTopologies" in planned["message"] and f"at most {MAX_POOL_MEMBERS}" in planned["message"]
    assert [e[:2] for e in first.events] == [("Warning", "TooManyMembers")] and first.status["members"] == []
    again = pool_pass({**_pool(), "status": first.status}, members, NODES, now=NOW, plan=never)
    assert again.events == []                                           # one Warning, not one a pass

    def pending(request: Any) -> Any:
        assert len(request.members) == MAX_POOL_MEMBERS
        raise PlanPending(running_s=0.0, queued_ahead=0, retry_after_s=1.0)

    with pytest.raises(PlanPending):                                    # at the bound the plan is asked for
        pool_pass(_pool(), members[:MAX_POOL_MEMBERS], NODES, now=NOW, plan=pending)
