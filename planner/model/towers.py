"""The other towers of a multimodal checkpoint (vision, audio) priced from the config's own fields.

vLLM builds a multimodal model's encoder towers and projectors beside the language model whenever it serves the
model with its multimodal inputs enabled, which is the default (only `--language-model-only`, which the operator renders
only when the user puts it in `engine.extraArgs`, leaves them out: vLLM config/multimodal.py `language_model_only`; see
`language_only_flag`). Their weights therefore sit on the GPU
beside the language model's. Called by planner.model.hf_config; pure: reads a parsed config dict, no architecture names.

A tower is read as a ViT-style transformer encoder from the block that describes it (`vision_config`, `audio_config`,
or Qwen-VL v1's outer `visual`): layers (`depth`, `num_hidden_layers`, `layers`, `encoder_layers`), width (`embed_dim`,
`width`, `hidden_size`, `d_model`; where `embed_dim` is given, `hidden_size` is the merger's output, as Qwen2-VL's
config writes it), MLP width (`intermediate_size`, `encoder_ffn_dim`, or `mlp_ratio` × width). Each layer: q, k, v, o
(4·w² with biases), the MLP (two matrices, three when the activation is SiLU: Qwen2.5-VL's and Pixtral's gated vision
MLPs) with biases, two LayerNorms. Then the patch embedding (channels × temporal patch × patch² × width), learned
positions (`num_position_embeddings`, else (image_size / patch_size)²; rotary towers without `image_size` have none), a
final norm, and the projector into the language model's width:
- `spatial_merge_size` s (Qwen2-VL / Qwen2.5-VL / Qwen3-VL merger, vLLM qwen2_vl.py Qwen2VisionPatchMerger): LayerNorm,
  (w·s²)² and (w·s²) × out with biases, out = `out_hidden_size` (or `hidden_size` beside `embed_dim`); Qwen3-VL repeats it
  for each `deepstack_visual_indexes` entry (vLLM qwen3_vl.py `deepstack_merger_list`); Kimi-K2.5's `merge_kernel_size`
  patch merger (vLLM kimi_k25.py KimiK25MultiModalProjector: pre-norm, linear_1, linear_2 into the text width) alike;
- `mm_tokens_per_image` (Gemma-3, vLLM gemma3_mm.py Gemma3MultiModalProjector): a w × text-width matrix and an RMSNorm;
- `output_dim` (Qwen-VL v1, vLLM qwen_vl.py VisionTransformer + Resampler2): a cross-attention resampler of `n_queries`
  (256 in its code) learned queries into `output_dim`, then ln_post and an output_dim² projection;
- `pixel_shuffle_ratio` with `projector_input_dim`/`projector_output_dim` (Llama-4, vLLM mllama4.py
  Llama4VisionPixelShuffleMLP and Llama4MultiModalProjector): (w / ratio²) × in, in × out, then `vision_output_dim` ×
  text width, biases only where `multi_modal_projector_bias` says;
- otherwise a LLaVA-style MLP (vLLM llava.py LlavaMultiModalProjector: w × text and text × text with biases) when the
  config names `projector_hidden_act`, else one w × text matrix; the assumption says which.
An encoder whose features are taken from an inner layer (`vision_feature_layer`, LLaVA-style) is built only up to it.
Norm and bias shapes differ by a few thousand values between families (RMSNorm against LayerNorm, a bias-free patch
conv): under 0.01 % of any tower here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LANGUAGE_ONLY_FLAGS", "TOWER_BLOCKS", "Towers", "language_only_flag", "read_towers"]

# Blocks that describe a tower, and where they sit: the outer config (Qwen-VL v1's `visual`) or any config level.
TOWER_BLOCKS = ("vision_config", "audio_config", "visual")
_TOWER_NAMES = ("visual", "vision", "tower", "audio", "mm_projector", "multi_modal_projector", "merger")


# What a tower's own config class fixes when config.json leaves a field out, by the block's `model_type` (as
# hf_config's _IMPLIED does for the language model): transformers writes only the values that differ from these
# defaults, so a checkpoint saved that way carries a near-empty block. Used only for absent fields, named in the
# assumptions; any other model_type is read from its fields alone.
_TOWER_IMPLIED: dict[str, dict[str, Any]] = {
    # transformers configuration_qwen2_vl.py Qwen2VLVisionConfig defaults (the Qwen2-VL-7B tower).
    "qwen2_vl": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu", "mlp_ratio": 4,
                 "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


@dataclass(frozen=True, slots=True)
class Towers:
    params: int            # weights of every tower and projector
    bytes_per_param: float  # as stored and served (16-bit: see read_towers)


def _num(block: Mapping[str, Any], *keys: str) -> int:
    for k in keys:
        v = block.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v)
    return 0


def _encoder(name: str, b: Mapping[str, Any], text_hidden: int, warn: Callable[[str], None], assume: list[str]) -> int:
    """Parameters of one encoder tower and its projector; 0 (with a warning) when its size cannot be read."""
    width = _num(b, "embed_dim", "width", "vt_hidden_size", "hidden_size", "d_model")
    layers = _num(b, "depth", "num_hidden_layers", "layers", "vt_num_hidden_layers", "encoder_layers", "num_layers")
    if width <= 0 or layers <= 0:
        warn(f"{name} has no readable layer count (depth/num_hidden_layers/layers/encoder_layers) and width "
             "(embed_dim/width/hidden_size/d_model): its tower is not priced, so the weights are under-counted")
        return 0
    feature = b.get("vision_feature_layer")
    picks = [feature] if isinstance(feature, int) and not isinstance(feature, bool) else feature if isinstance(feature, list) else []
    used = [layers + f + 1 if f < 0 else f for f in picks if isinstance(f, int) and not isinstance(f, bool)]
    if used and 0 < max(used) < layers:
        # vLLM llava.py (and the LLaVA-like models: `_get_num_hidden_layers`) builds the encoder only up to the deepest
        # layer whose features it uses; the checkpoint's later layers are not loaded.
        assume.append(f"{name}: vision_feature_layer {feature}: {max(used)} of its {layers} layers are built (vLLM llava.py)")
        layers = max(used)
    inter = _num(b, "intermediate_size", "vt_intermediate_size", "encoder_ffn_dim")
    ratio = b.get("mlp_ratio")
    if not inter and isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio > 0:
        inter = int(width * float(ratio))
    if not inter:
        inter = 4 * width
        assume.append(f"{name}: no intermediate_size or mlp_ratio; an MLP of 4 x {width} assumed")
    act = str(b.get("hidden_act") or b.get("activation_function") or "gelu").lower()
    matrices = 3 if act in ("silu", "swiglu", "swish") else 2
    attention = 4 * width * width + 4 * width          # q, k, v, o with biases
    mlp = matrices * width * inter + (matrices - 1) * inter + width
    per_layer = attention + mlp + 4 * width             # two LayerNorms
    patch = _num(b, "patch_size", "spatial_patch_size")
    channels = _num(b, "num_channels", "in_chans", "in_channels") or 3
    temporal = _num(b, "temporal_patch_size") or 1
    stem = channels * temporal * patch * patch * width + width if patch else 0
    mels = _num(b, "num_mel_bins")
    if mels:  # Whisper-style audio stem: two 3-tap convolutions (mel -> d, d -> d)
        stem += 3 * mels * width + 3 * width * width + 2 * width
    positions = _num(b, "num_position_embeddings", "max_source_positions")
    image = _num(b, "image_size")
    if not positions and image and patch:
        positions = (image // patch) ** 2
    body = layers * per_layer + stem + positions * width + 2 * width
    proj, how = _projector(b, width, text_hidden, assume, name)
    assume.append(f"{name}: a {layers}-layer encoder of width {width} (MLP {inter}, {'gated' if matrices == 3 else 'two-matrix'}) "
                  f"and {how}: {(body + proj) / 1e6:.0f} M weights loaded beside the language model")
    return body + proj


def _projector(b: Mapping[str, Any], width: int, text_hidden: int, assume: list[str], name: str) -> tuple[int, str]:
    merge = _num(b, "spatial_merge_size")
    kernel = b.get("merge_kernel_size")
    cells = merge * merge
    if not cells and isinstance(kernel, list) and len(kernel) == 2 and all(isinstance(k, int) for k in kernel):
        cells = int(kernel[0]) * int(kernel[1])
    if not cells and "patchmerger" in str(b.get("mm_projector_type") or "").lower():
        cells = 4
        assume.append(f"{name}: mm_projector_type {b.get('mm_projector_type')!r} without merge_kernel_size; a 2x2 merge assumed "
                      "(vLLM kimi_k25.py KimiK25MultiModalProjector's default)")
    if cells:
        out = (_num(b, "out_hidden_size", "text_hidden_size") or (_num(b, "hidden_size") if b.get("embed_dim") else 0)
               or text_hidden)
        wide = width * cells
        merger = 2 * width + wide * wide + wide + wide * out + out
        deep = b.get("deepstack_visual_indexes")
        extra = len(deep) if isinstance(deep, list) else 0
        return (1 + extra) * merger, f"a {cells}-patch merger into {out}" + (f" (+{extra} deepstack mergers)" if extra else "")
    if b.get("mm_tokens_per_image") is not None or b.get("_mm_tokens_per_image") is not None:
        return width * text_hidden + width, f"a {width} x {text_hidden} soft-token projection"
    out_dim = _num(b, "output_dim")
    if out_dim:
        queries = _num(b, "n_queries") or 256
        if not _num(b, "n_queries"):
            assume.append(f"{name}: no n_queries; the resampler's 256 learned queries (Qwen-VL's visual.py default) assumed")
        resampler = 2 * queries * out_dim + width * out_dim + 4 * out_dim * out_dim + 8 * out_dim
        return resampler + 2 * out_dim + out_dim * out_dim, f"a {queries}-query resampler into {out_dim}"
    shuffle = b.get("pixel_shuffle_ratio")
    p_in, p_out = _num(b, "projector_input_dim"), _num(b, "projector_output_dim")
    if isinstance(shuffle, int | float) and not isinstance(shuffle, bool) and shuffle > 0 and p_in and p_out:
        bias = bool(b.get("multi_modal_projector_bias"))
        shuffled = int(width / (float(shuffle) ** 2))
        vis_out = _num(b, "vision_output_dim") or p_out
        adapter = shuffled * p_in + p_in * p_out + (p_in + p_out if bias else 0)
        return adapter + vis_out * text_hidden + (text_hidden if bias else 0), f"a pixel-shuffle adapter and a {vis_out} x {text_hidden} projector"
    src = _num(b, "mm_hidden_size") or width
    target = _num(b, "text_hidden_size") or text_hidden
    if b.get("projector_hidden_act") is not None:
        return src * target + target * target + 2 * target, f"a two-layer MLP projector {src} -> {target} -> {target}"
    assume.append(f"{name}: no projector fields (spatial_merge_size, mm_tokens_per_image, output_dim, projector_hidden_act); "
                  f"one {src} x {target} projection assumed")
    return src * target, f"a {src} x {target} projection"


def read_towers(cfg: Mapping[str, Any], text_hidden: int, warn: Callable[[str], None], assume: list[str]) -> Towers | None:
    """The towers the config describes beside its language model, or None when it describes none.

    Stored and served in 16 bits: a tower is kept in the checkpoint's dtype when the language model is quantised
    (Qwen-VL-Chat-Int4's GPTQ index holds qweight only under transformer.h.*; compressed-tensors and ModelOpt
    checkpoints list the tower in `ignore` / `modules_to_not_convert`), and vLLM serves an FP32 tower in the model's
    16-bit dtype as it does the rest."""
    total = 0
    for key in TOWER_BLOCKS:
        block = cfg.get(key)
        if not isinstance(block, Mapping):
            continue
        b = dict(block)
        implied = {k: v for k, v in _TOWER_IMPLIED.get(str(b.get("model_type") or ""), {}).items() if b.get(k) is None}
        if implied:
            b.update(implied)
            assume.append(f"{key}: {', '.join(sorted(implied))} absent: {b['model_type']}'s vision config class defaults taken")
        # Model-level projector fields live beside the blocks (Gemma-3 `mm_tokens_per_image`, LLaVA `projector_hidden_act`).
        for k in ("mm_tokens_per_image", "projector_hidden_act", "mm_hidden_size", "vision_feature_layer"):
            if k not in b and cfg.get(k) is not None:
                b[k] = cfg[k]
        total += _encoder(key, b, text_hidden, warn, assume)
    if total == 0:
        return None
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        skip = [*(quant.get("ignore") or []), *(quant.get("modules_to_not_convert") or []), *(quant.get("exclude_modules") or [])]
        if skip and not any(n in str(s).lower() for s in skip for n in _TOWER_NAMES):
            warn("quantization_config skips modules but names no tower (visual, vision, audio, projector): the towers were "
                 "priced in 16 bits; a quantised tower would take fewer bytes")
    return Towers(params=total, bytes_per_param=2.0)


# The engine flags that start a multimodal model without its towers, per engine: vLLM `--language-model-only` (config/
# multimodal.py: every modality limited to 0 and the encoder not built, vllm-project/vllm PR #22299; in the 0.32/0.33
# parsers, not in 0.11's). SGLang's `--language-model-only` / `--language-only` are not honoured: the sources we found do
# not settle what the covered release skips (sgl-project/sglang PR #34479, still open, says the tower was "built-and-
# left-empty" before it), so the towers stay counted (a plan that counts too much memory never overfills the GPU).
LANGUAGE_ONLY_FLAGS: dict[str, tuple[str, ...]] = {"vllm": ("--language-model-only",)}


def language_only_flag(engine: str, extra_args: tuple[str, ...], has_flag: Callable[[str], bool]) -> str | None:
    """`LanguageModelOnly`: the flag among the user's extra engine arguments that makes the engine skip the towers, when
    the engine release's parser has it (`has_flag`) and no later `--no-` form undoes it; else None. The last one wins,
    as on the engines' command lines."""
    on: str | None = None
    flags = LANGUAGE_ONLY_FLAGS.get(engine, ())
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if name in flags and has_flag(name):
            on = name
        elif name.startswith("--no-") and "--" + name[5:] in flags:
            on = None
    return on
