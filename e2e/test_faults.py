"""Faults during transitions: the API server restarted mid-transition, the operator SIGKILLed five times during
transitions, and Prometheus answering garbage.

Each scenario watches its resource every second (e2e/invariants.py): the GPUs its pods request never exceed
maxGPUs + maxSurgeGPUs, and the Ready pods its entry Service routes to never carry less than the floor the running
transition declared (status.replan transitionFloorRps, priced by the operator's own capacity function). Each
prints its figures (recovery times, samples, the lowest serving capacity seen against the floor).

The two transition scenarios switch the spec's arrival rate between 5 and 40 req/s with metrics that play no part
(replanInterval 10m, so drift never starts a second transition): the load a transition must carry is then the
spec's, and its floor is min(spec rate, the running layout's capacity), above zero. They run on the session's
control plane like every scenario.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from servingtopology.operator.replan import ReplanMemory
from servingtopology.planner.live.transition import Phase, TransitionState

from .cluster import LocalCluster
from .conftest import Kube
from .garbage_prometheus import BODY_MARKER, Garbage, GarbagePrometheus
from .invariants import INSTANCE, SET_LABEL, TopologyWatch
from .objects import topology
from .processes import wait_until
from .stack import Emulator, Operator

MAX_GPUS, SURGE_GPUS = 8, 2
LOW_RPS, HIGH_RPS = 5, 40
API_DOWN_S = 5.0        # how long the API server stays down
KILLS = 5


def _apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))


def _patch_spec(cluster: LocalCluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", "stopo", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": patch}))


def _transitions_topology(name: str, namespace: str, prometheus_url: str) -> dict[str, Any]:
    return topology(name, namespace, prometheus_url=prometheus_url, arrival_rate=LOW_RPS, max_gpus=MAX_GPUS,
                    max_surge_gpus=SURGE_GPUS, allowed_layouts=["replicas"], replan_interval="10m", cooldown="10m")


def _memory(obj: dict[str, Any]) -> ReplanMemory:
    return ReplanMemory.from_dict((obj.get("status") or {}).get("replan"))


def _running(state: TransitionState | None) -> bool:
    return state is not None and state.phase not in (Phase.DONE, Phase.FAILED)


def _settled(kube: Kube, namespace: str, name: str) -> bool:
    """Converged on the current generation: planned for it, Ready, no transition running, every planned pod Ready."""
    obj = kube.topology(namespace, name)
    status = obj.get("status", {})
    conditions = {c["type"]: c.get("status") for c in status.get("conditions", [])}
    generation = obj["metadata"]["generation"]
    if not (status.get("observedGeneration") == generation and status.get("plan", {}).get("generation") == generation
            and conditions.get("Ready") == "True" and conditions.get("Progressing") != "True"
            and not _running(_memory(obj).transition)):
        return False
    deployments = kube.items("deployments", namespace, selector=f"{INSTANCE}={name}")
    return all(d.get("status", {}).get("readyReplicas", 0) == d["spec"]["replicas"]
               and d.get("status", {}).get("replicas", 0) == d["spec"]["replicas"] for d in deployments)


def _workloads(kube: Kube, namespace: str, name: str) -> dict[str, tuple[int, int]]:
    """Each Deployment's (generation, spec.replicas)."""
    return {d["metadata"]["name"]: (d["metadata"]["generation"], d["spec"]["replicas"])
            for d in kube.items("deployments", namespace, selector=f"{INSTANCE}={name}")}


