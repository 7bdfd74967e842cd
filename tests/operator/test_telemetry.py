"""The operator's per-resource metrics: a pass sets the plan's layout, P:D instances, GPUs and predicted TTFT/TPOT
under `topology_namespace`/`topology`; measured figures, the prediction error and the transition phase follow the
status; stale label sets go away; deletion drops the resource's series; the planner is timed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from cases import decision
from fake_cluster import FakeCluster
from prometheus_client import generate_latest
from test_reconcile import topology

from servingtopology.operator.entry.handlers import Runtime
from servingtopology.operator.entry.telemetry import new_metrics
from servingtopology.planner.layout import Layout, Parallelism

LOG = logging.getLogger("test")
T = {"topology_namespace": "default", "topology": "llama-8b"}


class Patch:
    def __init__(self) -> None:
        self.status: dict[str, Any] = {}


def value(metrics: Any, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def status(layout: str = "2×TP4", *, replicas: int = 2, observed: dict[str, Any] | None = None,
           transition: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "plan": {"layout": layout, "kind": "replicas", "pd": "-", "gpus": replicas * 4,
                 "roles": [{"role": "aggregated", "replicas": replicas}], "predicted": {"ttftMs": 250.0, "tpotMs": 20.0}},
        "observed": observed or {},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving"}],
        "replan": {"transition": transition} if transition else {},
    }


def test_a_pass_publishes_the_plan_of_the_resource_under_its_namespace_and_name() -> None:
    rt = Runtime(cluster=FakeCluster(), planner=lambda problem: decision(Layout.replicas(2, Parallelism(tp=4))), metrics=new_metrics(),
                 clock=lambda: datetime(2026, 1, 1, tzinfo=UTC), metrics_source=None)
    patch = Patch()
    rt.handle(topology(), patch, LOG, "create")
    m = rt.metrics
    assert value(m, "servingtopology_plan_info", **T, layout="2×TP4", kind="replicas", pd="-") == 1.0
    assert value(m, "servingtopology_plan_instances", **T, role="aggregated") == 2.0
    assert value(m, "servingtopology_plan_gpus", **T) == 8.0
    assert value(m, "servingtopology_predicted_ttft_seconds", **T) == patch.status["plan"]["predicted"]["ttftMs"] / 1000
    assert value(m, "servingtopology_predicted_tpot_seconds", **T) == patch.status["plan"]["predicted"]["tpotMs"] / 1000
    assert value(m, "servingtopology_condition", **T, type="Ready", reason=next(
        c["reason"] for c in patch.status["conditions"] if c["type"] == "Ready")) in (0.0, 1.0)
    # The resource's own SLO, for the dashboard's SLO lines, at the percentile the spec names.
    slo = topology()["spec"]["slo"]
    (pct, bound), = slo["ttftMs"].items()
    assert value(m, "servingtopology_slo_ttft_seconds", **T, percentile=pct[1:]) == bound / 1000
    (pct, bound), = slo["tpotMs"].items()
    assert value(m, "servingtopology_slo_tpot_seconds", **T, percentile=pct[1:]) == bound / 1000
    # nothing measured yet: no series rather than a zero
    assert value(m, "servingtopology_observed_ttft_seconds", **T) is None
    assert b'servingtopology_plan_info{' in generate_latest(m.registry)


def test_measured_figures_error_and_transition_phase_follow_the_status_and_stale_series_go() -> None:
    m = new_metrics()
    m.record(namespace="default", name="llama-8b", status=status(observed={"ttftMs": 500.0, "tpotMs": 30.0, "ttftError": 1.0,
                                                                          "tpotError": 0.5, "arrivalRateRps": 12.0}))
    assert value(m, "servingtopology_observed_ttft_seconds", **T) == 0.5
    assert value(m, "servingtopology_observed_tpot_seconds", **T) == 0.03
    old = new_metrics()   # status written before ttftMs / tpotMs were named so
    old.record(namespace="default", name="llama-8b", status=status(observed={"ttftMsP95": 500.0, "tpotMsP95": 30.0}))
    assert value(old, "servingtopology_observed_ttft_seconds", **T) == 0.5 and value(old, "servingtopology_observed_tpot_seconds", **T) == 0.03
    assert value(m, "servingtopology_prediction_error_ratio", **T, figure="ttft") == 1.0
    assert value(m, "servingtopology_observed_requests_per_second", **T) == 12.0
    moving = {"phase": "Progressing", "startedS": 100.0}
    for _ in range(3):  # every pass of one transition counts it once
        m.record(namespace="default", name="llama-8b", status=status(transition=moving))
    assert value(m, "servingtopology_transitions_total", **T) == 1.0
    assert value(m, "servingtopology_transition_phase", **T, phase="Progressing") == 1.0
    assert value(m, "servingtopology_transition_phase", **T, phase="Done") == 0.0
    assert value(m, "servingtopology_observed_ttft_seconds", **T) is None   # no longer in status: gone, not stale
    m.record(namespace="default", name="llama-8b", status=status("1P2D@TP2", transition={"phase": "Done", "startedS": 100.0}) | {
        "plan": {"layout": "1P2D@TP2", "kind": "pd", "pd": "1:2", "gpus": 6,
                 "roles": [{"role": "prefill", "replicas": 1}, {"role": "decode", "replicas": 2}, {"role": "router", "replicas": 1}]}})
    assert value(m, "servingtopology_plan_info", **T, layout="2×TP4", kind="replicas", pd="-") is None
    assert value(m, "servingtopology_plan_info", **T, layout="1P2D@TP2", kind="pd", pd="1:2") == 1.0
    assert value(m, "servingtopology_plan_instances", **T, role="aggregated") is None
    assert value(m, "servingtopology_plan_instances", **T, role="prefill") == 1.0
    assert value(m, "servingtopology_plan_instances", **T, role="decode") == 2.0
    assert value(m, "servingtopology_transition_phase", **T, phase="Done") == 1.0
    m.record(namespace="default", name="llama-8b", status=status(transition={"phase": "Progressing", "startedS": 900.0}))
    assert value(m, "servingtopology_transitions_total", **T) == 2.0


def test_a_deleted_resource_leaves_no_series_and_others_keep_theirs() -> None:
    m = new_metrics()
    m.record(namespace="default", name="llama-8b", status=status(transition={"phase": "Progressing", "startedS": 1.0}))
    m.record(namespace="team", name="other", status=status())
    m.forget(namespace="default", name="llama-8b")
    text = generate_latest(m.registry).decode()
    assert 'topology="llama-8b"' not in text
    assert value(m, "servingtopology_plan_gpus", topology_namespace="team", topology="other") == 8.0


def test_the_planner_is_timed_also_when_it_fails() -> None:
    m = new_metrics()
    assert m.timed(lambda problem: problem * 2)(21) == 42

    def broken(problem: int) -> int:
        raise ValueError("no")

    with pytest.raises(ValueError):
        m.timed(broken)(1)
    assert value(m, "servingtopology_plan_seconds_count") == 2.0
