"""What `kubectl get stopo`, `describe` and the Events show, through the real reconcile against the in-memory cluster:
the printer columns' texts (measured / predicted with units, the layout and phase of a transition), Ready held
while the serving floor is (ServingFloorHeld), Progressing carrying the transition, the MetricsGrace rule, no
drift judged on samples of a layout that no longer runs (PostTransitionWindow), and before/after figures at the
same load in the Events (SameLoadFigures).

Scenarios are test_live_reconcile's: Llama-3.1-8B at 40 req/s runs as 3×TP1; at 80 req/s the planner moves it to
3×TP2 through a second set.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import timedelta
from typing import Any

from cases import prediction
from fake_cluster import FakeCluster
from test_live_reconcile import NS, T0, CountingPlanner, ScriptedMetrics, live_topology, run, running
from test_reconcile import cond, reasons

from servingtopology.operator.api.resource import PlanStatus
from servingtopology.operator.live.readout import ms_text, pair_text, phase_text, summary_status, traffic_shares
from servingtopology.operator.plan_status import change_message, predicted
from servingtopology.operator.reconcile import reconcile
from servingtopology.operator.replan import METRICS_GRACE_MIN_S, ReplanMemory, _change
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role
from servingtopology.planner.live.transition import ClusterView, Mode, Phase, TransitionState
from servingtopology.planner.problem import Candidate

UNIT = re.compile(r"^(-|[0-9.]+(ms|s)) / (-|[0-9.]+(ms|s))$")


def summary(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["status"]["summary"])


# ---- the texts ----


def test_durations_carry_their_unit_and_a_missing_figure_is_a_dash() -> None:
    # (ms, text): sub-10 ms keeps a decimal; seconds from 1 s; no figure at all is "-".
    rows = [(8.07, "8.1ms"), (39.9, "40ms"), (999.4, "999ms"), (4600.0, "4.6s"), (208169.0, "208s"), (None, "-")]
    assert [ms_text(ms) for ms, _ in rows] == [text for _, text in rows]
    assert pair_text(4600.0, 39.9) == "4.6s / 40ms" and pair_text(None, 40.0) == "- / 40ms"


def _surge(serving: tuple[str, ...], phase: Phase = Phase.PROGRESSING) -> TransitionState:
    old, new = Layout.replicas(3, Parallelism(tp=1)), Layout.replicas(3, Parallelism(tp=2))
    return TransitionState(mode=Mode.SURGE, phase=phase, source=old, target=new, from_set="a", to_set="b",
                           desired={"a": {Role.AGGREGATED: 3}, "b": {Role.AGGREGATED: 2}}, serving=serving, since_s=0.0, started_s=0.0)


def test_the_traffic_split_follows_the_ready_entry_endpoints_of_the_serving_sets() -> None:
    state = _surge(("a", "b"))
    view = ClusterView(ready={"a": {Role.AGGREGATED: 3}, "b": {Role.AGGREGATED: 1}})
    assert traffic_shares(state, view) == {"a": 0.75, "b": 0.25}
    assert phase_text(state, traffic_shares(state, view)) == "Progressing (Surge): 3×TP1 75%, 3×TP2 25%"
    # Only the old set serves: the new one takes nothing, however ready it is.
    assert traffic_shares(_surge(("a",)), view) == {"a": 1.0}
    assert phase_text(_surge(("b",), Phase.DRAINING), {"b": 1.0}) == "Draining (Surge): 3×TP2 100%"
    assert phase_text(None, None) == "Steady"


def test_a_failed_transition_keeps_showing_both_layouts_and_its_phase() -> None:
    failed = _surge(("a", "b"), Phase.FAILED)
    s = summary_status(mode="Auto", plan=None, proposal=None, observed=None, transition=failed, shares={"a": 0.5, "b": 0.5})
    assert s.phase == "Failed (Surge)" and s.layout == "-"   # no plan: nothing claimed as running
    in_place = TransitionState(mode=Mode.IN_PLACE, phase=Phase.PROGRESSING, source=failed.source, target=failed.source,
                               from_set="a", to_set="a", desired={"a": {Role.AGGREGATED: 3}}, serving=("a",), since_s=0.0, started_s=0.0)
    assert phase_text(in_place, {"a": 1.0}) == "Progressing (InPlace)"


# ---- the columns through the reconcile ----


def test_steady_columns_show_measured_over_predicted_with_units_and_the_error() -> None:
    obj, _, _, _ = running(minutes=8)
    s = summary(obj)
    observed = obj["status"]["observed"]
    assert (s["mode"], s["layout"], s["gpus"], s["pd"], s["phase"], s["proposal"]) == ("Auto", "3×TP1", "3", "-", "Steady", "-")
    # The scripted engines report p95 TTFT 120 ms and TPOT 20 ms; the prediction is the running layout's at the observed load.
    assert s["ttft"] == f"120ms / {ms_text(observed['predictedTtftMs'])}" and UNIT.match(s["ttft"]), s
    assert s["tpot"] == f"20ms / {ms_text(observed['predictedTpotMs'])}" and UNIT.match(s["tpot"]), s
    expected = 120.0 / observed["predictedTtftMs"] - 1
    assert s["error"].startswith(f"TTFT {expected * 100:+.0f}%, TPOT "), s


def test_the_measured_figures_name_the_percentile_they_are_at_and_status_from_before_the_rename_still_reads() -> None:
    # status.observed held the SLO percentile's figure under the name ttftMsP95 whatever the percentile was.
    obj, cluster, planner, metrics = running(minutes=8)
    observed = obj["status"]["observed"]
    assert (observed["ttftMs"], observed["ttftPercentile"], observed["tpotMs"], observed["tpotPercentile"]) == (120.0, 95.0, 20.0, 95.0)
    assert "ttftMsP95" not in observed and "tpotMsP95" not in observed
    old = {k: v for k, v in observed.items() if k not in ("ttftMs", "ttftPercentile", "tpotMs", "tpotPercentile")}
    obj["status"]["observed"] = old | {"ttftMsP95": 120.0, "tpotMsP95": 20.0}
    before = len(cluster.events)
    run(obj, cluster, planner, metrics, 7)   # the same minute, not due: the old figures are read back, not replaced
    assert (obj["status"]["observed"]["ttftMs"], obj["status"]["observed"]["tpotMs"]) == (120.0, 20.0)
    assert "ttftPercentile" not in obj["status"]["observed"]
    assert summary(obj)["ttft"].startswith("120ms / ") and cond(obj, "Ready")["status"] == "True"
    assert "StatusUnreadable" not in reasons(cluster)[before:]


def test_a_new_topology_without_a_measurement_shows_a_dash_over_the_plans_prediction() -> None:
    obj, cluster = live_topology(), FakeCluster()
    run(obj, cluster, CountingPlanner(), ScriptedMetrics(empty=True), 0)
    predicted = obj["status"]["plan"]["predicted"]
    assert summary(obj)["ttft"] == f"- / {ms_text(predicted['ttftMs'])}" and summary(obj)["error"] == "-"


def test_ready_reason_tells_dry_run_invalid_and_infeasible_apart() -> None:
    dry = live_topology("DryRun")
    run(dry, FakeCluster(), CountingPlanner(), ScriptedMetrics(), 0)
    bad = live_topology()
    bad["spec"]["hardware"]["maxGPUs"] = 0
    run(bad, FakeCluster(), CountingPlanner(), ScriptedMetrics(), 0)
    tight = live_topology()
    tight["spec"]["slo"] = {"ttftMs": {"p95": 1}, "tpotMs": {"p95": 1}}
    run(tight, FakeCluster(), CountingPlanner(), ScriptedMetrics(), 0)
    got = {name: (cond(o, "Ready")["status"], cond(o, "Ready")["reason"], summary(o)["mode"])
           for name, o in (("dry", dry), ("bad", bad), ("tight", tight))}
    assert got == {"dry": ("False", "AwaitingApproval", "DryRun"), "bad": ("False", "InvalidSpec", "Auto"), "tight": ("False", "Infeasible", "Auto")}
    proposal = dry["status"]["proposal"]
    assert summary(dry)["proposal"] == f"{proposal['id']}: {proposal['layout']}" and summary(dry)["layout"] == f"{proposal['layout']} (proposed)"


# ---- a surge transition ----


def _start_surge(obj: dict[str, Any], cluster: FakeCluster, planner: Any, metrics: ScriptedMetrics) -> tuple[int, str]:
    """Drift to 80 req/s until the transition to 3×TP2 starts; (next minute, the arriving set)."""
    metrics.rate = 80.0
    minute = 5
    while not (obj["status"].get("replan") or {}).get("transition"):
        run(obj, cluster, planner, metrics, minute)
        minute += 1
    return minute, obj["status"]["replan"]["transition"]["toSet"]


def test_ready_stays_true_while_the_old_set_holds_the_floor_and_progressing_carries_the_phase() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    minute, new_set = _start_surge(obj, cluster, planner, metrics)
    cluster.unready = {f"llama-8b-{new_set}-aggregated"}   # the new pods take a few passes to become Ready
    seen: list[tuple[str, str, str, str, str]] = []
    for _ in range(3):
        run(obj, cluster, planner, metrics, minute)
        minute += 1
        ready, progressing, s = cond(obj, "Ready"), cond(obj, "Progressing"), summary(obj)
        seen.append((ready["status"], ready["reason"], progressing["reason"], s["layout"], s["phase"]))
    assert all(r == ("True", "ServingFloorHeld", "SurgeProgressing", "3×TP1 → 3×TP2", "Progressing (Surge): 3×TP1 100%") for r in seen), seen
    assert cond(obj, "Progressing")["status"] == "True" and "3×TP1 → 3×TP2" in cond(obj, "Progressing")["message"]
    assert summary(obj)["gpus"] == "3 → 6" and summary(obj)["proposal"] == "3×TP2"
    # The new set becomes Ready and takes traffic beside the old one; the split is shown, Ready holds.
    cluster.unready = set()
    phases = []
    for _ in range(6):
        run(obj, cluster, planner, metrics, minute)
        minute += 1
        if (obj["status"]["replan"] or {}).get("transition"):
            phases.append(summary(obj)["phase"])
            assert cond(obj, "Ready")["status"] == "True", cond(obj, "Ready")
    assert any("3×TP2" in p and "%" in p for p in phases), phases
    assert summary(obj)["layout"] == "3×TP2" and summary(obj)["phase"] == "Steady"


def test_ready_goes_false_when_the_serving_sets_fall_below_the_floor_mid_transition() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    minute, new_set = _start_surge(obj, cluster, planner, metrics)
    old_set = obj["status"]["replan"]["transition"]["fromSet"]
    cluster.unready = {f"llama-8b-{new_set}-aggregated", f"llama-8b-{old_set}-aggregated"}
    run(obj, cluster, planner, metrics, minute)
    assert (cond(obj, "Ready")["status"], cond(obj, "Ready")["reason"]) == ("False", "BelowServingFloor")


# ---- MetricsGrace ----


def _run_at(obj: dict[str, Any], cluster: FakeCluster, planner: Any, metrics: ScriptedMetrics, seconds: float) -> None:
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=planner, now=T0 + timedelta(seconds=seconds), metrics=metrics)
    obj["status"] = json.loads(json.dumps({k: v for k, v in out.status.items() if v is not None}))


def test_a_new_topology_gets_no_metrics_warning_before_its_workloads_have_been_ready_for_the_grace_period() -> None:
    obj, cluster, planner, metrics = live_topology(), FakeCluster(), CountingPlanner(), ScriptedMetrics(empty=True)
    obj["spec"]["policy"]["replanInterval"] = "10s"
    for second in range(0, int(METRICS_GRACE_MIN_S), 5):    # Ready from the first pass on; grace max(10 s, 60 s)
        _run_at(obj, cluster, planner, metrics, second)
        assert "MetricsUnavailable" not in reasons(cluster), (second, reasons(cluster))
        if second > 0:   # the first pass plans and applies; fetching starts with the next
            available = cond(obj, "MetricsAvailable")
            assert (available["status"], available["reason"]) == ("Unknown", "AwaitingMetrics"), available
    for second in range(60, 90, 5):
        _run_at(obj, cluster, planner, metrics, second)
    assert reasons(cluster).count("MetricsUnavailable") == 1 and cond(obj, "MetricsAvailable")["status"] == "False"


def test_metrics_are_awaited_while_the_workloads_are_not_ready_however_long_that_takes() -> None:
    obj, cluster, planner, metrics = live_topology(), FakeCluster(), CountingPlanner(), ScriptedMetrics(empty=True)
    cluster.ready = False
    for minute in range(5):
        run(obj, cluster, planner, metrics, minute)
    assert "MetricsUnavailable" not in reasons(cluster)
    assert "not Ready" in cond(obj, "MetricsAvailable")["message"]


def test_an_outage_after_metrics_flowed_is_reported_at_once() -> None:
    obj, cluster, planner, metrics = running(minutes=3)
    metrics.down = True
    run(obj, cluster, planner, metrics, 3)
    assert reasons(cluster).count("MetricsUnavailable") == 1


# ---- PostTransitionWindow and SameLoadFigures ----


def _finish(obj: dict[str, Any], cluster: FakeCluster, planner: Any, metrics: ScriptedMetrics, minute: int) -> int:
    while (obj["status"].get("replan") or {}).get("transition"):
        run(obj, cluster, planner, metrics, minute)
        minute += 1
        assert minute < 60, "the transition did not finish"
    return minute


def test_after_a_transition_drift_is_judged_only_on_samples_taken_after_it_ended() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    minute, _ = _start_surge(obj, cluster, planner, metrics)
    minute = _finish(obj, cluster, planner, metrics, minute)
    ended_s = (T0 + timedelta(minutes=minute - 1)).timestamp()
    assert obj["status"]["replan"]["samples"] == [] and "observed" not in obj["status"]
    assert summary(obj)["ttft"].startswith("- / ")   # nothing measured on 3×TP2 yet
    drift_events = reasons(cluster).count("DriftDetected")
    for _ in range(8):   # steady at the new load
        run(obj, cluster, planner, metrics, minute)
        minute += 1
        memory = ReplanMemory.from_dict(obj["status"]["replan"])
        assert all(s.at_s - s.interval_s >= ended_s for s in memory.samples), (ended_s, [s.at_s for s in memory.samples])
    assert reasons(cluster).count("DriftDetected") == drift_events, reasons(cluster)
    assert obj["status"]["plan"]["layout"] == "3×TP2" and cond(obj, "DriftDetected")["status"] == "False"


def _figures(message: str) -> str:
    """The `p95 TTFT a→b, TPOT c→d` part of a change message."""
    found = re.search(r"p95 TTFT \S+→\S+, TPOT \S+→\S+", message)
    assert found, message
    return found.group(0)


def test_the_events_that_start_and_end_a_transition_quote_the_same_figures_at_the_same_load() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    minute, _ = _start_surge(obj, cluster, planner, metrics)
    _finish(obj, cluster, planner, metrics, minute)
    started = next(e for e in cluster.events if e.reason == "TransitionStarted")
    applied = [e for e in cluster.events if e.reason == "PlanApplied"][-1]
    assert "3×TP1 → 3×TP2 at 80 req/s" in started.message and "3×TP1 → 3×TP2 at 80 req/s" in applied.message, (started, applied)
    assert _figures(started.message) == _figures(applied.message), (started.message, applied.message)
    # 3×TP1 at 80 req/s is over its capacity: its TTFT "before" is far above what it was planned with at 40 req/s.
    planned_at_40 = next(e for e in cluster.events if e.reason == "PlanApplied")
    at_40 = re.search(r"p95 TTFT (\S+?),", planned_at_40.message)
    before_at_80 = re.search(r"p95 TTFT (\S+?)→", started.message)
    assert at_40 and before_at_80 and at_40.group(1) != before_at_80.group(1), (planned_at_40.message, started.message)


def test_the_proposal_keeps_the_load_its_before_and_after_figures_were_predicted_at() -> None:
    obj, cluster, planner, metrics = running(minutes=5)
    _start_surge(obj, cluster, planner, metrics)
    proposal = obj["status"]["proposal"]
    assert proposal["loadRps"] == 80.0 and proposal["before"]["ttftMs"] > proposal["predicted"]["ttftMs"], proposal
    assert NS == "default"


def test_start_and_end_messages_format_the_same_digits_when_a_figure_sits_on_a_rounding_edge() -> None:
    """Status stores TTFT to 0.1 ms and TPOT to 0.01 ms; 158.54 ms reads "159ms" raw but "158ms" once stored as 158.5.
    TransitionStarted (from the Candidate) and PlanApplied (from status) must quote the same digits (a CI run failed so)."""
    for ttft_before, ttft_after, tpot_after in ((339_456.0, 158.54, 17.049), (9.96, 9.949, 9.9951), (999.54, 158.45, 16.995)):
        before = Candidate(Layout.replicas(1, Parallelism(tp=1)), prediction(ttft_before, 277.0), score=0.0)
        after = Candidate(Layout.replicas(3, Parallelism(tp=1)), prediction(ttft_after, tpot_after), score=1.0)
        started = _change(before, after, 95, 25.0, engine=Engine.VLLM)
        stored = predicted(after.prediction)
        plan = PlanStatus.model_construct(layout="3×TP1", gpus=3, predicted=stored)
        applied = change_message(current_layout="1×TP1", current_gpus=1, before=predicted(before.prediction), after=plan,
                                 reason="r", percentile="p95", verb="did", load_rps=25.0)
        assert _figures(started) == _figures(applied), (started, applied)
