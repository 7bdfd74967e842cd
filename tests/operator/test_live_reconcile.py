"""Live replanning through the real reconcile, against the in-memory cluster and a scripted metrics source:
metrics down, a sustained drift in DryRun and in Auto (a transition, one step per pass, within the GPU budget
plus surge and above the capacity floor at every pass), and an operator restart in the middle of a transition.

The planner is the real one (`decide`) on the example spec: Llama-3.1-8B on up to 8 H100s, 40 req/s of 2k-token
prompts, which it serves with 3×TP1; at 60 req/s it wants 5×TP1 (in place), at 80 req/s 3×TP2 (a second set).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fake_cluster import FakeCluster
from test_reconcile import cond, reasons, topology

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.live.metrics import MetricsUnavailable
from servingtopology.operator.live.url_policy import UrlAllowList
from servingtopology.operator.live_replan import MetricsRequest
from servingtopology.operator.reconcile import Outcome, reconcile
from servingtopology.operator.render.manifests import SET_LABEL
from servingtopology.operator.replan import ReplanMemory
from servingtopology.planner.layout import Role
from servingtopology.planner.live.calibration import combined
from servingtopology.planner.live.observe import MetricSample
from servingtopology.planner.live.replan_decision import capacity_of
from servingtopology.planner.live.transition import layout_from_state
from servingtopology.planner.problem import Decision, Problem
from servingtopology.planner.search.decide import decide
from servingtopology.spec import to_problem

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MAX_GPUS, SURGE_GPUS = 8, 2   # the example's hardware.maxGPUs and policy.maxSurgeGPUs
NS = "default"


@dataclass
class ScriptedMetrics:
    """A MetricsSource (and its factory) reporting what engines at `rate` req/s of `prompt_tokens` would."""

    rate: float = 40.0
    prompt_tokens: float = 2048.0
    down: bool = False
    empty: bool = False
    requests: list[MetricsRequest] = field(default_factory=list)

    def __call__(self, request: MetricsRequest) -> ScriptedMetrics:
        self.requests.append(request)
        return self

    def fetch_sample(self, *, at_s: float, interval_s: float) -> MetricSample:
        if self.down:
            raise MetricsUnavailable("Prometheus query failed: ConnectionError: connection refused")
        if self.empty:
            return MetricSample(at_s=at_s, interval_s=interval_s)
        return MetricSample(at_s=at_s, interval_s=interval_s, request_rate_rps=self.rate, input_tokens_mean=self.prompt_tokens,
                            output_tokens_mean=256.0, prefix_hit_rate=0.2, ttft_ms=120.0, tpot_ms=20.0, running=8.0, waiting=0.0)


class CountingPlanner:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, problem: Problem) -> Decision:
        self.calls += 1
        return decide(problem)


def live_topology(mode: str = "Auto", *, surge_gpus: int = SURGE_GPUS) -> dict[str, Any]:
    obj = topology(mode)
    obj["spec"]["policy"] |= {"replanInterval": "1m", "cooldown": "5m", "maxSurgeGPUs": surge_gpus}
    return obj


def run(obj: dict[str, Any], cluster: FakeCluster, planner: Any, metrics: ScriptedMetrics, minute: int,
        allow: UrlAllowList | None = None) -> Outcome:
    """One reconcile; its status goes back through JSON, as the API server would store it."""
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=planner, now=T0 + timedelta(minutes=minute), metrics=metrics,
                    metrics_allow=allow)
    obj["status"] = json.loads(json.dumps({k: v for k, v in out.status.items() if v is not None}))
    return out


def deployments(cluster: FakeCluster) -> dict[str, int]:
    return {r.name: o["spec"]["replicas"] for r, o in cluster.objects.items() if r.kind == "Deployment"}


def running(minutes: int = 5, *, surge_gpus: int = SURGE_GPUS) -> tuple[dict[str, Any], FakeCluster, CountingPlanner, ScriptedMetrics]:
    """A topology in Auto that has run 3×TP1 at a steady 40 req/s for a few intervals."""
    obj, cluster, planner, metrics = live_topology(surge_gpus=surge_gpus), FakeCluster(), CountingPlanner(), ScriptedMetrics()
    for minute in range(minutes):
        run(obj, cluster, planner, metrics, minute)
    assert obj["status"]["plan"]["layout"] == "3×TP1" and planner.calls == 1
    return obj, cluster, planner, metrics


def serving_capacity(obj: dict[str, Any], cluster: FakeCluster) -> float:
    """Requests/s the sets behind the entry Service carry at their ready counts (the transition's own yardstick:
    the workload it was started for, with the calibration's factors)."""
    mem = ReplanMemory.from_dict(obj["status"]["replan"])
    state = mem.transition
    assert state is not None
    spec = parse_topology_spec(obj["spec"])
    problem = to_problem(spec)
    problem = replace(problem, workload=mem.assumed or problem.workload, factors=combined(problem.factors, mem.calibration.factors))
    capacity = capacity_of(problem)
    entry = next(o for r, o in cluster.objects.items() if r.kind == "Service" and r.name == obj["metadata"]["name"])
    shapes = {state.from_set: state.source, state.to_set: state.target}
    serving = [entry["spec"]["selector"][SET_LABEL]] if SET_LABEL in entry["spec"]["selector"] else list(shapes)
    total = 0.0
    for s in serving:
        layout = shapes[s]
        counts = {role: 0 for role in layout.roles}
        for r, o in cluster.objects.items():
            labels = o["metadata"]["labels"]
            if r.kind == "Deployment" and labels.get(SET_LABEL) == s and labels["servingtopology.io/role"] in [x.value for x in layout.roles]:
                counts[Role(labels["servingtopology.io/role"])] = o["spec"]["replicas"]
        if all(counts.values()):
            total += capacity(type(layout)(layout.kind, {r: replace(rl, count=counts[r]) for r, rl in layout.roles.items()}, layout.precision))
    return total


def test_metrics_down_keep_everything_report_it_once_and_never_replan() -> None:
    obj, cluster, planner, metrics = running(minutes=2)
    workloads = copy.deepcopy(cluster.objects)
    metrics.down, metrics.rate = True, 80.0   # a drift nobody can see
    for minute in range(2, 9):
        run(obj, cluster, planner, metrics, minute)
    assert cond(obj, "MetricsAvailable")["status"] == "False" and "connection refused" in cond(obj, "MetricsAvailable")["message"]
    assert reasons(cluster).count("MetricsUnavailable") == 1
    assert cluster.objects == workloads and planner.calls == 1   # resourceVersions unchanged: nothing was written
    assert obj["status"]["plan"]["layout"] == "3×TP1" and cond(obj, "Ready")["status"] == "True"
    metrics.down, metrics.empty = False, True   # Prometheus is back but has no series for these pods
    run(obj, cluster, planner, metrics, 9)
    assert cond(obj, "MetricsAvailable")["status"] == "False" and reasons(cluster).count("MetricsUnavailable") == 1
    metrics.empty = False
    run(obj, cluster, planner, metrics, 10)
    assert cond(obj, "MetricsAvailable")["status"] == "True" and reasons(cluster)[-1] == "MetricsAvailable"


def test_the_metrics_source_is_built_from_the_spec_and_its_token_secret() -> None:
    obj, cluster, planner, metrics = live_topology(), FakeCluster(), CountingPlanner(), ScriptedMetrics()
    obj["spec"]["metrics"]["bearerTokenSecret"] = {"name": "prom", "key": "token"}
    cluster.secrets[(NS, "prom")] = {"token": "s3cret\n"}
    run(obj, cluster, planner, metrics, 0)
    run(obj, cluster, planner, metrics, 1)
    request = metrics.requests[-1]
    assert request.url == "http://prometheus-operated.monitoring.svc:9090" and request.bearer_token == "s3cret"
    assert request.matchers == {"namespace": NS, "servingtopology_io_topology": "llama-8b"}
    assert (request.window_s, request.ttft_quantile, request.tpot_quantile) == (60, 0.95, 0.95)


def test_a_token_secret_that_cannot_be_read_counts_as_metrics_down() -> None:
    obj, cluster, planner, metrics = live_topology(), FakeCluster(), CountingPlanner(), ScriptedMetrics()
    obj["spec"]["metrics"]["bearerTokenSecret"] = {"name": "missing"}
    run(obj, cluster, planner, metrics, 0)
    run(obj, cluster, planner, metrics, 1)
    assert cond(obj, "MetricsAvailable")["status"] == "False" and "missing" in cond(obj, "MetricsAvailable")["message"]
    assert metrics.requests == []


def test_steady_traffic_reports_what_it_observes_and_changes_nothing() -> None:
    obj, cluster, planner, _ = running(minutes=8)
    observed = obj["status"]["observed"]
    assert observed["arrivalRateRps"] == pytest.approx(40.0) and observed["inputTokensMean"] == 2048.0
    assert cond(obj, "MetricsAvailable")["status"] == "True" and cond(obj, "DriftDetected")["status"] == "False"
    assert planner.calls == 1 and not [e for e in cluster.events if e.reason.startswith(("Plan", "Transition")) and e.reason != "PlanApplied"]


def test_a_sustained_drift_in_dry_run_proposes_and_leaves_the_workloads_alone() -> None:
    obj, cluster, planner, metrics = running(minutes=3)
    obj["spec"]["policy"]["mode"] = "DryRun"
    obj["metadata"]["generation"] += 1
    run(obj, cluster, planner, metrics, 3)
    workloads, applies = copy.deepcopy(cluster.objects), cluster.applies
    metrics.rate = 80.0
    for minute in range(4, 10):
        run(obj, cluster, planner, metrics, minute)
    proposed = [e for e in cluster.events if e.reason == "PlanProposed"]
    assert proposed[-1].message.startswith("would change 3×TP1 → 3×TP2"), proposed[-1].message
    assert "DriftDetected" in reasons(cluster)
    proposal = obj["status"]["proposal"]
    assert proposal["layout"] == "3×TP2" and proposal["fromLayout"] == "3×TP1" and proposal["before"]["ttftMs"] > 0
    assert [h["action"] for h in obj["status"]["history"]][-1] == "Proposed"
    assert cluster.objects == workloads and cluster.applies == applies
    assert obj["status"]["plan"]["layout"] == "3×TP1"


def drive(obj: dict[str, Any], cluster: FakeCluster, planner: Any, metrics: ScriptedMetrics, *, start: int,
          until_done: bool = True, passes: int = 40, limit_gpus: int = MAX_GPUS + SURGE_GPUS) -> tuple[list[Outcome], int]:
    """Reconcile once a minute; at every pass check the GPU budget plus surge and, while a transition runs, its floor."""
    outs: list[Outcome] = []
    started = False
    for minute in range(start, start + passes):
        outs.append(run(obj, cluster, planner, metrics, minute))
        assert cluster.gpus_held(NS) <= limit_gpus, deployments(cluster)
        cluster.tick()
        transition = (obj["status"].get("replan") or {}).get("transition")
        if transition:
            started = True
            floor = obj["status"]["replan"]["transitionFloorRps"]
            assert serving_capacity(obj, cluster) >= floor - 1e-9, (minute, deployments(cluster))
        elif started and until_done:
            return outs, minute + 1
    return outs, start + passes


def test_a_sustained_drift_in_auto_runs_a_transition_one_step_per_pass_to_the_new_layout() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    old_set = obj["status"]["plan"]["set"]
    metrics.rate = 80.0
    outs, _ = drive(obj, cluster, planner, metrics, start=5)
    plan = obj["status"]["plan"]
    assert plan["layout"] == "3×TP2" and plan["set"] != old_set
    # Only the new layout's objects are left.
    assert deployments(cluster) == {f"llama-8b-{plan['set']}-aggregated": 3}
    assert sorted(r.kind for r in cluster.objects) == ["Deployment", "Service"]
    steps = [e.reason for e in cluster.events if e.reason.startswith("Transition")]
    assert steps[0] == "TransitionStarted" and "TransitionRoute" in steps and steps[-1] == "TransitionDelete"
    # One step per pass: no pass records two changes of the transition.
    assert all(sum(1 for r in o.applied if "Deployment" in r) <= 1 for o in outs)
    assert [h["layout"] for h in obj["status"]["history"]][-1] == "3×TP2"
    assert cond(obj, "Progressing")["status"] == "False" and cond(obj, "Ready")["status"] == "True"
    assert "proposal" not in obj["status"] or obj["status"]["proposal"] is None


def test_a_smaller_shift_of_the_same_shape_scales_in_place_without_a_second_set() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    old_set = obj["status"]["plan"]["set"]
    metrics.rate = 60.0
    drive(obj, cluster, planner, metrics, start=5)
    assert obj["status"]["plan"]["layout"] == "5×TP1" and obj["status"]["plan"]["set"] == old_set
    assert deployments(cluster) == {f"llama-8b-{old_set}-aggregated": 5}
    assert "TransitionRoute" not in reasons(cluster)


def test_an_operator_restarted_mid_transition_resumes_from_status_and_converges() -> None:
    # No surge GPUs: the new set has to grow while the old one shrinks, over several passes.
    obj, cluster, planner, metrics = running(minutes=5, surge_gpus=0)
    metrics.rate = 80.0
    minute = 5
    while not (obj["status"].get("replan") or {}).get("transition"):
        run(obj, cluster, planner, metrics, minute)
        minute += 1
    _, minute = drive(obj, cluster, planner, metrics, start=minute, until_done=False, passes=2, limit_gpus=MAX_GPUS)
    transition = obj["status"]["replan"]["transition"]
    assert transition["phase"] == "Progressing" and len(transition["desired"]) == 2, transition
    target = layout_from_state(transition["target"])
    # A new operator process: nothing but the object (its status through JSON) and the cluster; a fresh planner and source.
    restarted = json.loads(json.dumps(obj))
    planner2, metrics2 = CountingPlanner(), ScriptedMetrics(rate=80.0)
    outs, _ = drive(restarted, cluster, planner2, metrics2, start=minute, limit_gpus=MAX_GPUS)
    assert len(outs) > 2
    assert restarted["status"]["plan"]["layout"] == target.label == "3×TP2"
    assert deployments(cluster) == {f"llama-8b-{restarted['status']['plan']['set']}-aggregated": 3}
    assert planner2.calls == 0   # it resumed; it did not plan again


def test_a_transition_whose_new_pods_never_become_ready_rolls_back() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    old_set, old = obj["status"]["plan"]["set"], deployments(cluster)
    metrics.rate = 80.0
    minute = 5
    while not (obj["status"].get("replan") or {}).get("transition"):
        run(obj, cluster, planner, metrics, minute)
        minute += 1
    new_set = obj["status"]["replan"]["transition"]["toSet"]
    cluster.unready = {f"llama-8b-{new_set}-aggregated"}
    outs = []
    for _ in range(40):   # ready timeout 900 s: 15 passes a minute apart, then the rollback
        outs.append(run(obj, cluster, planner, metrics, minute))
        minute += 1
        assert cluster.gpus_held(NS) <= MAX_GPUS + SURGE_GPUS
        if not obj["status"]["replan"].get("transition"):
            break
    assert "TransitionRollback" in reasons(cluster) and "TransitionRolledBack" in reasons(cluster)
    assert any(o.requeue_after_s == 0.0 for o in outs)   # the rollback asks to run again at once, not in 15 s
    assert obj["status"]["plan"]["layout"] == "3×TP1" and obj["status"]["plan"]["set"] == old_set
    assert deployments(cluster) == old


def test_pods_that_take_long_to_terminate_hold_the_next_step_back_and_the_budget_holds() -> None:
    obj, cluster, planner, metrics = running(minutes=5, surge_gpus=0)
    cluster.grace_passes = 2   # a removed pod keeps its GPUs over the next two passes
    metrics.rate = 80.0
    outs, _ = drive(obj, cluster, planner, metrics, start=5, limit_gpus=MAX_GPUS)
    assert obj["status"]["plan"]["layout"] == "3×TP2"
    steps = [e.message for e in cluster.events if e.reason == "TransitionScale"]
    assert len(steps) >= 3 and len(outs) > len(steps) + 2   # passes spent waiting for GPUs to come free


def test_pinned_only_observes_however_the_traffic_drifts() -> None:
    obj = topology("Pinned", pinned={"kind": "replicas", "replicas": 3, "tp": 1})
    obj["spec"]["policy"] |= {"replanInterval": "1m", "cooldown": "5m"}
    cluster, planner, metrics = FakeCluster(), CountingPlanner(), ScriptedMetrics(rate=80.0)
    for minute in range(10):
        run(obj, cluster, planner, metrics, minute)
    assert obj["status"]["plan"]["layout"] == "3×TP1" and planner.calls == 1
    assert obj["status"]["observed"]["arrivalRateRps"] == pytest.approx(80.0)
    assert not [r for r in reasons(cluster) if r.startswith(("Transition", "PlanProposed"))]
    assert obj["status"]["replan"]["transition"] is None


def test_a_blocked_change_keeps_reading_the_metrics_and_starts_once_the_measured_load_lets_it() -> None:
    # Pinned 4×TP1 serving more than any step towards 2×TP2 can keep within maxGPUs 4 and no surge: the move is blocked.
    # While it waits, the running layout's metrics are still read (status.observed follows them) and the load the floor
    # follows is the measured one, so when the traffic falls the move starts. The old reconcile stopped reading metrics
    # while a change was blocked: status.observed froze and the floor kept the load measured before the edit for ever.
    obj = topology("Pinned", pinned={"kind": "replicas", "replicas": 4, "tp": 1})
    obj["spec"]["policy"] |= {"replanInterval": "1m", "cooldown": "5m", "maxSurgeGPUs": 0}
    obj["spec"]["hardware"]["maxGPUs"] = 4
    cluster, planner, metrics = FakeCluster(), CountingPlanner(), ScriptedMetrics(rate=200.0)
    for minute in range(4):
        run(obj, cluster, planner, metrics, minute)
        cluster.tick()
    assert obj["status"]["plan"]["layout"] == "4×TP1" and obj["status"]["observed"]["arrivalRateRps"] == pytest.approx(200.0)
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 2, "tp": 2}
    obj["metadata"]["generation"] += 1
    running_before = deployments(cluster)
    for minute in range(4, 8):
        metrics.rate = 150.0 + minute
        run(obj, cluster, planner, metrics, minute)
        cluster.tick()
        assert cond(obj, "Planned")["reason"] == "TransitionBlocked" and deployments(cluster) == running_before
    assert 157.0 < obj["status"]["observed"]["arrivalRateRps"] < 200.0   # the window now holds the passes' readings
    assert obj["status"]["observed"]["at"] == (T0 + timedelta(minutes=7)).isoformat().replace("+00:00", "Z")
    assert reasons(cluster).count("TransitionBlocked") == 1 and planner.calls == 2
    metrics.rate = 0.5   # the traffic falls: a sequence that keeps 0.5 req/s serving fits in 4 GPUs
    for minute in range(8, 40):
        run(obj, cluster, planner, metrics, minute)
        cluster.tick()
        assert cluster.gpus_held(NS) <= 4
        if obj["status"]["plan"]["layout"] == "2×TP2" and not obj["status"]["replan"].get("transition"):
            break
    assert reasons(cluster).count("TransitionStarted") == 1 and obj["status"]["plan"]["layout"] == "2×TP2"
    assert planner.calls == 2   # the blocked change started from its plan: judged again, never planned again
