"""The memory model reproduces the issue's reference figures (shared/reference/engines.md sections 1.5, 3)."""

import pytest

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Parallelism
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.memory import (
    kv_bytes_per_token,
    kv_pool_bytes,
    kv_pool_tokens,
    max_request_tokens,
    sliding_kv_bytes_per_seq,
    transfer_floor_s,
    weight_bytes_per_gpu,
    weight_bytes_total,
)

KIB = 1024


@pytest.mark.parametrize(
    ("model", "kv", "tp", "expected_bytes"),
    [
        ("llama-2-7b", KvDtype.AUTO, 1, 524_288),        # MHA: 2 × 32 layers × 32 heads × 128 × 2 B = 512 KiB
        ("llama-2-7b", KvDtype.AUTO, 8, 65_536),         # sharded 8 ways
        ("llama-3.1-70b", KvDtype.AUTO, 1, 320 * KIB),   # GQA 8 KV heads
        ("llama-3.1-70b", KvDtype.AUTO, 8, 40 * KIB),
        ("llama-3.1-70b", KvDtype.AUTO, 16, 40 * KIB),   # TP 16 > 8 KV heads: replicated, no further saving
        ("llama-3.1-70b", KvDtype.FP8, 1, 160 * KIB),    # fp8 halves it
        ("qwen3-235b-a22b", KvDtype.AUTO, 8, 47 * KIB),  # 4 KV heads replicated at TP 8
        ("deepseek-v3", KvDtype.AUTO, 1, 70_272),        # MLA: 61 × (512 + 64) × 2 B ≈ 68.6 KiB
        ("deepseek-v3", KvDtype.AUTO, 8, 70_272),        # the latent is replicated on every TP rank
        ("deepseek-v3", KvDtype.FP8, 8, 35_136),
        ("gpt-oss-120b", KvDtype.AUTO, 1, 36 * KIB),     # only the 18 full-attention layers grow with context
    ],
)
def test_kv_bytes_per_token_matches_the_reference_table(model, kv, tp, expected_bytes):
    assert kv_bytes_per_token(resolve_model(model), kv, tp=tp) == expected_bytes


def test_deepseek_v3_mla_cache_is_about_68_6_kib_whatever_the_tp():
    m = resolve_model("deepseek-ai/DeepSeek-V3")
    for tp in (1, 2, 4, 8, 16):
        assert kv_bytes_per_token(m, KvDtype.AUTO, tp=tp) / KIB == pytest.approx(68.6, abs=0.05)


def test_a_512_token_llama_2_7b_prompt_is_256_mib_and_its_transfer_floors():
    per_token = kv_bytes_per_token(resolve_model("Llama-2-7B"), KvDtype.BF16, tp=1)
    prompt = 512 * per_token
    assert prompt == 256 * 2**20
    assert transfer_floor_s(prompt, link_gbit=10) * 1e3 == pytest.approx(215, abs=0.5)
    assert transfer_floor_s(prompt, link_gbit=100) * 1e3 == pytest.approx(21.5, abs=0.05)
    # At 11.5 GB/s of effective bandwidth the same prompt takes longer than the ideal floor.
    assert prompt / 11.5e9 * 1e3 > transfer_floor_s(prompt, link_gbit=100) * 1e3


def test_tp_beyond_kv_heads_replicates_the_cache():
    m = resolve_model("llama-3.1-8b")  # 8 KV heads
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=8) == kv_bytes_per_token(m, KvDtype.AUTO, tp=16)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=4) == 2 * kv_bytes_per_token(m, KvDtype.AUTO, tp=8)


def test_pp_splits_the_layers_of_the_cache():
    m = resolve_model("llama-3.1-70b")
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1, pp=2) == kv_bytes_per_token(m, KvDtype.AUTO, tp=1) / 2


