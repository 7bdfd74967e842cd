"""The kopf wiring: status lands in kopf's patch, metrics count passes and errors, API failures become
retries, and every trigger (create, update, resume, timer) is registered."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from cases import decision
from fake_cluster import FakeCluster
from prometheus_client import generate_latest
from test_reconcile import topology

from servingtopology.operator.cluster import ClusterError
from servingtopology.operator.handlers import Runtime, register
from servingtopology.operator.telemetry import new_metrics
from servingtopology.planner.layout import Layout, Parallelism

LOG = logging.getLogger("test")


class Patch:
    def __init__(self) -> None:
        self.status: dict[str, Any] = {}


def runtime(cluster: FakeCluster, layout: Layout | None = None) -> Runtime:
    planned = decision(layout or Layout.replicas(2, Parallelism(tp=4)))
    return Runtime(cluster=cluster, planner=lambda problem: planned, metrics=new_metrics(),
                   clock=lambda: datetime(2026, 1, 1, tzinfo=UTC), metrics_source=None)


def sample(rt: Runtime, name: str, **labels: str) -> float:
    value = rt.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_a_pass_stages_the_status_in_kopfs_patch_and_counts_it() -> None:
    cluster = FakeCluster()
    rt, patch = runtime(cluster), Patch()
    rt.handle(topology(), patch, LOG, "create")
    assert patch.status["plan"]["layout"] == "2×TP4" and patch.status["proposal"] is None
    assert sample(rt, "servingtopology_reconciles_total", trigger="create", result="ok") == 1
    assert sample(rt, "servingtopology_decisions_total", action="applied") == 1
    assert sample(rt, "servingtopology_applied_objects_total") == 2
    assert b"servingtopology_plans_total" in generate_latest(rt.metrics.registry)


def test_an_invalid_spec_is_counted_as_an_error_but_not_retried() -> None:
    rt, patch = runtime(FakeCluster()), Patch()
    rt.handle(topology(colour="blue"), patch, LOG, "update")
    assert sample(rt, "servingtopology_errors_total", reason="InvalidSpec") == 1
    assert patch.status["conditions"][0]["reason"] == "InvalidSpec"


def test_an_api_failure_becomes_a_temporary_error_with_a_delay() -> None:
    class Failing(FakeCluster):
        def apply(self, obj: Any) -> bool:
            raise ClusterError("connection refused")

    rt, patch = runtime(Failing()), Patch()
    with pytest.raises(kopf.TemporaryError) as caught:
        rt.handle(topology(), patch, LOG, "timer")
    assert caught.value.delay and caught.value.delay > 0
    assert patch.status == {}  # nothing half-written
    assert sample(rt, "servingtopology_errors_total", reason="ApiError") == 1


def test_a_bug_is_caught_at_the_handler_boundary_and_retried() -> None:
    rt = runtime(FakeCluster())
    rt.planner = lambda problem: (_ for _ in ()).throw(ZeroDivisionError("oops"))
    with pytest.raises(kopf.TemporaryError, match="ZeroDivisionError"):
        rt.handle(topology(), Patch(), LOG, "create")


def test_every_trigger_is_registered_once() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, runtime(FakeCluster()), timer_interval_s=30, peering_name="p", clusterwide=True)
    ids = {h.id for h in registry._spawning.get_all_handlers()} | {h.id for h in registry._changing.get_all_handlers()}
    assert {"reconcile-create", "reconcile-update/spec", "reconcile-resume", "reconcile-timer", "forget"} <= ids



def test_timer_passes_read_live_metrics_through_the_runtimes_source() -> None:
    from test_live_reconcile import ScriptedMetrics

    cluster, source = FakeCluster(), ScriptedMetrics()
    rt = runtime(cluster)
    rt.metrics_source = source
    body = topology()
    first = Patch()
    rt.handle(body, first, LOG, "create")
    body["status"] = first.status
    second = Patch()
    rt.handle(body, second, LOG, "timer")
    assert source.requests and source.requests[0].url == body["spec"]["metrics"]["prometheusUrl"]
    assert second.status["replan"]["metricsAvailable"] is True
    assert next(c for c in second.status["conditions"] if c["type"] == "MetricsAvailable")["status"] == "True"


def test_the_production_runtime_reads_prometheus() -> None:
    from servingtopology.operator.live import prometheus_source

    rt = Runtime(cluster=FakeCluster(), planner=lambda problem: decision(Layout.replicas(1, Parallelism())), metrics=new_metrics())
    assert rt.metrics_source is prometheus_source
