"""Weight bytes against real checkpoints: the planner's bytes for a checkpoint as stored, read from its config.json, against
the exact byte count of the same checkpoint's tensors (`metadata.total_size` of its model.safetensors.index.json).

Each pair (config.json and index of the same repository; tests/planner/data/model_configs/README.md names both files and
their commits) was read from the public search index; only `total_size` is taken from the index. total_size counts every
stored tensor: norms and biases (which the planner leaves out: under 0.1 % here), vision towers and multi-token-prediction
layers. Where vLLM does not load a stored tensor set into GPU memory for plain serving, or loads it in another dtype, the
case says which rule and source, and the bytes it takes off are spelt from the config's own numbers, never from the
planner. The planner's figure is `weight_bytes_total(model, model.checkpoint_precision)`: what the memory model charges
for one copy of the weights. docs/models.md holds the table.
"""

from dataclasses import dataclass
from typing import Any

import pytest

from servingtopology.planner.memory import weight_bytes_total
from tests.planner.model_configs import load, raw

TOL = 0.005  # ±0.5 %: every case below lands within 0.05 % once the rule it states is applied


def _fp32_served_in_16_bits(cfg: dict[str, Any], total: int) -> float:
    """vLLM `--dtype auto` serves a float32 checkpoint in a 16-bit dtype (vllm/config ModelConfig dtype resolution:
    float32 configs are downcast, "following the common practice"), so each stored 4-byte value takes 2 on the GPU."""
    assert cfg["torch_dtype"] == "float32"
    return total * 2 / 4


def _without_mimo_mtp_layer(cfg: dict[str, Any], total: int) -> float:
    """MiMo's checkpoint stores its MTP block as `model.mtp_layers.0.*` (the index lists q/k/v with biases, o, a gated MLP,
    `input_proj` from [embedding; hidden] (2h) to h and five norms); vLLM's mimo.py skips `mtp_layers` when it loads the
    model and builds them only for MTP speculative decoding (mimo_mtp.py). Its bytes, from the config's numbers (BF16):"""
    h, inter, kv, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"], cfg["head_dim"]
    q_o = 2 * h * h + h                      # q (with bias) and o
    k_v = 2 * (h * kv * hd + kv * hd)        # k and v with biases
    mlp = 3 * h * inter
    mtp = cfg["num_nextn_predict_layers"] * (q_o + k_v + mlp + 2 * h * h + 5 * h)
    return total - 2 * mtp


