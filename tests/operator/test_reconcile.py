"""Reconcile flows against the in-memory cluster: create, idempotence, spec change, DryRun, Pinned,
invalid spec, infeasible plans, multi-node without LeaderWorkerSet, readiness, and deletion."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases import decision, prediction
from fake_cluster import FakeCluster

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.reconcile import Outcome, approval_refusal, reconcile
from servingtopology.planner.errors import Infeasible
from servingtopology.planner.layout import Layout, LayoutKind, Parallelism, RoleLayout
from servingtopology.planner.live.transition import set_name
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.spec import to_layout

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
REPLICAS = Layout.replicas(4, Parallelism(tp=2))
PD = Layout.pd(RoleLayout(2, Parallelism(tp=4)), RoleLayout(3, Parallelism(tp=4)))
R, P = set_name(REPLICAS), set_name(PD)   # the workload sets these layouts run as


class ScriptedPlanner:
    """Returns the next scripted Decision (or raises the scripted error), and keeps every Problem it saw."""

    def __init__(self, *results: Decision | Exception) -> None:
        self.results = list(results)
        self.problems: list[Problem] = []

    def __call__(self, problem: Problem) -> Decision:
        self.problems.append(problem)
        result = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        if isinstance(result, Exception):
            raise result
        if problem.pinned is not None:
            return decision(problem.pinned, ttft_ms=result.best.prediction.ttft_ms, tpot_ms=result.best.prediction.tpot_ms)
        return result


def topology(mode: str = "Auto", **spec_changes: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    obj["metadata"] |= {"uid": "uid-1", "generation": 1}
    obj["spec"]["policy"]["mode"] = mode
    obj["spec"].update(spec_changes)
    return obj


def run(obj: dict[str, Any], cluster: FakeCluster, planner: ScriptedPlanner, *, minutes: int = 0) -> Outcome:
    """One reconcile, then write its status back the way kopf's status patch would."""
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=planner, now=T0 + timedelta(minutes=minutes))
    obj["status"] = {k: v for k, v in out.status.items() if v is not None}
    annotations = obj["metadata"].get("annotations", {})
    for ref, key, value in cluster.removed_annotations:   # what the API server does with the operator's guarded patch
        if ref.name == obj["metadata"]["name"] and annotations.get(key) == value:
            del annotations[key]
    cluster.removed_annotations.clear()
    return out


def bump(obj: dict[str, Any], **spec_changes: Any) -> None:
    obj["spec"].update(spec_changes)
    obj["metadata"]["generation"] += 1


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def reasons(cluster: FakeCluster) -> list[str]:
    return [e.reason for e in cluster.events]


def test_the_example_parses_as_a_topology_spec() -> None:
    spec = parse_topology_spec(topology()["spec"])
    assert spec.engine.image.startswith("vllm/") and spec.hardware.tolerations[0].operator == "Exists"


def test_create_in_auto_renders_workloads_and_reports_the_plan() -> None:
    obj, cluster = topology(), FakeCluster()
    out = run(obj, cluster, ScriptedPlanner(decision(REPLICAS, ttft_ms=310, tpot_ms=30)))
    assert cluster.kinds() == [f"Deployment/llama-8b-{R}-aggregated", "Service/llama-8b"]
    plan = obj["status"]["plan"]
    assert (plan["layout"], plan["gpus"], plan["pd"], plan["predicted"]["ttftMs"]) == ("4×TP2", 8, "-", 310.0)
    assert plan["roles"][0]["engineArgs"][:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert cond(obj, "Ready")["status"] == "True" and cond(obj, "Planned")["status"] == "True"
    assert obj["status"]["observedGeneration"] == 1
    assert reasons(cluster) == ["PlanApplied", "WorkloadsApplied"]
    assert out.decided and out.requeue_after_s is None


def test_a_second_pass_changes_nothing_and_does_not_replan() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    before = (copy.deepcopy(cluster.objects), len(cluster.events), copy.deepcopy(obj["status"]))
    out = run(obj, cluster, planner, minutes=5)
    assert (cluster.objects, len(cluster.events), obj["status"]) == before
    assert len(planner.problems) == 1 and out.applied == () and not out.decided


def test_a_deleted_workload_is_put_back_on_the_next_pass() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    victim = next(r for r in cluster.objects if r.kind == "Deployment")
    cluster.delete(victim)
    out = run(obj, cluster, planner, minutes=1)
    assert victim in cluster.objects and out.applied == (f"Deployment/llama-8b-{R}-aggregated",)


PD8 = Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(3, Parallelism(tp=2)))   # fits the example's 8 GPUs


