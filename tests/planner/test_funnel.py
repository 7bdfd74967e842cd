"""The funnel and `decide`: stage accounting, shape rules, infeasibility reports, layout kinds."""

import pytest

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.layout import EngineKnobs, LayoutKind, Parallelism
from servingtopology.planner.layout import Layout as L
from servingtopology.planner.search.decide import decide, predict_layout
from servingtopology.planner.search.funnel import run_funnel, shape_rejection
from servingtopology.spec import load_spec, parse_spec, to_problem


def _problem(**over):
    spec = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
            "workload": {"arrivalRate": 10, "inputTokens": 1000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 60}}}
    spec.update(over)
    return to_problem(parse_spec(spec))


def test_every_stage_accounts_for_every_candidate():
    result = run_funnel(_problem())
    entering = result.candidates_total
    for stage in result.stages:
        assert stage.admitted + stage.rejected == entering, stage
        assert sum(stage.reasons.values()) == stage.rejected, stage
        entering = stage.admitted
    assert result.survivors_total == entering


def test_the_default_scenario_plans_within_the_budget_and_slos():
    p = to_problem(load_spec(None))
    d = decide(p)
    assert d.best.layout.gpus <= 8
    assert d.best.prediction.meets_slo
    assert d.best.prediction.ttft_ms <= 200 and d.best.prediction.tpot_ms <= 35
    assert d.kv_bytes_per_token == 524_288
    # Stages 1–7, with the engine release's PD rules as stages 2a, 2b… (planner.search.funnel.engine_ladder).
    assert [s.stage[0] for s in d.funnel if not s.stage[1].isalpha()] == list("1234567")


@pytest.mark.parametrize(("tp", "pp", "dp", "why"), [
    (3, 1, 1, "attention heads"),            # 32 heads are not divisible by 3
    (16, 1, 1, "spans nodes"),               # a TP group larger than an 8-GPU node
    (1, 64, 1, "exceeds the layers"),        # 32 layers cannot make 64 stages
    (1, 1, 2, "MoE or MLA"),                 # attention DP on a dense model
])
def test_impossible_shapes_are_rejected_at_stage_1(tp, pp, dp, why):
    p = _problem(hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 128})
    assert why in (shape_rejection(p, tp, pp, dp) or "")


def test_attention_dp_is_allowed_for_moe_models():
    p = _problem(model="qwen3-30b-a3b")
    assert shape_rejection(p, 2, 1, 4) is None


def test_a_model_too_big_for_the_budget_reports_the_memory_stage_and_a_closest_miss():
    p = _problem(model="llama-3.1-405b", hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 4})
    with pytest.raises(Infeasible) as err:
        decide(p)
    assert err.value.stage.startswith("3")
    assert "405b" in err.value.closest_miss and err.value.funnel


def test_an_impossible_slo_reports_how_far_the_closest_miss_was():
    p = _problem(slo={"ttftMs": {"p95": 1}, "tpotMs": {"p95": 60}})
    with pytest.raises(Infeasible) as err:
        decide(p)
    assert err.value.stage.startswith("5")
    assert "p95 TTFT" in err.value.closest_miss and "against the 1 ms SLO" in err.value.closest_miss and "short" not in err.value.closest_miss


def test_long_prompts_at_a_tight_tpot_move_the_choice_to_pd():
    # 16k-token prompts interleaved with decodes stall them; a tight TPOT needs decodes kept apart. (At 30 ms the
    # measured GEMMs' faster decode steps let 3×TP8 replicas meet it; 25 ms moves the choice to PD.)
    p = _problem(model="llama-3.1-70b", hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 32},
                 workload={"arrivalRate": 2, "inputTokens": 16000, "outputTokens": 300},
                 slo={"ttftMs": {"p95": 4000}, "tpotMs": {"p95": 25}})
    d = decide(p)
    assert d.best.layout.kind is LayoutKind.PD


def test_short_prompts_keep_replicas():
    d = decide(_problem(workload={"arrivalRate": 10, "inputTokens": 200, "outputTokens": 200}))
    assert d.best.layout.kind is LayoutKind.REPLICAS


def test_a_pinned_layout_is_kept_and_still_predicted():
    pinned = L.replicas(2, Parallelism(tp=4), EngineKnobs(256, 8192, 0.9))
    p = _problem()
    d = decide(type(p)(**{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "pinned": pinned}))
    assert d.best.layout == pinned and d.best.why == "pinned by the spec"
    assert d.best.prediction.ttft_ms > 0


def test_more_load_never_raises_a_layouts_slo_capacity_or_lowers_its_latency():
    layout = L.replicas(1, Parallelism(tp=1), EngineKnobs(256, 8192, 0.9))
    low = predict_layout(_problem(workload={"arrivalRate": 2, "inputTokens": 1000, "outputTokens": 200}), layout).prediction
    high = predict_layout(_problem(workload={"arrivalRate": 8, "inputTokens": 1000, "outputTokens": 200}), layout).prediction
    assert high.ttft_ms >= low.ttft_ms and high.tpot_ms >= low.tpot_ms
    assert high.capacity_rps == pytest.approx(low.capacity_rps, rel=1e-6)


def test_min_gpus_picks_the_fewest_gpus_that_carry_the_load():
    d = decide(_problem(objective="min-gpus"))
    others = [a.layout.gpus for a in d.alternatives if a.prediction.meets_slo]
    assert all(d.best.layout.gpus <= g for g in others)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_predicted_ttft_counts_the_front_end_overhead_of_the_engine(engine):
    # Plans predict the TTFT a client sees (what the silicon benchmarks measured): the engine's TTFT plus
    # perf.request_overhead_s, which for SGLang is about 0.15 s. Zeroing the overhead lowers it by exactly that.
    from dataclasses import replace

    from servingtopology.planner.layout import Engine
    from servingtopology.planner.perf.step import perf_params, pinned_params, request_overhead_s

    p = _problem(engine=engine)
    layout = L.replicas(2, Parallelism(tp=1), EngineKnobs(256, 8192, 0.9))
    with_overhead = predict_layout(p, layout).prediction.ttft_ms
    quiet = replace(perf_params(), ttft_overhead_s=0.0, sglang_ttft_overhead_s=0.0, ttft_s_per_input_token=0.0,
                    sglang_ttft_s_per_input_token=0.0)
    with pinned_params(quiet):
        without = predict_layout(p, layout).prediction.ttft_ms
    expected = float(request_overhead_s(Engine(engine), 1000)) * 1e3
    assert with_overhead - without == pytest.approx(expected, rel=1e-6)
    assert (expected > 100.0) == (engine == "sglang")