def _without_siglip_tower(cfg: dict[str, Any], total: int) -> float:
    """Gemma-3 (Gemma3ForConditionalGeneration) stores a SigLIP vision tower and its projector beside the language model.
    The planner prices the language model only (hf_config: "other towers are not counted"); vLLM's gemma3_mm.py builds
    the tower when the model serves images, so a multimodal deployment holds these bytes too (left open: see docs/models.md).
    SigLIP shapes (transformers modeling_siglip.py): per layer q, k, v, o (d x d with biases), fc1/fc2 (d x i with biases),
    two LayerNorms; a patch conv (3 x p x p -> d), (image/p)^2 position embeddings, a final LayerNorm; the projector
    (Gemma3MultiModalProjector) is a d x text_hidden matrix and an RMSNorm of d."""
    v, text = cfg["vision_config"], cfg["text_config"]
    d, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
    embeddings = d * v["num_channels"] * p * p + d + (v["image_size"] // p) ** 2 * d + 2 * d
    projector = d * text["hidden_size"] + d
    return total - 2 * (v["num_hidden_layers"] * layer + embeddings + projector)


def _without_stored_tied_head(cfg: dict[str, Any], total: int) -> float:
    """This Gemma copy stores `lm_head.weight` beside `model.embed_tokens.weight`, but Gemma ties them in its model code
    (the config has no tie_word_embeddings; transformers GemmaConfig defaults it to true) and vLLM's gemma.py skips a
    stored lm_head.weight when it loads ("not used in vllm as it is tied with embed_token"): vocab x hidden values fewer."""
    assert "tie_word_embeddings" not in cfg and cfg["model_type"] == "gemma"
    return total - 2 * cfg["vocab_size"] * cfg["hidden_size"]


def _without_qwen_vl_visual(cfg: dict[str, Any], total: int) -> float:
    """Qwen-VL stores its vision transformer (`transformer.visual.*`, FP16, left unquantised by the GPTQ pass: the index
    lists qweight/scales only under transformer.h.*) beside the language model; vLLM's qwen_vl.py builds it for image
    input. Shapes from the same repository's visual.py (VisionTransformer, VisualAttentionBlock, Resampler) and the
    config's `visual` block: a bias-free patch conv, 256 x width position embeddings, ln_pre, `layers` blocks of
    (two LayerNorms, in_proj 3w x w, out_proj w x w, c_fc w x int(w * mlp_ratio), c_proj back, all with biases), then the
    resampler (256 x out sin-cos pos_embed and 256 x out queries, kv_proj w -> out without bias, a MultiheadAttention of
    out with in/out projections and biases, ln_q, ln_kv), ln_post and an out x out projection."""
    v = cfg["visual"]
    w, out, p = v["width"], v["output_dim"], v["patch_size"]
    m = int(w * v["mlp_ratio"])
    block = 4 * w + 3 * w * w + 3 * w + w * w + w + w * m + m + m * w + w
    vit = w * 3 * p * p + 256 * w + 2 * w + v["layers"] * block
    resampler = 2 * 256 * out + w * out + 4 * out * out + 4 * out + 4 * out
    return total - 2 * (vit + resampler + 2 * out + out * out)


@dataclass(frozen=True)
class Checkpoint:
    fixture: str
    total_size: int          # model.safetensors.index.json metadata.total_size, bytes
    rule: Any = None         # (config, total_size) -> bytes vLLM holds on the GPU to serve it; None: all of total_size
    what: str = ""


CHECKPOINTS = [
    Checkpoint("ckpt-wizardlm-2-8x22b", 281_241_268_224, what="Mixtral MoE, 8 experts, untied, BF16"),
    Checkpoint("ckpt-qwen-72b", 144_575_840_256, what="Qwen (v1) remote code, intermediate_size counts both gated halves"),
    Checkpoint("ckpt-bloom-176b", 352_494_542_848, what="BLOOM: `n_embed`, two-matrix GELU MLP, tied, biases"),
    Checkpoint("ckpt-phi3-3b-slerp", 7_642_159_104, what="Phi-3-mini shape (fused qkv/gate_up tensors), untied"),
    Checkpoint("ckpt-granite-3b-code-instruct-128k", 6_965_007_360, what="Llama with attention and MLP biases, tied"),
    Checkpoint("ckpt-qwen3.5-18b-reap-a3b", 37_087_995_136,
               what="Qwen3.5 MoE: Gated DeltaNet + gated attention, 128 experts, FP16; the config's MTP layer is not stored"),
    Checkpoint("ckpt-granite-3.1-1b-a400m-instruct", 5_338_513_408, _fp32_served_in_16_bits,
               what="GraniteMoE stored in FP32, tied"),
    Checkpoint("ckpt-mimo-7b", 15_666_819_072, _without_mimo_mtp_layer, what="MiMo: Qwen2 shape plus a stored MTP layer"),
    Checkpoint("ckpt-medgemma-27b-it", 54_864_813_280, _without_siglip_tower,
               what="Gemma-3 27B with its SigLIP tower; sliding-window layers, tied"),
    Checkpoint("ckpt-minimax-m1", 912_210_767_872, what="MiniMax-M1: lightning (linear) attention + 1 softmax layer in 8, 32 experts"),
    Checkpoint("ckpt-phi-tiny-moe", 7_510_440_576, what="PhiMoE: 16 experts, attention and LM-head biases"),
    Checkpoint("ckpt-cogito-qwen2.5-14b", 29_531_895_808, what="Qwen2.5-14B fine-tune: q/k/v biases, GQA 8, untied"),
    Checkpoint("ckpt-gemma-2b", 6_060_920_832, _without_stored_tied_head,
               what="Gemma-2B: MQA, head_dim 256 != hidden/heads, gated GELU, tied by model_type (FP16)"),
    Checkpoint("ckpt-reflection-llama-3.1-70b", 282_214_825_984, _fp32_served_in_16_bits,
               what="Llama-3.1-70B fine-tune stored in FP32, GQA 8"),
    Checkpoint("ckpt-qwen3.5-2b-dense", 3_763_650_176,
               what="Qwen3.5 dense: Gated DeltaNet + gated attention, tied; the config's MTP layer is not stored"),
    Checkpoint("ckpt-qwen-vl-chat-int4", 9_731_786_240, _without_qwen_vl_visual,
               what="Qwen-VL GPTQ int4 group 128 (qzeros and g_idx stored), FP16 LM head and embeddings"),
]


def served_bytes(c: Checkpoint) -> float:
    return float(c.total_size) if c.rule is None else float(c.rule(raw(c.fixture), c.total_size))


@pytest.mark.parametrize("c", CHECKPOINTS, ids=[c.fixture for c in CHECKPOINTS])
def test_weight_bytes_match_the_checkpoint(c: Checkpoint) -> None:
    m = load(c.fixture)
    predicted = weight_bytes_total(m, m.checkpoint_precision)
    assert predicted == pytest.approx(served_bytes(c), rel=TOL), f"{c.fixture}: {predicted / 1e9:.3f} GB predicted"


def test_qwen_v1_mlp_projections_are_half_of_intermediate_size() -> None:
    """Qwen-72B's config says intermediate_size 49152; its w1, w2 and c_proj are 24576 wide (vLLM qwen.py:
    QWenMLP(hidden_size, intermediate_size // 2)). Read at face value the planner charged 241.2 GB against the
    checkpoint's 144.6 GB (+66.8 %)."""
    m = load("ckpt-qwen-72b")
    assert m.intermediate_size == 24576
    assert any("mlp_width_divisor" in a for a in m.assumptions)
    assert not any("attn_dropout_prob" in w for w in m.warnings)


def test_bloom_hidden_size_is_read_from_n_embed() -> None:
    """BLOOM's config names the width `n_embed` (transformers BloomConfig takes it as hidden_size); the reader refused
    the config ("lacks a usable num_hidden_layers and hidden_size")."""
    m = load("ckpt-bloom-176b")
    assert (m.hidden_size, m.num_layers, m.ffn_matrices, m.tie_embeddings) == (14336, 70, 2, True)
    assert m.intermediate_size == 4 * 14336
