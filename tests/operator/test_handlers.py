"""The kopf wiring: status lands in kopf's patch, metrics count passes and errors, API failures become
retries, a pass that asks to run again is requeued through kopf, and every trigger (create, update,
resume, timer) is registered."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from cases import decision
from fake_cluster import FakeCluster
from prometheus_client import generate_latest
from test_reconcile import topology

from servingtopology.operator.cluster.cluster import ClusterError
from servingtopology.operator.entry.handlers import MIN_REQUEUE_S, QUIET_REQUEUES, Requeue, Runtime, register, requeue_delay_s
from servingtopology.operator.entry.telemetry import new_metrics
from servingtopology.operator.reconcile import PROGRESS_REQUEUE_S, Outcome
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
    assert set(patch.status) == {"conditions"}  # nothing half-written: only the failure's condition
    failed = next(c for c in patch.status["conditions"] if c["type"] == "Reconciled")
    assert failed["status"] == "False" and failed["reason"] == "ApiError" and "connection refused" in failed["message"]
    assert sample(rt, "servingtopology_errors_total", reason="ApiError") == 1


def test_a_bug_is_caught_at_the_handler_boundary_and_retried() -> None:
    rt = runtime(FakeCluster())
    rt.planner = lambda problem: (_ for _ in ()).throw(ZeroDivisionError("oops"))
    with pytest.raises(kopf.TemporaryError, match="ZeroDivisionError"):
        rt.handle(topology(), Patch(), LOG, "create")


def test_every_trigger_is_registered_once() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, runtime(FakeCluster()), timer_interval_s=30, peering_name="p", clusterwide=True)
    ids = {h.id for h in registry._spawning.get_all_handlers()} | {h.id for h in registry._changing.get_all_handlers()} \
        | {h.id for h in registry._watching.get_all_handlers()}
    assert {"reconcile-create", "reconcile-update", "reconcile-resume", "reconcile-timer", "forget"} <= ids
    update = next(h for h in registry._changing.get_all_handlers() if h.id == "reconcile-update")
    assert update.field is None      # any change of the essence (an approval, a pool's cap, a reverting edit) runs it



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
    from servingtopology.operator.live.metrics_reads import MetricsReads
    from servingtopology.operator.live_replan import prometheus_source

    rt = Runtime(cluster=FakeCluster(), planner=lambda problem: decision(Layout.replicas(1, Parallelism())), metrics=new_metrics())
    assert isinstance(rt.metrics_source, MetricsReads) and rt.metrics_source.inner is prometheus_source


def registered(rt: Runtime, handler_id: str, *, timer_interval_s: float = 30) -> Any:
    registry = kopf.OperatorRegistry()
    register(registry, rt, timer_interval_s=timer_interval_s, peering_name="p", clusterwide=True)
    handlers = [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers(), *registry._activities.get_all_handlers(),
                *registry._watching.get_all_handlers()]
    fn = next(h.fn for h in handlers if h.id == handler_id)
    if not asyncio.iscoroutinefunction(fn):
        return fn

    def call(**kwargs: Any) -> Any:
        return asyncio.run(fn(**kwargs))
    return call


@pytest.mark.parametrize("handler_id", ["reconcile-create", "reconcile-update", "reconcile-resume", "reconcile-timer"])
def test_a_pass_still_rolling_out_asks_kopf_to_run_it_again_after_the_passes_delay(handler_id: str) -> None:
    rt, patch = runtime(FakeCluster(ready=False)), Patch()
    with pytest.raises(kopf.TemporaryError) as caught:
        registered(rt, handler_id)(body=topology(), patch=patch, logger=LOG)
    assert isinstance(caught.value, Requeue) and caught.value.delay == PROGRESS_REQUEUE_S
    assert patch.status["plan"]["layout"] == "2×TP4"   # the status is staged before the requeue: kopf applies it
    assert sample(rt, "servingtopology_reconciles_total", trigger=handler_id.split("-")[1].split("/")[0], result="ok") == 1


def test_a_settled_pass_is_not_requeued() -> None:
    rt, patch = runtime(FakeCluster()), Patch()
    registered(rt, "reconcile-create")(body=topology(), patch=patch, logger=LOG)
    assert patch.status["plan"]["layout"] == "2×TP4"


def test_a_requeue_no_sooner_than_the_next_timer_tick_is_left_to_the_timer() -> None:
    rt = runtime(FakeCluster(ready=False))
    registered(rt, "reconcile-timer", timer_interval_s=PROGRESS_REQUEUE_S)(body=topology(), patch=Patch(), logger=LOG)


@pytest.mark.parametrize(("wanted_s", "heartbeat_s", "delay_s"), [
    (None, 30.0, None),              # nothing to wait for
    (15.0, 30.0, 15.0),              # sooner than the tick: ask kopf
    (60.0, 30.0, None),              # the tick comes first
    (30.0, 30.0, None),              # the tick comes just as soon
    (0.0, 30.0, MIN_REQUEUE_S),      # never a zero delay: no busy loop
])
def test_the_requeue_delay_is_asked_for_only_when_sooner_than_the_heartbeat(wanted_s: float | None, heartbeat_s: float,
                                                                           delay_s: float | None) -> None:
    assert requeue_delay_s(Outcome({}, requeue_after_s=wanted_s), heartbeat_s=heartbeat_s) == delay_s


def test_kopfs_error_line_for_a_requeue_is_demoted_so_it_posts_no_event() -> None:
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, None, None)

    requeue = record(f"Timer 'reconcile-timer' failed temporarily: {Requeue(15.0)}")
    failure = record("Handler 'reconcile-create' failed temporarily: Kubernetes API: connection refused")
    assert QUIET_REQUEUES.filter(requeue) and QUIET_REQUEUES.filter(failure)
    assert requeue.levelno == logging.DEBUG and failure.levelno == logging.ERROR


def test_the_operators_startup_installs_the_quiet_requeue_filter_on_kopfs_object_logger() -> None:
    objects = logging.getLogger("kopf.objects")
    objects.removeFilter(QUIET_REQUEUES)
    try:
        registered(runtime(FakeCluster()), "register.<locals>.configure")(settings=kopf.OperatorSettings())
        assert QUIET_REQUEUES in objects.filters
    finally:
        objects.removeFilter(QUIET_REQUEUES)
