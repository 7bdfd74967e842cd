"""Read a Hugging Face config.json into a ModelArch from its fields, never from its architecture name.

Called by planner.model.catalog (catalog and `from_hf_config`), the spec conversion and the CLI. Pure: takes a parsed
dict. Unknown fields that look like they shape the model give a warning naming them; every default the
reader had to take is listed in `ModelArch.assumptions` (the decision record prints both).

Layer layouts follow the engines' model code (vLLM model_executor/models): Nemotron-H `hybrid_override_pattern`
(M mamba, * attention, - MLP, E MoE), `layers_block_type`, `layer_types`, Jamba `attn_layer_period/offset` and
`expert_layer_period/offset`, Qwen3-Next `full_attention_interval`, MiniMax `attn_type_list`, DeepSeek
`first_k_dense_replace`/`moe_layer_freq`, Qwen-MoE `mlp_only_layers`/`decoder_sparse_step`, Llama-4
`interleave_moe_layer_step`, Gemma-3 `sliding_window_pattern`, Qwen2 `max_window_layers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from servingtopology.planner.arch import CheckpointQuant, ModelArch, ModuleGroup, StateKind
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import Precision
from servingtopology.planner.model.checkpoint_quant import parse_quantization
from servingtopology.planner.model.towers import read_towers

__all__ = ["from_hf_config", "text_config"]

_WRAPPERS = ("text_config", "language_config", "llm_config", "text_model_config")
# Fields that do not change weights, FLOPs or cache bytes (tokens, norms, rope, routing maths, HF bookkeeping).
_NEUTRAL = frozenset({
    "architectures", "model_type", "auto_map", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "initializer_range", "rope_theta", "rope_scaling",
    "rope_parameters", "original_max_position_embeddings", "partial_rotary_factor", "rotary_dim", "rope_interleave", "rotary_pct", "rotary_emb_base",
    "attention_dropout", "attn_dropout_prob", "emb_dropout_prob", "hidden_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop", "use_cache", "attention_bias",
    "mlp_bias", "use_bias", "bias", "norm_topk_prob", "scoring_func", "topk_method", "n_group", "topk_group",
    "routed_scaling_factor", "aux_loss_alpha", "router_aux_loss_coef", "output_router_logits", "seq_aux", "ep_size",
    "pretraining_tp", "use_qk_norm", "qk_norm_type", "qk_layernorm", "use_routing_bias", "router_jitter_noise",
    "num_logits_to_keep", "residual_in_fp32", "rescale_prenorm_residual", "mamba_hidden_act", "mamba_proj_bias",
    "mamba_conv_bias", "chunk_size", "mamba_chunk_size", "use_mamba_kernels", "time_step_min", "time_step_max",
    "time_step_floor", "time_step_limit", "time_step_rank", "router_temperature", "moe_router_topk_scaling_factor",
    "qk_head_dim", "head_size", "hidden_act", "mlp_hidden_act", "hidden_activation", "swiglu_limit", "final_logit_softcapping",
    "attn_logit_softcapping", "query_pre_attn_scalar", "use_sliding_window", "sliding_window",
    "index_share_for_mtp_iteration", "indexer_rope_interleave", "rope_local_base_freq", "use_mtp", "mtp_transformer_layers",
    "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "vision_config", "audio_config",
    "quantization_config", "compression_config", "max_window_layers", "cache_implementation", "use_return_dict",
    # Hugging Face PretrainedConfig generation and bookkeeping defaults that `to_dict()` writes into nested configs.
    "chunk_size_feed_forward", "encoder_no_repeat_ngram_size", "no_repeat_ngram_size", "min_length", "max_length",
    "num_beam_groups", "num_beams", "num_return_sequences", "pruned_heads", "repetition_penalty", "length_penalty",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "id2label", "label2id", "exponential_decay_length_penalty",
    "cross_attention_hidden_size", "task_specific_params", "bad_words_ids", "begin_suppress_tokens", "suppress_tokens",
    # Training-time MoE and attention knobs (DBRX ffn_config / attn_config; llm-foundry names).
    "moe_jitter_eps", "moe_loss_weight", "moe_normalize_expert_weights", "uniform_expert_assignment", "clip_qkv", "emb_pdrop",
    "output_attentions", "output_hidden_states", "return_dict",
    # Norm epsilons and routing groups under other names (LFM2 `block_norm_eps`, Kimi-Linear `num_expert_group`).
    "block_norm_eps", "num_expert_group",
    # Which layers skip RoPE: a NoPE layer still caches K and V (vLLM smollm3/llama FullAttentionSpec); the layout
    # matters only beside chunked attention, where `_apply_chunked` reads them.
    "no_rope_layers", "no_rope_layer_interval",
})
# What a model's own code fixes when its config.json leaves a field out, by the config's `model_type`: defaults of
# transformers' config classes and fixed parts of vLLM's model code. Used only for an absent field, and named in the
# assumptions; any other model_type takes the generic default. This is no list of supported models: a model_type
# not named here is read the same way, from its fields.
_IMPLIED: dict[str, dict[str, Any]] = {
    # transformers configuration_gemma.py, configuration_gemma2.py, modular_gemma3.py (Gemma3TextConfig derives from
    # Gemma2Config), configuration_cohere.py, configuration_cohere2.py: tie_word_embeddings=True by default.
    **{mt: {"tie_word_embeddings": True} for mt in ("gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "cohere2")},
    # vLLM llama4.py Llama4MoE (and transformers Llama4TextMoe): every MoE layer has one shared expert of the
    # routed experts' width (`intermediate_size`) beside the routed ones; the config has no field for it.
    "llama4_text": {"n_shared_experts": 1},
    # vLLM model_executor/models/config.py NemotronHForCausalLMConfig: --mamba-ssm-cache-dtype 'auto' becomes the
    # config's `mamba_ssm_cache_dtype`, else float32 (DEFAULT_MAMBA_SSM_CACHE_DTYPE: "Only float32 is known to have no
    # accuracy issues by default").
    "nemotron_h": {"mamba_ssm_cache_dtype": "float32"},
    # DeepSeek-V3's MTP layer (model.layers.61) stores its own `embed_tokens` and `shared_head.head` (671 B + 14 B = 685 B
    # in the release), which vLLM deepseek_mtp.py loads (`embed_tokens` shared by the MTP layers, a head per layer).
    **{mt: {"mtp_use_dedicated_embeddings": True} for mt in ("deepseek_v3", "deepseek_v32")},
    # transformers configuration_starcoder2.py: tie_word_embeddings=True; Starcoder2MLP is c_fc -> act -> c_proj (two
    # matrices; vLLM 0.33 runs it through its Transformers backend), which no field says: its `hidden_act` is the same
    # GELU Gemma gates with.
    "starcoder2": {"tie_word_embeddings": True, "mlp_gated": False},
    # Two-matrix MLPs as well: vLLM gpt2.py, opt.py, bloom.py, falcon.py (FalconMLP), gpt_j.py; GPTBigMLP c_fc/c_proj,
    # GPTNeoXMLP dense_h_to_4h/dense_4h_to_h, PhiMLP fc1/fc2 and MptMLP up_proj/down_proj (transformers modeling code;
    # vLLM 0.33 runs the first three through its Transformers backend and no longer loads MPT). Their config classes
    # (transformers configuration_<model_type>.py) tie the embeddings by default, but GPT-NeoX's, Phi's and GPT-J's.
    **{mt: {"tie_word_embeddings": True, "mlp_gated": False} for mt in ("gpt2", "opt", "bloom", "falcon", "gpt_bigcode", "mpt")},
    **{mt: {"tie_word_embeddings": False, "mlp_gated": False} for mt in ("gpt_neox", "phi", "gptj")},
    # transformers configuration_lfm2.py Lfm2Config: tie_embedding=True and block_auto_adjust_ff_dim=True by default
    # (Lfm2MLP then takes 2/3 of the width, rounded up to block_multiple_of, 256 by default).
    "lfm2": {"tie_word_embeddings": True, "block_auto_adjust_ff_dim": True},
    # Qwen (v1, remote code `QWenLMHeadModel`): `intermediate_size` counts both gated projections together; each (w1, w2)
    # is intermediate_size // 2 wide, and so is c_proj's input (vLLM qwen.py QWenBlock: `QWenMLP(config.hidden_size,
    # config.intermediate_size // 2)`; the released modeling_qwen.py: `ff_dim_in = config.intermediate_size // 2`).
    "qwen": {"mlp_width_divisor": 2},
}
# Other names the reader takes for an implied field: a config that gives one of them gives the field.
_ALSO_READ_AS: dict[str, tuple[str, ...]] = {"n_shared_experts": ("num_shared_experts",), "tie_word_embeddings": ("tie_embedding",)}
_SHAPE_HINTS = ("layer", "head", "dim", "size", "expert", "rank", "window", "kv", "state", "conv", "expand", "pattern",
                "interval", "ratio", "topk", "top_k", "compress", "quant", "mtp", "nextn", "sparse", "mamba", "ssm", "linear", "attn",
                "num_", "n_", "moe", "block", "group")


# Token ids and scalar multipliers (muP, routing scales) never change weights, FLOPs or cache bytes.
_SCALAR_SUFFIXES = ("_token_id", "_token_ids", "_token_index", "_multiplier", "_multipliers", "_scaling_factor", "_rope_theta",
                    # Norm and residual scalars (MiniMax-M1 `layernorm_*_alpha` / `_beta`) and dropout rates.
                    "_alpha", "_beta", "_dropout")


class _Reader:
    """A config dict that records which keys were read, so the rest can be named in warnings."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.cfg = cfg
        self.read: set[str] = set()

    def get(self, *keys: str, default: Any = None) -> Any:
        for k in keys:
            self.read.add(k)
        for k in keys:
            if self.cfg.get(k) is not None:
                return self.cfg[k]
        return default

    def num(self, *keys: str, default: int = 0) -> int:
        v = self.get(*keys)
        try:
            return int(v) if v is not None and not isinstance(v, bool) else default
        except (TypeError, ValueError):
            return default


