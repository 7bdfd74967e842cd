"""An infeasible resource's Planned condition and PlanInfeasible Event carry the planner's advice (planner.search.advice):
the real planner, through the real reconcile, against the in-memory cluster."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from fake_cluster import FakeCluster
from test_reconcile import cond, topology

from servingtopology.operator.reconcile import reconcile
from servingtopology.planner.search.decide import decide


def test_an_infeasible_plan_says_what_would_make_it_feasible() -> None:
    # The example at 200 req/s on a budget of 2 GPUs: nothing fits the load.
    obj = topology("DryRun")
    obj["spec"]["hardware"]["maxGPUs"] = 2
    obj["spec"]["workload"]["arrivalRate"] = 200
    cluster = FakeCluster()
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert out.error == "Infeasible"
    obj["status"] = {k: v for k, v in out.status.items() if v is not None}
    message = cond(obj, "Planned")["message"]
    assert "needs ≥" in message and "GPUs of this kind" in message
    assert "feasible at ≤" in message and "req/s" in message
    assert cluster.events[-1].reason == "PlanInfeasible" and "needs ≥" in cluster.events[-1].message
