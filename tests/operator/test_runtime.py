"""The operator's runtime under load and faults (issue 17): a pass never waits on a plan (PlanPending requeues it
with `Planned=Unknown, Planning`), a plan over budget marks its resource and nothing else, a queued pass with a stale
copy does not plan twice, failures end in a condition and a capped exponential back-off logged once, liveness fails
when passes stop completing, the timer leaves no finalizer and stops on deletion, kopf's routine lines are DEBUG
while each decision is one INFO line, and condition times are the time of writing."""

from __future__ import annotations

import asyncio
import copy
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import plan_fakes
import pytest
from fake_cluster import FakeCluster
from test_handlers import LOG, Patch, registered, runtime
from test_reconcile import topology

from servingtopology.operator.cluster.cluster import ClusterError, ObjectRef
from servingtopology.operator.cluster.plan_worker import PlanBudget, PlanPending, PlanWorker
from servingtopology.operator.entry.handlers import (
    DECISIONS_LOGGER,
    QUIET_REQUEUES,
    RETRY_CAP_S,
    Runtime,
    register,
    retry_delay_s,
)
from servingtopology.operator.entry.telemetry import new_metrics
from servingtopology.operator.render.manifests import API_VERSION, KIND

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions", [])}


def stored(cluster: FakeCluster, obj: dict[str, Any]) -> dict[str, Any]:
    """Keep the resource in the fake API server, as kopf's patches would leave it."""
    meta = obj["metadata"]
    cluster.objects[ObjectRef(API_VERSION, KIND, meta.get("namespace", "default"), meta["name"])] = obj
    return obj


def worker_runtime(cluster: FakeCluster, fn: Any, **kw: Any) -> Runtime:
    return Runtime(cluster=cluster, planner=PlanWorker(fn=fn, **kw), metrics=new_metrics(), clock=lambda: T0, metrics_source=None)


def test_a_pass_does_not_wait_for_its_plan_and_the_plan_is_proposed_once_when_done() -> None:
    cluster = FakeCluster()
    rt = worker_runtime(cluster, plan_fakes.slow, wait_s=0.1)
    obj = stored(cluster, topology("DryRun"))
    patch = Patch()
    with pytest.raises(PlanPending) as pending:
        rt.handle(obj, patch, LOG, "create")
    assert pending.value.future is not None and 0 < pending.value.retry_after_s <= 10
    planned = conditions(patch.status)["Planned"]
    assert planned["status"] == "Unknown" and planned["reason"] == "Planning"
    assert not [e for e in cluster.events if e.reason == "PlanProposed"]
    rt.planner.plan(rt_problem(rt, obj), wait_s=None)  # type: ignore[attr-defined]   # the plan finishes
    obj["status"] = {**obj.get("status", {}), **patch.status}
    done = Patch()
    rt.handle(obj, done, LOG, "create")
    assert done.status["proposal"]["layout"] == "2×TP4"
    assert [e.reason for e in cluster.events].count("PlanProposed") == 1


def rt_problem(rt: Runtime, obj: dict[str, Any]) -> Any:
    from servingtopology.operator.api.resource import parse_topology_spec
    from servingtopology.operator.pass_context import PassState, build_problem

    return build_problem(PassState(obj, rt.cluster, T0), parse_topology_spec(obj["spec"]), None)


def test_a_plan_over_budget_marks_its_resource_and_the_next_resource_still_plans() -> None:
    cluster = FakeCluster()
    rt = worker_runtime(cluster, plan_fakes.hungry, budget=PlanBudget(wall_s=60, memory_mib=384), wait_s=60)
    heavy = stored(cluster, topology("DryRun"))
    patch = Patch()
    rt.handle(heavy, patch, LOG, "create")
    planned = conditions(patch.status)["Planned"]
    assert planned["status"] == "False" and planned["reason"] == "PlanBudgetExceeded"
    assert "planning needed > 384 MiB" in planned["message"] and "spec.search" in planned["message"]
    assert [e.reason for e in cluster.events] == ["PlanBudgetExceeded"]
    # The operator goes on: another resource (another Problem) plans in the same runtime.
    rt.planner.fn = plan_fakes.quick  # type: ignore[attr-defined]
    light = topology("DryRun")
    light["metadata"] |= {"name": "light", "uid": "uid-2"}
    light["spec"]["workload"]["arrivalRate"] = 7
    stored(cluster, light)
    other = Patch()
    rt.handle(light, other, LOG, "create")
    assert other.status["proposal"]["layout"] == "2×TP4"


