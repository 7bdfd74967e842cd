"""A pinned layout meets the funnel's stage-3 test (planner.perf.memory_fit): each role's rank pool against what that
role must hold, the prefill rank the longest prompt, the decode or aggregated rank the longest request."""

from dataclasses import replace

import pytest

from servingtopology.planner.errors import PinRefused
from servingtopology.planner.layout import EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.perf.memory_fit import MemoryShortfall, memory_refusal
from servingtopology.planner.problem import SearchSpace
from servingtopology.planner.search.decide import decide, refuse_pin
from servingtopology.planner.search.funnel import MEMORY_STAGE, run_funnel
from servingtopology.spec import parse_spec, to_problem


def _problem(*, engine="sglang", prompt=100_000, output=1_000):
    return to_problem(parse_spec({
        "model": "llama-3.1-8b", "engine": engine, "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
        "workload": {"arrivalRate": 0.05, "inputTokens": prompt, "outputTokens": output},
        "slo": {"ttftMs": {"p95": 600_000}, "tpotMs": {"p95": 200}}}))


def _knobs(fraction):
    return EngineKnobs(max_num_seqs=64, max_num_batched_tokens=8192, memory_fraction=fraction)


@pytest.mark.parametrize(("layout", "role", "shortfall"), [
    # a prefill rank at 0.3 of an H100 keeps about 50k tokens of Llama-3.1-8B: short of the 100k prompt, while the decode
    # ranks at 0.9 hold the whole request: the case the decode-only check let through
    (Layout.pd(RoleLayout(1, Parallelism(tp=1), _knobs(0.3)), RoleLayout(1, Parallelism(tp=2), _knobs(0.9))), Role.PREFILL,
     MemoryShortfall.SHORT),
    # at 0.15 the weights alone take more than the prefill rank's share: no pool at all
    (Layout.pd(RoleLayout(1, Parallelism(tp=1), _knobs(0.15)), RoleLayout(1, Parallelism(tp=2), _knobs(0.9))), Role.PREFILL,
     MemoryShortfall.NO_POOL),
    # the decode rank short of prompt + output while the prefill rank holds the prompt
    (Layout.pd(RoleLayout(1, Parallelism(tp=2), _knobs(0.9)), RoleLayout(1, Parallelism(tp=1), _knobs(0.3))), Role.DECODE,
     MemoryShortfall.SHORT),
    # replicas: the one role
    (Layout.replicas(2, Parallelism(tp=1), _knobs(0.3)), Role.AGGREGATED, MemoryShortfall.SHORT),
])
def test_a_pinned_role_whose_rank_pool_cannot_hold_what_it_must_is_refused_naming_the_role_pool_and_request(layout, role, shortfall):
    problem = replace(_problem(), pinned=layout)
    with pytest.raises(PinRefused) as err:
        decide(problem)
    field = "layout" if role is Role.AGGREGATED else f"layout.{role.value}"
    r = layout.roles[role]
    pool = kv_pool_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision, parallelism=r.parallelism,
                          knobs=r.knobs)
    need = "100,000" if role is Role.PREFILL else "101,000"
    assert err.value.stage == MEMORY_STAGE and err.value.field == field
    assert need in err.value.message and (f"holds {pool:,} KV tokens" if shortfall is MemoryShortfall.SHORT else "no KV pool") in err.value.message


def test_a_pin_whose_every_role_holds_its_share_is_planned():
    layout = Layout.pd(RoleLayout(1, Parallelism(tp=2), _knobs(0.9)), RoleLayout(1, Parallelism(tp=2), _knobs(0.9)))
    problem = replace(_problem(), pinned=layout)
    refuse_pin(problem, layout)
    assert decide(problem).best.layout == layout


@pytest.mark.parametrize("fraction", [0.25, 0.3, 0.35, 0.4, 0.5, 0.9])
@pytest.mark.parametrize("prompt", [20_000, 60_000, 100_000])
def test_the_search_admits_a_replica_shape_at_stage_3_exactly_when_the_pin_of_it_is_not_refused(fraction, prompt):
    # SGLang's pool is not rounded to blocks, so the funnel's vectorised pool and the pin's are the same number.
    base = _problem(prompt=prompt)
    problem = replace(base, search=SearchSpace(layouts=base.search.layouts[:1], tp=(1,), pp=(1,), dp=(1,), max_num_seqs=(64,),
                                               max_num_batched_tokens=(8192,), memory_fraction=(fraction,), kv_dtypes=base.search.kv_dtypes))
    stage3 = next(s for s in run_funnel(problem).stages if s.stage == MEMORY_STAGE)
    pin = Layout.replicas(1, Parallelism(tp=1), replace(_knobs(fraction), kv_dtype=base.search.kv_dtypes[0]))
    assert (stage3.admitted > 0) == (memory_refusal(problem, pin) is None)


def test_the_memory_refusal_of_a_vllm_pin_names_its_role_knob():
    layout = Layout.pd(RoleLayout(1, Parallelism(tp=1), _knobs(0.3)), RoleLayout(1, Parallelism(tp=2), _knobs(0.9)))
    refusal = memory_refusal(replace(_problem(engine="vllm"), pinned=layout), layout)
    assert refusal is not None and refusal.role is Role.PREFILL and "layout.prefill.engineArgs.memoryFraction" in refusal.reason
