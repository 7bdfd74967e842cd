"""Model architecture from a Hugging Face config.json, and the built-in model catalog.

Handles dense and MoE (routed plus shared experts, leading dense layers), MHA/GQA, MLA, sliding-window
and linear-attention layers. Called by the spec conversion, the memory and performance models. Pure:
parses dicts; reading a user's config.json file is the caller's job (`from_hf_config`).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .errors import InvalidSpec

__all__ = ["ModelArch", "from_hf_config", "model_catalog", "resolve_model", "SUPPORTED_ARCHITECTURES"]

SUPPORTED_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
    "GptOssForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM",
    "Qwen3NextForCausalLM", "KimiK2ForCausalLM",
})


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What the planner needs of a transformer; counts are per model, not per rank."""

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
    num_dense_layers: int = 0  # leading dense layers of an MoE model (DeepSeek first_k_dense_replace)
    # MLA (DeepSeek): the cache holds one latent of kv_lora_rank + qk_rope_head_dim per token and layer.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # Sliding-window layers keep at most `sliding_window` tokens; linear-attention layers keep a fixed state.
    sliding_window: int = 0
    num_sliding_layers: int = 0
    num_linear_layers: int = 0
    checkpoint_precision: str = "bf16"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers - self.num_linear_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

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
        q = h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * h
        return q + kv + o

    @property
    def dense_ffn_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def routed_expert_params_total(self) -> int:
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def non_expert_params(self) -> int:
        """Attention, dense FFNs, shared experts, routers and embeddings: everything TP-sharded, not EP-sharded."""
        layers = self.num_layers * self.attention_params_per_layer
        layers += self.num_dense_layers * self.dense_ffn_params_per_layer if self.is_moe else self.num_layers * self.dense_ffn_params_per_layer
        layers += self.num_moe_layers * (self.num_shared_experts * self.expert_params + self.hidden_size * self.num_experts)
        return layers + self.embedding_params

    @property
    def total_params(self) -> int:
        return self.non_expert_params + self.routed_expert_params_total

    @property
    def active_params_per_token(self) -> int:
        """Weights one token's forward pass multiplies (embedding lookup excluded, LM head included)."""
        lm_head = self.vocab_size * self.hidden_size
        body = self.non_expert_params - self.embedding_params
        return body + self.num_moe_layers * self.experts_per_token * self.expert_params + lm_head

    @property
    def kv_latent_dim(self) -> int:
        """Values cached per token and layer for MLA (latent plus rope key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _first(cfg: Mapping[str, Any], *keys: str, default: Any = 0) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def from_hf_config(cfg: Mapping[str, Any], *, name: str = "", field: str = "modelConfig") -> ModelArch:
    """Build a ModelArch from a parsed config.json; multimodal configs use their `text_config`."""
    if isinstance(cfg.get("text_config"), Mapping) and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures", [])}
    archs = list(cfg.get("architectures") or [])
    if archs and not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise InvalidSpec(field, f"unsupported architecture {archs[0]!r}; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidSpec(field, f"config.json lacks a usable {exc} (need num_hidden_layers, hidden_size, num_attention_heads)") from None
    kv_heads = int(_first(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    num_experts = int(_first(cfg, "n_routed_experts", "num_local_experts", "num_experts"))
    layer_types = list(cfg.get("layer_types") or [])
    sliding = int(cfg.get("sliding_window") or 0)
    n_sliding = sum(1 for t in layer_types if t == "sliding_attention") if sliding else 0
    n_linear = sum(1 for t in layer_types if t in ("linear_attention", "mamba"))
    if sliding and not layer_types and cfg.get("sliding_window_pattern"):
        pattern = int(cfg["sliding_window_pattern"])
        n_sliding = layers - layers // pattern
    if sliding and not layer_types and not cfg.get("sliding_window_pattern") and not cfg.get("use_sliding_window", True):
        sliding = 0
    quant = cfg.get("quantization_config") or {}
    qmethod = str(quant.get("quant_method", "")).lower()
    ckpt = {"fp8": "fp8", "mxfp4": "fp4", "modelopt_fp4": "fp4", "nvfp4": "fp4", "awq": "int4", "gptq": "int4"}.get(qmethod, "bf16")
    return ModelArch(
        name=name or str(cfg.get("_name_or_path") or (archs[0] if archs else "custom")),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(_first(cfg, "intermediate_size", default=4 * hidden)),
        vocab_size=int(_first(cfg, "vocab_size", default=32000)),
        max_context_tokens=int(_first(cfg, "max_position_embeddings", "max_sequence_length", default=4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=num_experts,
        experts_per_token=int(_first(cfg, "num_experts_per_tok", "moe_top_k")) if num_experts else 0,
        moe_intermediate_size=int(_first(cfg, "moe_intermediate_size", default=cfg.get("intermediate_size", 0))) if num_experts else 0,
        num_shared_experts=int(_first(cfg, "n_shared_experts", "num_shared_experts")) if num_experts else 0,
        num_dense_layers=int(_first(cfg, "first_k_dense_replace")) if num_experts else 0,
        kv_lora_rank=int(_first(cfg, "kv_lora_rank")),
        qk_rope_head_dim=int(_first(cfg, "qk_rope_head_dim")),
        qk_nope_head_dim=int(_first(cfg, "qk_nope_head_dim")),
        v_head_dim=int(_first(cfg, "v_head_dim")),
        q_lora_rank=int(_first(cfg, "q_lora_rank")),
        sliding_window=sliding if n_sliding else 0,
        num_sliding_layers=n_sliding,
        num_linear_layers=n_linear,
        checkpoint_precision=ckpt,
    )


def _norm(name: str) -> str:
    return name.strip().lower()


@cache
def _catalog_index() -> dict[str, tuple[str, str]]:
    """Lower-cased id, HF id or alias -> (catalog id, data file)."""
    raw = tomllib.loads(resources.files(__package__).joinpath("data/models.toml").read_text())
    index: dict[str, tuple[str, str]] = {}
    for mid, e in raw.items():
        for key in (mid, e["hf_id"], *e.get("aliases", [])):
            index[_norm(key)] = (mid, str(e["file"]))
            index[_norm(key.split("/")[-1])] = (mid, str(e["file"]))
    return index


@cache
def _load_catalog_model(mid: str, file: str) -> ModelArch:
    text = resources.files(__package__).joinpath(f"data/models/{file}").read_text()
    return from_hf_config(json.loads(text), name=mid)


def model_catalog() -> dict[str, ModelArch]:
    """Every catalog model, by catalog id."""
    seen = {mid: file for mid, file in _catalog_index().values()}
    return {mid: _load_catalog_model(mid, file) for mid, file in sorted(seen.items())}


def resolve_model(name: str, *, field: str = "model") -> ModelArch:
    """Find a catalog model by id, Hugging Face id or alias (case-insensitive)."""
    hit = _catalog_index().get(_norm(name)) or _catalog_index().get(_norm(name.split("/")[-1]))
    if hit is None:
        allowed = ", ".join(sorted(model_catalog()))
        raise InvalidSpec(field, f"unknown model {name!r}; use a catalog id ({allowed}) or give modelConfig: a config.json path")
    return _load_catalog_model(*hit)
