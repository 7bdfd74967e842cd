"""One test per architecture family: parameters, cache bytes and state bytes of a real model's config.json.

Configs are copies in tests/planner/data/model_configs (README.md names the source of each). Expected values are
the engines' own formulas spelt out here from the config's numbers (vLLM v1 kv_cache_interface specs and
layers/mamba/mamba_utils.py), or published totals from the model cards, never figures read back from the planner.
"""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.arch import ModuleGroup, StateKind
from servingtopology.planner.hardware import GIB, Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Parallelism
from servingtopology.planner.model.catalog import from_hf_config
from servingtopology.planner.perf.memory import (
    attention_read_bytes,
    kv_bytes_per_token,
    kv_pool_bytes,
    kv_pool_tokens,
    language_model_bytes,
    pool_tokens_from_bytes,
    sliding_kv_bytes_per_seq,
    state_bytes_per_seq,
    weight_bytes_total,
)
from servingtopology.planner.perf.step import evaluate_step_s, step_coefficients
from tests.planner.model_configs import BF16, CONFIGS, FP8, full_attention_bytes, load, raw
from tests.planner.strategies import hf_configs

# (config, published total parameters in billions, published active parameters in billions, tolerance)
PUBLISHED = [
    ("llama-3.1-8b-instruct", 8.03, None, 0.01),      # dense GQA (Meta model card: 8.03 B)
    ("qwen3-30b-a3b", 30.5, 3.3, 0.02),               # MoE (Qwen3 card: 30.5 B total, 3.3 B activated incl. embeddings)
    ("deepseek-v3", 671.0, 37.0, 0.02),               # MLA + MoE (DeepSeek-V3 report: 671 B main model, 37 B activated)
    ("deepseek-v3.2", 671.0, 37.0, 0.02),             # + DSA indexer (same body; 685 B with the MTP layer, below)
    ("qwen3-next-80b-a3b", 80.0, 3.0, 0.02),          # hybrid Gated DeltaNet (80 B total, 3 B activated)
    ("qwen3.5-397b-a17b", 397.0, 17.0, 0.05),         # hybrid Gated DeltaNet in a text_config wrapper
    ("nemotron-h-8b", 8.1, None, 0.02),               # Mamba-2 hybrid (Nemotron-H-8B: 8.1 B)
    ("jamba-v0.1", 51.6, 12.0, 0.02),                 # Mamba-1 hybrid with MoE every other layer (AI21: 52 B, 12 B active)
    ("gpt-oss-20b", 20.9, 3.6, 0.02),                 # sliding window, MXFP4 experts (OpenAI card: 20.9 B, 3.6 B active)
    ("minimax-m2.5", 230.0, 10.0, 0.05),              # FP8 block MoE with MTP modules (230 B total, 10 B activated)
    ("glm-5-nvfp4", 744.0, 40.0, 0.03),               # MLA + DSA + MoE (GLM-5: 744 B total, 40 B activated)
    ("kimi-k2.5", 1000.0, 32.0, 0.05),                # MLA + MoE, INT4 experts (Kimi K2: 1 T total, 32 B activated)
]


@pytest.mark.parametrize(("name", "total_b", "active_b", "tol"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameters_match_the_published_totals(name, total_b, active_b, tol):
    m = load(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=tol)
    if active_b is not None:
        # Cards count activated parameters with or without the embedding and head (±0.6 B here).
        assert m.active_params_per_token / 1e9 == pytest.approx(active_b, abs=max(active_b * 0.05, 0.6))


def test_dense_gqa_caches_k_and_v_of_each_kv_head():
    m = load("llama-3.1-8b-instruct")  # 32 layers, 8 KV heads of 128
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(32, 8, 128, BF16)
    assert kv_bytes_per_token(m, KvDtype.FP8, tp=8) == full_attention_bytes(32, 1, 128, FP8)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=16) == full_attention_bytes(32, 1, 128, BF16)  # heads replicate past 8


def test_moe_experts_and_the_dense_first_layers_are_counted_apart():
    q = load("qwen3-30b-a3b")
    assert (q.num_experts, q.experts_per_token, q.num_moe_layers, q.num_dense_layers) == (128, 8, 48, 0)
    assert q.routed_expert_params_total == 48 * 128 * 3 * 2048 * 768
    ds = load("deepseek-v3")  # first_k_dense_replace 3: three dense FFNs of 18432, 58 MoE layers of 256 + 1 shared
    assert (ds.num_dense_layers, ds.num_moe_layers) == (3, 58)
    assert ds.dense_ffn_params_total == 3 * 3 * 7168 * 18432
    assert ds.shared_expert_params_total == 58 * 3 * 7168 * 2048


def test_mla_caches_one_latent_per_token_and_layer_on_every_rank():
    m = load("deepseek-v3")  # vLLM MLAAttentionSpec: one KV head of kv_lora_rank + qk_rope_head_dim
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == 61 * (512 + 64) * BF16
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=8) == 61 * (512 + 64) * BF16


