"""What the planner knows of a decoder-only LLM: layer counts by kind, widths, experts, caches, checkpoint format.

Built by planner.model.hf_config from a config.json (never by architecture name) and read by the memory and
performance models. Counts are per model, not per rank. Pure values and arithmetic; no parsing here.

Parameter formulas follow the engines' module shapes (vLLM model_executor/models: llama, deepseek_v2,
qwen3_next, mamba_mixer2, jamba): a gated FFN is gate + up + down, MLA is q_a/q_b (or q), kv_a, kv_b, o,
a Gated DeltaNet is in_proj_qkvz + in_proj_ba + conv1d + out_proj, Mamba-2 is in_proj + conv1d + out_proj.
Norms, biases and rotary tables are left out (under 0.1 % of any model here).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servingtopology.planner.hardware import Precision

__all__ = ["ModelArch", "CheckpointQuant", "StateKind", "ModuleGroup"]


class StateKind(enum.StrEnum):
    """What a fixed-state (non-attention) mixer layer keeps per sequence."""

    NONE = "none"
    GATED_DELTA_NET = "gated_delta_net"  # Qwen3-Next / Qwen3.5 linear attention
    MAMBA1 = "mamba1"                     # Jamba
    MAMBA2 = "mamba2"                     # Nemotron-H, Falcon-H1, Granite-4 hybrids
    LINEAR_ATTENTION = "linear_attention"  # MiniMax-01 lightning attention: one (head_dim × head_dim) state per head
    KDA = "kda"                           # Kimi Delta Attention (Kimi-Linear): q/k/v short convs, FP32 (d × d) state per head
    SHORT_CONV = "short_conv"             # LFM2 gated short convolution: only a (L_cache − 1) × conv_dim conv state


class ModuleGroup(enum.StrEnum):
    """Weight groups whose storage format a checkpoint may set separately."""

    ATTENTION = "attention"
    LINEAR_MIXER = "linear_mixer"
    DENSE_FFN = "dense_ffn"
    SHARED_EXPERTS = "shared_experts"
    ROUTED_EXPERTS = "routed_experts"
    LM_HEAD = "lm_head"


@dataclass(frozen=True, slots=True)
class CheckpointQuant:
    """The checkpoint's weight format from `quantization_config`: which groups are stored quantised, in what.

    `bytes_per_param` includes block scales and zero points (FP8 block 128×128: 1.0002; NVFP4: 4 bits plus an
    FP8 scale per 16 = 0.5625; MXFP4: 4 bits plus an E8M0 scale per 32 = 0.53125; INT4 group g with BF16
    scales: 0.5 + 2/g, plus 0.5/g for asymmetric zero points).
    """

    method: str
    precision: Precision
    bytes_per_param: float
    quantized: frozenset[ModuleGroup]
    # Routed experts stored in another format than the other quantised groups (DeepSeek-V4 `expert_dtype: fp4` beside
    # an FP8 block `quantization_config`); None: they share the checkpoint's format.
    expert_precision: Precision | None = None
    expert_bytes_per_param: float = 0.0

    def covers(self, group: ModuleGroup) -> bool:
        return group in self.quantized


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What the planner needs of a decoder-only transformer; counts are per model, not per rank."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context_tokens: int
    tie_embeddings: bool = False
    # MoE: experts per MoE layer, experts each token visits, per-expert FFN width, shared experts.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # total width of the shared expert(s); 0: num_shared × moe width
    num_dense_layers: int = 0  # layers whose FFN is dense (all of them for a dense model; DeepSeek's first_k_dense_replace)
    num_moe_ffn_layers: int = 0  # layers whose FFN is routed experts
    ffn_matrices: int = 3  # 3: gated (SwiGLU/GeGLU: gate, up, down); 2: plain (relu², gelu MLP)
    # MLA (DeepSeek): the cache holds one latent of kv_lora_rank + qk_rope_head_dim per token and layer.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    attn_output_gate: bool = False  # q_proj also produces a per-head output gate (Qwen3-Next / Qwen3.5)
    # Query heads summed over the attention layers when they differ by layer (`num_attention_heads_per_layer`);
    # 0: every attention layer has `num_heads`. KV heads, and so the cache, are per model.
    query_heads_total: int = 0
    # Sparse attention indexer (DeepSeek-V3.2 / GLM-5 DSA): each query attends to the top-k tokens the indexer picks.
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    num_indexer_layers: int = 0  # layers that keep their own indexer key cache
    # Compressed sparse attention (DeepSeek-V4 `compress_ratios`): every layer keeps a window of one shared K=V vector of
    # `head_dim` per token, and a layer of ratio r > 1 also one compressed entry per r tokens (vLLM deepseek_v4
    # attention.py: MLAAttentionSpec with tokens_per_state = r); its indexer keys (ratio-4 layers) one per r tokens too.
    compressed_kv_values_per_token: float = 0.0  # sum over layers of head_dim / r
    compressed_indexer_keys_per_token: float = 0.0  # sum over indexer layers of 1 / r
    kv_shared_vector: bool = False  # K and V are one cached vector (MQA-style latent): one vector per token, not two
    o_lora_rank: int = 0  # low-rank grouped output projection (wo_a per group, then wo_b)
    o_groups: int = 0
    # Sliding-window layers keep at most `sliding_window` tokens; fixed-state layers keep a state per sequence.
    sliding_window: int = 0
    num_sliding_layers: int = 0
    num_linear_layers: int = 0  # fixed-state mixer layers (Gated DeltaNet, Mamba, linear attention)
    num_mixerless_layers: int = 0  # layers with an FFN and no token mixer (Nemotron-H '-' and 'E' layers)
    num_parallel_state_layers: int = 0  # attention layers that also run a state-space mixer beside it (Falcon-H1)
    state_kind: StateKind = StateKind.NONE
    linear_mixer_params: int = 0  # weights of all fixed-state mixer layers together
    state_conv_values: int = 0  # conv state values per sequence per fixed-state layer (TP-sharded)
    state_ssm_values: int = 0  # recurrent state values per sequence per fixed-state layer (TP-sharded)
    state_heads: int = 0  # heads the recurrent state is split over (TP shards them; replicated past it)
    # Recurrent state kept in FP32 whatever the model dtype: Kimi's KDA always (vLLM kda_state_dtype), others when the
    # config's `mamba_ssm_dtype` says float32 (vLLM Qwen3_5ForConditionalGenerationConfig sets --mamba-ssm-cache-dtype
    # 'auto' to it; SGLang mamba2_state_dtype reads it too).
    state_ssm_fp32: bool = False
    # The config names the recurrent state's dtype (`mamba_ssm_dtype`, `mamba_ssm_cache_dtype`, or its model_type's code
    # fixes one): the engines take it. Unnamed, each engine keeps its own default (planner.perf.memory.state_bytes_per_seq).
    state_ssm_dtype_given: bool = False
    # Cross-layer KV sharing: attention layers that read another layer's KV cache and allocate none of their own (vLLM
    # builds them with `kv_sharing_target_layer_name`, or for Hunyuan CLA as cross-attention over the previous layer's
    # K and V), by kind. `kv_reuse_drops_kv_proj`: those layers have no k/v projections either (hunyuan_v1.py
    # HunYuanCrossAttention has only q_proj and o_proj).
    kv_reuse_full_layers: int = 0
    kv_reuse_sliding_layers: int = 0
    kv_reuse_drops_kv_proj: bool = False
    # Multi-token prediction: extra decoder layers loaded only for MTP speculative decoding.
    num_mtp_layers: int = 0
    # The MTP block stores its own embedding and one LM head per MTP layer (DeepSeek-V3's layer 61 `embed_tokens` and
    # `shared_head.head`); False: it reads the main model's (Qwen3.5 `mtp_use_dedicated_embeddings: false`, MiMo).
    mtp_dedicated_embeddings: bool = False
    checkpoint: CheckpointQuant | None = None
    # Encoder towers of a multimodal checkpoint (vision, audio) and their projectors into the language model, which
    # vLLM loads beside it by default (planner.model.towers). Weights only: never in the per-token FLOPs or the KV cache.
    tower_params: int = 0
    tower_bytes_per_param: float = 2.0
    # What the config said that the planner did not use (warnings) and what it assumed (assumptions).
    warnings: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    # ---- kinds ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def has_indexer(self) -> bool:
        return self.index_topk > 0 and self.index_head_dim > 0

    @property
    def checkpoint_precision(self) -> Precision:
        """The precision the checkpoint's quantised weights are stored in (BF16 when it is not quantised)."""
        return self.checkpoint.precision if self.checkpoint is not None else Precision.BF16

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers - self.num_linear_layers - self.num_mixerless_layers

    @property
    def num_state_layers(self) -> int:
        """Layers that keep a fixed state per sequence."""
        return self.num_linear_layers + self.num_parallel_state_layers

    @property
    def num_attention_layers(self) -> int:
        """Layers with softmax attention (full or sliding window)."""
        return self.num_full_attention_layers + self.num_sliding_layers

    @property
    def num_kv_reuse_layers(self) -> int:
        """Attention layers that read another layer's KV cache and keep none of their own."""
        return self.kv_reuse_full_layers + self.kv_reuse_sliding_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_moe_ffn_layers if self.is_moe else 0

    # ---- parameter counts (weights, not bytes) ----
    @property
    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_head) if self.q_lora_rank else h * self.num_heads * qk_head
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv + o
        q_out = self.num_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        q = (h * self.q_lora_rank + self.q_lora_rank * q_out) if self.q_lora_rank else h * q_out
        kv = (1 if self.kv_shared_vector else 2) * h * self.num_kv_heads * self.head_dim
        if self.o_lora_rank:  # vLLM deepseek_v4 wo_a (heads x head_dim -> groups x o_lora, grouped) and wo_b
            o = self.num_heads * self.head_dim * self.o_lora_rank + max(self.o_groups, 1) * self.o_lora_rank * h
        else:
            o = self.num_heads * self.head_dim * h
        return q + kv + o

    @property
    def indexer_params_per_layer(self) -> int:
        """DSA indexer: wq_b (q_lora_rank → heads × dim), wk (hidden → dim), weights_proj (hidden → heads)."""
        if not self.has_indexer:
            return 0
        q_in = self.q_lora_rank or self.hidden_size
        return q_in * self.index_n_heads * self.index_head_dim + self.hidden_size * (self.index_head_dim + self.index_n_heads)

    @property
    def dense_ffn_params_per_layer(self) -> int:
        return self.ffn_matrices * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return self.ffn_matrices * self.hidden_size * self.moe_intermediate_size

    @property
    def shared_expert_params_per_layer(self) -> int:
        width = self.shared_expert_intermediate_size or self.num_shared_experts * self.moe_intermediate_size
        return self.ffn_matrices * self.hidden_size * width

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts + (self.hidden_size if self.shared_expert_intermediate_size else 0)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def attention_params_total(self) -> int:
        """Softmax-attention projections of every attention layer, with their indexers."""
        base = self.num_attention_layers * self.attention_params_per_layer + self.num_indexer_layers * self.indexer_params_per_layer
        if self.kv_reuse_drops_kv_proj and not self.is_mla:
            base -= self.num_kv_reuse_layers * 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        if self.query_heads_total and not self.is_mla:
            # q (and its gate) and o grow with each layer's own query heads; k and v do not.
            extra_heads = self.query_heads_total - self.num_attention_layers * self.num_heads
            base += extra_heads * self.head_dim * self.hidden_size * (3 if self.attn_output_gate else 2)
        return base

    @property
    def dense_ffn_params_total(self) -> int:
        return self.num_dense_layers * self.dense_ffn_params_per_layer

    @property
    def shared_expert_params_total(self) -> int:
        return self.num_moe_layers * self.shared_expert_params_per_layer

    @property
    def routed_expert_params_total(self) -> int:
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def non_expert_params(self) -> int:
        """Attention, mixers, dense FFNs, shared experts, routers and embeddings: everything TP-sharded, not EP-sharded."""
        return (self.attention_params_total + self.linear_mixer_params + self.dense_ffn_params_total + self.shared_expert_params_total
                + self.num_moe_layers * self.router_params_per_layer + self.embedding_params)

    @property
    def total_params(self) -> int:
        """Weights of the language model (MTP layers excluded: see `mtp_params`; encoder towers: `tower_params`)."""
        return self.non_expert_params + self.routed_expert_params_total

    @property
    def total_params_with_towers(self) -> int:
        """Weights the engine loads to serve the model with its multimodal inputs: the language model and its towers."""
        return self.total_params + self.tower_params

    @property
    def mtp_params(self) -> int:
        """Weights the checkpoint stores for its multi-token-prediction layers: each a decoder layer (MoE where the model
        is) and the projection of [embedding; hidden] back to hidden (eh_proj, MiMo's input_proj, Qwen's mtp.fc); with
        dedicated embeddings also one embedding for the block and an LM head per layer (DeepSeek-V3's layer 61, as vLLM
        deepseek_mtp.py loads it: `embed_tokens` shared by the MTP layers, `shared_head.head` per layer; 671 B + 14 B =
        685 B). Without them the MTP layers read the main model's embedding and head (nothing more stored)."""
        if self.num_mtp_layers == 0:
            return 0
        ffn = (self.num_experts * self.expert_params + self.shared_expert_params_per_layer + self.router_params_per_layer
               if self.is_moe else self.dense_ffn_params_per_layer)
        per_layer = self.attention_params_per_layer + self.indexer_params_per_layer + ffn + 2 * self.hidden_size**2
        embeddings = (self.num_mtp_layers + 1) * self.vocab_size * self.hidden_size if self.mtp_dedicated_embeddings else 0
        return self.num_mtp_layers * per_layer + embeddings

    @property
    def active_params_per_token(self) -> int:
        """Weights one token's forward pass multiplies (embedding lookup excluded, LM head included)."""
        lm_head = self.vocab_size * self.hidden_size
        body = self.non_expert_params - self.embedding_params
        return body + self.num_moe_layers * self.experts_per_token * self.expert_params + lm_head

    @property
    def indexer_keys_per_token(self) -> float:
        """Indexer key entries cached per context token, over all indexer layers (compressed layers keep one per r)."""
        return self.compressed_indexer_keys_per_token if self.compressed_kv_values_per_token else float(self.num_indexer_layers)

    @property
    def kv_latent_dim(self) -> int:
        """Values cached per token and layer for MLA (latent plus rope key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def params_of(self, group: ModuleGroup) -> int:
        """Parameters of one weight group (LM head only; input embeddings are not a GEMM and stay unquantised)."""
        return {
            ModuleGroup.ATTENTION: self.attention_params_total,
            ModuleGroup.LINEAR_MIXER: self.linear_mixer_params,
            ModuleGroup.DENSE_FFN: self.dense_ffn_params_total,
            ModuleGroup.SHARED_EXPERTS: self.shared_expert_params_total,
            ModuleGroup.ROUTED_EXPERTS: self.routed_expert_params_total,
            ModuleGroup.LM_HEAD: 0 if self.tie_embeddings else self.vocab_size * self.hidden_size,
        }[group]
