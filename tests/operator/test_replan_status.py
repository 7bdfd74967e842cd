"""status.replan is typed: a strict, schema-validated round trip; what cannot be read is named in a condition or an
Event, and a running transition that cannot be read holds the workloads instead of being silently dropped."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fake_cluster import FakeCluster
from test_reconcile import PD8, REPLICAS, ScriptedPlanner, bump, cond, decision, run, topology

from servingtopology.operator.replan import ReplanMemory, ReplanStatusError, read_replan_status
from servingtopology.operator.replan_status import validate_replan_status
from servingtopology.planner.layout import Engine, Layout, Parallelism
from servingtopology.planner.live.calibration import LiveCalibration
from servingtopology.planner.live.transition import Budget, CapacityDrop, StartVerdict, start_requested


def _mid_transition() -> tuple[dict[str, Any], FakeCluster, ScriptedPlanner]:
    """A resource whose spec edit started a transition 4×TP2 → 1P3D@TP2 that is one step in."""
    obj, cluster = topology(), FakeCluster()
    planner = ScriptedPlanner(decision(REPLICAS, ttft_ms=310, tpot_ms=30), decision(PD8, ttft_ms=180, tpot_ms=28))
    run(obj, cluster, planner)
    bump(obj, workload={**obj["spec"]["workload"], "arrivalRate": 30})
    run(obj, cluster, planner, minutes=10)
    assert obj["status"]["replan"]["transition"]["phase"] == "Progressing"
    return obj, cluster, planner


def test_the_running_transition_round_trips_through_json_and_the_schema() -> None:
    obj, _, _ = _mid_transition()
    raw = json.loads(json.dumps(obj["status"]["replan"]))
    model, unreadable = validate_replan_status(raw)
    assert unreadable is None and model.transition is not None and model.transitionFloorRps is not None
    memory = ReplanMemory.from_dict(raw)
    assert memory.to_dict() == raw and ReplanMemory.from_dict(memory.to_dict()) == memory


@pytest.mark.parametrize(("corrupt", "field"), [
    (lambda r: r["transition"].pop("toSet"), "status.replan.transition.toSet"),                      # a key lost
    (lambda r: r["transition"]["desired"].update({"x": {"aggregated": "two"}}), "status.replan.transition.desired"),  # a type
    (lambda r: r["transition"].update({"phase": "Sideways"}), "status.replan.transition.phase"),      # not a phase
    (lambda r: r.pop("transitionFloorRps"), "transitionFloorRps"),                                    # the floor lost
    (lambda r: r.update({"transitionFloorRps": -1}), "status.replan.transitionFloorRps"),             # a negative floor
])
def test_a_running_transition_that_cannot_be_read_holds_the_workloads_and_says_why(corrupt: Any, field: str) -> None:
    obj, cluster, planner = _mid_transition()
    corrupt(obj["status"]["replan"])
    raw, before, events = copy.deepcopy(obj["status"]["replan"]), copy.deepcopy(cluster.objects), len(cluster.events)
    out = run(obj, cluster, planner, minutes=11)
    assert cluster.objects == before and out.applied == () and out.pruned == ()        # nothing applied, nothing pruned
    assert obj["status"]["replan"] == raw                                                # written back as it was
    degraded = cond(obj, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "StatusUnreadable") and field in degraded["message"]
    assert [e.reason for e in cluster.events[events:]] == ["StatusUnreadable"] and out.error == "StatusUnreadable"
    run(obj, cluster, planner, minutes=12)
    assert len(cluster.events) == events + 1                                              # one Event, not one per pass


def test_a_transition_survives_an_unreadable_metric_window_which_alone_starts_afresh() -> None:
    obj, cluster, planner = _mid_transition()
    transition = copy.deepcopy(obj["status"]["replan"]["transition"])
    obj["status"]["replan"]["samples"] = [{"at_s": "yesterday", "interval_s": 60}]
    events = len(cluster.events)
    run(obj, cluster, planner, minutes=11)
    assert obj["status"]["replan"]["samples"] == []
    assert obj["status"]["replan"]["transition"]["fromSet"] == transition["fromSet"]   # still the same transition
    warning = next(e for e in cluster.events[events:] if e.reason == "StatusUnreadable")
    assert "status.replan.samples" in warning.message and "start afresh" in warning.message


def test_an_unreadable_plan_during_a_transition_holds_too() -> None:
    obj, cluster, planner = _mid_transition()
    obj["status"]["plan"]["gpus"] = "eight"
    before = copy.deepcopy(cluster.objects)
    out = run(obj, cluster, planner, minutes=11)
    assert cluster.objects == before and out.error == "StatusUnreadable"
    assert obj["status"]["plan"]["gpus"] == "eight" and obj["status"]["replan"]["transition"]


def test_strict_reading_refuses_coercions_and_names_the_field() -> None:
    with pytest.raises(ReplanStatusError, match=r"status.replan.metricsAvailable"):
        ReplanMemory.from_dict({"metricsAvailable": "yes"})
    with pytest.raises(ReplanStatusError, match=r"status.replan.drift.streak"):
        ReplanMemory.from_dict({"drift": {"streak": -3}})
    memory, unreadable = read_replan_status({"calibration": {"fit": {"factors": {"weights": 9.0}}}, "lastFetchS": 60.0})
    assert unreadable is not None and unreadable.sections == ("calibration",) and not unreadable.transition
    assert memory.last_fetch_s == 60.0 and memory.calibration == LiveCalibration()
    # An older operator's smoothed ratios read as no calibration, without a complaint.
    memory, unreadable = read_replan_status({"calibration": {"ttftCorrection": 1.3, "tpotCorrection": 0.9, "samples": 4}, "lastFetchS": 60.0})
    assert unreadable is None and memory.calibration == LiveCalibration()


def _toy_capacity(layout: Layout) -> float:
    return float(layout.gpus)      # one req/s per GPU


def test_a_requested_change_keeps_the_full_floor_when_a_sequence_can() -> None:
    budget = Budget(max_gpus=8, surge_gpus=8, floor_rps=8.0)
    got = start_requested(Layout.replicas(4, Parallelism(tp=2)), Layout.replicas(1, Parallelism(tp=8)), budget=budget,
                          capacity=_toy_capacity, now_s=0.0, engine=Engine.VLLM)
    assert got.verdict is StartVerdict.FLOOR_KEPT and got.floor_rps == 8.0 and got.lowered == "" and got.gpus_needed == 16


def test_a_requested_change_lowers_the_floor_only_as_far_as_it_must_and_only_when_allowed() -> None:
    # 4×TP2 → 1×TP8 with 2 GPUs of surge: one TP2 instance (2 req/s) can keep serving while the TP8 comes up.
    budget = Budget(max_gpus=8, surge_gpus=2, floor_rps=8.0)
    current, target = Layout.replicas(4, Parallelism(tp=2)), Layout.replicas(1, Parallelism(tp=8))
    got = start_requested(current, target, budget=budget, capacity=_toy_capacity, now_s=0.0, engine=Engine.VLLM, allow=CapacityDrop.ABOVE_ZERO)
    assert got.verdict is StartVerdict.FLOOR_LOWERED and got.floor_rps == 2.0 and got.state is not None
    assert "keeps the serving floor of 8.00 req/s" in got.lowered and "may dip to 2.00 req/s" in got.lowered
    assert "keeping it needs 16 GPUs during the move: raise policy.maxSurgeGPUs to 8" in got.lowered
    held = start_requested(current, target, budget=budget, capacity=_toy_capacity, now_s=0.0, engine=Engine.VLLM)   # the default: Never
    assert held.verdict is StartVerdict.FLOOR_WOULD_DROP and held.state is None and held.holdable_rps == 2.0
    assert held.message.endswith("or set policy.capacityDrop to AboveZero to move keeping at least 2.00 req/s")


def test_the_sample_schema_names_every_field_of_the_planners_metric_sample_and_no_other() -> None:
    # SampleStatus mirrors planner.live.observe.MetricSample field by field (a schema at the status trust boundary):
    # a field added to one and not the other would be dropped or refused on the next pass.
    import dataclasses

    from servingtopology.operator.replan_status import SampleStatus
    from servingtopology.planner.live.observe import MetricSample

    assert list(SampleStatus.model_fields) == [f.name for f in dataclasses.fields(MetricSample)]