def test_a_queued_pass_holding_a_stale_copy_does_not_plan_the_same_generation_twice() -> None:
    cluster = FakeCluster()
    calls: list[int] = []
    rt = runtime(cluster)
    inner = rt.planner
    rt.planner = lambda problem: (calls.append(1), inner(problem))[1]
    obj = stored(cluster, topology("DryRun"))
    stale = copy.deepcopy(obj)
    first = Patch()
    rt.handle(obj, first, LOG, "create")
    obj["status"] = first.status            # kopf patched the status; the timer's queued copy predates it
    rt.handle(stale, Patch(), LOG, "timer")
    assert len(calls) == 1
    assert [e.reason for e in cluster.events].count("PlanProposed") == 1


def test_repeated_failures_back_off_exponentially_to_a_cap_log_once_and_end_in_a_condition(caplog: pytest.LogCaptureFixture) -> None:
    class Failing(FakeCluster):
        def owned_objects(self, namespace: str, name: str) -> dict[ObjectRef, Any]:
            raise ClusterError("connection refused")

    rt = runtime(Failing())
    delays = []
    with caplog.at_level(logging.DEBUG, logger=DECISIONS_LOGGER):
        for _ in range(7):
            patch = Patch()
            with pytest.raises(kopf.TemporaryError) as caught:
                rt.handle(topology(), patch, LOG, "timer")
            delays.append(caught.value.delay)
            failed = conditions(patch.status)["Reconciled"]
            assert failed["status"] == "False" and failed["reason"] == "ApiError" and "next try in" in failed["message"]
    assert delays == [15, 30, 60, 120, 240, 300, 300] and delays[-1] == RETRY_CAP_S
    loud = [r for r in caplog.records if r.name == DECISIONS_LOGGER and r.levelno >= logging.WARNING]
    assert len(loud) == 1, [r.getMessage() for r in loud]
    # kopf's own "failed temporarily" line for the retries is demoted too (it would also post an Error Event).
    line = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, f"Timer 'reconcile-timer' failed temporarily: {caught.value}", None, None)
    QUIET_REQUEUES.filter(line)
    assert line.levelno == logging.DEBUG
    # Recovery: the next good pass sets Reconciled back to True.
    rt.cluster = FakeCluster()
    ok = Patch()
    rt.handle(topology(), ok, LOG, "timer")
    assert conditions(ok.status)["Reconciled"]["status"] == "True"
    assert retry_delay_s(1) == 15 and retry_delay_s(50) == RETRY_CAP_S


def test_liveness_fails_when_no_pass_completed_for_the_stall_time_while_resources_exist() -> None:
    now = [0.0]
    rt = runtime(FakeCluster())
    rt.monotonic = lambda: now[0]
    rt.stall_s = 120
    now[0] = 500.0
    assert rt.health()["resources"] == 0          # nothing to reconcile: alive however long it idles
    rt.handle(topology(), Patch(), LOG, "create")
    now[0] += 119
    assert rt.health()["idleSeconds"] == 119
    now[0] += 2
    probe = registered(rt, "lastReconcile")
    with pytest.raises(kopf.PermanentError, match="no reconcile pass completed for 121 s"):
        probe()
    rt.handle(topology(), Patch(), LOG, "timer")
    assert probe()["idleSeconds"] == 0


def test_no_handler_puts_a_finalizer_on_the_resource() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, runtime(FakeCluster()), timer_interval_s=30, peering_name="p", clusterwide=True)
    needing = [h.id for h in [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()] if h.requires_finalizer]
    assert needing == []