def settle(obj: dict[str, Any], cluster: FakeCluster, planner: ScriptedPlanner, *, minutes: int, passes: int = 40) -> list[Outcome]:
    """Reconcile once a minute until no transition runs; return every pass's outcome (GPUs checked at each)."""
    outs = []
    for i in range(passes):
        outs.append(run(obj, cluster, planner, minutes=minutes + i))
        assert cluster.gpus_held("default") <= 8 + 2   # maxGPUs + maxSurgeGPUs of the example
        if not (obj["status"].get("replan") or {}).get("transition"):
            return outs
    raise AssertionError("the transition did not finish")


# The running 4×TP2 as the planner predicts it at the new load of 30 req/s (it was planned at 310 ms for the old one).
REPLICAS_AT_30 = Candidate(REPLICAS, prediction(2500, 45, meets_slo=False), score=0.1)


def test_a_spec_change_replans_and_moves_to_the_new_layout_through_a_transition() -> None:
    obj, cluster = topology(), FakeCluster()
    planner = ScriptedPlanner(decision(REPLICAS, ttft_ms=310, tpot_ms=30), decision(PD8, ttft_ms=180, tpot_ms=28, current=REPLICAS_AT_30))
    run(obj, cluster, planner)
    bump(obj, workload={**obj["spec"]["workload"], "arrivalRate": 30})
    outs = settle(obj, cluster, planner, minutes=10)
    assert len(outs) > 2   # one step per pass, not all at once
    new = set_name(PD8)
    assert cluster.kinds() == [
        f"Deployment/llama-8b-{new}-decode", f"Deployment/llama-8b-{new}-prefill", f"Deployment/llama-8b-{new}-router",
        "Role/llama-8b-router", "RoleBinding/llama-8b-router", "Service/llama-8b", f"Service/llama-8b-{new}-decode",
        f"Service/llama-8b-{new}-prefill", "ServiceAccount/llama-8b-router"]
    assert f"Deployment/llama-8b-{R}-aggregated" in [r for o in outs for r in o.pruned]
    assert planner.problems[1].current == REPLICAS  # the running layout is the planner's `current`
    started = next(e for e in cluster.events if e.reason == "TransitionStarted")
    # Before and after at the same load (SameLoadFigures), in the Event that starts the change and the one that ends it.
    assert started.message.startswith("Surge transition: changing 4×TP2 → 1P3D@TP2 at 30 req/s: p95 TTFT 2.5s→180ms, TPOT 45ms→28ms")
    applied = next(e for e in reversed(cluster.events) if e.reason == "PlanApplied")
    assert applied.message.startswith("changed 4×TP2 → 1P3D@TP2 at 30 req/s: p95 TTFT 2.5s→180ms, TPOT 45ms→28ms, GPUs 8→8; 4×TP2's "
                                      "TTFT of 2.5s is time spent queueing: it carries 20 req/s within the SLO, under the 30 req/s "
                                      "offered, because")
    assert obj["status"]["history"][-1]["layout"] == "1P3D@TP2"
    assert [h["layout"] for h in obj["status"]["history"]] == ["4×TP2", "1P3D@TP2"]
    assert obj["status"]["plan"]["pd"] == "1:3" and obj["status"]["plan"]["set"] == new
    assert obj["status"]["proposal"] is None if "proposal" in obj["status"] else True
    assert cond(obj, "Progressing")["status"] == "False" and cond(obj, "Ready")["status"] == "True"


def _blocked_passes(obj: dict[str, Any], cluster: FakeCluster, planner: ScriptedPlanner, *, first: int, passes: int) -> list[Outcome]:
    """Reconcile a blocked change once a minute, checking after each pass that no running object changed."""
    running, applies, outs = copy.deepcopy(cluster.objects), cluster.applies, []
    for i in range(passes):
        outs.append(run(obj, cluster, planner, minutes=first + i))
        assert cluster.objects == running and cluster.applies == applies, f"pass {i} changed what runs"
        assert outs[-1].applied == () and outs[-1].pruned == ()
    return outs


