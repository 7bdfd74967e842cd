"""The record and the funnel say nothing false at the edges: a family none of whose candidates reached the ranking is
told which stage removed them (its own funnel), never "no candidate passed stages 1–5" while they passed; the stage
counts only fall, stage 7 never admitting more than stage 6; a pinned layout counts as evaluated in its family."""

from dataclasses import replace

import pytest

from servingtopology.planner.layout import Layout, Parallelism
from servingtopology.planner.search.decide import decide
from servingtopology.planner.search.funnel import run_funnel
from servingtopology.planner.search.record_facts import Family, record_facts
from servingtopology.spec import parse_spec, to_problem


def _problem(rate=0.02):
    # Llama-3.1-8B at a light load: one GPU carries it, so stage 5 hands on only the fewest-GPU candidates and the
    # tensor-parallel family, feasible on its own, never reaches the ranking.
    return to_problem(parse_spec({
        "model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "maxGPUs": 8},
        "workload": {"arrivalRate": rate, "inputTokens": 2000, "outputTokens": 200},
        "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}}}))


def test_a_family_that_passed_stages_1_to_5_but_was_not_handed_on_is_not_said_to_have_failed_them():
    problem = _problem()
    decision = decide(problem)
    rows = {r.family: r for r in record_facts(problem, decision, engine_release="vLLM").families}
    tp = rows[Family.TP]
    alone = run_funnel(replace(problem, search=replace(problem.search, tp=tuple(t for t in problem.search.tp if t > 1), pp=(1,),
                                                       layouts=problem.search.layouts[:1])), keep=1)
    assert tp.evaluated == 0 and alone.survivors   # the case: feasible alone, absent from the ranking
    assert "no candidate of it passed" not in tp.why
    assert f"{alone.stages[-1].admitted:,} candidates of it passed stages 1–5" in tp.why


@pytest.mark.parametrize("rate", [
    0.02,   # a light load: most survivors of stage 5 are not handed on
    20.0,   # a load that needs several GPUs
])
def test_the_funnel_counts_only_fall_through_stages_6_and_7(rate):
    stages = decide(_problem(rate)).funnel
    admitted = [s.admitted for s in stages]
    assert stages[-2].stage.startswith("6") and stages[-1].stage.startswith("7")
    assert admitted == sorted(admitted, reverse=True), admitted


def test_a_pinned_layout_counts_as_evaluated_in_its_family():
    # At 200 req/s no searched candidate survives, so the pin is the one layout of its family that was evaluated.
    pin = Layout.replicas(1, Parallelism(tp=1))
    problem = replace(_problem(200.0), pinned=pin)
    decision = decide(problem)
    rows = {r.family: r for r in record_facts(problem, decision, engine_release="vLLM").families}
    assert not decision.evaluated
    assert rows[Family.REPLICAS].best == decision.best.layout.label and rows[Family.REPLICAS].evaluated == 1