def test_kopf_stops_the_timer_of_a_deleted_resource_through_its_public_filter() -> None:
    # kopf matches a timer's `when=` filter on every watch event (kopf._core.intents.registries.match) and stops a
    # running timer whose filter no longer matches; `forget` runs on the DELETED event before the timers are matched.
    from kopf._cogs.structs.bodies import Body
    from kopf._cogs.structs.ephemera import Memo
    from kopf._cogs.structs.patches import Patch as KopfPatch
    from kopf._cogs.structs.references import Resource
    from kopf._core.intents.causes import SpawningCause

    rt = runtime(FakeCluster())
    registry = kopf.OperatorRegistry()
    register(registry, rt, timer_interval_s=30, peering_name="p", clusterwide=True)
    body = Body(topology())
    cause = SpawningCause(resource=Resource("servingtopology.io", "v1alpha1", "servingtopologies"), indices={},  # type: ignore[arg-type]
                          logger=LOG, patch=KopfPatch(), body=body, memo=Memo(), reset=False)

    def timers() -> list[str]:
        return [h.id for h in registry._spawning.get_handlers(cause)]

    assert timers() == ["reconcile-timer"]
    registered(rt, "forget")(type="DELETED", body=topology())
    assert timers() == []


def test_the_kopf_adapter_fails_at_start_up_naming_the_version_when_kopf_changes() -> None:
    from servingtopology.operator.entry.kopf_compat import KOPF_CHECKED, KopfInternalsChanged, timer_without_finalizer

    class Moved:
        _spawning = object()      # a registry whose spawning handlers are no longer a `_handlers` list

    with pytest.raises(KopfInternalsChanged, match=rf"kopf {kopf.__version__}: .*_spawning._handlers.*kopf{KOPF_CHECKED}"):
        timer_without_finalizer(Moved(), "reconcile-timer")  # type: ignore[arg-type]
    with pytest.raises(KopfInternalsChanged, match="0 spawning handlers have the id 'nope'"):
        timer_without_finalizer(kopf.OperatorRegistry(), "nope")
    import tomllib
    from pathlib import Path

    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"kopf{KOPF_CHECKED}" in deps, "pyproject.toml pins kopf to the range the adapter was checked against"


def test_a_routine_timer_pass_logs_nothing_at_info_and_each_decision_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    for message in ("Timer 'reconcile-timer' succeeded.", "Handler 'reconcile-create' succeeded.", "Creation is processed: 1 succeeded; 0 failed."):
        line = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)
        QUIET_REQUEUES.filter(line)
        assert line.levelno == logging.DEBUG, message
    rt = runtime(FakeCluster())
    obj = topology("DryRun")
    with caplog.at_level(logging.INFO, logger=DECISIONS_LOGGER):
        first = Patch()
        rt.handle(obj, first, LOG, "create")
        obj["status"] = first.status
        rt.handle(obj, Patch(), LOG, "timer")
    lines = [r.getMessage() for r in caplog.records if r.name == DECISIONS_LOGGER]
    assert len(lines) == 1 and lines[0].startswith("default/llama-8b: PlanProposed: "), lines


def test_condition_times_are_the_time_the_status_is_written() -> None:
    times = iter([T0, T0 + timedelta(seconds=25)])
    rt = runtime(FakeCluster())
    rt.clock = lambda: next(times)
    patch = Patch()
    rt.handle(topology("DryRun"), patch, LOG, "create")
    assert {c["lastTransitionTime"] for c in patch.status["conditions"]} == {"2026-01-01T00:00:25Z"}


