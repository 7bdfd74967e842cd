"""What a plan renders runs as planned: the model's context against the longest request, TP×DP groups over whole
nodes, and the engines' start-up rules no argument parser checks, for searched and pinned layouts alike."""

import itertools

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.search.decide import decide
from servingtopology.planner.search.tables import shape_rejection
from servingtopology.spec import parse_spec, to_problem


def _spec(**over):
    spec = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
            "workload": {"arrivalRate": 1, "inputTokens": 1000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 60000}, "tpotMs": {"p95": 200}}}
    spec.update(over)
    return spec


def _problem(**over):
    return to_problem(parse_spec(_spec(**over)))


# ---------------------------------------------------------------- the model's context
@pytest.mark.parametrize(("model", "prompt", "output", "field", "needs", "context"), [
    # Llama-3.1-8B holds 131,072 tokens: 200,000 + 100 was planned as 5×TP1
    ("llama-3.1-8b", 200_000, 100, "workload.inputTokens", "200,100", "131,072"),
    # Llama-2-7B holds 4,096: 600,000-token prompts got "483515% short"
    ("meta-llama/Llama-2-7b-hf", 600_000, 100, "workload.inputTokens", "600,100", "4,096"),
    # the output alone takes the request past the context: the output is named
    ("meta-llama/Llama-2-7b-hf", 1_000, 3_500, "workload.outputTokens", "4,500", "4,096"),
])
def test_a_request_longer_than_the_models_context_is_refused_naming_the_field_and_the_limit(model, prompt, output, field, needs,
                                                                                               context):
    with pytest.raises(InvalidSpec) as err:
        decide(_problem(model=model, workload={"arrivalRate": 0.1, "inputTokens": prompt, "outputTokens": output}))
    assert err.value.field == field
    assert f"needs {needs} tokens" in err.value.message and f"the model's context is {context} tokens" in err.value.message
    assert "% short" not in err.value.message


def test_the_longest_request_is_the_distributions_tail_not_its_mean():
    # mean 60,000 but a lognormal p99 far beyond 131,072: refused, as the funnel's memory stage would hold that tail.
    with pytest.raises(InvalidSpec, match="the model's context is 131,072"):
        decide(_problem(workload={"arrivalRate": 0.1, "inputTokens": {"distribution": "lognormal", "mean": 60_000, "sigma": 0.6},
                                  "outputTokens": 100}))


def test_a_pinned_layout_is_held_to_the_context_too():
    with pytest.raises(InvalidSpec, match="context"):
        decide(_problem(workload={"arrivalRate": 0.1, "inputTokens": 140_000, "outputTokens": 100},
                        layout={"kind": "replicas", "replicas": 1, "tp": 8}))


def test_a_plan_within_the_context_holds_its_longest_request():
    d = decide(_problem(workload={"arrivalRate": 0.1, "inputTokens": 120_000, "outputTokens": 1_000}))
    assert d.best.prediction.max_request_tokens >= 121_000
    assert d.best.prediction.max_request_tokens <= 131_072


# ---------------------------------------------------------------- groups over whole nodes
_DSV3 = {"model": "deepseek-ai/DeepSeek-V3", "precision": "fp8", "engine": "sglang",
         "hardware": {"gpu": "h200_sxm", "gpusPerNode": 8, "maxGPUs": 16, "allowCrossNodeTP": True},
         "workload": {"arrivalRate": 1, "inputTokens": 2000, "outputTokens": 300},
         "slo": {"ttftMs": {"p95": 5000}, "tpotMs": {"p95": 200}}}


@pytest.mark.parametrize(("tp", "dp", "label"), [
    (16, 1, "1×TP16"),           # DeepSeek-V3 FP8 as TP16 on two 8-GPU H200 nodes
    (2, 8, "1×TP2·DP8·EP"),      # TP2 × attention DP8 with expert parallelism over the same 16 GPUs
])
def test_deepseek_v3_over_two_h200_nodes_plans_when_cross_node_groups_are_allowed(tp, dp, label):
    spec = {**_DSV3, "layout": {"kind": "replicas", "replicas": 1, "tp": tp, "dp": dp, "ep": dp > 1}}
    d = decide(to_problem(parse_spec(spec)))
    assert d.best.layout.label == label and d.best.layout.gpus == 16


@pytest.mark.parametrize(("tp", "pp", "dp", "why"), [
    (16, 1, 1, None),                                   # a TP16 group over two whole nodes
    (2, 1, 8, None),                                    # TP2·DP8 over two whole nodes
    (16, 2, 1, None),                                   # two stages of a two-node group: four whole nodes
    (4, 1, 3, "does not fill whole nodes"),             # 12 GPUs over 8-GPU nodes: one and a half nodes
])
def test_a_group_larger_than_a_node_must_tile_whole_nodes(tp, pp, dp, why):
    p = to_problem(parse_spec({**_DSV3, "hardware": {**_DSV3["hardware"], "maxGPUs": 64}}))
    got = shape_rejection(p, tp, pp, dp)
    assert got is None if why is None else why in (got or "")


