"""Weight bytes against real checkpoints: the planner's bytes for a checkpoint as stored, read from its config.json,
against the exact byte count of the same checkpoint's tensors (`metadata.total_size` of its
model.safetensors.index.json).

Each pair (config.json and index of the same repository; tests/planner/data/model_configs/README.md names both files and
their commits) was read from the public search index; only `total_size` is taken from the index. total_size counts every
stored tensor: norms and biases (which the planner leaves out: under 0.1 % here), vision towers and
multi-token-prediction layers. A multimodal checkpoint is compared whole: vLLM loads its towers beside the language
model unless started with `--language-model-only`, and the planner prices them (planner.model.towers). Where vLLM does not
load a stored tensor set into GPU memory for plain serving, or loads it in another dtype, the case says which rule and
source, and the bytes it takes off are spelt from the config's own numbers, never from the planner. The planner's figure
is `weight_bytes_total(model, model.checkpoint_precision)`: what the memory model charges for one copy of the weights.
docs/models.md holds the table.
"""

from dataclasses import dataclass
from typing import Any

import pytest

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs
from servingtopology.planner.model.catalog import from_hf_config
from servingtopology.planner.perf.memory import (
    kv_pool_bytes,
    language_model_bytes,
    tower_bytes,
    weight_bytes_per_gpu,
    weight_bytes_total,
)
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