def test_sparse_indexer_adds_its_fp8_key_cache_and_attention_reads_only_the_top_k():
    m = load("deepseek-v3.2")
    indexer = 61 * (128 + 128 // 128 * 4)  # vLLM DeepseekV32IndexerCache: 128 FP8 values + an FP32 scale = 132 B
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == 61 * 576 * BF16 + indexer
    assert kv_bytes_per_token(m, KvDtype.FP8, tp=1) == 61 * 656 + indexer  # fp8_ds_mla: 512 + 4 × 4 + 64 × 2 bytes
    read = attention_read_bytes(m, KvDtype.AUTO, tp=1, pp=1)
    assert read.cap_tokens == 2048 and read.per_context_token == indexer and read.capped_per_token == 61 * 576 * BF16


def test_hybrid_gated_deltanet_keeps_a_fixed_state_per_sequence_and_kv_only_in_full_layers():
    m = load("qwen3-next-80b-a3b")  # full_attention_interval 4: 12 full layers, 36 Gated DeltaNet layers
    assert (m.num_full_attention_layers, m.num_state_layers, m.state_kind) == (12, 36, StateKind.GATED_DELTA_NET)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(12, 2, 256, BF16)
    # vLLM gated_delta_net_state_shape: conv (K−1) × (2·k_heads·k_dim + v_heads·v_dim), recurrent v_heads × v_dim × k_dim.
    conv, recurrent = 3 * (2 * 16 * 128 + 32 * 128), 32 * 128 * 128
    assert state_bytes_per_seq(m, tp=1) == 36 * (conv + recurrent) * BF16
    assert state_bytes_per_seq(m, tp=4) == 36 * (conv + recurrent) / 4 * BF16


def test_a_text_config_wrapper_is_followed_and_its_layer_types_counted():
    m = load("qwen3.5-397b-a17b")
    assert (m.num_layers, m.num_full_attention_layers, m.num_state_layers, m.num_mtp_layers) == (60, 15, 45, 1)
    conv, recurrent = 3 * (2 * 16 * 128 + 64 * 128), 64 * 128 * 128
    assert state_bytes_per_seq(m, tp=1) == 45 * (conv + recurrent) * BF16
    assert any("text_config" in a for a in m.assumptions)


def test_mamba2_hybrid_pattern_gives_mixerless_mlp_layers_and_mamba_state():
    m = load("nemotron-h-8b")  # 24 M (Mamba-2), 4 * (attention), 24 - (relu² MLP)
    assert (m.num_state_layers, m.num_full_attention_layers, m.num_mixerless_layers, m.num_dense_layers) == (24, 4, 24, 24)
    assert m.ffn_matrices == 2
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(4, 8, 128, BF16)
    # vLLM mamba2_state_shape: conv (K−1) × (I + 2·G·N), recurrent heads × head_dim × N; I = 128 × 64. The recurrent
    # state in FP32: vLLM's NemotronHForCausalLMConfig turns --mamba-ssm-cache-dtype 'auto' into the config's
    # mamba_ssm_cache_dtype, else float32 (SGLang's mamba2_state_dtype defaults to float32 too).
    conv, recurrent = 3 * (128 * 64 + 2 * 8 * 128), 128 * 64 * 128
    assert state_bytes_per_seq(m, tp=1) == 24 * (conv * BF16 + recurrent * 4)


def test_mamba1_hybrid_interleaves_attention_and_experts_by_period():
    m = load("jamba-v0.1")  # attention at i % 8 == 4, MoE at i % 2 == 1
    assert (m.num_full_attention_layers, m.num_state_layers, m.num_moe_layers, m.state_kind) == (4, 28, 16, StateKind.MAMBA1)
    inner = 2 * 4096  # vLLM mamba1_state_shape: conv (K−1) × I, recurrent I × N
    assert state_bytes_per_seq(m, tp=1) == 28 * (3 * inner + inner * 16) * BF16


def test_sliding_window_layers_hold_a_window_per_sequence_not_per_token():
    m = load("gpt-oss-20b")  # layer_types: 12 sliding (window 128) and 12 full, 8 KV heads of 64
    assert (m.num_sliding_layers, m.sliding_window) == (12, 128)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(12, 8, 64, BF16)
    # vLLM SlidingWindowSpec.max_memory_usage_bytes: window − 1 + max_num_batched_tokens tokens.
    assert sliding_kv_bytes_per_seq(m, KvDtype.AUTO, tp=1, pp=1, max_num_batched_tokens=8192) == full_attention_bytes(12, 8, 64, BF16) * (127 + 8192)


def test_sliding_and_state_bytes_come_out_of_the_kv_pool():
    gpu, knobs = resolve_gpu("h200_sxm"), EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)
    for name in ("gpt-oss-20b", "qwen3-next-80b-a3b"):
        m = load(name)
        par = Parallelism(tp=2)
        pool = float(kv_pool_bytes(m, gpu, engine=Engine.VLLM, precision=m.checkpoint_precision, tp=2, pp=1, dp=1,
                                   max_num_batched_tokens=8192, max_num_seqs=256, memory_fraction=0.9))
        naive = pool / float(kv_bytes_per_token(m, KvDtype.AUTO, tp=2))
        tokens = kv_pool_tokens(m, gpu, engine=Engine.VLLM, precision=m.checkpoint_precision, parallelism=par, knobs=knobs)
        assert 0 < tokens < naive