def test_a_group_larger_than_a_node_without_cross_node_groups_allowed_is_still_refused():
    p = to_problem(parse_spec({**_DSV3, "hardware": {**_DSV3["hardware"], "allowCrossNodeTP": False}}))
    assert shape_rejection(p, 16, 1, 1) == "TP×DP group spans nodes"
    assert shape_rejection(p, 2, 1, 8) == "TP×DP group spans nodes"


def test_the_search_offers_tp16_over_two_nodes_when_allowed():
    spec = {**_DSV3, "search": {"tp": [16], "pp": [1], "dp": [1], "layouts": ["replicas"]}}
    d = decide(to_problem(parse_spec(spec)))
    assert d.best.layout.label == "1×TP16"


# ---------------------------------------------------------------- the engines' start-up rules
def test_the_analytic_prefill_of_sglang_under_attention_dp_takes_the_per_rank_chunk():
    # A 2,000-token prompt: one chunk under a 2,048 or 8,192 budget per rank, but SGLang at attention DP 4 gives a rank
    # 512 (four chunks) or 2,048 (one chunk) of them; vLLM gives every DP rank the whole budget.
    from servingtopology.planner.hardware import Precision, resolve_gpu
    from servingtopology.planner.layout import Engine, KvDtype
    from servingtopology.planner.model.catalog import resolve_model
    from servingtopology.planner.perf.analytic import estimate_prefill, load_shape
    from servingtopology.planner.workload import LengthDist, Workload

    shape = load_shape(Workload(LengthDist.fixed(2000), LengthDist.fixed(100), arrival_rate_rps=0.001), ttft_percentile=95, tpot_percentile=95)

    def ttft(engine, budget):
        e = estimate_prefill(resolve_model("qwen3-30b-a3b"), resolve_gpu("h100_sxm"), precision=Precision.BF16, engine=engine, kv=KvDtype.AUTO,
                             shape=shape, rate_rps=0.001, tp=1, pp=1, dp=4, count=1, max_num_batched_tokens=budget)
        return float(e.ttft_s)

    # Four steps of 512 tokens against one of 2,048: the same GEMM work, four times each step's fixed costs (1.46× with
    # the MoE exchange timed from NCCL's tables, small at 512 tokens a rank; 1.5× and more with the fitted 53 µs one).
    assert ttft(Engine.SGLANG, 2048) > 1.3 * ttft(Engine.SGLANG, 8192)
    assert ttft(Engine.VLLM, 2048) == pytest.approx(ttft(Engine.VLLM, 8192))


@pytest.mark.parametrize("version", ["0.11.0", "0.32.0", "0.33.0"])
def test_a_pinned_vllm_layout_with_more_seqs_than_batched_tokens_is_refused_naming_both_fields(version):
    spec = _spec(engine={"name": "vllm", "version": version},
                 layout={"kind": "replicas", "replicas": 1, "tp": 1, "engineArgs": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}})
    with pytest.raises(InvalidSpec) as err:
        decide(to_problem(parse_spec(spec)))
    assert err.value.field == "layout.engineArgs.maxNumBatchedTokens"
    assert "maxNumSeqs 512" in err.value.message and "maxNumBatchedTokens 256" in err.value.message
    assert "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)" in err.value.message
    assert "vllm/config/scheduler.py:" in err.value.message


def test_a_pd_role_breaking_the_rule_is_named_by_its_role():
    spec = _spec(layout={"kind": "pd", "prefill": {"count": 1, "tp": 1}, "decode": {"count": 1, "tp": 1,
                                                                                   "engineArgs": {"maxNumSeqs": 1024, "maxNumBatchedTokens": 512}}})
    with pytest.raises(InvalidSpec) as err:
        decide(to_problem(parse_spec(spec)))
    assert err.value.field == "layout.decode.engineArgs.maxNumBatchedTokens"


def test_sglang_has_no_such_rule_and_plans_the_same_knobs():
    spec = _spec(engine="sglang", layout={"kind": "replicas", "replicas": 1, "tp": 1,
                                          "engineArgs": {"maxNumSeqs": 512, "maxNumBatchedTokens": 256}})
    assert decide(to_problem(parse_spec(spec))).best.layout.label == "1×TP1"