def test_a_handler_waits_for_its_plan_on_the_event_loop_while_another_resources_pass_completes() -> None:
    cluster = FakeCluster()
    rt = worker_runtime(cluster, plan_fakes.slow, wait_s=0.1, slots=1)
    slow_obj = stored(cluster, topology("DryRun"))
    planned = rt.planner.plan(rt_problem(rt, slow_obj), wait_s=None)  # type: ignore[attr-defined]
    assert planned.best.layout.label == "2×TP4"
    slow_obj["spec"]["workload"]["arrivalRate"] = 11          # a new Problem: a new 1.5 s plan
    settled = topology("DryRun")                              # already planned: its pass needs no plan
    settled["metadata"] |= {"name": "settled", "uid": "uid-2"}
    first = Patch()
    rt.handle(stored(cluster, settled), first, LOG, "create")
    settled["status"] = first.status
    done: list[str] = []

    async def both() -> None:
        registry = kopf.OperatorRegistry()
        register(registry, rt, timer_interval_s=30, peering_name="p", clusterwide=True)
        fns = {h.id: h.fn for h in [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]}
        slow_patch = Patch()

        async def slow() -> None:
            await fns["reconcile-create"](body=slow_obj, patch=slow_patch, logger=LOG)
            done.append("slow")

        async def timer() -> None:
            await asyncio.sleep(0.3)
            await fns["reconcile-timer"](body=settled, patch=Patch(), logger=LOG)
            done.append("settled")

        await asyncio.gather(slow(), timer())
        assert slow_patch.status["proposal"]["layout"] == "2×TP4"

    asyncio.run(both())
    assert done == ["settled", "slow"]


def test_a_pass_that_runs_before_kopf_wrote_the_previous_status_does_not_plan_again() -> None:
    # The create handler and the timer both waited on the same plan; the second pass reads the object before kopf
    # has written the first pass's status (the same resourceVersion): it must not propose the plan again.
    cluster = FakeCluster()
    calls: list[int] = []
    rt = runtime(cluster)
    inner = rt.planner
    rt.planner = lambda problem: (calls.append(1), inner(problem))[1]
    obj = stored(cluster, topology("DryRun"))
    obj["metadata"]["resourceVersion"] = "7"
    rt.handle(obj, Patch(), LOG, "create")
    second = Patch()
    rt.handle(obj, second, LOG, "timer")
    assert len(calls) == 1 and [e.reason for e in cluster.events].count("PlanProposed") == 1
    assert second.status["proposal"]["layout"] == "2×TP4"      # the staged proposal is kept, not dropped
    obj["metadata"]["resourceVersion"] = "8"                    # kopf wrote its annotations, not yet the status
    rt.handle(obj, Patch(), LOG, "timer")
    assert len(calls) == 1
    obj["status"] = second.status                               # the status is written: the object is the truth
    obj["metadata"] |= {"resourceVersion": "9", "generation": 2}
    obj["spec"]["workload"]["arrivalRate"] = 12
    rt.handle(obj, Patch(), LOG, "update")
    assert len(calls) == 2 and [e.reason for e in cluster.events].count("PlanProposed") == 2


def test_a_retried_api_request_at_start_up_is_a_warning_and_an_escalation_stays_an_error() -> None:
    from servingtopology.operator.entry.handlers import KOPF_API_LOGGER, QUIET_RETRIES

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord(KOPF_API_LOGGER, logging.ERROR, __file__, 1, message, None, None)

    retry = record("Request attempt #1/9 failed; will retry: GET https://api/apis/servingtopology.io/v1alpha1/servingtopologies "
                   "-> APITooManyRequestsError('storage is (re)initializing')")
    final = record("Request attempt #9/9 failed; escalating: GET https://api/... -> APIServerError()")
    assert QUIET_RETRIES.filter(retry) and QUIET_RETRIES.filter(final)
    assert retry.levelno == logging.WARNING and final.levelno == logging.ERROR
    api = logging.getLogger(KOPF_API_LOGGER)
    api.removeFilter(QUIET_RETRIES)
    try:
        registered(runtime(FakeCluster()), "register.<locals>.configure")(settings=kopf.OperatorSettings())
        assert QUIET_RETRIES in api.filters
    finally:
        api.removeFilter(QUIET_RETRIES)