def test_weights_shard_by_tp_and_pp_and_experts_by_tp_times_dp():
    m = resolve_model("deepseek-v3")
    one = weight_bytes_per_gpu(m, Precision.FP8, tp=1, pp=1, dp=1)
    assert weight_bytes_per_gpu(m, Precision.FP8, tp=8, pp=1, dp=1) == pytest.approx(one / 8)
    # With attention DP the experts shard 16 ways but attention is replicated per DP rank.
    dp = weight_bytes_per_gpu(m, Precision.FP8, tp=2, pp=1, dp=8)
    assert one / 16 < dp < one / 2
    assert weight_bytes_total(m, Precision.FP8) == pytest.approx(one)


def test_fp8_weights_take_about_half_of_bf16():
    m = resolve_model("llama-3.1-70b")
    ratio = weight_bytes_total(m, Precision.FP8) / weight_bytes_total(m, Precision.BF16)
    assert 0.5 < ratio < 0.53  # embeddings stay in bf16


def test_vllm_pool_reproduces_the_rtx_4090_run():
    # vLLM 0.19 reported 2588 blocks of 16 = 41,408 KV tokens for Llama-3.1-8B at gmu 0.9, mnbt 2048.
    tokens = kv_pool_tokens(resolve_model("meta-llama/Llama-3.1-8B"), resolve_gpu("rtx_4090"), engine=Engine.VLLM,
                            precision=Precision.BF16, parallelism=Parallelism(), knobs=EngineKnobs(256, 2048, 0.9))
    assert tokens == pytest.approx(41_408, rel=0.01)
    assert tokens % 16 == 0


def test_sglang_pool_counts_only_weights_inside_the_static_fraction():
    m, g = resolve_model("llama-3.1-8b"), resolve_gpu("h100_sxm")
    kw = dict(precision=Precision.BF16, tp=1, pp=1, dp=1, max_num_batched_tokens=8192, max_num_seqs=256, memory_fraction=0.88)
    sglang = kv_pool_bytes(m, g, engine=Engine.SGLANG, **kw)
    vllm = kv_pool_bytes(m, g, engine=Engine.VLLM, **kw)
    assert sglang == pytest.approx(0.88 * g.memory_bytes - weight_bytes_total(m, Precision.BF16), rel=1e-6)
    assert vllm < sglang  # vLLM also takes activations and runtime reserves out of its fraction


def test_a_model_that_does_not_fit_has_no_pool_and_holds_no_request():
    m, g = resolve_model("llama-3.1-405b"), resolve_gpu("h100_sxm")
    knobs = EngineKnobs(256, 8192, 0.9)
    assert kv_pool_tokens(m, g, engine=Engine.VLLM, precision=Precision.BF16, parallelism=Parallelism(tp=4), knobs=knobs) == 0
    assert max_request_tokens(m, g, engine=Engine.VLLM, precision=Precision.BF16, parallelism=Parallelism(tp=4), knobs=knobs) == 0


def test_the_longest_request_is_capped_by_the_model_context():
    m, g = resolve_model("llama-2-7b"), resolve_gpu("h200_sxm")
    longest = max_request_tokens(m, g, engine=Engine.VLLM, precision=Precision.BF16, parallelism=Parallelism(tp=1), knobs=EngineKnobs())
    assert longest == 4096


def test_sliding_window_layers_hold_a_bounded_cache_per_sequence():
    m = resolve_model("gpt-oss-120b")
    per_seq = sliding_kv_bytes_per_seq(m, KvDtype.AUTO, tp=1, pp=1, max_num_batched_tokens=8192)
    # 18 sliding layers × (128 − 1 + 8192) tokens × 2 × 8 heads × 64 × 2 B
    assert per_seq == 2 * 18 * 8 * 64 * 2 * (128 - 1 + 8192)
    assert sliding_kv_bytes_per_seq(resolve_model("llama-3.1-8b"), KvDtype.AUTO, tp=1, pp=1, max_num_batched_tokens=8192) == 0