def _siglip_tower_bytes(cfg: dict[str, Any]) -> float:
    """Gemma-3 (Gemma3ForConditionalGeneration) stores a SigLIP vision tower and its projector beside the language model;
    vLLM's gemma3_mm.py builds both whenever the model serves images (the default). Spelt here from transformers'
    modeling_siglip.py, independently of planner.model.towers: per layer q, k, v, o (d x d with biases), fc1/fc2 (d x i with
    biases), two LayerNorms; a patch conv (3 x p x p -> d), (image/p)^2 position embeddings, a final LayerNorm; the
    projector (Gemma3MultiModalProjector) is a d x text_hidden matrix and an RMSNorm of d. BF16."""
    v, text = cfg["vision_config"], cfg["text_config"]
    d, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
    embeddings = d * v["num_channels"] * p * p + d + (v["image_size"] // p) ** 2 * d + 2 * d
    projector = d * text["hidden_size"] + d
    return 2 * (v["num_hidden_layers"] * layer + embeddings + projector)


def _without_stored_tied_head(cfg: dict[str, Any], total: int) -> float:
    """This Gemma copy stores `lm_head.weight` beside `model.embed_tokens.weight`, but Gemma ties them in its model code
    (the config has no tie_word_embeddings; transformers GemmaConfig defaults it to true) and vLLM's gemma.py skips a
    stored lm_head.weight when it loads ("not used in vllm as it is tied with embed_token"): vocab x hidden values fewer."""
    assert "tie_word_embeddings" not in cfg and cfg["model_type"] == "gemma"
    return total - 2 * cfg["vocab_size"] * cfg["hidden_size"]


def _qwen_vl_visual_bytes(cfg: dict[str, Any]) -> float:
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
    return 2 * (vit + resampler + 2 * out + out * out)


def _qwen2_vl_visual_bytes(cfg: dict[str, Any]) -> float:
    """Qwen2-VL (vLLM qwen2_vl.py Qwen2VisionTransformer): a bias-free Conv3d patch embedding (in_chans x temporal x
    patch^2 -> embed_dim), rotary positions (no table), `depth` blocks of (norm1, norm2 LayerNorms, qkv 3e x e and proj
    e x e with biases, fc1 e x (e * mlp_ratio) and fc2 back with biases), then Qwen2VisionPatchMerger: ln_q over e,
    (e * s^2)^2 and (e * s^2) x hidden_size, both with biases. BF16."""
    v = cfg["vision_config"]
    e, s2, out = v["embed_dim"], v["spatial_merge_size"] ** 2, v["hidden_size"]
    m = int(e * v["mlp_ratio"])
    block = 4 * e + 3 * e * e + 3 * e + e * e + e + e * m + m + m * e + e
    patch = v["in_chans"] * v["temporal_patch_size"] * v["patch_size"] ** 2 * e
    merger = 2 * e + (e * s2) ** 2 + e * s2 + e * s2 * out + out
    return 2 * (patch + v["depth"] * block + merger)


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
    Checkpoint("ckpt-medgemma-27b-it", 54_864_813_280,
               what="Gemma-3 27B with its SigLIP tower and projector (planner.model.towers); sliding-window layers, tied"),
    Checkpoint("ckpt-minimax-m1", 912_210_767_872, what="MiniMax-M1: lightning (linear) attention + 1 softmax layer in 8, 32 experts"),
    Checkpoint("ckpt-phi-tiny-moe", 7_510_440_576, what="PhiMoE: 16 experts, attention and LM-head biases"),
    Checkpoint("ckpt-cogito-qwen2.5-14b", 29_531_895_808, what="Qwen2.5-14B fine-tune: q/k/v biases, GQA 8, untied"),
    Checkpoint("ckpt-gemma-2b", 6_060_920_832, _without_stored_tied_head,
               what="Gemma-2B: MQA, head_dim 256 != hidden/heads, gated GELU, tied by model_type (FP16)"),
    Checkpoint("ckpt-reflection-llama-3.1-70b", 282_214_825_984, _fp32_served_in_16_bits,
               what="Llama-3.1-70B fine-tune stored in FP32, GQA 8"),
    Checkpoint("ckpt-qwen3.5-2b-dense", 3_763_650_176,
               what="Qwen3.5 dense: Gated DeltaNet + gated attention, tied; the config's MTP layer is not stored"),
    Checkpoint("ckpt-qwen-vl-chat-int4", 9_731_786_240,
               what="Qwen-VL GPTQ int4 group 128 (qzeros and g_idx stored), FP16 LM head, embeddings and visual tower"),
    Checkpoint("ckpt-olmocr-qwen2-vl-7b", 16_582_751_232,
               what="Qwen2-VL-7B checkpoint whose vision_config writes only non-default fields (Qwen2VLVisionConfig "
                    "defaults: a 675.8 M-weight ViT, embed_dim 1280, mlp_ratio 4, and a 2x2 merger), BF16"),
    Checkpoint("ckpt-olmocr-qwen2-vl-7b-full-vision", 16_582_751_232,
               what="the same repository's other config.json version, the vision block written out in full"),
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


# (fixture, the tower's bytes spelt from the model's own code above, the language model's share of total_size before)
TOWERS = [
    ("ckpt-medgemma-27b-it", _siglip_tower_bytes),
    ("ckpt-qwen-vl-chat-int4", _qwen_vl_visual_bytes),
    ("ckpt-olmocr-qwen2-vl-7b-full-vision", _qwen2_vl_visual_bytes),
]


@pytest.mark.parametrize(("name", "spelt"), TOWERS, ids=[t[0] for t in TOWERS])
def test_towers_are_priced_from_the_config_fields(name, spelt) -> None:
    """The generic tower reader lands on each family's own shapes (vLLM gemma3_mm.py / siglip.py, qwen_vl.py, qwen2_vl.py):
    within 0.1 % (Qwen-VL's table of 256 positions is read as (448/14)^2 = 1024 from image_size: 1.3 M weights of 1,937 M).
    Old main priced none: MedGemma -0.85 GB (-1.5 %), Qwen-VL-Chat-Int4 -3.87 GB (-39.8 %), Qwen2-VL -1.35 GB (-8.2 %)."""
    m = load(name)
    assert tower_bytes(m) == pytest.approx(spelt(raw(name)), rel=0.001)
    assert any("loaded beside the language model" in a for a in m.assumptions)


def test_language_model_figures_stay_apart_from_the_towers() -> None:
    """The towers add weights, not per-token work: the same config without its vision block has the same language model
    (parameters, active parameters per token, KV bytes) and only the tower's bytes fewer. Per GPU the tower is split by TP
    (vLLM's default --mm-encoder-tp-mode weights) and charged on every PP stage (each stage builds the tower)."""
    cfg = raw("ckpt-olmocr-qwen2-vl-7b-full-vision")
    with_tower = from_hf_config(cfg)
    text_only = from_hf_config({k: v for k, v in cfg.items() if k != "vision_config"})
    assert text_only.tower_params == 0 and with_tower.tower_params > 0
    assert (with_tower.total_params, with_tower.active_params_per_token) == (text_only.total_params, text_only.active_params_per_token)
    assert with_tower.total_params_with_towers == with_tower.total_params + with_tower.tower_params
    bf16 = Precision.BF16
    assert language_model_bytes(with_tower, bf16) == weight_bytes_total(text_only, bf16)
    assert weight_bytes_total(with_tower, bf16) == weight_bytes_total(text_only, bf16) + 2 * with_tower.tower_params
    for tp, pp in ((1, 1), (2, 1), (2, 2), (4, 2)):
        extra = weight_bytes_per_gpu(with_tower, bf16, tp=tp, pp=pp) - weight_bytes_per_gpu(text_only, bf16, tp=tp, pp=pp)
        assert extra == pytest.approx(2 * with_tower.tower_params / tp)
    # The KV pool of a vLLM rank shrinks by the same bytes (H200, TP 2).
    h200, knobs = resolve_gpu("h200_sxm"), EngineKnobs()
    pools = [kv_pool_bytes(m, h200, engine=Engine.VLLM, precision=bf16, tp=2, pp=1, dp=1,
                           max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs,
                           memory_fraction=knobs.memory_fraction) for m in (text_only, with_tower)]
    assert pools[0] - pools[1] == pytest.approx(with_tower.tower_params)


def test_a_tower_that_cannot_be_read_is_named() -> None:
    """A vision block without a layer count or width is not priced silently: a warning names it."""
    cfg = {**raw("ckpt-olmocr-qwen2-vl-7b-full-vision"), "vision_config": {"patch_size": 14}}
    m = from_hf_config(cfg)
    assert m.tower_params == 0
    assert any("vision_config" in w and "not priced" in w for w in m.warnings)


def test_a_llava_style_tower_is_built_up_to_its_feature_layer() -> None:
    """LLaVA-1.5's shape (a CLIP ViT-L/14-336 tower of 24 layers, 1024 wide, MLP 4096; features from layer -2; a
    two-layer GELU projector 1024 -> 4096 -> 4096): vLLM llava.py `_get_num_hidden_layers` builds 24 - 2 + 1 = 23 layers
    (clip.py: q, k, v, o and fc1/fc2 with biases, two LayerNorms each), the patch conv and (336/14)^2 positions, and
    LlavaMultiModalProjector's linear_1 and linear_2 with biases."""
    text = raw("ckpt-olmocr-qwen2-vl-7b-full-vision")
    cfg = {k: v for k, v in text.items() if k != "vision_config"} | {
        "hidden_size": 4096, "projector_hidden_act": "gelu", "vision_feature_layer": -2,
        "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "image_size": 336,
                          "patch_size": 14, "hidden_act": "quick_gelu", "model_type": "clip_vision_model"}}
    d, i = 1024, 4096
    layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
    stem = 3 * 14 * 14 * d + d + (336 // 14) ** 2 * d + 2 * d
    projector = d * 4096 + 4096 * 4096 + 2 * 4096
    m = from_hf_config(cfg)
    assert m.tower_params == 23 * layer + stem + projector
    assert any("vision_feature_layer -2: 23 of its 24 layers" in a for a in m.assumptions)


def test_an_audio_tower_is_priced_like_a_vision_tower() -> None:
    """An `audio_config` block (Qwen2-Audio's Whisper-style encoder: d_model 1280, 32 encoder_layers, encoder_ffn_dim 5120,
    128 mel bins, 1500 source positions; vLLM qwen2_audio.py builds WhisperEncoder and a d_model x text linear projector)
    is read with the same rules: two 3-tap convolutions over the mel bins, a position table, the layers, one projection.
    No checkpoint of it was at hand: the shapes are spelt from whisper.py, not checked against a stored total."""
    cfg = raw("ckpt-olmocr-qwen2-vl-7b-full-vision")
    cfg = {k: v for k, v in cfg.items() if k != "vision_config"} | {
        "audio_config": {"d_model": 1280, "encoder_layers": 32, "encoder_ffn_dim": 5120, "num_mel_bins": 128,
                         "max_source_positions": 1500, "activation_function": "gelu", "model_type": "qwen2_audio_encoder"}}
    d, i = 1280, 5120
    layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
    stem = 3 * 128 * d + 3 * d * d + 2 * d + 1500 * d + 2 * d
    m = from_hf_config(cfg)
    assert m.tower_params == 32 * layer + stem + d * 3584
    assert 0.63e9 < m.tower_params < 0.65e9  # Whisper-large's encoder, about 0.64 B


def test_a_near_empty_vision_block_takes_its_config_class_defaults() -> None:
    """The olmOCR repository's config.json at the index's own commit writes `vision_config` as {in_chans, model_type
    qwen2_vl, spatial_patch_size}: transformers saved only the fields that differ from Qwen2VLVisionConfig's defaults.
    vLLM loads it through that class, so the tower is the defaults' one, the same as the other config version's full
    block; the assumption names the fields taken."""
    sparse, full = load("ckpt-olmocr-qwen2-vl-7b"), load("ckpt-olmocr-qwen2-vl-7b-full-vision")
    assert sparse.tower_params == full.tower_params == pytest.approx(_qwen2_vl_visual_bytes(raw("ckpt-olmocr-qwen2-vl-7b-full-vision")) / 2, rel=1e-3)
    assert any("depth, embed_dim" in a and "defaults taken" in a for a in sparse.assumptions)
    assert sparse.warnings == ()