def text_config(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The language model's own config: nested `text_config`-style wrappers are followed, outer fields kept as fallbacks."""
    for key in _WRAPPERS:
        inner = cfg.get(key)
        if isinstance(inner, Mapping) and ("num_hidden_layers" in inner or "hidden_size" in inner):
            merged = {k: v for k, v in cfg.items() if k not in _WRAPPERS}
            merged.update(inner)
            if not inner.get("architectures") and cfg.get("architectures"):
                merged["architectures"] = cfg["architectures"]
            return merged, key
    return dict(cfg), ""


# Nested blocks that hold a model's own fields (DBRX `attn_config` / `ffn_config`, as vLLM's dbrx.py reads them) are
# merged as fallbacks; other towers, checkpoint formats and rope settings are not. Hugging Face writes
# PretrainedConfig bookkeeping into such blocks (`tie_word_embeddings: true`, `model_type: ""`): it is never merged.
_NOT_NESTED_MODEL = frozenset({*_WRAPPERS, "vision_config", "audio_config", "quantization_config", "compression_config",
                               "rope_scaling", "rope_parameters", "speech_config", "thinker_config", "talker_config"})
_BOOKKEEPING = frozenset({"tie_word_embeddings", "return_dict", "output_hidden_states", "output_attentions", "model_type",
                          "architectures", "torch_dtype", "dtype", "transformers_version", "is_encoder_decoder"})


def _merge_nested(inner: dict[str, Any]) -> list[str]:
    """Merge the fields of nested `*_config` blocks into `inner` where the top level lacks them; returns their names."""
    merged = []
    for key, block in list(inner.items()):
        if not key.endswith("_config") or key in _NOT_NESTED_MODEL or not isinstance(block, Mapping):
            continue
        merged.append(key)
        for k, v in block.items():
            if k not in inner and k not in _BOOKKEEPING and k not in _NEUTRAL:
                inner[k] = v
    return merged


def _mixers(r: _Reader, layers: int, warn: Callable[[str], None], assume: list[str]) -> tuple[list[str], list[str | None]]:
    """Per-layer token mixer (full, sliding, state, parallel, none) and, where the layout fixes it, the FFN kind."""
    ffn: list[str | None] = [None] * layers
    interval = r.num("full_attention_interval")  # read first: layer_types, when present, spells the same layout out
    pattern = r.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        if len(pattern) != layers:
            warn(f"hybrid_override_pattern has {len(pattern)} entries for {layers} layers; the pattern's length was used")
            layers = len(pattern)
            ffn = [None] * layers
        mix = []
        for i, ch in enumerate(pattern):
            mix.append({"M": "state", "*": "full"}.get(ch, "none"))
            ffn[i] = {"-": "dense", "E": "moe"}.get(ch, "no_ffn")
            if ch not in "M*-E":
                warn(f"hybrid_override_pattern symbol {ch!r} is not understood (M, *, -, E); layer {i} taken as an MLP layer")
                ffn[i] = "dense"
        return mix, ffn
    blocks = r.get("layers_block_type")
    if isinstance(blocks, list) and blocks:
        mix = []
        for i, b in enumerate(str(x).lower() for x in blocks):
            if b in ("mamba", "mamba2", "ssm"):
                mix.append("state")
            elif b in ("attention", "full_attention"):
                mix.append("full")
            elif b in ("mlp", "moe"):
                mix.append("none")
                ffn[i] = "dense" if b == "mlp" else "moe"
            else:
                warn(f"layers_block_type entry {b!r} is not understood; layer {i} taken as full attention")
                mix.append("full")
        if any(m == "none" for m in mix):
            ffn = [f if f is not None else "no_ffn" for f in ffn]
        return mix[:layers] + ["full"] * (layers - len(mix)), ffn
    types = r.get("layer_types")
    if isinstance(types, list) and types:
        kinds = {"full_attention": "full", "attention": "full", "global": "full", "sliding_attention": "sliding",
                 "sliding_window": "sliding", "local": "sliding", "chunked_attention": "sliding", "linear_attention": "state",
                 "mamba": "state", "mamba2": "state", "ssm": "state", "conv": "state", "short_conv": "state", "kda": "state"}
        mix = []
        for i, t in enumerate(str(x).lower() for x in types[:layers]):
            if t not in kinds:
                warn(f"layer_types entry {t!r} is not understood; layer {i} taken as full attention")
            mix.append(kinds.get(t, "full"))
        return mix + ["full"] * (layers - len(mix)), ffn
    full_idxs = r.get("full_attn_idxs")
    if isinstance(full_idxs, list):
        # LFM2 (vLLM lfm2.py: `layer_types` built from `full_attn_idxs`; every other layer is a short-conv block).
        full = {int(i) for i in full_idxs}
        return ["full" if i in full else "state" for i in range(layers)], ffn
    kda = r.get("kda_layers")
    if isinstance(kda, list) and kda:
        # Kimi-Linear `linear_attn_config.kda_layers` counts layers from 1 (configuration_kimi.py `is_kda_layer`:
        # `(layer_idx + 1) in kda_layers`; its full_attn_layers end at num_hidden_layers); the rest run MLA.
        r.get("full_attn_layers")
        linear = {int(i) - 1 for i in kda}
        return ["state" if i in linear else "full" for i in range(layers)], ffn
    attn_types = r.get("attn_type_list")
    if isinstance(attn_types, list) and attn_types:
        return ["full" if int(x) == 1 else "state" for x in attn_types[:layers]] + ["full"] * (layers - len(attn_types)), ffn
    period = r.num("attn_layer_period")
    if period > 0:
        offset = r.num("attn_layer_offset")
        return ["full" if i % period == offset else "state" for i in range(layers)], ffn
    if interval > 0:
        return ["full" if (i + 1) % interval == 0 else "state" for i in range(layers)], ffn
    if r.get("ssm_state_size", "mamba_d_state", "state_size") is not None:
        if r.num("num_attention_heads") > 0:
            assume.append("state-space fields with attention heads and no layer pattern: every layer runs attention and an SSM "
                          "side by side (Falcon-H1's parallel hybrid)")
            return ["parallel"] * layers, ffn
        return ["state"] * layers, ffn
    return ["full"] * layers, ffn


def _apply_sliding(r: _Reader, mix: list[str], max_ctx: int, assume: list[str]) -> int:
    """Mark sliding-window layers; returns the window (0 when no layer slides)."""
    chunk = r.num("attention_chunk_size")
    if chunk > 0 and "sliding" not in mix and not r.num("sliding_window"):
        return _apply_chunked(r, mix, chunk, max_ctx, assume)
    window = r.num("sliding_window", "attention_chunk_size")
    if window <= 0 or (window >= max_ctx > 0 and "sliding" not in mix):
        for i, m in enumerate(mix):
            if m == "sliding":
                mix[i] = "full"
        return 0
    if "sliding" in mix:
        return window
    if r.get("use_sliding_window") is False:
        return 0
    full = [i for i, m in enumerate(mix) if m == "full"]
    pattern = r.num("sliding_window_pattern")
    max_window_layers = r.num("max_window_layers", default=-1)
    if pattern > 0:
        slide = [i for i in full if (i + 1) % pattern != 0]
    elif r.get("use_sliding_window") is True and max_window_layers >= 0:
        slide = [i for i in full if i >= max_window_layers]
    elif str(r.get("cache_implementation") or "") == "hybrid":
        assume.append("cache_implementation 'hybrid' without a pattern: every other layer slides (Gemma-2)")
        slide = [i for i in full if i % 2 == 0]
    else:
        assume.append(f"sliding_window {window} with no per-layer pattern: every attention layer slides")
        slide = full
    for i in slide:
        mix[i] = "sliding"
    return window if slide else 0


def _apply_chunked(r: _Reader, mix: list[str], chunk: int, max_ctx: int, assume: list[str]) -> int:
    """Chunked local attention (Llama-4 `attention_chunk_size`): layers that use RoPE attend within their chunk,
    the no-RoPE layers attend globally. The layout is `no_rope_layers` (1: RoPE, chunked; 0: global), else every
    `no_rope_layer_interval`-th layer is global (transformers Llama4TextConfig: interval 4 by default, so layers
    3, 7, 11, ... are global). vLLM llama4.py: `use_chunked_local_attn = not self.nope and attention_chunk_size`,
    cached as ChunkedLocalAttentionSpec, which frees the blocks of past chunks (at most one chunk per sequence,
    as a sliding window of `attention_chunk_size` tokens is charged here)."""
    if chunk >= max_ctx > 0:
        return 0
    uses_rope = r.get("no_rope_layers")
    if isinstance(uses_rope, list) and uses_rope:
        local = [i for i, m in enumerate(mix) if m == "full" and i < len(uses_rope) and int(uses_rope[i]) == 1]
    else:
        interval = r.num("no_rope_layer_interval", default=4)
        if r.get("no_rope_layer_interval") is None:
            assume.append(f"attention_chunk_size {chunk} without no_rope_layers: every {interval}th layer attends globally, "
                          "the others within their chunk (transformers Llama4TextConfig default no_rope_layer_interval 4)")
        local = [i for i, m in enumerate(mix) if m == "full" and (interval <= 0 or (i + 1) % interval != 0)]
    for i in local:
        mix[i] = "sliding"
    return chunk if local else 0


def _ffn_kinds(r: _Reader, layers: int, given: list[str | None], moe: bool) -> list[str]:
    if not moe:
        r.read.add("mlp_only_layers")  # which layers skip the experts: moot without experts (Qwen3.5 dense writes [])
        return [g if g is not None and g != "moe" else "dense" for g in given]
    out: list[str] = []
    k = r.num("first_k_dense_replace")
    freq = r.num("moe_layer_freq", default=1)
    step = r.num("decoder_sparse_step", default=1)
    inter = r.num("interleave_moe_layer_step", default=1)
    e_period, e_offset = r.num("expert_layer_period"), r.num("expert_layer_offset")
    only = {int(i) for i in (r.get("mlp_only_layers") or [])}
    # ERNIE-4.5 (vLLM ernie45_moe.py): MoE where (i + 1) % moe_layer_interval == 0 and start <= i <= end.
    start_raw, end_raw = r.get("moe_layer_start_index"), r.get("moe_layer_end_index")
    start = min(int(x) for x in start_raw) if isinstance(start_raw, list) and start_raw else int(start_raw or 0)
    end = max(int(x) for x in end_raw) if isinstance(end_raw, list) and end_raw else (
        int(end_raw) if end_raw is not None else layers - 1)
    end = end if end >= 0 else layers - 1
    e_interval = r.num("moe_layer_interval", default=1)
    moe_layers = r.get("moe_layers")
    kinds = r.get("mlp_layer_types")
    for i in range(layers):
        if given[i] is not None:
            out.append(str(given[i]))
            continue
        sparse = i >= k and (freq <= 1 or i % freq == 0) and (step <= 1 or (i + 1) % step == 0) and i not in only
        sparse = sparse and (inter <= 1 or (i + 1) % inter == 0) and (e_period <= 0 or i % e_period == e_offset)
        sparse = sparse and start <= i <= end and (e_interval <= 1 or (i + 1) % e_interval == 0)
        if isinstance(moe_layers, list):
            sparse = i in {int(x) for x in moe_layers}
        if isinstance(kinds, list) and i < len(kinds):
            sparse = str(kinds[i]).lower() in ("sparse", "moe")
        out.append("moe" if sparse else "dense")
    return out


def _state(r: _Reader, hidden: int, heads: int, head_dim: int) -> tuple[StateKind, int, int, int, int]:
    """(kind, mixer params per layer, conv values, recurrent values, state heads) of one fixed-state layer.

    Shapes are vLLM's MambaStateShapeCalculator (layers/mamba/mamba_utils.py): Gated DeltaNet conv
    (K−1) × (2·k_heads·k_dim + v_heads·v_dim) and recurrent v_heads × v_dim × k_dim; Mamba-2 conv
    (K−1) × (I + 2·G·N) and recurrent heads × head_dim × N; Mamba-1 conv (K−1) × I and recurrent I × N;
    linear attention heads × head_dim × head_dim.
    """
    if r.get("kda_layers") is not None:
        # Kimi Delta Attention (vLLM kimi_linear.py KimiDeltaAttention; MambaStateShapeCalculator.kda_state_shape):
        # q, k, v, o of heads x head_dim from `linear_attn_config` (the top-level head_dim is the legacy attention
        # one), a short conv on each of q, k, v, low-rank f (decay) and g (gate) projections through head_dim and a
        # per-head beta; conv state (K-1) x 3·H·d, recurrent H x d x d in FP32 (kda_state_dtype).
        block = r.cfg.get("linear_attn_config")
        lin: Mapping[str, Any] = block if isinstance(block, Mapping) else {}
        kh = int(lin.get("num_heads") or heads)
        kd = int(lin.get("head_dim") or head_dim)
        k = int(lin.get("short_conv_kernel_size") or 4)
        r.get("short_conv_kernel_size")
        width = kh * kd
        params = 4 * hidden * width + 3 * width * k + 2 * (hidden * kd + kd * width) + hidden * kh
        return StateKind.KDA, params, (k - 1) * 3 * width, kh * kd * kd, kh
    if r.get("conv_L_cache", "conv_l_cache") is not None:
        # LFM2 gated short convolution (vLLM lfm2.py ShortConv): in_proj hidden -> 3 x conv_dim (B, C, x), a depthwise
        # conv of L_cache taps, out_proj conv_dim -> hidden; state (L_cache - 1) x conv_dim
        # (MambaStateShapeCalculator.short_conv_state_shape), no recurrent state.
        k = r.num("conv_L_cache", "conv_l_cache", default=3)
        conv_dim = r.num("conv_dim", default=hidden)
        params = hidden * 3 * conv_dim + conv_dim * k + conv_dim * hidden
        return StateKind.SHORT_CONV, params, (k - 1) * conv_dim, 0, 1
    if r.num("linear_num_value_heads", "linear_num_key_heads") > 0:
        kh = r.num("linear_num_key_heads", default=heads)
        vh = r.num("linear_num_value_heads", default=kh)
        kd = r.num("linear_key_head_dim", default=head_dim)
        vd = r.num("linear_value_head_dim", default=kd)
        k = r.num("linear_conv_kernel_dim", default=4)
        conv_dim = 2 * kh * kd + vh * vd
        params = hidden * (2 * kh * kd + 2 * vh * vd) + hidden * 2 * vh + conv_dim * k + vh * vd * hidden
        return StateKind.GATED_DELTA_NET, params, (k - 1) * conv_dim, vh * vd * kd, vh
    n = r.num("ssm_state_size", "mamba_d_state", "state_size")
    if n > 0:
        k = r.num("conv_kernel", "mamba_d_conv", "d_conv", default=4)
        mheads = r.num("mamba_num_heads", "mamba_n_heads")
        mhead_dim = r.num("mamba_head_dim", "mamba_d_head")
        expand = r.get("expand", "mamba_expand", default=2)
        inter = r.num("mamba_d_ssm", "mamba_intermediate_size") or (mheads * mhead_dim) or int(float(expand) * hidden)
        if mheads > 0 or mhead_dim > 0 or r.get("n_groups", "mamba_n_groups") is not None:
            g = r.num("n_groups", "mamba_n_groups", default=1)
            mheads = mheads or max(inter // max(mhead_dim, 1), 1)
            mhead_dim = mhead_dim or inter // mheads
            conv_dim = inter + 2 * g * n
            params = hidden * (2 * inter + 2 * g * n + mheads) + conv_dim * k + inter * hidden
            return StateKind.MAMBA2, params, (k - 1) * conv_dim, mheads * mhead_dim * n, mheads
        dt_raw = r.get("mamba_dt_rank", "time_step_rank", default="auto")
        dt_rank = math.ceil(hidden / 16) if str(dt_raw) == "auto" else int(dt_raw)
        params = hidden * 2 * inter + inter * k + inter * (dt_rank + 2 * n) + dt_rank * inter + inter * n + inter * hidden
        return StateKind.MAMBA1, params, (k - 1) * inter, inter * n, inter
    params = 4 * hidden * heads * head_dim + hidden * heads * head_dim  # q, k, v, o and an output gate
    return StateKind.LINEAR_ATTENTION, params, 0, heads * head_dim * head_dim, heads


# RoPE scalings whose max_position_embeddings already counts the scaling (vLLM config/model.py `_get_and_verify_max_len`:
# "su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"; line 2613 in 0.33.0).
_ROPE_ALREADY_SCALED = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})


