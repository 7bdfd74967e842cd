"""EngineNamed on every surface: the operator names a layout in its engine's words (Layout.label_for), as the command
line's record does. SGLang counts an attention-DP group's GPUs as its TP size: four GPUs with attention split four ways
are `TP4·DP4-attn` (`--tp-size 4 --attn-dp-size 4`), never vLLM's `TP1·DP4`, in status, Events, conditions,
transitions and the record alike."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_cluster import FakeCluster
from test_reconcile import ROOT

from servingtopology.cli.main import main
from servingtopology.operator.reconcile import reconcile
from servingtopology.planner.layout import Engine, Layout, Parallelism, RoleLayout
from servingtopology.planner.live.transition import Budget, ClusterView, next_step, start_transition
from servingtopology.planner.search.decide import decide

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _resource(pinned: dict[str, Any]) -> dict[str, Any]:
    """examples/servingtopology.yaml on SGLang with a MoE model (attention DP needs one), pinned to `pinned`."""
    obj = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    obj["metadata"] |= {"uid": "uid-1", "generation": 1}
    obj["spec"]["model"] = "Qwen/Qwen3-30B-A3B"
    obj["spec"]["engine"] = {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23"}
    obj["spec"]["policy"]["mode"] = "Pinned"
    obj["spec"]["pinned"] = pinned
    return obj


def _record_decision(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The layout the command line's decision record names (`plan CR.yaml --record`)."""
    record = path.with_suffix(".md")
    assert main(["plan", str(path), "--no-simulate", "--no-progress", "--record", str(record)]) == 0
    capsys.readouterr()
    found = re.search(r"\*\*Decision:\*\* pinned by the spec: \*\*(.+?)\*\*", record.read_text())
    assert found is not None, record.read_text()
    return found.group(1)


@pytest.mark.parametrize(("pinned", "label"), [
    # SGLang's "TP4/DP4 attention": four GPUs, attention split four ways (vLLM's words: 1×TP1·DP4)
    ({"kind": "replicas", "replicas": 1, "tp": 4, "dp": 4, "dpAttention": True}, "1×TP4·DP4-attn"),
    # a PD layout whose roles split their attention differently (vLLM's words: 1P(TP1·DP4)·1D(TP2·DP2))
    ({"kind": "pd", "dpAttention": True, "prefill": {"count": 1, "tp": 4, "dp": 4}, "decode": {"count": 1, "tp": 4, "dp": 2}},
     "1P(TP4·DP4-attn)·1D(TP4·DP2-attn)"),
])
def test_the_operators_events_and_status_name_the_layout_as_the_clis_record_does(
        pinned: dict[str, Any], label: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = _resource(pinned)
    path = tmp_path / "cr.yaml"
    path.write_text(yaml.safe_dump(obj))
    assert _record_decision(path, capsys) == label
    cluster = FakeCluster()
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=T0)
    assert out.error is None, out.status.get("conditions")
    assert out.status["plan"]["layout"] == label
    applied = [e.message for e in cluster.events if e.reason == "PlanApplied"]
    assert applied and label in applied[0], applied
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert label in planned["message"]
    annotations = {o["metadata"].get("annotations", {}).get("servingtopology.io/layout") for o in cluster.objects.values()}
    assert label in annotations, annotations


def test_a_transitions_messages_name_both_layouts_in_the_engines_words() -> None:
    attn = Layout.replicas(1, Parallelism(tp=1, dp=4))
    two = Layout.pd(RoleLayout(1, Parallelism(tp=1, dp=4)), RoleLayout(1, Parallelism(tp=2, dp=2)))
    budget = Budget(max_gpus=8, surge_gpus=4, floor_rps=1.0)
    state = start_transition(attn, two, budget=budget, capacity=lambda layout: 10.0, now_s=0.0, engine=Engine.SGLANG)
    assert state.message == "1×TP4·DP4-attn → 1P(TP4·DP4-attn)·1D(TP4·DP2-attn) (Surge)"
    assert type(state).from_dict(state.to_dict()).engine is Engine.SGLANG   # a restarted operator keeps the words
    step = next_step(state, ClusterView(ready={state.from_set: dict(state.desired[state.from_set])}), budget=budget,
                     capacity=lambda layout: 10.0, now_s=1.0)
    assert "TP4·DP4-attn" in step.message and "TP1·DP4" not in step.message, step.message