def test_decode_attention_past_the_window_grows_only_with_the_full_layers():
    m = load("gpt-oss-20b")
    c = step_coefficients(m, resolve_gpu("h100_sxm"), precision=Precision.FP4, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1, pp=1, dp=1)
    def t(ctx: float) -> float:
        return float(evaluate_step_s(c, prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=1.0, decode_context_tokens=ctx))
    slope_past = (t(20000.0) - t(10000.0)) / 10000.0
    slope_inside = (t(100.0) - t(50.0)) / 50.0
    # The full layers' cost per cached token: the measured decode attention's at one sequence where a table covers them
    # (`measured_decode_attention`), else the roofline's.
    full = float(c.attn_ctx_s) if c.dec_attn_curve is None else float(c.dec_attn_curve.dense()[1, 0])
    assert slope_past == pytest.approx(full, rel=1e-6)
    assert slope_inside == pytest.approx(full + float(c.attn_capped_ctx_s), rel=1e-6)


def test_fp8_block_checkpoint_stores_every_gemm_in_fp8_but_what_it_leaves_out():
    m = load("minimax-m2.5")  # modules_to_not_convert: gate (router), e_score_correction_bias, lm_head
    ck = m.checkpoint
    assert ck is not None and ck.precision is Precision.FP8 and ck.bytes_per_param == pytest.approx(1 + 4 / 128**2)
    assert ck.covers(ModuleGroup.ATTENTION) and ck.covers(ModuleGroup.ROUTED_EXPERTS) and not ck.covers(ModuleGroup.LM_HEAD)
    assert m.num_mtp_layers == 3 and kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(62, 8, 128, BF16)
    q = load("qwen3-235b-a22b-fp8")  # its ignore list names routers and norms only: every GEMM stays FP8
    assert q.checkpoint is not None and q.checkpoint.covers(ModuleGroup.ATTENTION) and q.checkpoint.covers(ModuleGroup.ROUTED_EXPERTS)


def test_mxfp4_checkpoint_is_the_published_size():
    m = load("gpt-oss-20b")  # OpenAI's model card: a 12.8 GiB checkpoint (MXFP4 experts, BF16 attention and embeddings)
    assert m.checkpoint is not None and m.checkpoint.quantized == {ModuleGroup.ROUTED_EXPERTS}
    assert weight_bytes_total(m, m.checkpoint_precision) / GIB == pytest.approx(12.8, rel=0.01)


