"""One transition per change, whatever kopf delivers: the operator's Runtime (operator/entry/handlers.py) against the
in-memory cluster with the real planner and scripted live metrics, fed the way kopf feeds it under load: every pass
duplicated (a change handler and the timer queued for the same object), the duplicate holding a stale copy of the
object (the spec and status before the previous pass), and some passes' status written by "kopf" only after the
next pass has read the object.

Each change of the running layout must start exactly one transition (one TransitionStarted Event), and every pass
that changes what runs (a Deployment's replicas, a set added or removed) must do it under a transition the status
declared before the pass (stored, or staged by the previous pass), with a serving floor above zero, scale-downs
included (operator/reconcile.py, TransitionDeclaredFirst).
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

from fake_cluster import FakeCluster
from test_handlers import LOG, Patch
from test_live_reconcile import NS, T0, CountingPlanner, ScriptedMetrics, deployments, live_topology
from test_runtime import stored

from servingtopology.operator.entry.handlers import Runtime
from servingtopology.operator.entry.telemetry import new_metrics


class Kopf:
    """Feeds the Runtime like kopf: a pass per minute, duplicated with a stale copy, status written after the handler."""

    def __init__(self) -> None:
        self.cluster = FakeCluster()
        self.metrics = ScriptedMetrics()
        self.minute = 0
        self.rt = Runtime(cluster=self.cluster, planner=CountingPlanner(), metrics=new_metrics(),
                          clock=lambda: T0 + timedelta(minutes=self.minute), metrics_source=self.metrics)
        self.obj = stored(self.cluster, live_topology())
        self.obj["metadata"] |= {"resourceVersion": "1", "generation": 1}
        self.version = 1
        self.unwritten: list[Patch] = []
        self.undeclared: list[str] = []       # passes that changed what runs with no transition declared
        self.floors: list[float] = []

    def _write(self, patch: Patch) -> None:
        status = self.obj.setdefault("status", {})
        for key, value in patch.status.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = json.loads(json.dumps(value))
        self.version += 1
        self.obj["metadata"]["resourceVersion"] = str(self.version)

    def edit(self, rate: float) -> None:
        self.obj["spec"]["workload"]["arrivalRate"] = rate
        self.metrics.rate = rate
        self.obj["metadata"]["generation"] += 1
        self.version += 1
        self.obj["metadata"]["resourceVersion"] = str(self.version)

    def tick(self, trigger: str, stale: dict[str, Any], *, write_late: bool) -> None:
        """One minute: the fresh pass, then its duplicate holding `stale`; kopf writes the status now or next minute."""
        before = deployments(self.cluster)
        for body, why in ((copy.deepcopy(self.obj), trigger), (stale, "timer")):
            # What the status declares before this pass: stored, or staged by a pass whose status kopf writes next.
            declared = [r for r in [self.obj.get("status", {}).get("replan"), *(q.status.get("replan") for q in self.unwritten)]
                        if r and r.get("transition")]
            patch = Patch()
            self.rt.handle(body, patch, LOG, why)
            for late in self.unwritten:
                self._write(late)
            self.unwritten = []
            if write_late:
                self.unwritten.append(patch)
            else:
                self._write(patch)
            after = deployments(self.cluster)
            if after != before and self.minute > 0 and not declared:
                self.undeclared.append(f"minute {self.minute} {why}: {before} -> {after}")
            if after != before and declared:
                self.floors.append(float(declared[-1].get("transitionFloorRps") or 0.0))
            before = after
        self.cluster.tick()
        self.minute += 1

    def run(self, minutes: int, trigger: str = "timer") -> None:
        for i in range(minutes):
            stale = copy.deepcopy(self.obj)
            self.tick(trigger if i == 0 else "timer", stale, write_late=i % 3 == 1)


def started(cluster: FakeCluster) -> int:
    return [e.reason for e in cluster.events].count("TransitionStarted")


def test_each_change_starts_exactly_one_transition_through_duplicated_and_stale_passes_scale_downs_included() -> None:
    k = Kopf()
    k.run(5, trigger="create")
    assert k.obj["status"]["plan"]["layout"] == "3×TP1" and started(k.cluster) == 0
    counts: list[tuple[float, int, str]] = []
    for rate in (80.0, 40.0, 10.0):           # 3×TP1 → 3×TP2 (a second set), back (surge), then 3×TP1 → 1×TP1 in place
        before = started(k.cluster)
        stale_spec = copy.deepcopy(k.obj)     # the timer's queued copy still holds the old spec
        k.edit(rate)
        k.tick("update", stale_spec, write_late=False)
        k.run(30)
        counts.append((rate, started(k.cluster) - before, k.obj["status"]["plan"]["layout"]))
        assert not (k.obj["status"].get("replan") or {}).get("transition"), f"the change to {rate} req/s did not finish"
    assert [(r, n) for r, n, _ in counts] == [(80.0, 1), (40.0, 1), (10.0, 1)], counts
    assert [layout for _, _, layout in counts] == ["3×TP2", "3×TP1", "1×TP1"], counts
    assert deployments(k.cluster) == {f"llama-8b-{k.obj['status']['plan']['set']}-aggregated": 1}
    assert k.undeclared == [], k.undeclared
    assert k.floors and min(k.floors) > 0, k.floors
    assert k.cluster.gpus_held(NS) == 1


def test_a_transition_started_for_this_generation_is_not_reported_as_waiting_for_the_spec_change() -> None:
    from test_live_reconcile import run, running

    obj, cluster, planner, metrics = running(minutes=5)
    obj["spec"]["workload"]["arrivalRate"], metrics.rate = 80, 80.0
    obj["metadata"]["generation"] = 2
    planned = []
    for minute in range(5, 9):
        run(obj, cluster, planner, metrics, minute)
        cluster.tick()
        planned.append(next(c for c in obj["status"]["conditions"] if c["type"] == "Planned")["reason"])
    assert "TransitionInProgress" not in planned and set(planned) == {"Planned"}, planned


def test_the_pass_that_declares_a_transition_shows_ready_as_the_serving_floor_held() -> None:
    from test_live_reconcile import run, running

    obj, cluster, planner, metrics = running(minutes=5)
    obj["spec"]["workload"]["arrivalRate"], metrics.rate = 80, 80.0
    obj["metadata"]["generation"] = 2
    run(obj, cluster, planner, metrics, 5)
    assert obj["status"]["replan"]["transition"], "the change declared no transition"
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ServingFloorHeld"), ready


def test_a_blocked_change_posts_one_warning_and_changes_nothing_through_duplicated_and_stale_passes() -> None:
    # Pinned 3×TP1, then pinned 1×TP2 with maxGPUs 2 and no surge: the TP2 fits only once every TP1 is gone, so the
    # move would stop serving (policy.capacityDrop defaults to Never): TransitionBlocked, the old operator went ahead.
    k = Kopf()
    k.obj["spec"]["policy"]["mode"] = "Pinned"
    k.obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 3, "tp": 1}
    k.run(5, trigger="create")
    running = deployments(k.cluster)
    assert k.obj["status"]["plan"]["layout"] == "3×TP1" and running
    stale_spec = copy.deepcopy(k.obj)
    k.obj["spec"]["hardware"]["maxGPUs"] = 2
    k.obj["spec"]["policy"]["maxSurgeGPUs"] = 0
    k.obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 2}
    k.obj["metadata"]["generation"] += 1
    k.version += 1
    k.obj["metadata"]["resourceVersion"] = str(k.version)
    k.tick("update", stale_spec, write_late=False)
    k.run(10)
    assert deployments(k.cluster) == running and k.undeclared == []
    reasons = [e.reason for e in k.cluster.events]
    assert reasons.count("TransitionBlocked") == 1 and "TransitionStarted" not in reasons, reasons
    planned = next(c for c in k.obj["status"]["conditions"] if c["type"] == "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "TransitionBlocked")
    assert planned["message"].startswith("FloorWouldDrop: keeping 3×TP1 serving as it is; no step sequence from 3×TP1 (3 GPUs) → "
                                         "1×TP2 (2 GPUs) keeps the serving floor of ")
    assert "keeping it needs 4 GPUs during the move: raise policy.maxSurgeGPUs to 2" in planned["message"]
    assert k.obj["status"]["proposal"]["layout"] == "1×TP2" and k.obj["status"]["plan"]["layout"] == "3×TP1"
    assert k.rt.planner.calls == 2   # once per generation: the blocked passes look again without planning again
