"""Memory model: weights per GPU, KV bytes per token, the per-rank KV pool, the longest request.

Called by the funnel (vectorised: every function accepts numpy arrays for the parallelism and knob
arguments), the simulator (pool sizes) and the decision record. Pure arithmetic; no engine is run.

Sources: vLLM `request_memory`/`determine_available_memory`/`get_num_blocks` and SGLang
`profile_max_num_token` as summarised in shared/reference/engines.md sections 1.5, 2.4 and 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np

from servingtopology.planner.arch import ModelArch, ModuleGroup, StateKind
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Parallelism

__all__ = [
    "weight_bytes_total", "weight_bytes_per_gpu", "tower_bytes", "language_model_bytes", "linear_weight_bytes", "expert_weight_bytes", "group_bytes_per_param",
    "kv_bytes_per_token", "sliding_kv_bytes_per_seq", "state_bytes_per_seq", "fixed_bytes_per_seq", "pool_tokens_from_bytes",
    "AttentionRead", "attention_read_bytes", "activation_reserve_bytes", "kv_pool_bytes", "kv_pool_tokens", "max_request_tokens",
    "transfer_floor_s", "RUNTIME_RESERVE_BYTES", "INDEXER_KEY_BYTES_PER_DIM",
]

# A scalar or a numpy array of candidates; every formula here broadcasts.
Num: TypeAlias = Any

# CUDA context, NCCL buffers, CUDA graphs and allocator slack not seen by the activation profile.
# Calibrated on the RTX 4090 vLLM 0.19 run in shared/groundtruth/llmservingsim_vllm_refs: 0.9 × 25.25 GB
# requested, 16.06 GB of Llama-3.1-8B weights and 41,408 KV tokens (5.43 GB) leave 1.24 GB of non-KV
# memory at max_num_batched_tokens 2048, of which the activation and logits profile below explains 0.40 GB.
RUNTIME_RESERVE_BYTES = 0.84e9
NCCL_RESERVE_BYTES_PER_PEER = 0.12e9
# DSA indexer keys: FP8 values plus one FP32 scale per 128 (vLLM DeepseekV32IndexerCache: head_size =
# index_head_dim + index_head_dim // 128 × 4 bytes, e.g. 132 bytes per token and layer), whatever the KV dtype.
INDEXER_KEY_BYTES_PER_DIM = 1.0 + 4.0 / 128
STATE_BYTES_PER_VALUE = 2.0  # fixed-state layers keep their state in the model dtype (BF16; vLLM 'auto') unless told
_DENSE_GROUPS = (ModuleGroup.ATTENTION, ModuleGroup.LINEAR_MIXER, ModuleGroup.DENSE_FFN, ModuleGroup.SHARED_EXPERTS)


def group_bytes_per_param(model: ModelArch, group: ModuleGroup, precision: Precision, moe_precision: Precision | None = None) -> float:
    """Bytes one weight of `group` takes when served at `precision` (routed experts at `moe_precision`).

    An unquantised checkpoint takes the serving precision for every GEMM but the LM head (vLLM's online FP8 and
    ModelOpt leave it in BF16). A quantised checkpoint keeps the groups it left unquantised in BF16 (gpt-oss
    attention, Kimi-K2.5's dense layers); the groups it quantised take its own format (exact scale overhead) when
    the serving precision is that format, else the serving precision's (a benchmark that names another format).
    """
    served = (moe_precision or precision) if group is ModuleGroup.ROUTED_EXPERTS else precision
    ck = model.checkpoint
    if ck is None:
        return 2.0 if group is ModuleGroup.LM_HEAD else served.weight_bytes
    if not ck.covers(group):
        return 2.0
    if group is ModuleGroup.ROUTED_EXPERTS and ck.expert_precision is not None:
        # Experts stored in their own format (DeepSeek-V4 `expert_dtype`) are served as stored unless a benchmark
        # names another MoE format.
        return ck.expert_bytes_per_param if moe_precision in (None, ck.expert_precision) else served.weight_bytes
    return ck.bytes_per_param if served is ck.precision else served.weight_bytes


def _embedding_bytes(model: ModelArch) -> float:
    # Input embeddings stay in BF16 under every weight format (a lookup, not a GEMM); the LM head is a group.
    return model.vocab_size * model.hidden_size * 2.0


def _non_expert_bytes(model: ModelArch, precision: Precision) -> float:
    dense = sum(model.params_of(g) * group_bytes_per_param(model, g, precision) for g in _DENSE_GROUPS)
    head = model.params_of(ModuleGroup.LM_HEAD) * group_bytes_per_param(model, ModuleGroup.LM_HEAD, precision)
    routers = model.num_moe_layers * model.router_params_per_layer * 2.0
    return dense + head + routers + _embedding_bytes(model)


def tower_bytes(model: ModelArch) -> float:
    """Bytes of a multimodal model's encoder towers and projectors (planner.model.towers), stored and served in 16 bits
    whatever the serving precision of the language model (checkpoints leave them unquantised)."""
    return model.tower_params * model.tower_bytes_per_param


def language_model_bytes(model: ModelArch, precision: Precision, moe_precision: Precision | None = None) -> float:
    """Bytes of the language model's weights alone (what `--language-model-only` would load)."""
    return _non_expert_bytes(model, precision) + model.routed_expert_params_total * group_bytes_per_param(
        model, ModuleGroup.ROUTED_EXPERTS, precision, moe_precision)


def weight_bytes_total(model: ModelArch, precision: Precision, moe_precision: Precision | None = None) -> float:
    """Bytes of all weights of one copy of the model: the language model and, for a multimodal model, its towers."""
    return language_model_bytes(model, precision, moe_precision) + tower_bytes(model)


def weight_bytes_per_gpu(model: ModelArch, precision: Precision, *, tp: Num, pp: Num, dp: Num = 1,
                         moe_precision: Precision | None = None) -> Num:
    """Weights on one GPU: non-expert weights sharded by TP (replicated across attention-DP ranks),
    routed experts sharded over TP × DP (tensor or expert parallel), layers split by PP.

    Encoder towers are sharded by TP (vLLM's default `--mm-encoder-tp-mode weights`: "split the weights of each layer
    across TP ranks"; `data` would replicate them) and are not split by PP: a multimodal model builds its tower in
    every pipeline stage's module (only the language model's layers are PP-split), so each stage is charged it."""
    experts = model.routed_expert_params_total * group_bytes_per_param(model, ModuleGroup.ROUTED_EXPERTS, precision, moe_precision)
    return (_non_expert_bytes(model, precision) / tp + experts / (tp * dp)) / pp + tower_bytes(model) / tp


def linear_weight_bytes(model: ModelArch, precision: Precision) -> float:
    """Bytes of the TP-sharded GEMM weights a step streams: attention, mixers, dense FFNs, shared experts, routers, LM head."""
    dense = sum(model.params_of(g) * group_bytes_per_param(model, g, precision) for g in _DENSE_GROUPS)
    routers = model.num_moe_layers * model.router_params_per_layer * 2.0
    return dense + routers + model.vocab_size * model.hidden_size * group_bytes_per_param(model, ModuleGroup.LM_HEAD, precision)


def expert_weight_bytes(model: ModelArch, precision: Precision, moe_precision: Precision | None = None) -> float:
    """Bytes of one routed expert."""
    return model.expert_params * group_bytes_per_param(model, ModuleGroup.ROUTED_EXPERTS, precision, moe_precision)


def _mla_bytes_per_layer(model: ModelArch, kv_dtype: KvDtype) -> float:
    if model.has_indexer and kv_dtype is KvDtype.FP8:
        # vLLM's sparse FlashMLA "fp8_ds_mla" entry: FP8 latent, an FP32 scale per 128, BF16 rope key (656 bytes).
        return model.kv_lora_rank * (1.0 + 4.0 / 128) + model.qk_rope_head_dim * 2.0
    return float(model.kv_latent_dim * kv_dtype.bytes_per_value)


def kv_bytes_per_token(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num = 1) -> Num:
    """KV bytes one GPU stores per cached token, counting only layers that grow with context and own a cache.

    MHA/GQA: 2 × (L_full/PP) × max(1, n_kv // TP) × head_dim × dtype bytes (KV heads replicate when TP > n_kv).
    MLA: (L_attn/PP) × (kv_lora_rank + qk_rope_head_dim) × dtype bytes on every TP rank (the latent is replicated;
    vLLM MLAAttentionSpec with one KV head). DSA indexer: its FP8 key per token in each indexer layer.
    Layers that read another layer's cache (cross-layer KV sharing) store nothing: vLLM gives a layer with
    `kv_sharing_target_layer_name` no KV cache spec of its own and points it at its target's tensor
    (`initialize_kv_cache_for_kv_sharing`); Hunyuan's CLA layers attend over the previous layer's K and V.
    Sliding-window and fixed-state layers do not grow with context: see `fixed_bytes_per_seq`.
    """
    return _kv_bytes_per_token(model, kv_dtype, tp=tp, pp=pp, owned=True)


def _kv_bytes_per_token(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num, owned: bool) -> Num:
    """KV bytes per token of the full-attention layers: those that own a cache (`owned`), else all that read one."""
    indexer = model.indexer_keys_per_token * model.index_head_dim * INDEXER_KEY_BYTES_PER_DIM / pp + 0 * tp
    reuse = model.kv_reuse_full_layers if owned else 0
    if model.is_mla:
        return (model.num_attention_layers - reuse) / pp * _mla_bytes_per_layer(model, kv_dtype) + indexer
    heads = np.maximum(1, model.num_kv_heads // tp)
    compressed = model.compressed_kv_values_per_token / pp * _compressed_bytes_per_value(kv_dtype)
    layers = model.num_full_attention_layers - reuse
    return 2 * (layers / pp) * heads * model.head_dim * kv_dtype.bytes_per_value + indexer + compressed


def _compressed_bytes_per_value(kv_dtype: KvDtype) -> float:
    """DeepSeek-V4's cache entries (compressed entries and the window's shared K=V vector) in vLLM's fp8_ds_mla layout:
    448 FP8 NoPE bytes, 128 bytes of BF16 RoPE and an 8-byte scale per 512-value entry, 584 bytes (deepseek_v4
    attention.py `state_content_bytes`, DeepseekV4SWACache `packed_bytes_per_token`). Under FP8 and under auto too: the
    default CUDA attention classes (FlashMLA; FlashInfer on SM12) keep `use_fp8_ds_mla_layout` and turn
    `--kv-cache-dtype auto` into fp8_ds_mla (`_resolve_dsv4_kv_cache_dtype`); BF16 entries only when BF16 is asked for."""
    return float(kv_dtype.bytes_per_value) if kv_dtype is KvDtype.BF16 else 584.0 / 512.0


def _sliding_bytes_per_token(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num, owned: bool = True) -> Num:
    """Sliding-window KV bytes per windowed token: layers that own a cache (`owned`), else all that read one."""
    heads = np.maximum(1, model.num_kv_heads // tp)
    layers = model.num_sliding_layers - (model.kv_reuse_sliding_layers if owned else 0)
    if model.kv_shared_vector:  # DeepSeek-V4's window: one shared K=V vector a token, as its compressed entries are stored
        return (layers / pp) * heads * model.head_dim * _compressed_bytes_per_value(kv_dtype)
    return 2 * (layers / pp) * heads * model.head_dim * kv_dtype.bytes_per_value


def sliding_kv_bytes_per_seq(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num, max_num_batched_tokens: Num) -> Num:
    """Fixed KV one running sequence holds in sliding-window layers: min(window − 1 + step budget, context) tokens
    (vLLM SlidingWindowSpec.max_memory_usage_bytes)."""
    if model.num_sliding_layers - model.kv_reuse_sliding_layers == 0:
        return 0 * tp
    tokens = np.minimum(model.sliding_window - 1 + max_num_batched_tokens, model.max_context_tokens)
    return _sliding_bytes_per_token(model, kv_dtype, tp=tp, pp=pp) * tokens


def state_bytes_per_seq(model: ModelArch, *, tp: Num, pp: Num = 1, engine: Engine | None = None) -> Num:
    """Conv and recurrent state one sequence holds in the fixed-state layers on one GPU (`engine` None: vLLM's).

    vLLM MambaSpec per layer: conv values / TP plus recurrent values over min(TP, state heads) (heads are
    TP-sharded; past the head count they replicate). SGLang's MambaPool holds the same shapes per request slot.
    Dtypes: the conv state in the model dtype; the recurrent one in FP32 where the config names float32 (vLLM
    --mamba-ssm-cache-dtype 'auto' takes Qwen3.5's `mamba_ssm_dtype`, Nemotron-H's `mamba_ssm_cache_dtype` or float32;
    Kimi's KDA always, kda_state_dtype), else in the model dtype under vLLM; SGLang keeps a Mamba-2 or Gated DeltaNet
    recurrent state in FP32 unless the config names another dtype (configs/mamba_utils.py `mamba2_state_dtype`:
    default float32, then the config's `mamba_ssm_dtype`, then SGLANG_MAMBA_SSM_DTYPE).
    """
    if model.num_state_layers == 0:
        return 0 * tp
    sglang_fp32 = (engine is Engine.SGLANG and not model.state_ssm_dtype_given
                   and model.state_kind in (StateKind.MAMBA2, StateKind.GATED_DELTA_NET))
    ssm_bytes = 4.0 if model.state_ssm_fp32 or sglang_fp32 else STATE_BYTES_PER_VALUE
    per_layer = (model.state_conv_values / tp * STATE_BYTES_PER_VALUE
                 + model.state_ssm_values / np.minimum(tp, max(model.state_heads, 1)) * ssm_bytes)
    return model.num_state_layers / pp * per_layer


def fixed_bytes_per_seq(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num, engine: Engine | None = None) -> Num:
    """Bytes a decoding sequence holds whatever its length: its window of sliding-window KV (vLLM frees the blocks
    that fall out of the window: SlidingWindowManager.remove_skipped_blocks; one 16-token block of slack) plus
    its fixed state."""
    window = np.minimum(model.sliding_window + 16, model.max_context_tokens) if model.num_sliding_layers else 0
    return _sliding_bytes_per_token(model, kv_dtype, tp=tp, pp=pp) * window + state_bytes_per_seq(model, tp=tp, pp=pp, engine=engine)


def pool_tokens_from_bytes(model: ModelArch, pool_bytes: Num, kv_dtype: KvDtype, *, tp: Num, pp: Num, max_num_seqs: Num,
                           max_num_batched_tokens: Num, engine: Engine | None = None) -> Num:
    """Context tokens a KV pool of `pool_bytes` holds once running sequences' fixed bytes are set aside.

    Sliding-window and fixed-state layers take a fixed share per running sequence out of the same pool (vLLM's
    hybrid allocator shares one block pool between layer groups; SGLang sizes a mamba pool per request slot),
    plus, in sliding layers, one sequence at its peak with a whole prefill chunk inside its window.
    The share is set aside for `max_num_seqs` sequences, but never more than half the pool: an engine that
    cannot hold that many lowers its running cap instead (SGLang caps max_running_requests by its mamba pool).
    A model whose every layer is windowed or fixed-state holds any context: its pool counts max_context per sequence.
    """
    pool = np.maximum(pool_bytes, 0.0)
    # One sequence at its peak (window − 1 + a whole prefill chunk: vLLM SlidingWindowSpec.max_memory_usage_bytes).
    chunk = sliding_kv_bytes_per_seq(model, kv_dtype, tp=tp, pp=pp, max_num_batched_tokens=max_num_batched_tokens) + 0.0 * pool
    per_seq = fixed_bytes_per_seq(model, kv_dtype, tp=tp, pp=pp, engine=engine)
    per_tok = kv_bytes_per_token(model, kv_dtype, tp=tp, pp=pp)
    room = np.maximum(pool - chunk, 0.0)
    seqs = np.where(per_seq > 0, np.minimum(max_num_seqs, np.floor(room / 2.0 / np.maximum(per_seq, 1e-9))), max_num_seqs)
    left = room - seqs * per_seq
    unbounded = seqs * model.max_context_tokens + 0.0 * pool
    return np.floor(np.where(per_tok > 0, left / np.maximum(per_tok, 1e-9), unbounded))


@dataclass(frozen=True, slots=True)
class AttentionRead:
    """Bytes one GPU's decode attention reads per step, split by how they grow (scalars or arrays).

    per_context_token: read for every context token (full layers, DSA indexer keys);
    capped_per_token with cap_tokens: read for at most `cap_tokens` of a sequence's context (sliding-window
    layers read their window, DSA's sparse MLA its top-k tokens); per_sequence: fixed state read and written.
    """

    per_context_token: Any
    capped_per_token: Any
    cap_tokens: float
    per_sequence: Any


def attention_read_bytes(model: ModelArch, kv_dtype: KvDtype, *, tp: Num, pp: Num, engine: Engine | None = None) -> AttentionRead:
    """What decode attention reads, for the step-time model (planner.perf.step)."""
    state = 2.0 * state_bytes_per_seq(model, tp=tp, pp=pp, engine=engine)  # read and written back every step
    if model.is_mla and model.has_indexer:
        indexer = model.num_indexer_layers * model.index_head_dim * INDEXER_KEY_BYTES_PER_DIM / pp + 0 * tp
        latent = model.num_attention_layers / pp * _mla_bytes_per_layer(model, kv_dtype) + 0 * tp
        return AttentionRead(per_context_token=indexer, capped_per_token=latent, cap_tokens=float(model.index_topk), per_sequence=state)
    # Every attention layer reads its context, whether from its own cache or from the layer it shares one with.
    full = _kv_bytes_per_token(model, kv_dtype, tp=tp, pp=pp, owned=False)
    if model.num_sliding_layers:
        return AttentionRead(per_context_token=full, capped_per_token=_sliding_bytes_per_token(model, kv_dtype, tp=tp, pp=pp, owned=False),
                             cap_tokens=float(model.sliding_window), per_sequence=state)
    return AttentionRead(per_context_token=full, capped_per_token=0.0 * full, cap_tokens=float("inf"), per_sequence=state)


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


@lru_cache(maxsize=4096)
def kv_pool_tokens(model: ModelArch, gpu: Gpu, *, engine: Engine, precision: Precision, parallelism: Parallelism,
                   knobs: EngineKnobs) -> int:
    """Context tokens one attention-DP rank can cache (vLLM rounds down to whole blocks).

    Remembered (every argument is a frozen value and the result a pure function of them): a plan asks it about twice
    for each of its hundreds of survivors, and they share a few dozen (parallelism, knobs) pairs."""
    tp, pp, dp = parallelism.tp, parallelism.pp, parallelism.dp
    pool = float(kv_pool_bytes(model, gpu, engine=engine, precision=precision, tp=tp, pp=pp, dp=dp,
                               max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs,
                               memory_fraction=knobs.memory_fraction))
    if pool <= 0:
        return 0
    tokens = int(pool_tokens_from_bytes(model, pool, knobs.kv_dtype, tp=tp, pp=pp, max_num_seqs=knobs.max_num_seqs,
                                        max_num_batched_tokens=knobs.max_num_batched_tokens, engine=engine))
    if engine is Engine.VLLM:
        tokens -= tokens % knobs.block_size_tokens
    return max(tokens, 0)


def max_request_tokens(model: ModelArch, gpu: Gpu, *, engine: Engine, precision: Precision, parallelism: Parallelism,
                       knobs: EngineKnobs) -> int:
    """Longest single request (prompt + output) one rank can hold: the pool or the model's context."""
    return min(model.max_context_tokens, kv_pool_tokens(model, gpu, engine=engine, precision=precision,
                                                        parallelism=parallelism, knobs=knobs))


def transfer_floor_s(num_bytes: float, *, link_gbit: float) -> float:
    """Ideal time to move `num_bytes` over a link of `link_gbit` Gb/s (no latency, no protocol overhead)."""
    return num_bytes * 8.0 / (link_gbit * 1e9)