def test_a_spec_change_over_the_gpu_budget_waits_with_everything_running_as_it_was() -> None:
    # (a) OverBudget: 2P3D@TP4 needs 20 GPUs, over maxGPUs 8; the old operator replaced 4×TP2 by it at once.
    obj, cluster = topology(), FakeCluster()
    planner = ScriptedPlanner(decision(REPLICAS, ttft_ms=310, tpot_ms=30), decision(PD, ttft_ms=180, tpot_ms=28, current=REPLICAS_AT_30))
    run(obj, cluster, planner)
    created = len(cluster.events)
    bump(obj, workload={**obj["spec"]["workload"], "arrivalRate": 30})
    _blocked_passes(obj, cluster, planner, first=10, passes=4)
    assert len(planner.problems) == 2   # planned once for the generation; the later passes only look again
    planned = cond(obj, "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "TransitionBlocked")
    assert planned["message"].startswith("OverBudget: keeping 4×TP2 serving as it is; 4×TP2 (8 GPUs) → 2P3D@TP4 (20 GPUs): "
                                         "2P3D@TP4 needs 20 GPUs, over hardware.maxGPUs 8; keeping it needs ")
    assert "raise hardware.maxGPUs to 20" in planned["message"]
    assert cond(obj, "Ready")["status"] == "True" and cond(obj, "Ready")["reason"] == "WorkloadsReady"
    assert reasons(cluster)[created:] == ["TransitionBlocked"]   # one Warning, not one per pass; nothing started or applied
    proposal = obj["status"]["proposal"]
    assert (proposal["layout"], proposal["fromLayout"], proposal["gpus"], proposal["fromGPUs"]) == ("2P3D@TP4", "4×TP2", 20, 8)
    assert proposal["message"].startswith("would change 4×TP2 → 2P3D@TP4 at 30 req/s: p95 TTFT 2.5s→180ms, TPOT 45ms→28ms, GPUs 8→20")
    assert obj["status"]["plan"]["layout"] == "4×TP2" and [h["layout"] for h in obj["status"]["history"]] == ["4×TP2"]
    assert obj["status"]["summary"]["proposal"] == "2P3D@TP4" and not (obj["status"].get("replan") or {}).get("transition")


# (b) maxGPUs 2, no surge: 3×TP1 → 1×TP2 has no step sequence that keeps any capacity serving (the TP2 fits only
# once every TP1 is gone). The old operator recorded a floor of 0 with a TransitionUnsafe Warning and went ahead.
TP1X3, TP2X1 = Layout.replicas(3, Parallelism(tp=1)), Layout.replicas(1, Parallelism(tp=2))


def _squeezed(capacity_drop: str | None) -> tuple[dict[str, Any], FakeCluster, ScriptedPlanner]:
    obj, cluster = topology(), FakeCluster()
    planner = ScriptedPlanner(decision(TP1X3, ttft_ms=300, tpot_ms=30), decision(TP2X1, ttft_ms=200, tpot_ms=25))
    run(obj, cluster, planner)
    policy = {**obj["spec"]["policy"], "maxSurgeGPUs": 0} | ({"capacityDrop": capacity_drop} if capacity_drop else {})
    bump(obj, hardware={**obj["spec"]["hardware"], "maxGPUs": 2}, policy=policy)
    return obj, cluster, planner


def test_a_spec_edit_whose_move_would_stop_serving_is_blocked_by_default_and_names_the_gpus_it_needs() -> None:
    obj, cluster, planner = _squeezed(None)
    _blocked_passes(obj, cluster, planner, first=1, passes=3)
    planned = cond(obj, "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "TransitionBlocked")
    message = planned["message"]
    assert message.startswith("FloorWouldDrop: keeping 3×TP1 serving as it is; no step sequence from 3×TP1 (3 GPUs) → 1×TP2 (2 GPUs) "
                              "keeps the serving floor of ")
    assert "within 2 GPUs (hardware.maxGPUs 2 + policy.maxSurgeGPUs 0) (the most a sequence keeps: 0.00 req/s)" in message
    assert "GPUs during the move: raise policy.maxSurgeGPUs to " in message
    assert message.endswith("or set policy.capacityDrop to Any to move with serving stopped for a while")
    assert reasons(cluster).count("TransitionBlocked") == 1 and "TransitionStarted" not in reasons(cluster)
    assert cond(obj, "Ready")["status"] == "True" and obj["status"]["proposal"]["layout"] == "1×TP2"
    # The user raises the surge: a new generation, planned again, and the move starts with its full floor.
    bump(obj, policy={**obj["spec"]["policy"], "maxSurgeGPUs": 2})
    run(obj, cluster, planner, minutes=10)
    replan = obj["status"]["replan"]
    assert replan["transition"]["target"]["roles"]["aggregated"]["tp"] == 2 and replan["transitionFloorRps"] > 0
    assert replan["transitionKeepsServing"] is True and cond(obj, "Planned")["reason"] == "Planned"
    assert reasons(cluster).count("TransitionStarted") == 1


@pytest.mark.parametrize("capacity_drop", ["AboveZero", None])
def test_a_move_that_cannot_keep_any_capacity_stays_blocked_unless_capacity_drop_is_any(capacity_drop: str | None) -> None:
    obj, cluster, planner = _squeezed(capacity_drop)
    _blocked_passes(obj, cluster, planner, first=1, passes=2)
    assert cond(obj, "Planned")["reason"] == "TransitionBlocked" and "FloorWouldDrop" in cond(obj, "Planned")["message"]


def test_capacity_drop_any_lets_the_move_stop_serving_and_says_so_once() -> None:
    obj, cluster, planner = _squeezed("Any")
    settle(obj, cluster, planner, minutes=1)
    events = reasons(cluster)
    assert events.count("TransitionFloorDroppedToZero") == 1 and events.count("TransitionStarted") == 1
    dropped = next(e for e in cluster.events if e.reason == "TransitionFloorDroppedToZero")
    assert "policy.capacityDrop Any: serving may stop during the move" in dropped.message
    assert obj["status"]["plan"]["layout"] == "1×TP2" and cluster.gpus_held("default") <= 2


def test_dry_run_proposes_with_an_event_and_touches_no_workload() -> None:
    obj, cluster = topology("DryRun"), FakeCluster()
    run(obj, cluster, ScriptedPlanner(decision(PD)))
    assert cluster.objects == {} and cluster.applies == 0
    assert reasons(cluster) == ["PlanProposed"]
    assert cluster.events[0].message.startswith("proposal p1: would create 2P3D@TP4: p95 TTFT 180ms")
    assert obj["status"]["proposal"]["layout"] == "2P3D@TP4" and "plan" not in obj["status"]
    assert cond(obj, "Ready")["reason"] == "AwaitingApproval"


# ---- approval (issue 29) -----------------------------------------------------------------------------------------------

APPROVE = "servingtopology.io/approve"


def approve(obj: dict[str, Any], proposal_id: str) -> None:
    obj["metadata"].setdefault("annotations", {})[APPROVE] = proposal_id


def test_dry_run_shows_the_proposal_id_and_its_predicted_figures_in_ready_and_the_columns() -> None:
    obj, cluster = topology("DryRun"), FakeCluster()
    run(obj, cluster, ScriptedPlanner(decision(PD, ttft_ms=180, tpot_ms=25)))
    proposal, ready, summary = obj["status"]["proposal"], cond(obj, "Ready"), obj["status"]["summary"]
    assert proposal["id"] == "p1" and cluster.events[0].message.startswith("proposal p1: would create 2P3D@TP4")
    assert (ready["status"], ready["reason"]) == ("False", "AwaitingApproval")
    assert "proposal p1 (2P3D@TP4, 20 GPUs; predicted TTFT 180 ms, TPOT 25.0 ms" in ready["message"]
    assert f"kubectl annotate stopo llama-8b -n default {APPROVE}=p1" in ready["message"]
    assert (summary["layout"], summary["gpus"], summary["ttft"], summary["tpot"], summary["proposal"]) == (
        "2P3D@TP4 (proposed)", "20 (proposed)", "- / 180ms", "- / 25ms", "p1: 2P3D@TP4")


def test_approving_the_current_proposal_applies_exactly_it_and_keeps_it_reconciled() -> None:
    obj, cluster = topology("DryRun"), FakeCluster()
    planner = ScriptedPlanner(decision(REPLICAS, ttft_ms=180, tpot_ms=25))
    run(obj, cluster, planner)
    assert cluster.objects == {}
    approve(obj, "p1")
    run(obj, cluster, planner, minutes=1)
    assert planner.problems[-1].pinned == REPLICAS       # planned pinned to the proposal, not searched again
    assert obj["status"]["plan"]["layout"] == "4×TP2" and f"Deployment/llama-8b-{R}-aggregated" in cluster.kinds()
    assert obj["status"]["approval"]["id"] == "p1" and cond(obj, "Approved")["reason"] == "ProposalApproved"
    assert reasons(cluster)[0] == "PlanProposed" and reasons(cluster).count("ProposalApproved") == 1
    assert "proposal p1 was approved" in next(e.message for e in cluster.events if e.reason == "PlanApplied")
    run(obj, cluster, planner, minutes=2)           # the annotation stays: nothing is approved twice, the plan is kept
    assert reasons(cluster).count("ProposalApproved") == 1 and reasons(cluster).count("PlanApplied") == 1
    assert obj["status"]["plan"]["layout"] == "4×TP2" and cond(obj, "Ready")["reason"] != "AwaitingApproval"


def test_a_stale_id_is_refused_with_a_named_condition_and_one_warning() -> None:
    obj, cluster = topology("DryRun"), FakeCluster()
    planner = ScriptedPlanner(decision(PD), decision(REPLICAS))
    run(obj, cluster, planner)
    bump(obj, workload={**obj["spec"]["workload"], "arrivalRate": 5})   # a new generation: p1 is replaced by p2
    run(obj, cluster, planner, minutes=1)
    assert obj["status"]["proposal"]["id"] == "p2"
    approve(obj, "p1")
    run(obj, cluster, planner, minutes=2)
    run(obj, cluster, planner, minutes=3)
    approved = cond(obj, "Approved")
    assert (approved["status"], approved["reason"]) == ("False", "ProposalStale")
    assert "servingtopology.io/approve=p1 names no current proposal: the current proposal is p2 (4×TP2, 8 GPUs)" in approved["message"]
    assert reasons(cluster).count("ProposalStale") == 1 and cluster.objects == {} and "plan" not in obj["status"]
    assert next(e for e in cluster.events if e.reason == "ProposalStale").type == "Warning"
    assert APPROVE not in obj["metadata"]["annotations"] and "the annotation was removed" in approved["message"]


def test_an_approval_armed_for_a_future_id_is_refused_removed_and_never_applies_that_proposal() -> None:
    obj, cluster = topology("DryRun"), FakeCluster()
    planner = ScriptedPlanner(decision(PD), decision(REPLICAS))
    run(obj, cluster, planner)
    assert obj["status"]["proposal"]["id"] == "p1"
    approve(obj, "p2")                                  # p2 does not exist yet: nobody has seen it
    run(obj, cluster, planner, minutes=1)
    refused = cond(obj, "Approved")
    assert (refused["status"], refused["reason"]) == ("False", "ProposalNotShown")
    assert refused["message"].startswith("servingtopology.io/approve=p2 names no proposal shown so far (an approval counts only "
                                         "for the proposal current when it is set): the current proposal is p1 (2P3D@TP4, 20 GPUs); "
                                         "nothing was applied and the annotation was removed")
    assert APPROVE not in obj["metadata"]["annotations"]
    assert [e.type for e in cluster.events if e.reason == "ProposalNotShown"] == ["Warning"]
    bump(obj, workload={**obj["spec"]["workload"], "arrivalRate": 5})   # the next edit makes p2
    for minute in range(2, 6):
        run(obj, cluster, planner, minutes=minute)
    assert obj["status"]["proposal"]["id"] == "p2"
    assert cluster.objects == {} and cluster.applies == 0 and "plan" not in obj["status"] and "approval" not in obj["status"]
    assert "ProposalApproved" not in reasons(cluster)


def test_a_future_id_written_with_the_spec_edit_that_makes_it_is_refused_too() -> None:
    obj, cluster = topology("DryRun"), FakeCluster()
    planner = ScriptedPlanner(decision(PD), decision(REPLICAS))
    run(obj, cluster, planner)
    bump(obj, workload={**obj["spec"]["workload"], "arrivalRate": 5})
    approve(obj, "p2")                                  # one apply: the edit and the id it will get
    for minute in range(1, 4):
        run(obj, cluster, planner, minutes=minute)
    assert obj["status"]["proposal"]["id"] == "p2" and cond(obj, "Approved")["reason"] == "ProposalNotShown"
    assert cluster.objects == {} and APPROVE not in obj["metadata"]["annotations"]
    approve(obj, "p2")                                  # approved once it is shown: it runs
    run(obj, cluster, planner, minutes=5)
    assert obj["status"]["plan"]["layout"] == "4×TP2" and cond(obj, "Approved")["reason"] == "ProposalApproved"


@pytest.mark.parametrize(("asked", "shown", "reason"), [
    ("p1", 2, "ProposalStale"),       # shown, then replaced
    ("p2", 2, "ProposalStale"),       # the latest id, but of another generation or already replaced
    ("p3", 2, "ProposalNotShown"),    # the next id: armed before it exists
    ("p0", 2, "ProposalNotShown"),    # never an id
    ("p01", 2, "ProposalNotShown"),   # not how ids are written
    ("latest", 2, "ProposalNotShown"),
])
def test_a_refused_id_is_stale_only_when_this_resource_showed_it(asked: str, shown: int, reason: str) -> None:
    assert approval_refusal(asked, proposals_shown=shown).value == reason


def test_auto_with_approval_required_proposes_and_applies_only_what_is_approved() -> None:
    obj = topology("Auto")
    obj["spec"]["policy"]["approval"] = "Required"
    cluster, planner = FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    assert cluster.objects == {} and obj["status"]["proposal"]["id"] == "p1" and cond(obj, "Ready")["reason"] == "AwaitingApproval"
    approve(obj, "p1")
    run(obj, cluster, planner, minutes=1)
    assert obj["status"]["plan"]["layout"] == "4×TP2" and f"Deployment/llama-8b-{R}-aggregated" in cluster.kinds()


def test_dry_run_over_a_running_plan_words_the_change_and_leaves_the_workloads_alone() -> None:
    obj, cluster = topology(), FakeCluster()
    current = Candidate(REPLICAS, prediction(310, 30), score=0.5)
    planner = ScriptedPlanner(decision(REPLICAS, ttft_ms=310, tpot_ms=30),
                              decision(Layout.pd(RoleLayout(1, Parallelism(tp=4)), RoleLayout(3, Parallelism(tp=2))),
                                       ttft_ms=180, tpot_ms=25, reasons=("long prompts stall decode",), current=current))
    run(obj, cluster, planner)
    running, applies = copy.deepcopy(cluster.objects), cluster.applies
    bump(obj, policy={**obj["spec"]["policy"], "mode": "DryRun"})
    run(obj, cluster, planner, minutes=3)
    assert cluster.objects == running and cluster.applies == applies
    proposed = cluster.events[-1]
    assert proposed.reason == "PlanProposed"
    assert proposed.message == ("proposal p1: would change 4×TP2 → 1P(TP4)·3D(TP2): p95 TTFT 310ms→180ms, TPOT 30ms→25ms, GPUs 8→10, "
                                "because long prompts stall decode")
    assert obj["status"]["plan"]["layout"] == "4×TP2" and obj["status"]["proposal"]["fromLayout"] == "4×TP2"


def test_dry_run_proposes_once_per_generation() -> None:
    obj, cluster, planner = topology("DryRun"), FakeCluster(), ScriptedPlanner(decision(PD))
    run(obj, cluster, planner)
    run(obj, cluster, planner, minutes=5)
    assert reasons(cluster) == ["PlanProposed"] and len(planner.problems) == 1


def test_pinned_renders_the_given_layout_and_still_reports_predictions() -> None:
    pinned = {"kind": "pd", "prefill": {"count": 1, "tp": 2}, "decode": {"count": 2, "tp": 2}}
    obj, cluster, planner = topology("Pinned", pinned=pinned), FakeCluster(), ScriptedPlanner(decision(REPLICAS, ttft_ms=222))
    run(obj, cluster, planner)
    spec = parse_topology_spec(obj["spec"])
    assert planner.problems[0].pinned == to_layout(spec, spec.pinned)
    assert obj["status"]["plan"]["layout"] == "1P2D@TP2" and obj["status"]["plan"]["predicted"]["ttftMs"] == 222.0
    assert f"Deployment/llama-8b-{set_name(to_layout(spec, spec.pinned))}-prefill" in cluster.kinds()
    assert cond(obj, "Planned")["reason"] == "Pinned"


@pytest.mark.parametrize(("change", "field"), [
    ({"policy": {"mode": "Pinned"}}, "pinned"),                         # Pinned without a layout
    ({"hardware": {"gpu": "h100_sxm", "maxGPUs": 0}}, "maxGPUs"),       # below the minimum
    ({"engine": {"name": "trtllm", "image": "x"}}, "engine.name"),      # not an engine we drive
    ({"colour": "blue"}, "colour"),                                     # unknown field
    # requests longer than Llama-3.1-8B's 131,072-token context: no layout serves them (it planned 5×TP1 before); the
    # spec's engine.extraArgs tell the engines a shorter context, which the refusal names (ServedContext)
    ({"workload": {"arrivalRate": 1, "inputTokens": 200000, "outputTokens": 100}}, "up to the model's 131,072"),
])
def test_an_invalid_spec_sets_ready_false_with_an_event_and_applies_nothing(change: dict[str, Any], field: str) -> None:
    obj, cluster, planner = topology(**change), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    out = run(obj, cluster, planner)
    assert cluster.objects == {} and planner.problems == []
    ready = cond(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec") and field in ready["message"]
    assert [(e.type, e.reason) for e in cluster.events] == [("Warning", "InvalidSpec")]
    assert out.error == "InvalidSpec"


def test_an_unknown_model_tells_a_resource_author_the_resources_own_fields() -> None:
    obj, cluster, planner = topology(model="acme/never-heard-of-it-7b"), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    message = cond(obj, "Ready")["message"]
    assert cond(obj, "Ready")["reason"] == "InvalidSpec" and "spec.model" in message
    assert "spec.modelConfigMap" in message and "spec.modelSource" in message
    assert "modelConfig:" not in message     # the CLI's field, which a resource does not have
    assert cluster.objects == {} and planner.problems == []


def test_an_unknown_gpu_keeps_the_running_workloads_and_is_reported_once() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    running = copy.deepcopy(cluster.objects)
    bump(obj, hardware={**obj["spec"]["hardware"], "gpu": "tpu-v9"})
    run(obj, cluster, planner, minutes=1)
    run(obj, cluster, planner, minutes=2)
    assert cluster.objects == running
    assert cond(obj, "Ready")["reason"] == "InvalidSpec" and "hardware.gpu" in cond(obj, "Ready")["message"]
    assert reasons(cluster).count("InvalidSpec") == 1
    assert obj["status"]["plan"]["layout"] == "4×TP2"


def test_no_feasible_layout_keeps_the_running_workloads_and_names_the_stage() -> None:
    obj, cluster = topology(), FakeCluster()
    planner = ScriptedPlanner(decision(REPLICAS), Infeasible("memory", "needs 92 GiB per GPU, has 80"))
    run(obj, cluster, planner)
    running = copy.deepcopy(cluster.objects)
    bump(obj, slo={"ttftMs": {"p95": 5}, "tpotMs": {"p95": 1}})
    out = run(obj, cluster, planner, minutes=1)
    assert cluster.objects == running and out.error == "Infeasible"
    planned = cond(obj, "Planned")
    assert planned["reason"] == "Infeasible" and "'memory'" in planned["message"]
    assert cluster.events[-1].type == "Warning" and cluster.events[-1].reason == "PlanInfeasible"


def test_a_multi_node_plan_without_leader_worker_set_is_refused_whole() -> None:
    wide = Layout.replicas(1, Parallelism(tp=8, pp=2))
    obj, cluster = topology(), FakeCluster(lws_installed=False)
    out = run(obj, cluster, ScriptedPlanner(decision(wide)))
    assert cluster.objects == {} and out.error == "LeaderWorkerSetMissing"
    ready = cond(obj, "Ready")
    assert ready["reason"] == "LeaderWorkerSetMissing" and "leaderworkerset.x-k8s.io" in ready["message"]
    assert reasons(cluster) == ["LeaderWorkerSetMissing"]


def test_a_multi_node_plan_with_leader_worker_set_is_applied() -> None:
    wide = Layout.replicas(1, Parallelism(tp=8, pp=2))
    obj, cluster = topology(), FakeCluster(lws_installed=True)
    run(obj, cluster, ScriptedPlanner(decision(wide)))
    assert f"LeaderWorkerSet/llama-8b-{set_name(wide)}-aggregated" in cluster.kinds()
    assert obj["status"]["plan"]["roles"][0]["nodesPerInstance"] == 2
    assert cond(obj, "Ready")["status"] == "True"


def test_workloads_not_ready_yet_report_progressing_and_ask_for_a_requeue() -> None:
    obj, cluster = topology(), FakeCluster(ready=False)
    out = run(obj, cluster, ScriptedPlanner(decision(REPLICAS)))
    assert cond(obj, "Ready")["status"] == "False" and cond(obj, "Progressing")["status"] == "True"
    assert "aggregated 0/4" in cond(obj, "Ready")["message"] and out.requeue_after_s is not None
    cluster.ready = True
    run(obj, cluster, ScriptedPlanner(decision(REPLICAS)), minutes=1)
    assert cond(obj, "Ready")["status"] == "True" and cond(obj, "Progressing")["status"] == "False"


def test_deleting_the_topology_leaves_nothing_behind() -> None:
    obj, cluster = topology(), FakeCluster()
    run(obj, cluster, ScriptedPlanner(decision(PD)))
    assert len(cluster.objects) == 9
    cluster.collect_garbage(obj["metadata"]["uid"])  # what the API server's garbage collector does
    assert cluster.objects == {}


def test_allowed_layouts_narrow_the_search() -> None:
    obj = topology()
    obj["spec"]["policy"]["allowedLayouts"] = ["replicas"]
    planner = ScriptedPlanner(decision(REPLICAS))
    run(obj, FakeCluster(), planner)
    assert planner.problems[0].search.layouts == (LayoutKind.REPLICAS,)


def test_a_model_config_map_is_read_for_planning() -> None:
    obj = topology()
    del obj["spec"]["model"]
    obj["spec"] |= {"modelConfigMap": {"name": "arch"}, "modelSource": "/models/custom-8b"}
    cluster = FakeCluster()
    cluster.config_maps[("default", "arch")] = {
        "config.json": (ROOT / "planner" / "data" / "models" / "meta-llama_Llama-3.1-8B-Instruct.json").read_text()}
    planner = ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    assert planner.problems[0].model.num_layers == 32
    assert obj["status"]["plan"]["roles"][0]["engineArgs"][2] == "/models/custom-8b"


def test_a_missing_model_config_map_is_an_invalid_spec() -> None:
    obj = topology()
    del obj["spec"]["model"]
    obj["spec"] |= {"modelConfigMap": {"name": "nowhere"}, "modelSource": "/models/x"}
    cluster = FakeCluster()
    run(obj, cluster, ScriptedPlanner(decision(REPLICAS)))
    assert cond(obj, "Ready")["reason"] == "InvalidSpec" and "nowhere" in cond(obj, "Ready")["message"]


def test_status_keys_written_by_others_do_not_make_the_plan_forgotten() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    obj["status"]["kopf"] = {"progress": {}}
    run(obj, cluster, planner, minutes=1)
    assert len(planner.problems) == 1 and obj["status"]["plan"]["layout"] == "4×TP2"


def test_replicas_lost_without_a_change_mark_the_topology_degraded_until_they_return() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    assert cond(obj, "Degraded")["status"] == "False"
    cluster.ready = False  # pods crash; the plan and the objects are unchanged
    run(obj, cluster, planner, minutes=1)
    run(obj, cluster, planner, minutes=2)
    assert cond(obj, "Degraded")["status"] == "True" and cond(obj, "Progressing")["status"] == "False"
    assert cond(obj, "Ready")["reason"] == "ReplicasUnavailable"
    assert reasons(cluster).count("ReplicasUnavailable") == 1
    cluster.ready = True
    run(obj, cluster, planner, minutes=3)
    assert cond(obj, "Degraded")["status"] == "False" and cond(obj, "Ready")["status"] == "True"


def test_a_rollout_in_progress_is_not_degraded() -> None:
    obj, cluster = topology(), FakeCluster(ready=False)
    run(obj, cluster, ScriptedPlanner(decision(REPLICAS)))
    run(obj, cluster, ScriptedPlanner(decision(REPLICAS)), minutes=1)
    assert cond(obj, "Degraded")["status"] == "False" and cond(obj, "Progressing")["status"] == "True"


def test_engine_failures_name_the_pod_its_role_and_the_engines_own_message() -> None:
    from servingtopology.operator.reconcile import engine_failures

    def pod(name: str, message: str, code: int) -> dict[str, object]:
        return {"metadata": {"name": name, "labels": {"servingtopology.io/role": "decode"}},
                "status": {"containerStatuses": [{"name": "engine", "lastState": {"terminated": {"exitCode": code, "message": message}}}]}}

    msg = "AssertionError: Decode TP cannot be smaller than prefill TP"
    healthy = {"metadata": {"name": "ok"}, "status": {"containerStatuses": [{"name": "engine", "state": {"running": {}}}]}}
    assert engine_failures([healthy, pod("d-1", msg, 1), pod("d-2", msg, 1)]) == [f"d-1 (decode): exit 1: {msg}"]
    assert engine_failures([healthy, pod("d-3", "clean exit", 0)]) == []


def test_plans_and_proposals_made_for_a_spec_edit_carry_each_predictions_interval() -> None:
    # IntervalsShown: the chosen layout's TTFT/TPOT under `predicted`, the running layout's at the same load under
    # `before`, each with the class's nominal interval around it (planner/live/error_bars.py), on the plan too.
    obj, cluster = topology(), FakeCluster()
    current = Candidate(REPLICAS, prediction(310, 30), score=0.5)
    planner = ScriptedPlanner(decision(REPLICAS, ttft_ms=310, tpot_ms=30),
                              decision(Layout.pd(RoleLayout(1, Parallelism(tp=4)), RoleLayout(3, Parallelism(tp=2))),
                                       ttft_ms=180, tpot_ms=25, current=current))
    run(obj, cluster, planner)
    plan = obj["status"]["plan"]["predicted"]
    assert plan["ttftInterval"]["low"] < 310 < plan["ttftInterval"]["high"]
    assert plan["tpotInterval"]["low"] < 30 < plan["tpotInterval"]["high"] and plan["tpotInterval"]["level"] == 0.8
    bump(obj, policy={**obj["spec"]["policy"], "mode": "DryRun"})
    run(obj, cluster, planner, minutes=3)
    proposal = obj["status"]["proposal"]
    after, before = proposal["predicted"], proposal["before"]
    assert after["ttftInterval"]["low"] < 180 < after["ttftInterval"]["high"]
    assert after["tpotInterval"]["low"] < 25 < after["tpotInterval"]["high"]
    assert before["tpotInterval"]["low"] < 30 < before["tpotInterval"]["high"]
    assert after["tpotInterval"]["classKey"].startswith("vllm") and before["tpotInterval"]["classKey"] != after["tpotInterval"]["classKey"]
