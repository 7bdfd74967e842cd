"""The planner proposes only what the chosen engine release runs: the PD rules of planner/data/engine_caps."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from servingtopology.planner.engines.caps import load_caps, pd_rule_violation, resolve_version
from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.layout import Engine, Layout, LayoutKind, Parallelism, Role, RoleLayout
from servingtopology.planner.problem import Problem, SearchSpace
from servingtopology.planner.search.decide import decide
from servingtopology.planner.search.funnel import run_funnel
from servingtopology.planner.search.record import render_record

from .strategies import problems


def _vllm(problem: Problem, version: str) -> Problem:
    return dataclasses.replace(problem, engine=Engine.VLLM, engine_version=version)


def _pd_violations(layouts: list[Layout]) -> list[str]:
    out = []
    for layout in layouts:
        if layout.kind is LayoutKind.PD:
            p, d = layout.roles[Role.PREFILL].parallelism, layout.roles[Role.DECODE].parallelism
            if d.tp < p.tp or p.pp > 1 or d.pp > 1:
                out.append(layout.label)
    return out


@given(problem=problems())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_vllm_0_11_plan_has_decode_tp_below_prefill_tp_or_pipeline_stages_in_a_pd_role(problem: Problem) -> None:
    problem = _vllm(problem, "0.11.0")
    survivors = run_funnel(problem).survivors
    assert not _pd_violations([s.layout for s in survivors])
    try:
        decision = decide(problem)
    except Infeasible:
        return
    proposed = [decision.best.layout, *(c.layout for c in decision.alternatives), *(c.layout for c in decision.evaluated)]
    assert not _pd_violations(proposed)


def _pd_problem(version: str) -> Problem:
    from servingtopology.planner.hardware import Precision, resolve_gpu
    from servingtopology.planner.model.catalog import resolve_model
    from servingtopology.planner.workload import LengthDist, Slo, Workload

    from .strategies import GPUS  # noqa: F401  (the same catalog the properties draw from)

    return Problem(model=resolve_model("llama-3.1-70b"), gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16,
                   max_gpus=16, engine_version=version,
                   workload=Workload(input_tokens=LengthDist.fixed(4000), output_tokens=LengthDist.fixed(300), arrival_rate_rps=4.0),
                   slo=Slo(ttft_ms=3000.0, tpot_ms=120.0),
                   search=SearchSpace(layouts=(LayoutKind.PD,), tp=(1, 2, 4, 8), pp=(1, 2), dp=(1,), max_num_seqs=(128,),
                                      max_num_batched_tokens=(8192,), memory_fraction=(0.9,), top_k=4))


@pytest.mark.parametrize(("version", "reasons", "absent"), [
    # vLLM 0.11.0: NIXL asserts decode TP >= prefill TP and keys its workers on the TP rank only (no PP in PD roles)
    ("0.11.0", ["vLLM 0.11.0: decode TP below prefill TP", "vLLM 0.11.0: PP > 1 in a PD role"], []),
    # vLLM 0.33.0: heterogeneous TP both ways; its NIXL consumer refuses pipeline stages on decode only
    ("0.33.0", ["vLLM 0.33.0: PP > 1 on decode"], ["decode TP below prefill TP"]),
])
def test_the_funnel_counts_what_the_release_refuses_under_its_name(version: str, reasons: list[str], absent: list[str]) -> None:
    stages = run_funnel(_pd_problem(version)).stages
    counted = {k: v for st in stages for k, v in st.reasons.items()}
    for reason in reasons:
        assert counted.get(reason, 0) > 0, counted
    assert not [r for r in counted if any(a in r for a in absent)]
    assert [st.stage for st in stages][1:2 + len(reasons)] == ["2 GPU budget and node fit", *(f"2{c} vLLM {version} rule" for c in "ab"[:len(reasons)])]
    entering = run_funnel(_pd_problem(version)).candidates_total
    for st in stages:  # every candidate is accounted for, the rules' stages included
        assert st.admitted + st.rejected == entering and sum(st.reasons.values()) == st.rejected
        entering = st.admitted


def test_the_decision_record_names_the_release_and_a_pinned_layout_the_release_refuses_says_so() -> None:
    problem = dataclasses.replace(_pd_problem("0.11.0"), pinned=Layout.pd(RoleLayout(1, Parallelism(tp=4)), RoleLayout(1, Parallelism(tp=2))))
    decision = decide(problem)
    assert "decode TP below prefill TP" in decision.best.why and "nixl_connector.py:968" in decision.best.why
    assert "(vLLM 0.11.0)" in render_record(problem, decision).splitlines()[0]


def test_rules_cite_the_source_line_they_come_from() -> None:
    rules = {r.id: r for r in load_caps("vllm", "0.11.0").pd_rules}
    assert rules["decode_tp_below_prefill_tp"].source.endswith("kv_connector/v1/nixl_connector.py:968")
    assert pd_rule_violation(load_caps("vllm", "0.11.0"), Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(1, Parallelism(tp=4)))) is None


@pytest.mark.parametrize(("version", "image", "expected"), [
    (None, "vllm/vllm-openai:v0.11.0", "0.11.0"),   # the image tag
    ("0.33", "vllm/vllm-openai:v0.11.0", "0.33.0"),  # spec.engine.version wins; X.Y takes the newest covered patch
    (None, "registry.local/vllm:latest", "0.33.0"),  # no version anywhere: the newest covered release
])
def test_the_release_comes_from_the_spec_or_the_image_tag(version: str | None, image: str, expected: str) -> None:
    assert resolve_version(Engine.VLLM, version=version, image=image) == expected


def test_an_uncovered_release_is_refused_naming_the_field_and_the_covered_ones() -> None:
    with pytest.raises(InvalidSpec, match=r"engine.image.*covered: 0.11.0, 0.32.0, 0.33.0"):
        resolve_version(Engine.VLLM, image="vllm/vllm-openai:v0.10.1")
