"""Saturated metrics readers are shown in MetricsAvailable (operator/live/metrics_reads.py, SaturationShown): a resource
whose read waits for a reader while every one is busy with other resources' reads no longer keeps MetricsFlowing.

Before: its passes raised MetricsPending for as long as the readers stayed busy, nothing was written about metrics, and
the condition kept saying MetricsFlowing about figures no read had refreshed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fake_cluster import FakeCluster
from test_live_reconcile import CountingPlanner, ScriptedMetrics, live_topology, run
from test_reconcile import cond

from servingtopology.operator.live.metrics import MetricsUnavailable
from servingtopology.operator.live.metrics_reads import READERS_SATURATED, MetricsPending, MetricsReads
from servingtopology.operator.live_replan import MetricsRequest
from servingtopology.planner.layout import Engine
from servingtopology.planner.live.observe import MetricSample


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class Blocking:
    """A factory whose reads of `blocked` owners wait for `release`; the others answer `healthy`'s sample."""

    def __init__(self, healthy: ScriptedMetrics, blocked: set[str]) -> None:
        self.healthy, self.blocked, self.release = healthy, blocked, threading.Event()

    def __call__(self, request: MetricsRequest) -> Any:
        return _Source(self, request)


class _Source:
    def __init__(self, owner: Blocking, request: MetricsRequest) -> None:
        self.owner, self.request = owner, request

    def fetch_sample(self, *, at_s: float, interval_s: float) -> MetricSample:
        if self.request.owner in self.owner.blocked:
            self.owner.release.wait(10.0)
        return self.owner.healthy.fetch_sample(at_s=at_s, interval_s=interval_s)


def test_a_read_queued_past_the_bound_while_every_reader_is_busy_is_named_saturated() -> None:
    clock = Clock()
    blocking = Blocking(ScriptedMetrics(), blocked={"ns/slow"})
    reads = MetricsReads(blocking, readers=1, wait_s=0.01, saturated_s=10.0, clock=clock)
    try:
        with pytest.raises(MetricsPending):
            reads(MetricsRequest(url="http://p:9090", engine=Engine.VLLM, owner="ns/slow")).fetch_sample(at_s=0.0, interval_s=60.0)
        mine = MetricsRequest(url="http://p:9090", engine=Engine.VLLM, owner="ns/chat")
        with pytest.raises(MetricsPending):      # queued behind the slow read: a pass does not wait
            reads(mine).fetch_sample(at_s=0.0, interval_s=60.0)
        clock.now_s = 5.0
        with pytest.raises(MetricsPending):      # within the bound: still only pending
            reads(mine).fetch_sample(at_s=5.0, interval_s=60.0)
        clock.now_s = 31.0
        with pytest.raises(MetricsUnavailable) as caught:
            reads(mine).fetch_sample(at_s=31.0, interval_s=60.0)
        assert caught.value.reason == READERS_SATURATED and "1 metrics readers are all busy" in str(caught.value)
        assert "waited 31 s" in str(caught.value)
    finally:
        blocking.release.set()
        reads.close()


def test_metrics_available_leaves_metrics_flowing_when_the_readers_are_saturated() -> None:
    obj, cluster, planner = live_topology(), FakeCluster(), CountingPlanner()
    clock = Clock()
    blocking = Blocking(ScriptedMetrics(), blocked=set())
    reads = MetricsReads(blocking, readers=1, wait_s=2.0, clock=clock)    # the default bound, SATURATED_S = 10 s
    try:
        for minute in range(3):
            clock.now_s = 60.0 * minute
            run(obj, cluster, planner, reads, minute)    # type: ignore[arg-type]
        available = cond(obj, "MetricsAvailable")
        assert (available["status"], available["reason"]) == ("True", "MetricsFlowing")
        # Another resource's read now holds the one reader; this resource's next read queues behind it.
        blocking.blocked.add("ns/slow")
        with pytest.raises(MetricsPending):
            reads(MetricsRequest(url="http://p:9090", engine=Engine.VLLM, owner="ns/slow")).fetch_sample(at_s=0.0, interval_s=60.0)
        reads.wait_s = 0.01
        for minute in range(3, 6):
            clock.now_s = 60.0 * minute
            run(obj, cluster, planner, reads, minute)    # type: ignore[arg-type]
        available = cond(obj, "MetricsAvailable")
        assert (available["status"], available["reason"]) == ("False", "MetricsReadersSaturated"), available
        assert "readers are all busy" in available["message"]
    finally:
        blocking.release.set()
        reads.close()
