"""Memory model: weights per GPU, KV bytes per token, the per-rank KV pool, the longest request.

Called by the funnel (vectorised: every function accepts numpy arrays for the parallelism and knob
arguments), the simulator (pool sizes) and the decision record. Pure arithmetic; no engine is run.

Sources: vLLM `request_memory`/`determine_available_memory`/`get_num_blocks` and SGLang
`profile_max_num_token` as summarised in shared/reference/engines.md sections 1.5, 2.4 and 3.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from .hardware import Gpu, Precision
from .layout import Engine, EngineKnobs, KvDtype, Parallelism
from .model import ModelArch

__all__ = [
    "weight_bytes_total", "weight_bytes_per_gpu", "kv_bytes_per_token", "sliding_kv_bytes_per_seq",
    "activation_reserve_bytes", "kv_pool_bytes", "kv_pool_tokens", "max_request_tokens",
    "transfer_floor_s", "RUNTIME_RESERVE_BYTES",
]

# A scalar or a numpy array of candidates; every formula here broadcasts.
Num: TypeAlias = Any

# CUDA context, NCCL buffers, CUDA graphs and allocator slack not seen by the activation profile.
# Calibrated on the RTX 4090 vLLM 0.19 run in shared/groundtruth/llmservingsim_vllm_refs: 0.9 × 25.25 GB
# requested, 16.06 GB of Llama-3.1-8B weights and 41,408 KV tokens (5.43 GB) leave 1.24 GB of non-KV
# memory at max_num_batched_tokens 2048, of which the activation and logits profile below explains 0.40 GB.
RUNTIME_RESERVE_BYTES = 0.84e9
NCCL_RESERVE_BYTES_PER_PEER = 0.12e9


def _embedding_bytes(model: ModelArch) -> float:
    # Embeddings and LM head stay in bf16 under fp8/fp4/int4 weight quantisation (e.g. gpt-oss, DeepSeek FP8).
    return model.embedding_params * 2.0


def weight_bytes_total(model: ModelArch, precision: Precision) -> float:
    """Bytes of all weights of one copy of the model."""
    body = model.total_params - model.embedding_params
    return body * precision.weight_bytes + _embedding_bytes(model)


def weight_bytes_per_gpu(model: ModelArch, precision: Precision, *, tp: Num, pp: Num, dp: Num = 1) -> Num:
    """Weights on one GPU: non-expert weights sharded by TP (replicated across attention-DP ranks),
    routed experts sharded over TP × DP (tensor or expert parallel), layers split by PP."""
    non_expert = (model.non_expert_params - model.embedding_params) * precision.weight_bytes + _embedding_bytes(model)
    experts = model.routed_expert_params_total * precision.weight_bytes
    return (non_expert / tp + experts / (tp * dp)) / pp


def kv_bytes_per_token(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num = 1) -> Num:
    """KV bytes one GPU stores per cached token, counting only layers that grow with context.

    MHA/GQA: 2 × (L_full/PP) × max(1, n_kv // TP) × head_dim × dtype bytes (KV heads replicate when TP > n_kv).
    MLA: (L/PP) × (kv_lora_rank + qk_rope_head_dim) × dtype bytes on every TP rank (the latent is replicated).
    """
    b = kv_dtype.bytes_per_value
    if model.is_mla:
        return model.num_layers / pp * model.kv_latent_dim * b + 0 * tp
    heads = np.maximum(1, model.num_kv_heads // tp)
    return 2 * (model.num_full_attention_layers / pp) * heads * model.head_dim * b


def sliding_kv_bytes_per_seq(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num, max_num_batched_tokens: Num) -> Num:
    """Fixed KV one running sequence holds in sliding-window layers: min(window − 1 + step budget) tokens."""
    if model.num_sliding_layers == 0:
        return 0 * tp
    heads = np.maximum(1, model.num_kv_heads // tp)
    tokens = np.minimum(model.sliding_window - 1 + max_num_batched_tokens, model.max_context_tokens)
    return 2 * (model.num_sliding_layers / pp) * heads * model.head_dim * kv_dtype.bytes_per_value * tokens


def activation_reserve_bytes(model: ModelArch, *, tp: Num, max_num_batched_tokens: Num, max_num_seqs: Num) -> Num:
    """Peak activation memory of vLLM's profile run at the token budget, plus logits, NCCL and runtime."""
    ffn = model.moe_intermediate_size * model.experts_per_token if model.is_moe else model.intermediate_size
    act = max_num_batched_tokens * (18 * model.hidden_size + 4 * ffn / tp)
    logits = np.minimum(max_num_batched_tokens, max_num_seqs) * model.vocab_size * 4.0
    nccl = (tp > 1) * NCCL_RESERVE_BYTES_PER_PEER * np.log2(np.maximum(tp, 1) * 2)
    return act + logits + nccl + RUNTIME_RESERVE_BYTES


def kv_pool_bytes(model: ModelArch, gpu: Gpu, *, engine: Engine, precision: Precision, tp: Num, pp: Num, dp: Num,
                  max_num_batched_tokens: Num, max_num_seqs: Num, memory_fraction: Num) -> Num:
    """KV bytes available on one GPU (each attention-DP rank has its own pool; never add them).

    vLLM: gpu_memory_utilization × memory − weights − activation peak − runtime reserve.
    SGLang: mem_fraction_static × memory − weights (activations live in the remaining 1 − fraction).
    Negative means the layout does not fit.
    """
    weights = weight_bytes_per_gpu(model, precision, tp=tp, pp=pp, dp=dp)
    budget = np.ceil(gpu.memory_bytes * memory_fraction)
    if engine is Engine.SGLANG:
        return budget - weights
    return budget - weights - activation_reserve_bytes(model, tp=tp, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)


def kv_pool_tokens(model: ModelArch, gpu: Gpu, *, engine: Engine, precision: Precision, parallelism: Parallelism,
                   knobs: EngineKnobs) -> int:
    """Tokens one attention-DP rank can cache (vLLM rounds down to whole blocks)."""
    tp, pp, dp = parallelism.tp, parallelism.pp, parallelism.dp
    pool = float(kv_pool_bytes(model, gpu, engine=engine, precision=precision, tp=tp, pp=pp, dp=dp,
                               max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs,
                               memory_fraction=knobs.memory_fraction))
    per_token = float(kv_bytes_per_token(model, knobs.kv_dtype, tp=tp, pp=pp))
    if pool <= 0 or per_token <= 0:
        return 0
    tokens = int(pool // per_token)
    if engine is Engine.VLLM:
        tokens -= tokens % knobs.block_size_tokens
    return tokens


def max_request_tokens(model: ModelArch, gpu: Gpu, *, engine: Engine, precision: Precision, parallelism: Parallelism,
                       knobs: EngineKnobs) -> int:
    """Longest single request (prompt + output) one rank can hold: the pool or the model's context."""
    return min(model.max_context_tokens, kv_pool_tokens(model, gpu, engine=engine, precision=precision,
                                                        parallelism=parallelism, knobs=knobs))


def transfer_floor_s(num_bytes: float, *, link_gbit: float) -> float:
    """Ideal time to move `num_bytes` over a link of `link_gbit` Gb/s (no latency, no protocol overhead)."""
    return num_bytes * 8.0 / (link_gbit * 1e9)