def _rope_scaled_context(cfg: Mapping[str, Any], model_type: str, max_ctx: int, assumptions: list[str]) -> int:
    """The context both engines derive when RoPE scaling stretches max_position_embeddings (linear, dynamic, ...): times
    `factor`, as vLLM's `_get_and_verify_max_len` (not for Gemma 3, whose max_position_embeddings is already scaled, nor
    for the types it lists as scaled) and SGLang's `get_context_length` (not when the scaling names its
    original_max_position_embeddings) both do; where they differ, the smaller context."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping) or "gemma3" in model_type or "original_max_position_embeddings" in rope:
        return max_ctx
    kind = str(rope.get("rope_type") or rope.get("type") or "default")
    factor = rope.get("factor")
    if kind in _ROPE_ALREADY_SCALED or isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 < factor <= 1024:
        return max_ctx
    scaled = int(max_ctx * factor)
    assumptions.append(f"context {scaled:,} tokens: max_position_embeddings {max_ctx:,} × the {kind} RoPE scaling factor {factor:g}, "
                       "as vLLM and SGLang derive it")
    return scaled


def from_hf_config(cfg: Mapping[str, Any], *, name: str = "", field: str = "modelConfig") -> ModelArch:
    """Build a ModelArch from a parsed config.json of any decoder-only LLM.

    Raises InvalidSpec only when the sizes that define a transformer are missing (layers and hidden size). The steps,
    in order (each notes what it assumed, in that order, in the ModelArch's `assumptions` and `warnings`):
    `_language_model` (the text model inside a wrapper, nested blocks, fields a model type implies), `_sizes` (layers,
    hidden size, heads, context, vocabulary), the layer kinds (`_mixers`, `_apply_sliding`, `_ffn_kinds`), `_mlp_matrices`,
    `_state_layers`, `_attention_extras` (per-layer heads, compressed and sparse attention), `_mtp_layers`, `_ffn_widths`,
    the KV reuse and checkpoint quantisation, the towers, and `_warn_unread` (shape fields nobody read).
    """
    warnings: list[str] = []
    assumptions: list[str] = []
    inner, r = _language_model(cfg, assumptions)
    sz = _sizes(r, inner, field, assumptions)
    num_experts = r.num("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", "n_experts")
    mix, given_ffn = _mixers(r, sz.layers, warnings.append, assumptions)
    window = _apply_sliding(r, mix, sz.max_ctx, assumptions)
    ffn = _ffn_kinds(r, len(mix), given_ffn, num_experts > 0)
    matrices = _mlp_matrices(r, assumptions)
    state = _state_layers(r, mix, sz, warnings.append, assumptions)
    if sz.heads <= 0 and any(m in ("full", "sliding", "parallel") for m in mix):
        raise InvalidSpec(field, "config.json has attention layers but no num_attention_heads")
    att = _attention_extras(r, mix, sz, warnings.append, assumptions)
    mtp, mtp_dedicated = _mtp_layers(r, assumptions)
    w = _ffn_widths(r, ffn, num_experts, sz.hidden, assumptions)
    reuse_full, reuse_sliding, reuse_drops_kv = _kv_reuse(r, mix, warnings.append, assumptions)
    checkpoint = parse_quantization(inner.get("quantization_config") or cfg.get("quantization_config") or inner.get("compression_config"),
                                    _representatives(mix, ffn, shared=bool(w.n_shared or w.shared_width)), warnings.append, assumptions)
    checkpoint = _expert_dtype(r, checkpoint, num_experts > 0 and "moe" in ffn, warnings.append, assumptions)
    heads, kv_heads = sz.heads, sz.kv_heads
    arch = ModelArch(
        name=name or str(inner.get("_name_or_path") or (list(inner.get("architectures") or []) or ["custom"])[0]),
        num_layers=len(mix), hidden_size=sz.hidden, num_heads=max(heads, 1), num_kv_heads=max(min(kv_heads, max(heads, 1)), 1),
        head_dim=max(sz.head_dim, 1), intermediate_size=w.dense_inter, vocab_size=sz.vocab, max_context_tokens=sz.max_ctx,
        tie_embeddings=bool(r.get("tie_word_embeddings", "tie_embedding", default=False)),
        num_experts=num_experts,
        experts_per_token=_per_layer(r, ("num_experts_per_tok", "experts_per_token", "moe_top_k", "num_experts_per_token", "moe_k", "moe_topk"),
                                     w.moe_idx, len(ffn), assumptions) if num_experts else 0,
        moe_intermediate_size=w.moe_inter, num_shared_experts=w.n_shared, shared_expert_intermediate_size=w.shared_width if num_experts else 0,
        num_dense_layers=sum(1 for f in ffn if f == "dense"), num_moe_ffn_layers=sum(1 for f in ffn if f == "moe"),
        ffn_matrices=matrices,
        kv_lora_rank=att.kv_lora, qk_rope_head_dim=r.num("qk_rope_head_dim"), qk_nope_head_dim=r.num("qk_nope_head_dim"),
        v_head_dim=r.num("v_head_dim"), q_lora_rank=r.num("q_lora_rank"), attn_output_gate=bool(r.get("attn_output_gate", default=False)),
        query_heads_total=att.query_heads_total,
        compressed_kv_values_per_token=att.compressed_values, compressed_indexer_keys_per_token=att.compressed_index_keys,
        kv_shared_vector=att.compressed_index_layers >= 0, o_lora_rank=r.num("o_lora_rank"), o_groups=r.num("o_groups"),
        index_n_heads=r.num("index_n_heads") if att.index_topk else 0, index_head_dim=r.num("index_head_dim") if att.index_topk else 0,
        index_topk=att.index_topk, num_indexer_layers=att.n_indexer,
        sliding_window=window, num_sliding_layers=sum(1 for m in mix if m == "sliding"),
        num_linear_layers=sum(1 for m in mix if m == "state"), num_mixerless_layers=sum(1 for m in mix if m == "none"),
        state_kind=state.kind, linear_mixer_params=state.n_state * state.mixer_params, state_conv_values=state.conv_values,
        state_ssm_values=state.ssm_values, state_heads=state.state_heads, num_parallel_state_layers=sum(1 for m in mix if m == "parallel"),
        state_ssm_fp32=state.kind is StateKind.KDA or state.ssm_fp32, state_ssm_dtype_given=state.ssm_given,
        kv_reuse_full_layers=reuse_full, kv_reuse_sliding_layers=reuse_sliding, kv_reuse_drops_kv_proj=reuse_drops_kv,
        num_mtp_layers=mtp, mtp_dedicated_embeddings=mtp_dedicated, checkpoint=checkpoint,
    )
    towers = read_towers(cfg, sz.hidden, warnings.append, assumptions)
    if towers is not None:
        arch = replace(arch, tower_params=towers.params, tower_bytes_per_param=towers.bytes_per_param)
    _warn_unread(inner, r, warnings.append)
    return replace(arch, warnings=tuple(warnings), assumptions=tuple(assumptions))


def _language_model(cfg: Mapping[str, Any], assumptions: list[str]) -> tuple[dict[str, Any], _Reader]:
    """The text model's fields (inside a multimodal wrapper, nested blocks merged, the fields its model type implies
    filled in where absent) and a reader over them."""
    inner, wrapper = text_config(cfg)
    if wrapper:
        assumptions.append(f"language model read from {wrapper}")
    nested = _merge_nested(inner)
    if nested:
        assumptions.append(f"fields read from the nested {', '.join(nested)} blocks")
    model_type = str(inner.get("model_type") or "")
    for key, value in _IMPLIED.get(model_type, {}).items():
        if key == "mtp_use_dedicated_embeddings" and not inner.get("num_nextn_predict_layers"):
            continue  # no MTP layers: nothing for the field to shape
        if all(inner.get(k) is None for k in (key, *_ALSO_READ_AS.get(key, ()))):
            inner[key] = value
            assumptions.append(f"plain two-matrix MLP (no gate projection), as {model_type}'s model code in vLLM has it" if key == "mlp_gated"
                               else f"{key} {value}: {model_type}'s model code halves intermediate_size for each MLP projection"
                               if key == "mlp_width_divisor"
                               else f"{key} absent: {value}, as vLLM's {model_type} config hook defaults it"
                               if key == "mamba_ssm_cache_dtype"
                               else f"{key} absent: {value}, as {model_type}'s own config class and model code have it")
    if inner.get("tie_word_embeddings") is None and inner.get("tie_embedding") is None:
        assumptions.append("tie_word_embeddings absent: the LM head is taken as a separate matrix (untied)")
    r = _Reader(inner)
    r.read.update(nested)
    return inner, r


@dataclass(frozen=True, slots=True)
class _Sizes:
    """The sizes every decoder has: layers as configured, hidden size, query and KV heads, head size, context, vocabulary."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    max_ctx: int
    vocab: int