@pytest.mark.parametrize(("block", "refused"), [(8, True), (24, True), (16, False), (32, False), (128, False)])
def test_vllm_block_sizes_must_be_multiples_of_16(block, refused):
    spec = _spec(layout={"kind": "replicas", "replicas": 1, "tp": 1, "engineArgs": {"blockSize": block}})
    if not refused:
        assert decide(to_problem(parse_spec(spec))).best.layout.roles
        return
    with pytest.raises(InvalidSpec) as err:
        decide(to_problem(parse_spec(spec)))
    assert err.value.field == "layout.engineArgs.blockSize" and "multiple of 16" in err.value.message


def test_the_search_never_picks_vllm_knobs_the_engine_refuses():
    from servingtopology.planner.engines.caps import knob_rejection, problem_caps

    p = _problem(search={"maxNumSeqs": [512, 1024], "maxNumBatchedTokens": [256, 2048], "layouts": ["replicas", "pd"]},
                 workload={"arrivalRate": 2, "inputTokens": 200, "outputTokens": 50})
    d = decide(p)
    for c in (d.best, *d.evaluated):
        for rl in c.layout.roles.values():
            assert knob_rejection(problem_caps(p), rl.knobs) is None, c.layout.label


def test_sglang_gets_no_block_size_and_each_attention_dp_rank_its_planned_running_requests():
    from servingtopology.planner.engines.args import engine_args
    from servingtopology.planner.hardware import Precision
    from servingtopology.planner.layout import Engine, EngineKnobs, Parallelism, Role, RoleLayout
    from servingtopology.spec import EngineArgsSpec

    rl = RoleLayout(1, Parallelism(tp=1, dp=4, ep=True), EngineKnobs(max_num_seqs=4, max_num_batched_tokens=2048, block_size_tokens=32))
    args = engine_args(Engine.SGLANG, Role.AGGREGATED, rl, precision=Precision.BF16, moe=True)
    flags = dict(itertools.pairwise(args))
    assert "--block-size" not in args and "--page-size" not in args
    # SGLang divides both by --attn-dp-size: 16 // 4 = the planned 4 sequences per rank, 2048 // 4 = 512 tokens per rank
    assert flags["--max-running-requests"] == "16" and flags["--chunked-prefill-size"] == "2048" and flags["--attn-dp-size"] == "4"
    fields = EngineArgsSpec.model_fields
    assert "maxNumSeqs x dp" in (fields["maxNumSeqs"].description or "")
    assert "divides by --attn-dp-size" in (fields["maxNumBatchedTokens"].description or "")
    assert "SGLang does not receive it" in (fields["blockSize"].description or "")


def test_the_record_states_the_longest_request_planned_against_the_context():
    from servingtopology.planner.search.record import render_record

    p = _problem(workload={"arrivalRate": 0.1, "inputTokens": 120_000, "outputTokens": 1_000})
    record = render_record(p, decide(p))
    assert "- **Longest request:** 121,000 tokens (p99 prompt + p99 output) of the model's 131,072-token context" in record


def test_a_workload_observed_live_past_the_context_is_planned_not_refused_as_a_spec():
    # The engines refuse longer requests, so a fitted lognormal's tail past the context is the fit's: decide plans (or finds
    # nothing feasible) but never calls the operator's replan an invalid spec.
    import contextlib
    import dataclasses

    from servingtopology.planner.errors import Infeasible
    from servingtopology.planner.workload import LengthDist, LengthKind

    p = _problem()
    tail = LengthDist(LengthKind.LOGNORMAL, mean=60_000, sigma=0.6)
    observed = dataclasses.replace(p, workload=dataclasses.replace(p.workload, input_tokens=tail))
    with contextlib.suppress(Infeasible):
        decide(observed)


@pytest.mark.parametrize(("rope", "model_type", "context"), [
    ({"rope_type": "linear", "factor": 4.0}, "llama", 16_384),                                    # stretched: both engines multiply
    ({"type": "dynamic", "factor": 2.0}, "llama", 8_192),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, "qwen2", 4_096),  # already counted
    ({"rope_type": "llama3", "factor": 8.0}, "llama", 4_096),
    ({"rope_type": "linear", "factor": 8.0}, "gemma3_text", 4_096),                               # vLLM: Gemma 3's is scaled
    ({"rope_type": "dynamic", "factor": 1.0}, "llama", 4_096),
])
def test_the_context_counts_rope_scaling_as_the_engines_derive_it(rope, model_type, context):
    from servingtopology.planner.model.catalog import from_hf_config

    cfg = {"model_type": model_type, "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
           "intermediate_size": 1024, "vocab_size": 32000, "max_position_embeddings": 4096, "rope_scaling": rope}
    assert from_hf_config(cfg).max_context_tokens == context