def test_nvfp4_checkpoint_takes_4_bits_and_a_scale_per_16():
    m = load("glm-5-nvfp4")
    assert m.checkpoint is not None and m.checkpoint.precision is Precision.FP4 and m.checkpoint.bytes_per_param == 0.5 + 1 / 16
    assert m.has_indexer and m.num_indexer_layers == 78


def test_int4_weight_only_checkpoints_price_group_scales_and_unquantised_modules():
    awq = load("llama-3.1-8b-instruct-awq-int4")  # AWQ gemm, group 128, zero points: 0.5 + 2/128 + 0.5/128 bytes
    assert awq.checkpoint is not None and awq.checkpoint.bytes_per_param == pytest.approx(0.5 + 2 / 128 + 0.5 / 128)
    assert weight_bytes_total(awq, Precision.INT4) / 1e9 == pytest.approx(5.73, rel=0.01)  # the Hub checkpoint: 5.73 GB
    kimi = load("kimi-k2.5")  # compressed-tensors int4 group 32; attention, shared experts, dense MLP and lm_head ignored
    assert kimi.checkpoint is not None and kimi.checkpoint.quantized == {ModuleGroup.ROUTED_EXPERTS}
    experts = 60 * 384 * 3 * 7168 * 2048
    assert kimi.routed_expert_params_total == experts
    rest = kimi.total_params - experts
    assert language_model_bytes(kimi, Precision.INT4) == pytest.approx(experts * (0.5 + 2 / 32) + rest * 2, rel=1e-6)
    # Its MoonViT tower (27 layers of 1152, MLP 4304) and 2x2 patch merger into 7168 stay in 16 bits beside it: the
    # Kimi-K2.5 card's "MoonViT, 400M" vision encoder, 0.42 B with the merger here.
    assert kimi.tower_params / 1e9 == pytest.approx(0.4, rel=0.2)
    assert weight_bytes_total(kimi, Precision.INT4) == language_model_bytes(kimi, Precision.INT4) + 2 * kimi.tower_params


def test_mtp_layers_are_counted_apart_from_the_served_weights():
    ds = load("deepseek-v3")  # 671 B + 14 B of MTP module = the 685 B of the checkpoint
    assert ds.num_mtp_layers == 1 and (ds.total_params + ds.mtp_params) / 1e9 == pytest.approx(685, rel=0.02)
    assert load("qwen3.5-397b-a17b").mtp_params > 0 and load("llama-3.1-8b-instruct").mtp_params == 0


def test_mtp_layers_count_what_the_checkpoint_stores():
    """DeepSeek-V3's layer 61 stores its own `embed_tokens` and `shared_head.head` (vLLM deepseek_mtp.py loads both: the
    685 B above). MiMo's `model.mtp_layers.0.*` holds a decoder layer and `input_proj` (2h -> h) and no embedding or head
    (the checkpoint index; vLLM mimo_mtp.py); Qwen3.5 says `mtp_use_dedicated_embeddings: false`. Old main added an
    embedding and an LM-head copy to every MTP layer: 2.91 GB for MiMo's 0.42 GB."""
    mimo, cfg = load("ckpt-mimo-7b"), raw("ckpt-mimo-7b")
    h, inter, kv, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"], cfg["head_dim"]
    stored = 2 * h * h + 2 * h * kv * hd + 3 * h * inter + 2 * h * h  # q, o, k, v, gated MLP, input_proj (no biases, norms)
    assert mimo.mtp_params == stored and 2 * mimo.mtp_params / 1e9 == pytest.approx(0.42, abs=0.01)
    qwen = load("ckpt-qwen3.5-2b-dense")
    assert 0 < qwen.mtp_params < qwen.vocab_size * qwen.hidden_size  # one decoder layer and mtp.fc, no 0.5 B embedding
    ds = load("deepseek-v3")
    assert ds.mtp_dedicated_embeddings and ds.mtp_params - from_hf_config(
        {**raw("deepseek-v3"), "mtp_use_dedicated_embeddings": False}).mtp_params == 2 * 129280 * 7168