def _sizes(r: _Reader, inner: Mapping[str, Any], field: str, assumptions: list[str]) -> _Sizes:
    """Layers, hidden size, heads, context and vocabulary; InvalidSpec without layers and a hidden size."""
    layers = r.num("num_hidden_layers", "num_layers", "n_layer", "n_layers")
    hidden = r.num("hidden_size", "d_model", "n_embd", "n_embed", "dim", "block_dim")
    if layers <= 0 or hidden <= 0:
        raise InvalidSpec(field, "config.json lacks a usable num_hidden_layers and hidden_size (also read: num_layers, n_layer, "
                                 "d_model, n_embd, n_embed); they are needed to size any decoder")
    heads = r.num("num_attention_heads", "n_head", "num_heads", "n_heads")
    head_dim = r.num("head_dim", "attention_head_dim", "kv_channels") or (hidden // heads if heads else 0)
    kv_heads = r.num("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv", "kv_n_heads", default=heads)
    if r.get("multi_query") is True and not r.get("new_decoder_architecture"):
        # One K and V head shared by every query head: vLLM falcon.py (`elif self.multi_query: total_num_kv_heads = 1`,
        # after new_decoder_architecture's num_kv_heads) and transformers GPTBigCode (`kv_heads = 1 if multi_query`).
        kv_heads = 1
        assumptions.append("multi_query: one KV head shared by every query head")
    max_ctx = r.num("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions", "model_max_length",
                    "max_seq_len", default=0)
    if max_ctx <= 0:
        max_ctx = 4096
        assumptions.append("no max_position_embeddings: a 4096-token context assumed")
    else:
        max_ctx = _rope_scaled_context(inner, str(inner.get("model_type") or ""), max_ctx, assumptions)
    vocab = r.num("vocab_size", "padded_vocab_size")
    if vocab <= 0:
        vocab = 32000
        assumptions.append("no vocab_size: 32000 assumed")
    return _Sizes(layers, hidden, heads, head_dim, kv_heads, max_ctx, vocab)


def _mlp_matrices(r: _Reader, assumptions: list[str]) -> int:
    """Matrices of each MLP: 3 (gate, up, down) unless the activation or a field says the MLP is plain (2)."""
    act_field = r.get("mlp_hidden_act", "hidden_act", "hidden_activation", "activation_function", "ffn_act_fn", default="silu")
    act = str(act_field.get("name", "silu") if isinstance(act_field, Mapping) else act_field).lower()
    gated = r.get("mlp_gated", "block_use_swiglu", "use_swiglu")
    matrices = 2 if act in ("relu2", "squared_relu") or gated is False else 3
    if act in ("relu2", "squared_relu"):
        assumptions.append(f"activation {act}: plain two-matrix MLPs (up, down), as vLLM's nemotron_h")
    elif gated is None and "gelu" in act:
        # Which MLP a GELU model has is fixed by its model code, not by a field (Gemma gates GELU, GPT-2 and StarCoder2
        # do not; vLLM and transformers build the module their architecture class names): say which one was taken.
        assumptions.append(f"hidden_act {act} with no field saying whether the MLP is gated: taken as gated (gate, up, "
                           "down); a plain GELU MLP has two matrices (set mlp_gated: false)")
    return matrices


@dataclass(frozen=True, slots=True)
class _StateLayers:
    """The layers that keep a fixed state per sequence (Mamba, linear attention): their kind and sizes."""

    n_state: int
    kind: StateKind = StateKind.NONE
    mixer_params: int = 0
    conv_values: int = 0
    ssm_values: int = 0
    state_heads: int = 0
    ssm_fp32: bool = False
    ssm_given: bool = False


def _state_layers(r: _Reader, mix: list[str], sz: _Sizes, warn: Callable[[str], None], assumptions: list[str]) -> _StateLayers:
    """The state layers' kind, per-layer parameters and state sizes, and the dtype their recurrent state is kept in."""
    n_state = sum(1 for m in mix if m in ("state", "parallel"))
    if not n_state:
        return _StateLayers(0)
    kind, mixer_params, conv_values, ssm_values, state_heads = _state(r, sz.hidden, sz.heads, sz.head_dim)
    ssm_fp32 = _ssm_state_fp32(r, kind, warn)
    ssm_given = kind is StateKind.KDA or r.get("mamba_ssm_dtype", "mamba_ssm_cache_dtype") is not None
    assumptions.append(f"{n_state} {kind.value} layers keep a fixed state per sequence, stored in the model dtype "
                       + ("with the recurrent state in FP32 (vLLM kda_state_dtype)" if kind is StateKind.KDA
                          else "with the recurrent state in FP32 (the config's mamba_ssm_dtype, which vLLM's "
                               "--mamba-ssm-cache-dtype 'auto' takes)" if ssm_fp32
                          else "(vLLM mamba_ssm_cache_dtype 'auto'; SGLang keeps a Mamba-2 or Gated DeltaNet "
                               "recurrent state in FP32 unless the config names its dtype)"))
    return _StateLayers(n_state, kind, mixer_params, conv_values, ssm_values, state_heads, ssm_fp32, ssm_given)


@dataclass(frozen=True, slots=True)
class _AttentionExtras:
    """What the attention layers add beyond heads × head_dim: per-layer query heads, MLA's latent, compressed and
    sparse (indexer) attention."""

    query_heads_total: int
    kv_lora: int
    compressed_values: float
    compressed_index_keys: float
    compressed_index_layers: int
    index_topk: int
    n_indexer: int


def _attention_extras(r: _Reader, mix: list[str], sz: _Sizes, warn: Callable[[str], None], assumptions: list[str]) -> _AttentionExtras:
    """Per-layer query heads, MLA's latent rank, DeepSeek-V4's compressed entries and a sparse-attention indexer."""
    per_layer_heads = r.get("num_attention_heads_per_layer")
    query_heads_total = 0
    if isinstance(per_layer_heads, list) and len(per_layer_heads) == len(mix):
        query_heads_total = sum(int(h) for h, m in zip(per_layer_heads, mix, strict=True) if m in ("full", "sliding", "parallel"))
        assumptions.append(f"num_attention_heads_per_layer: {query_heads_total} query heads over the attention layers "
                           f"({min(per_layer_heads)}-{max(per_layer_heads)} a layer); KV heads stay {sz.kv_heads}")
    elif per_layer_heads is not None:
        warn(f"num_attention_heads_per_layer has {len(per_layer_heads) if isinstance(per_layer_heads, list) else '?'} "
             f"entries for {len(mix)} layers; num_attention_heads {sz.heads} was used for every layer")
    kv_lora = r.num("kv_lora_rank")
    compressed_values, compressed_index_keys, compressed_index_layers = 0.0, 0.0, -1
    ratios = r.get("compress_ratios")
    head_dim = sz.head_dim
    if isinstance(ratios, list) and len(ratios) >= len(mix) and not kv_lora:
        # DeepSeek-V4 (vLLM models/deepseek_v4/attention.py): a window of `sliding_window` tokens in every layer, one
        # compressed head_dim entry per r tokens in layers of ratio r > 1, an indexer in the ratio-4 layers; the list may
        # carry the MTP layer's ratio after the decoder layers'.
        rs = [int(x) for x in ratios[:len(mix)]]
        compressed_values = sum(head_dim / x for x in rs if x > 1)
        compressed_index_layers = sum(1 for x in rs if x == 4)
        compressed_index_keys = sum(1 / x for x in rs if x == 4)
        assumptions.append(f"compress_ratios: {sum(1 for x in rs if x > 1)} layers keep one {head_dim}-value entry per "
                           f"{'/'.join(str(x) for x in sorted({x for x in rs if x > 1}))} tokens beside their window, "
                           f"{compressed_index_layers} with an indexer (vLLM deepseek_v4)")
    elif ratios is not None:
        warn(f"compress_ratios has {len(ratios) if isinstance(ratios, list) else '?'} entries for {len(mix)} layers "
             "and was not used: compressed attention not priced")
    index_topk = r.num("index_topk")
    indexer_types = r.get("indexer_types")
    n_attention = sum(1 for m in mix if m in ("full", "sliding", "parallel"))
    n_indexer = 0
    if index_topk > 0:
        n_indexer = sum(1 for t in indexer_types if str(t).lower() == "full") if isinstance(indexer_types, list) else n_attention
        if compressed_index_layers >= 0:
            n_indexer = compressed_index_layers
        assumptions.append(f"sparse attention: each query reads its top {index_topk} tokens; the indexer keeps its own FP8 key "
                           f"cache in {n_indexer} layers")
    return _AttentionExtras(query_heads_total, kv_lora, compressed_values, compressed_index_keys, compressed_index_layers,
                            index_topk, n_indexer)


def _mtp_layers(r: _Reader, assumptions: list[str]) -> tuple[int, bool]:
    """Multi-token-prediction layers (loaded only with MTP speculative decoding) and whether they carry their own
    embedding and LM head."""
    mtp = r.num("num_nextn_predict_layers", "mtp_num_hidden_layers")
    if not mtp and r.get("use_mtp"):
        mtp = r.num("num_mtp_modules", default=1) * r.num("mtp_transformer_layers", default=1)
    dedicated = r.get("mtp_use_dedicated_embeddings")
    mtp_dedicated = bool(dedicated) if isinstance(dedicated, bool) else False
    if mtp:
        assumptions.append(f"{mtp} multi-token-prediction layers are loaded only with MTP speculative decoding; not counted in the weights"
                           + ("; they store their own embedding and LM heads" if mtp_dedicated
                              else "; they read the main model's embedding and LM head"))
    return mtp, mtp_dedicated


@dataclass(frozen=True, slots=True)
class _FfnWidths:
    """The MLP and expert widths: the MoE layers' indices, an expert's width, a dense MLP's, the shared experts'."""

    moe_idx: list[int]
    moe_inter: int
    dense_inter: int
    shared_width: int
    n_shared: int


def _ffn_widths(r: _Reader, ffn: list[str], num_experts: int, hidden: int, assumptions: list[str]) -> _FfnWidths:
    """Widths of the dense MLPs, the routed experts and the shared experts, with the model families' own rules."""
    moe_idx = [i for i, f in enumerate(ffn) if f == "moe"]
    moe_inter = _per_layer(r, ("moe_intermediate_size", "expert_intermediate_size"), moe_idx, len(ffn), assumptions) if num_experts else 0
    dense_inter = r.num("intermediate_size_mlp", "block_ff_dim", "intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden)
    divisor = r.num("mlp_width_divisor", default=1)
    if divisor > 1:
        dense_inter //= divisor
        assumptions.append(f"mlp_width_divisor {divisor}: each MLP projection is intermediate_size / {divisor} = {dense_inter} wide")
    r.read.update(("block_multiple_of", "block_ffn_dim_multiplier"))
    if r.get("block_auto_adjust_ff_dim") is True:
        # LFM2's MLP (transformers Lfm2MLP, vLLM lfm2.py Lfm2MLP): 2/3 of the configured width, times
        # block_ffn_dim_multiplier, rounded up to block_multiple_of (Lfm2Config defaults 1.0 and 256).
        multiple = r.num("block_multiple_of", default=256)
        mult = r.get("block_ffn_dim_multiplier")
        width = int(2 * dense_inter / 3)
        width = int(float(mult) * width) if mult is not None else width
        adjusted = multiple * ((width + multiple - 1) // max(multiple, 1))
        assumptions.append(f"block_auto_adjust_ff_dim: the MLP is {adjusted} wide (2/3 of {dense_inter}, rounded up to {multiple})")
        dense_inter = adjusted
    if num_experts and not moe_inter:
        moe_inter = r.num("intermediate_size", "ffn_hidden_size", default=4 * hidden)
    shared_width = r.num("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", "shared_intermediate_size",
                         "share_expert_dim")
    n_shared = _per_layer(r, ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "num_shared_expert"), moe_idx,
                          len(ffn), assumptions) if num_experts else 0
    if r.get("use_mixed_mlp_moe") is False:
        n_shared = 0  # Hunyuan: no shared MLP beside the experts unless use_mixed_mlp_moe
    elif r.get("use_mixed_mlp_moe") is True and n_shared and not shared_width and r.num("intermediate_size") not in (0, moe_inter):
        # vLLM hunyuan_v1.py HunYuanSparseMoeBlock: the shared MLP is intermediate_size x num_shared_expert wide (when that
        # is the experts' width, n_shared x moe_intermediate_size says the same).
        shared_width = r.num("intermediate_size") * n_shared
    return _FfnWidths(moe_idx, moe_inter, dense_inter, shared_width, n_shared)


def _warn_unread(inner: Mapping[str, Any], r: _Reader, warn: Callable[[str], None]) -> None:
    """A warning for every field that looks like a shape and that no step read."""
    r.read.update(("intermediate_size", "num_hidden_layers"))
    for key in sorted(set(inner) - r.read - _NEUTRAL):
        value = inner[key]
        if isinstance(value, bool) or value is None or not isinstance(value, int | float | list | dict | str):
            continue
        if isinstance(value, str) and not key.endswith(("pattern", "type", "types")):
            continue
        if key.endswith(_SCALAR_SUFFIXES):
            continue
        if any(h in key.lower() for h in _SHAPE_HINTS):
            warn(f"field {key!r} is not understood by the planner and was ignored")


def _kv_reuse(r: _Reader, mix: list[str], warn: Callable[[str], None], assume: list[str]) -> tuple[int, int, bool]:
    """Attention layers that read another layer's KV cache: (full, sliding, whether they lack k/v projections).

    Hunyuan cross-layer attention (`use_cla`, `cla_share_factor` f): vLLM hunyuan_v1.py builds layer i as
    HunYuanCrossAttention (q_proj and o_proj only, attending over the K and V the previous layer computed) when
    i % f != 0, and skips such a layer's k/v weights when loading. `num_kv_shared_layers` N (Gemma-3n): the last N
    layers reuse the cache of the last earlier layer of their kind (vLLM `kv_sharing_target_layer_name`: no cache
    of their own); their k/v projections stay in the model.
    """
    attn = ("full", "sliding", "parallel")
    if r.get("use_cla") is True:
        factor = r.num("cla_share_factor", default=1)
        if factor > 1:
            idx = [i for i, m in enumerate(mix) if m in attn and i % factor != 0]
            full = sum(1 for i in idx if mix[i] != "sliding")
            assume.append(f"use_cla with cla_share_factor {factor}: {len(idx)} of {sum(1 for m in mix if m in attn)} attention "
                          "layers attend over the previous layer's K and V: no KV cache and no k/v projections of their own "
                          "(vLLM hunyuan_v1.py)")
            return full, len(idx) - full, True
        r.get("cla_share_factor")
    shared = r.num("num_kv_shared_layers")
    if shared > 0:
        if shared >= len(mix):
            warn(f"num_kv_shared_layers {shared} is not below the {len(mix)} layers; KV sharing was not priced")
            return 0, 0, False
        tail = mix[len(mix) - shared:]
        full = sum(1 for m in tail if m in ("full", "parallel"))
        sliding = sum(1 for m in tail if m == "sliding")
        assume.append(f"num_kv_shared_layers {shared}: the last {shared} layers reuse an earlier layer's KV cache and keep none "
                      "of their own (vLLM kv_sharing_target_layer_name)")
        return full, sliding, False
    return 0, 0, False


# `mamba_ssm_dtype` values and whether they keep the recurrent state in FP32.
_SSM_DTYPES = {"float32": True, "fp32": True, "bfloat16": False, "bf16": False, "float16": False, "fp16": False, "auto": False}


def _ssm_state_fp32(r: _Reader, kind: StateKind, warn: Callable[[str], None]) -> bool:
    """Whether the config keeps the recurrent (SSM / delta-rule) state in FP32: its `mamba_ssm_dtype` (Qwen3.5 writes
    "float32"). vLLM's Qwen3_5ForConditionalGenerationConfig.verify_and_update_config sets --mamba-ssm-cache-dtype
    'auto' to it and MambaStateDtypeCalculator then allocates the temporal state in that dtype, the conv state in the
    model dtype; SGLang's mamba2_state_dtype reads the same field (and keeps FP32 when it is absent: memory.py)."""
    value = r.get("mamba_ssm_dtype", "mamba_ssm_cache_dtype")
    if value is None or kind in (StateKind.KDA, StateKind.SHORT_CONV):
        return False
    key = str(value).lower().replace("torch.", "")
    if key not in _SSM_DTYPES:
        warn(f"mamba_ssm_dtype {value!r} is not understood; the recurrent state is priced in the model dtype")
        return False
    return _SSM_DTYPES[key]


def _per_layer(r: _Reader, keys: tuple[str, ...], layers: list[int], n_layers: int, assume: list[str]) -> int:
    """A count or width given once or per layer (Hunyuan's `moe_topk`, `num_shared_expert`, `moe_intermediate_size`
    lists, one entry a layer, as vLLM hunyuan_v1.py indexes them by layer_id): the mean over `layers`."""
    value = r.get(*keys)
    if isinstance(value, list):
        nums = [int(x) for x in value if isinstance(x, int | float) and not isinstance(x, bool)]
        if not nums or len(nums) != len(value):
            return 0
        if len(nums) != n_layers:  # not one entry a layer (ERNIE-VL's [text, vision] widths): the language model's first
            return nums[0]
        picked = [nums[i] for i in layers] or nums
        mean = round(sum(picked) / len(picked))
        if len(set(picked)) > 1:
            key = next(k for k in keys if r.cfg.get(k) is not None)
            assume.append(f"{key} differs by layer ({min(picked)}-{max(picked)}); the mean over the MoE layers, {mean}, was used")
        return mean
    return r.num(*keys)


# DeepSeek-V4 `expert_dtype` (no quantization_config field): "fp4" experts are packed E2M1 pairs with an E8M0 scale per
# 32 values (DeepSeek's inference model.py: torch.float4_e2m1fn_x2 experts; vLLM Fp8Config hands them to Mxfp4MoEMethod).
_MXFP4_BYTES = 0.5 + 1.0 / 32


def _expert_dtype(r: _Reader, checkpoint: CheckpointQuant | None, has_experts: bool, warn: Callable[[str], None],
                  assume: list[str]) -> CheckpointQuant | None:
    dtype = r.get("expert_dtype")
    if dtype is None or not has_experts:
        return checkpoint
    if str(dtype).lower() not in ("fp4", "mxfp4"):
        if str(dtype).lower() not in ("bf16", "bfloat16"):
            warn(f"expert_dtype {dtype!r} is not understood; the experts are priced as the rest of the checkpoint")
        return checkpoint
    assume.append("expert_dtype fp4: routed experts stored as MXFP4 (4 bits + an E8M0 scale per 32), as DeepSeek-V4's "
                  "model code and vLLM's Mxfp4MoEMethod load them")
    if checkpoint is None:
        return CheckpointQuant(method="mxfp4", precision=Precision.FP4, bytes_per_param=_MXFP4_BYTES,
                               quantized=frozenset({ModuleGroup.ROUTED_EXPERTS}))
    return replace(checkpoint, expert_precision=Precision.FP4, expert_bytes_per_param=_MXFP4_BYTES,
                   quantized=checkpoint.quantized | {ModuleGroup.ROUTED_EXPERTS})


def _representatives(mix: list[str], ffn: list[str], *, shared: bool) -> dict[ModuleGroup, tuple[str, ...]]:
    """Module names (vLLM prefixes) that stand for each weight group when matching a checkpoint's ignore list."""
    def last(pred: Any) -> int:
        idx = [i for i in range(len(mix)) if pred(i)]
        return idx[-1] if idx else len(mix) - 1
    a = last(lambda i: mix[i] in ("full", "sliding", "parallel"))
    s = last(lambda i: mix[i] in ("state", "parallel"))
    d = next((i for i, f in enumerate(ffn) if f == "dense"), 0)
    e = last(lambda i: ffn[i] == "moe")
    reps = {
        ModuleGroup.ATTENTION: (f"model.layers.{a}.self_attn.o_proj",),
        ModuleGroup.LINEAR_MIXER: (f"model.layers.{s}.linear_attn.out_proj", f"model.layers.{s}.mixer.out_proj"),
        ModuleGroup.DENSE_FFN: (f"model.layers.{d}.mlp.down_proj",),
        ModuleGroup.SHARED_EXPERTS: (f"model.layers.{e}.mlp.shared_experts.down_proj", f"model.layers.{e}.mlp.shared_expert.down_proj"),
        ModuleGroup.ROUTED_EXPERTS: (f"model.layers.{e}.mlp.experts.0.down_proj", f"model.layers.{e}.block_sparse_moe.experts.0.w2"),
        ModuleGroup.LM_HEAD: ("lm_head",),
    }
    present = {ModuleGroup.ATTENTION: any(m in ("full", "sliding", "parallel") for m in mix),
               ModuleGroup.LINEAR_MIXER: any(m in ("state", "parallel") for m in mix),
               ModuleGroup.DENSE_FFN: "dense" in ffn, ModuleGroup.SHARED_EXPERTS: "moe" in ffn and shared,
               ModuleGroup.ROUTED_EXPERTS: "moe" in ffn, ModuleGroup.LM_HEAD: True}
    return {g: names for g, names in reps.items() if present[g]}
