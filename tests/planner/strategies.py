"""Hypothesis strategies for planner values (one module, shared by the property tests)."""

from hypothesis import strategies as st

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, LayoutKind, Parallelism
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.problem import Problem, SearchSpace
from servingtopology.planner.workload import LengthDist, Slo, Workload

MODELS = ["llama-2-7b", "llama-3.1-8b", "qwen3-8b", "qwen3-32b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"]
GPUS = ["a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "l40s"]

models = st.sampled_from(MODELS).map(resolve_model)
gpus = st.sampled_from(GPUS).map(resolve_gpu)
kv_dtypes = st.sampled_from([KvDtype.AUTO, KvDtype.FP8])
parallelisms = st.builds(Parallelism, tp=st.sampled_from([1, 2, 4, 8, 16]), pp=st.sampled_from([1, 2, 4]), dp=st.just(1))
knobs = st.builds(EngineKnobs, max_num_seqs=st.sampled_from([32, 128, 256, 1024]),
                  max_num_batched_tokens=st.sampled_from([1024, 2048, 8192, 16384]), memory_fraction=st.sampled_from([0.8, 0.9, 0.95]))


BUDGETS = st.sampled_from([2, 4, 8, 16])


@st.composite
def problems(draw, *, max_gpus=BUDGETS):
    model = draw(models)
    prompt = draw(st.sampled_from([128, 1000, 4000]))
    # Requests within the model's context (a longer one is InvalidSpec: decide.context_rejection): Llama-2's 4,096 tokens
    # hold a 4,000-token prompt with 64 output tokens, not 300.
    output = draw(st.sampled_from([o for o in (64, 300) if prompt + o <= model.max_context_tokens]))
    return Problem(
        model=model,
        gpu=draw(gpus),
        engine=draw(st.sampled_from(list(Engine))),
        precision=Precision.BF16,
        max_gpus=draw(max_gpus),
        workload=Workload(input_tokens=LengthDist.fixed(prompt), output_tokens=LengthDist.fixed(output),
                          arrival_rate_rps=draw(st.sampled_from([0.5, 2.0, 8.0, 20.0]))),
        slo=Slo(ttft_ms=draw(st.sampled_from([300.0, 1000.0, 3000.0])), tpot_ms=draw(st.sampled_from([30.0, 60.0, 120.0]))),
        search=SearchSpace(layouts=(LayoutKind.REPLICAS, LayoutKind.PD), tp=(1, 2, 4, 8), pp=(1, 2), dp=(1,),
                           max_num_seqs=(128, 256), max_num_batched_tokens=(2048, 8192), memory_fraction=(0.9,), top_k=4),
    )


@st.composite
def hf_configs(draw):
    """Decoder-only config.json dicts mixing full, sliding-window and Gated DeltaNet layers, dense or MoE."""
    layers = draw(st.integers(2, 48))
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    cfg = {"num_hidden_layers": layers, "hidden_size": heads * draw(st.sampled_from([64, 128])), "num_attention_heads": heads,
           "num_key_value_heads": draw(st.sampled_from([1, 2, 4, 8])), "intermediate_size": draw(st.sampled_from([1024, 4096, 14336])),
           "vocab_size": draw(st.sampled_from([32000, 151936])), "max_position_embeddings": draw(st.sampled_from([4096, 131072])),
           "architectures": [draw(st.sampled_from(["AnyForCausalLM", "SomethingNewForConditionalGeneration"]))]}
    kinds = draw(st.lists(st.sampled_from(["full_attention", "sliding_attention", "linear_attention"]), min_size=layers, max_size=layers))
    cfg["layer_types"] = kinds
    cfg["sliding_window"] = draw(st.sampled_from([128, 1024, 4096]))
    if "linear_attention" in kinds:
        cfg.update({"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                    "linear_conv_kernel_dim": 4})
    if draw(st.booleans()):
        cfg.update({"num_experts": draw(st.sampled_from([8, 64, 128])), "num_experts_per_tok": 2, "moe_intermediate_size": 768,
                    "first_k_dense_replace": draw(st.integers(0, 2))})
    return cfg