def _assert_no_duplicates(kube: Kube, namespace: str, name: str) -> dict[str, int]:
    """After a transition: only the plan's set is left, one Deployment per role, one live ReplicaSet each, and
    exactly the pods the Deployments ask for. Returns the object counts."""
    plan_set = kube.topology(namespace, name)["status"]["plan"]["set"]
    deployments = kube.items("deployments", namespace, selector=f"{INSTANCE}={name}")
    sets = {d["metadata"]["labels"].get(SET_LABEL) for d in deployments}
    assert sets == {plan_set}, f"Deployments of sets {sets}, the plan runs {plan_set}"
    roles = [d["metadata"]["labels"].get("servingtopology.io/role") for d in deployments]
    assert len(roles) == len(set(roles)), f"two Deployments for one role: {roles}"
    live_rs = [rs for rs in kube.items("replicasets", namespace, selector=f"{INSTANCE}={name}") if rs["spec"].get("replicas")]
    assert len(live_rs) == len(deployments), [rs["metadata"]["name"] for rs in live_rs]
    pods = [p for p in kube.items("pods", namespace, selector=f"{INSTANCE}={name}") if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == sum(d["spec"]["replicas"] for d in deployments), (len(pods), [d["spec"]["replicas"] for d in deployments])
    services = kube.items("services", namespace, selector=f"{INSTANCE}={name}")
    names = [s["metadata"]["name"] for s in services]
    assert len(names) == len(set(names)) and name in names, names
    return {"deployments": len(deployments), "replicasets": len(live_rs), "pods": len(pods), "services": len(services)}


def _wait_for_a_running_transition(watch: TopologyWatch, what: str) -> TransitionState:
    """Polls the resource fast (the watch's reads, no kubectl) until its status declares a running transition."""
    found: list[TransitionState] = []

    def running() -> bool:
        sample = watch.sample_now()
        if sample is None or sample.floor_rps is None:
            return False
        found.append(_memory(watch.read()).transition)  # type: ignore[arg-type]
        return _running(found[-1])

    wait_until(running, timeout_s=180, interval_s=0.1, what=what)
    return found[-1]


@pytest.mark.e2e_seconds(37)
def test_the_api_server_restarted_mid_transition_completes_it_within_the_budget_and_floor(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    name = "apirestart"
    _apply(cluster, _transitions_topology(name, namespace, cluster.prometheus_url))
    wait_until(lambda: _settled(kube, namespace, name), timeout_s=240, what="first plan settled", on_timeout=operator.log_tail)
    before = kube.topology(namespace, name)["status"]["plan"]
    with TopologyWatch(cluster.kubeconfig, namespace, name) as watch:
        watch.mark_change()
        _patch_spec(cluster, namespace, name, {"workload": {"arrivalRate": HIGH_RPS}})
        state = _wait_for_a_running_transition(watch, "a transition to the new arrival rate")
        down = time.monotonic()
        cluster.stop_apiserver()
        time.sleep(API_DOWN_S)   # the outage itself
        cluster.start_apiserver()
        up = time.monotonic()
        wait_until(lambda: _settled(kube, namespace, name), timeout_s=300, what="the transition completed after the restart",
                   on_timeout=operator.log_tail)
        settled = time.monotonic()
    report = watch.check()
    after = kube.topology(namespace, name)["status"]["plan"]
    assert state.started_s in report.started_per_change[1], report.started_per_change
    assert after["layout"] != before["layout"] and after["gpus"] >= before["gpus"], (before, after)
    assert report.floor_rps is not None and report.floor_rps > 0, "no floor to hold: the scenario proves nothing"
    counts = _assert_no_duplicates(kube, namespace, name)
    assert operator.child is not None and operator.child.alive(), "the operator process died during the outage"
    print(f"\nAPI server down {up - down:.1f} s (killed while {state.from_set}→{state.to_set} {state.phase.value}); "
          f"transition finished {settled - up:.1f} s after it was back; {before['layout']} → {after['layout']}; "
          f"objects {counts}; {report.line()}")


@pytest.mark.e2e_seconds(38)
def test_the_operator_killed_five_times_during_transitions_resumes_each_from_status(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    name = "killed"
    _apply(cluster, _transitions_topology(name, namespace, cluster.prometheus_url))
    wait_until(lambda: _settled(kube, namespace, name), timeout_s=240, what="first plan settled", on_timeout=operator.log_tail)
    kills: list[dict[str, Any]] = []
    with TopologyWatch(cluster.kubeconfig, namespace, name) as watch:
        for i in range(KILLS):
            # Each kill follows a change of the arrival rate (5 ↔ 40 req/s: 1×TP1 ↔ 4×TP1). Odd kills land once the
            # status declares the transition (its first step applied): the new process must carry on from status.
            # Even kills land right after the change, before any status declares a transition: the new process
            # must pick up the unhandled change. A restart from scratch would show as a second startedS.
            declared = i % 2 == 0
            rate = HIGH_RPS if i % 2 == 0 else LOW_RPS
            watch.mark_change()
            _patch_spec(cluster, namespace, name, {"workload": {"arrivalRate": rate}})
            state = _wait_for_a_running_transition(watch, f"a transition to {rate} req/s") if declared else None
            killed = time.monotonic()
            operator.kill()
            operator.start()
            healthy = time.monotonic()

            def moved_on(snapshot: TransitionState | None = state) -> bool:
                obj = watch.read()
                now = _memory(obj).transition   # None once a transition has finished
                if snapshot is None:   # the change was unhandled: it must now be planned for
                    return bool((obj.get("status") or {}).get("plan", {}).get("generation") == obj["metadata"]["generation"])
                return now is None or now.to_dict() != snapshot.to_dict()

            wait_until(moved_on, timeout_s=180, what=f"the restarted operator's next step (kill {i + 1})",
                       on_timeout=operator.log_tail)
            now = _memory(watch.read()).transition
            if now is not None and state is not None:
                assert now.started_s == state.started_s and now.to_set == state.to_set, (state.to_dict(), now.to_dict())
            assert now is None or (now.phase is not Phase.FAILED and not now.rolled_back), now.to_dict()
            kills.append({"kill": i + 1, "to_rps": rate,
                          "at": f"{state.from_set}→{state.to_set} {state.phase.value}" if state else "change not yet handled",
                          "healthy_s": round(healthy - killed, 1), "moved_on_s": round(time.monotonic() - killed, 1),
                          "then": now.phase.value if now is not None else "finished"})
            wait_until(lambda: _settled(kube, namespace, name), timeout_s=240, what=f"the transition after kill {i + 1} completed",
                       on_timeout=operator.log_tail)
        wait_until(lambda: _settled(kube, namespace, name), timeout_s=300, what="the last transition completed",
                   on_timeout=operator.log_tail)
    report = watch.check()
    assert report.floor_rps is not None and report.floor_rps > 0, "no floor to hold: the scenario proves nothing"
    counts = _assert_no_duplicates(kube, namespace, name)
    print(f"\n{KILLS} kills: {json.dumps(kills)}; objects {counts}; {report.line()}")


GARBAGE_REASONS = ("MetricsUnavailable", "PrometheusAnswerInvalid")


@pytest.mark.e2e_seconds(68)
def test_prometheus_answering_garbage_gives_metrics_unavailable_touches_nothing_and_recovers(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    name = "garbled"
    with GarbagePrometheus(cluster.prometheus_url) as fake:
        # The spec's workload is the emulator's default traffic: live metrics agree with it, nothing to replan for.
        _apply(cluster, topology(name, namespace, prometheus_url=fake.url, arrival_rate=2, input_tokens=1000,
                                 output_tokens=200, replan_interval="10s", cooldown="10m", allowed_layouts=["replicas"]))
        wait_until(lambda: _settled(kube, namespace, name), timeout_s=240, what="first plan settled", on_timeout=operator.log_tail)
        kube.wait_condition(namespace, name, "MetricsAvailable", "True", timeout_s=180, log=operator.log_tail)
        plan_before = kube.topology(namespace, name)["status"]["plan"]
        workloads_before = _workloads(kube, namespace, name)
        log_from = len(operator.log_tail(10**9))
        with TopologyWatch(cluster.kubeconfig, namespace, name) as watch:
            fake.garbage()
            started = time.monotonic()
            cond = kube.wait_condition(namespace, name, "MetricsAvailable", "False", timeout_s=120, log=operator.log_tail)
            unavailable = time.monotonic()
            # Not JSON and no data.result are PrometheusAnswerInvalid, the 500 MetricsUnavailable: whichever came first.
            assert cond["reason"] in GARBAGE_REASONS, cond
            # Keep it up until every kind of garbage has been answered at least once after the condition turned.
            seen = dict(fake.hits)
            wait_until(lambda: all(fake.hits[g.value] > seen.get(g.value, 0) for g in Garbage), timeout_s=120,
                       what="every kind of garbage answered", on_timeout=lambda: str(fake.hits))
            during = kube.topology(namespace, name)
            assert during["status"]["plan"]["layout"] == plan_before["layout"]
            assert _workloads(kube, namespace, name) == workloads_before, "the workloads changed while metrics were garbage"
            assert not _running(_memory(during).transition), "a transition started on garbage"
            conditions = {c["type"]: c for c in during["status"]["conditions"]}
            assert conditions["Ready"]["status"] == "True", conditions["Ready"]
            assert conditions["MetricsAvailable"]["status"] == "False", conditions["MetricsAvailable"]
            events = kube.events(namespace)
            assert BODY_MARKER not in json.dumps(during["status"]) + json.dumps(events), "a response body reached status or Events"
            assert any(e.get("reason") in GARBAGE_REASONS for e in events), [e.get("reason") for e in events]
            garbage_hits = {g.value: fake.hits[g.value] for g in Garbage}
            fake.proxy()
            back = time.monotonic()
            kube.wait_condition(namespace, name, "MetricsAvailable", "True", timeout_s=120, log=operator.log_tail)
            recovered = time.monotonic()
            wait_until(lambda: any(e.get("reason") == "MetricsAvailable" for e in kube.events(namespace)), timeout_s=60,
                       what="the 'metrics are back' Event")
        assert _workloads(kube, namespace, name) == workloads_before
        assert kube.topology(namespace, name)["status"]["plan"]["layout"] == plan_before["layout"]
    report = watch.check()
    assert report.min_ready_serving >= sum(r for _, r in workloads_before.values()), "serving pods went down"
    # A pass that failed (an exception at the handler boundary, kopf's retry) is not "metrics unavailable".
    log = operator.log_tail(10**9)[log_from:]
    failed = [line for line in log.splitlines() if f"{namespace}/{name}" in line and ("reconcile failed" in line or "Traceback" in line)]
    assert not failed, failed[:5]
    print(f"\nMetricsAvailable=False {unavailable - started:.1f} s after the garbage started; garbage answered {garbage_hits}; "
          f"True again {recovered - back:.1f} s after Prometheus answered; workloads untouched; {report.line()}")
