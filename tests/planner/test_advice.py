"""Infeasible plans say what would make them feasible (planner.search.advice), and each piece of advice is true: planning
with it applied passes the funnel, and one step short of it does not."""

from dataclasses import replace

import pytest

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.search.decide import decide
from servingtopology.planner.search.funnel import run_funnel
from servingtopology.planner.workload import Slo
from servingtopology.spec import parse_spec, to_problem


def _problem(model="llama-3.1-70b", gpus=8, rate=40.0, ttft=300, tpot=40, input_tokens=2048):
    return to_problem(parse_spec({
        "model": model, "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": gpus},
        "workload": {"arrivalRate": rate, "inputTokens": input_tokens, "outputTokens": 256},
        "slo": {"ttftMs": {"p95": ttft}, "tpotMs": {"p95": tpot}}}))


def _advice(problem):
    with pytest.raises(Infeasible) as info:
        decide(problem)
    assert info.value.advice is not None
    return info.value


def _feasible(problem) -> bool:
    return bool(run_funnel(problem).survivors)


# (what is short, the problem): a load over what 8 GPUs carry; a TTFT no GPU count reaches; weights that do not fit
CASES = {
    "load": _problem(),
    "ttft": _problem(model="llama-3.1-8b", rate=5, ttft=40, input_tokens=4000),
    "memory": _problem(model="llama-3.1-405b", gpus=4, rate=1, ttft=3000, tpot=100, input_tokens=1000),
}


@pytest.mark.parametrize("case", CASES)
def test_needs_n_gpus_is_the_smallest_feasible_budget(case):
    problem = CASES[case]
    advice = _advice(problem).advice
    if advice.min_gpus is None:
        assert case == "ttft"      # a latency floor over the SLO: no budget up to the searched one helps
        assert not _feasible(replace(problem, max_gpus=advice.searched_gpus))
        assert advice.searched_gpus >= problem.max_gpus * 64
        return
    assert advice.min_gpus > problem.max_gpus
    assert _feasible(replace(problem, max_gpus=advice.min_gpus))
    assert not _feasible(replace(problem, max_gpus=advice.min_gpus - 1))


@pytest.mark.parametrize("case", ["load", "ttft"])
def test_feasible_at_the_advised_load(case):
    problem = CASES[case]
    advice = _advice(problem).advice
    if case == "ttft":
        assert advice.feasible_load_rps == 0.0    # the nearest layouts miss TTFT even when idle
        return
    assert 0 < advice.feasible_load_rps < problem.workload.arrival_rate_rps
    lighter = replace(problem, workload=replace(problem.workload, arrival_rate_rps=advice.feasible_load_rps * 0.99))
    assert _feasible(lighter)


def test_the_closest_layout_meets_the_slos_it_names():
    problem = CASES["ttft"]
    advice = _advice(problem).advice
    assert advice.closest is not None and advice.needed_ttft_ms > problem.slo.ttft_ms
    looser = replace(problem, slo=Slo(ttft_ms=advice.needed_ttft_ms * 1.01, tpot_ms=max(advice.needed_tpot_ms * 1.01, problem.slo.tpot_ms),
                                      ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile))
    result = run_funnel(looser)
    assert advice.closest.label in {s.layout.label for s in result.survivors}


def test_the_error_message_carries_the_advice_for_the_operator_condition():
    err = _advice(CASES["load"])
    message = str(err)
    assert f"needs ≥ {err.advice.min_gpus} GPUs of this kind" in message
    assert f"feasible at ≤ {err.advice.feasible_load_rps:.3g} req/s" in message
    assert "closest miss" in message and err.closest_miss in message