def test_a_field_the_reader_does_not_understand_is_named_in_a_warning():
    cfg = raw("llama-3.1-8b-instruct")
    cfg["compress_ratios"] = [0, 4, 128]
    cfg["quantization_config"] = {"quant_method": "frobnicate4"}
    m = from_hf_config(cfg)
    assert any("compress_ratios" in w for w in m.warnings)
    assert any("frobnicate4" in w for w in m.warnings) and m.checkpoint is None


def test_the_planner_never_refuses_a_config_by_its_architecture_name():
    for path in CONFIGS.glob("*.json"):
        cfg = json.loads(path.read_text())
        cfg["architectures"] = ["NeverHeardOfItForCausalLM"]
        assert from_hf_config(cfg).total_params > 1e8  # the smallest here: Qwen2-0.5B


def test_state_bytes_are_vectorised_over_candidates():
    m = load("qwen3-next-80b-a3b")
    tps = np.array([1, 2, 4, 8])
    assert np.all(np.diff(state_bytes_per_seq(m, tp=tps)) < 0)


def test_tp_must_divide_the_state_space_heads(tmp_path):
    from servingtopology.planner.search.funnel import shape_rejection
    from servingtopology.spec import parse_spec, to_problem

    cfg = raw("nemotron-h-8b")
    cfg["mamba_num_heads"] = 24  # 24 Mamba-2 heads beside 32 attention heads: TP 16 splits the attention, not the SSM
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = {"modelConfig": str(path), "hardware": {"gpu": "h100_sxm", "maxGPUs": 16},
            "workload": {"arrivalRate": 1, "inputTokens": 100, "outputTokens": 10}, "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 100}}}
    problem = to_problem(parse_spec(spec))
    assert shape_rejection(problem, 8, 1, 1) is None
    assert shape_rejection(problem, 16, 1, 1) == "TP does not divide the state-space heads"


@given(cfg=hf_configs(), tp=st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_any_decoder_config_loads_and_its_layers_and_bytes_add_up(cfg, tp):
    m = from_hf_config(cfg)
    assert m.num_full_attention_layers + m.num_sliding_layers + m.num_linear_layers + m.num_mixerless_layers == m.num_layers
    assert m.num_dense_layers + m.num_moe_layers == m.num_layers
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=tp) >= 0 and state_bytes_per_seq(m, tp=tp) >= 0
    pools = pool_tokens_from_bytes(m, np.array([1e9, 1e10, 1e11]), KvDtype.AUTO, tp=tp, pp=1, max_num_seqs=256, max_num_batched_tokens=8192)
    assert np.all(np.diff(pools) >= 0) and np.all(pools >= 0)


# Sliding-window layouts spelt without layer_types (synthetic configs with the real fields' semantics):
#   Gemma-3 `sliding_window_pattern` N: every Nth layer is global; Qwen2 `max_window_layers` M with use_sliding_window:
#   layers from M on slide; Gemma-2 `cache_implementation: hybrid`: every other layer slides; Mistral-7B-v0.1: all slide.
SLIDING = [
    ({"sliding_window": 1024, "sliding_window_pattern": 6}, 30, 1024),
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 28}, 8, 4096),
    ({"sliding_window": 4096, "cache_implementation": "hybrid"}, 18, 4096),
    ({"sliding_window": 4096}, 36, 4096),
    ({"sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}, 0, 0),
]


@pytest.mark.parametrize(("fields", "sliding", "window"), SLIDING)
def test_sliding_window_layouts_without_layer_types(fields, sliding, window):
    cfg = {"num_hidden_layers": 36, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4,
           "max_position_embeddings": 32768, **fields}
    m = from_hf_config(cfg)
    assert (m.num_sliding_layers, m.sliding_window) == (sliding, window)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(36 - sliding, 4, 128, BF16)


def test_a_model_whose_every_layer_slides_holds_any_context():
    m = from_hf_config({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "sliding_window": 4096, "max_position_embeddings": 32768})  # Mistral-7B-v0.1's layout
    tokens = kv_pool_tokens(m, resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16, parallelism=Parallelism(),
                            knobs=EngineKnobs())
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == 0 and tokens >= 32768
