"""Models the project had never seen, read from their public config.json as a new user would give them.

The configs (tests/planner/data/model_configs/README.md names the source of each) were collected after the reader was
written. Expected values are spelt out here from the configs' own numbers with the engines' formulas (vLLM v1
kv_cache_interface: FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec; vLLM
MambaStateShapeCalculator.mamba2_state_shape) or taken from the published totals on the model cards; never read back
from the planner. docs/models.md holds the table of what was checked.
"""


import pytest

from servingtopology.planner.arch import ModuleGroup, StateKind
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Parallelism
from servingtopology.planner.model.catalog import from_hf_config
from servingtopology.planner.perf.memory import (
    fixed_bytes_per_seq,
    kv_bytes_per_token,
    kv_pool_bytes,
    kv_pool_tokens,
    state_bytes_per_seq,
    weight_bytes_total,
)
from tests.planner.model_configs import BF16, FP8, full_attention_bytes, load, raw

# (config, published total in billions, published active in billions or None, relative tolerance on the total)
# The totals are of the language model and its towers as published (`total_params_with_towers`); active counts are the
# language model's alone (a tower runs once an image, not once a token).
PUBLISHED = [
    ("llama-4-scout", 109.0, 17.0, 0.005),         # Meta card: 17B active, 109B total, vision encoder included (108.64B here;
                                                   # the language model alone, 107.77B, is 1.1 % short)
    ("llama-4-maverick", 400.0, 17.0, 0.02),       # Meta card: 17B active, 400B total (a rounded label: 401.6B here)
    ("gemma-3-27b", 27.433, None, 0.005),          # Gemma 3 technical report, Table 1: 417M vision encoder + 1,416M
                                                   # embedding + 25,600M non-embedding (the language model alone is 1.5 % short)
    ("gemma-2-9b", 9.24, None, 0.01),              # google/gemma-2-9b safetensors total 9.24B
    ("mixtral-8x22b", 141.0, 39.0, 0.01),          # Mistral: 141B total, 39B active
    ("qwen3-coder-480b-a35b", 480.0, 35.0, 0.01),  # Qwen3-Coder-480B-A35B
    ("qwen3-vl-235b-a22b", 235.0, 22.0, 0.02),     # Qwen3-VL-235B-A22B (a rounded label; this trimmed config names no
                                                   # deepstack mergers: 235.55B with its 0.45B tower)
    ("deepseek-v2-lite", 15.7, 2.4, 0.01),         # DeepSeek-V2-Lite card: 15.7B total, 2.4B activated
    ("glm-4.7", 355.0, 32.0, 0.02),                # GLM-4.5/4.7: 355B total, 32B active
    ("glm-4.7-flash", 30.0, None, 0.02),           # GLM-4.7-Flash "30B-A3B" (the A3B label rounds 3.6B of weights a token)
    ("qwen2-0.5b", 0.49, None, 0.02),              # Qwen2 card: 0.49B
    ("falcon-h1-0.5b", 0.52, None, 0.02),          # tiiuae/Falcon-H1-0.5B: 0.52B in its safetensors
    ("dbrx-instruct-mlx-4bit", 132.0, 36.0, 0.01), # Databricks: DBRX 132B total, 36B active
    ("deepseek-v4-flash", 284.0, 13.0, 0.01),      # DeepSeek-V4-Flash: 284B total, 13B activated
    ("exaone-4.0-32b-fp8", 32.0, None, 0.01),      # EXAONE 4.0 32B (card: 30.95B without embeddings)
    ("phi-3-mini-4k", 3.8, None, 0.01),            # Phi-3-mini: 3.8B
]


@pytest.mark.parametrize(("name", "total_b", "active_b", "tol"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_unseen_models_match_their_published_totals(name, total_b, active_b, tol):
    m = load(name)
    assert m.total_params_with_towers / 1e9 == pytest.approx(total_b, rel=tol)
    if active_b is not None:
        # Cards count activated weights with or without the input embedding (Llama-4: 1.0B of it); ±1.05B here.
        assert m.active_params_per_token / 1e9 == pytest.approx(active_b, abs=max(active_b * 0.03, 1.05 if active_b > 10 else 0.2))


def test_llama4_chunked_attention_caches_per_token_only_in_its_global_layers():
    """Llama-4: `attention_chunk_size` 8192 and no layer list; the no-RoPE layers (3, 7, ..., 47: transformers
    Llama4TextConfig no_rope_layer_interval 4) attend globally, vLLM's llama4.py runs the other 36 as chunked local
    attention (ChunkedLocalAttentionSpec: one chunk per sequence). Old main charged all 48 as windowed: 0 bytes per
    token and a 188-million-token pool on two H200s."""
    for name in ("llama-4-scout", "llama-4-maverick"):
        m = load(name)
        assert (m.num_full_attention_layers, m.num_sliding_layers, m.sliding_window) == (12, 36, 8192)
        assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(12, 8, 128, BF16)  # 49,152
        assert kv_bytes_per_token(m, KvDtype.FP8, tp=8) == full_attention_bytes(12, 1, 128, FP8)
        # A decoding sequence holds at most one chunk (plus a block) in each chunked layer, whatever its length.
        per_seq = fixed_bytes_per_seq(m, KvDtype.AUTO, tp=1, pp=1)
        assert per_seq == full_attention_bytes(36, 8, 128, BF16) * (8192 + 16)
    scout = load("llama-4-scout")
    h200, par, knobs = resolve_gpu("h200_sxm"), Parallelism(tp=2), EngineKnobs()
    pool = kv_pool_bytes(scout, h200, engine=Engine.VLLM, precision=Precision.BF16, tp=2, pp=1, dp=1,
                         max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs,
                         memory_fraction=knobs.memory_fraction)
    tokens = kv_pool_tokens(scout, h200, engine=Engine.VLLM, precision=Precision.BF16, parallelism=par, knobs=knobs)
    assert 0 < tokens <= pool / full_attention_bytes(12, 4, 128, BF16)


def test_llama4_moe_layers_carry_a_shared_expert_and_dense_layers_the_wider_mlp():
    """vLLM llama4.py Llama4MoE: routed experts of `intermediate_size` plus one shared expert of the same width; the
    dense layers (Maverick: every other layer, interleave_moe_layer_step 2) use `intermediate_size_mlp`."""
    mav = load("llama-4-maverick")
    assert (mav.num_moe_layers, mav.num_dense_layers, mav.intermediate_size) == (24, 24, 16384)
    assert mav.shared_expert_params_per_layer == 3 * 5120 * 8192
    h, v, layers = 5120, 202048, 48
    attention = layers * (2 * h * 40 * 128 + 2 * h * 8 * 128)
    moe = 24 * (128 * 3 * h * 8192 + 3 * h * 8192 + h * 128)
    dense = 24 * 3 * h * 16384
    assert mav.total_params == attention + moe + dense + 2 * v * h
    assert any("n_shared_experts absent" in a for a in mav.assumptions)


def test_gemma_ties_its_embeddings_when_the_config_leaves_the_field_out():
    """Gemma-3's text_config has no tie_word_embeddings; transformers' Gemma3TextConfig (from Gemma2Config) defaults it
    to True and vLLM's gemma3.py shares the matrix. Old main counted a second 262144 x 5376 matrix: 28.4B."""
    m = load("gemma-3-27b")
    assert m.tie_embeddings
    h, layers = 5376, 62
    per_layer = 2 * h * 32 * 128 + 2 * h * 16 * 128 + 3 * h * 21504
    assert m.total_params == layers * per_layer + 262144 * h
    # Gemma-3 sliding_window_pattern 6: every 6th layer global (10), the rest a 1024-token window (vLLM gemma3.py).
    assert (m.num_full_attention_layers, m.num_sliding_layers, m.sliding_window) == (10, 52, 1024)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(10, 16, 128, BF16)
    assert any("tie_word_embeddings absent: True" in a for a in m.assumptions)
    # A config that says untied stays untied; a model_type with no known default is taken untied and says so.
    assert not from_hf_config({**raw("gemma-2-9b"), "tie_word_embeddings": False}).tie_embeddings
    other = from_hf_config({k: v for k, v in raw("mixtral-8x22b").items() if k != "tie_word_embeddings"})
    assert not other.tie_embeddings and any("tie_word_embeddings absent" in a for a in other.assumptions)


def test_per_layer_query_heads_and_a_compressed_tensors_fp8_block_checkpoint():
    """Laguna-XS.2: 48 query heads in its 10 global layers, 64 in its 30 sliding ones (`num_attention_heads_per_layer`),
    8 KV heads everywhere; compressed-tensors FP8 128x128 blocks on every Linear but the attention projections, the
    router gate and lm_head (its `ignore` regexes)."""
    m = load("laguna-xs.2-fp8")
    h, d = 2048, 128
    heads = 10 * 48 + 30 * 64
    attention = heads * d * h * 2 + 40 * 2 * h * 8 * d
    assert m.attention_params_total == attention
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(10, 8, 128, BF16)
    assert m.checkpoint is not None and m.checkpoint.precision is Precision.FP8
    assert m.checkpoint.quantized == {ModuleGroup.DENSE_FFN, ModuleGroup.SHARED_EXPERTS, ModuleGroup.ROUTED_EXPERTS}
    block = 1 + 4 / (128 * 128)
    ffn = 3 * h * 8192 + 39 * (256 * 3 * h * 512 + 3 * h * 512)
    expected = attention * 2 + ffn * block + 39 * h * 256 * 2 + 2 * 100352 * h * 2
    # rel 1e-5: the reader also counts a Qwen2-MoE-style shared-expert gate (hidden -> 1) with
    # `shared_expert_intermediate_size`, 160 kB here, which Laguna's config neither confirms nor rules out.
    assert weight_bytes_total(m, Precision.FP8) == pytest.approx(expected, rel=1e-5)
    assert not any("num_attention_heads_per_layer" in w for w in m.warnings)


def test_falcon_h1_runs_attention_and_mamba2_in_every_layer():
    """Falcon-H1-0.5B: 36 layers, each with GQA attention (2 KV heads of 64) and a Mamba-2 mixer (24 heads of 64,
    state 128, 1 group, conv 4). vLLM MambaStateShapeCalculator.mamba2_state_shape: conv (K-1) x (I + 2GN), temporal
    heads x head_dim x N, in the model dtype."""
    m = load("falcon-h1-0.5b")
    assert m.state_kind is StateKind.MAMBA2 and m.num_parallel_state_layers == 36
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(36, 2, 64, BF16)
    conv, temporal = 3 * (24 * 64 + 2 * 1 * 128), 24 * 64 * 128
    assert state_bytes_per_seq(m, tp=1) == 36 * (conv + temporal) * BF16
    assert state_bytes_per_seq(m, tp=2) == 36 * (conv / 2 + temporal / 2) * BF16


def test_mla_without_a_query_lora_caches_one_latent():
    """DeepSeek-V2-Lite (q_lora_rank null): vLLM MLAAttentionSpec, one head of kv_lora_rank + qk_rope_head_dim."""
    m = load("deepseek-v2-lite")
    assert m.q_lora_rank == 0 and m.is_mla
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == 27 * (512 + 64) * BF16
    assert kv_bytes_per_token(m, KvDtype.FP8, tp=4) == 27 * (512 + 64) * FP8  # replicated on every TP rank
    m2 = load("glm-4.7-flash")  # the same rule with a q LoRA and 47 layers
    assert kv_bytes_per_token(m2, KvDtype.AUTO, tp=1) == 47 * (512 + 64) * BF16


def test_fields_that_do_not_shape_a_model_give_no_warnings():
    """Token ids (Gemma-3 and Llama-4's boi/eoi/image_token_index), muP multipliers (Falcon-H1) and Step's
    `share_expert_dim` (its shared expert width: read, not ignored) are not gaps; old main warned about each."""
    for name in ("gemma-3-27b", "llama-4-scout", "falcon-h1-0.5b", "step-3.7-flash", "qwen3-vl-235b-a22b", "mixtral-8x22b"):
        assert load(name).warnings == (), name
    step = load("step-3.7-flash")
    assert step.shared_expert_params_per_layer == 3 * 4096 * 1280
    cfg = {**raw("step-3.7-flash"), "share_expert_dim": 2560}
    assert from_hf_config(cfg).shared_expert_params_per_layer == 3 * 4096 * 2560


def test_compressed_sparse_attention_caches_one_entry_per_r_tokens():
    """DeepSeek-V4-Flash (vLLM models/deepseek_v4/attention.py): every layer keeps a 128-token window of one shared
    512-value K=V vector; a layer of compress ratio r > 1 also one 512-value entry per r tokens (MLAAttentionSpec with
    tokens_per_state = r; vLLM's fp8_ds_mla layout, 584 bytes an entry, under FP8 and under auto, which the default CUDA
    classes turn into fp8_ds_mla: `_resolve_dsv4_kv_cache_dtype`; 2 bytes a value only when BF16 is asked for); the 21 ratio-4 layers
    keep indexer keys (128 FP8 values + an FP32 scale) per 4 tokens. q and o are low-rank (q_lora_rank, o_lora_rank in
    o_groups). Old main read it as plain attention: 291.3B total, 20.3B active, 5,676 bytes a token."""
    m = load("deepseek-v4-flash")
    ratios = raw("deepseek-v4-flash")["compress_ratios"][:43]
    fours, one28s = ratios.count(4), ratios.count(128)
    assert (fours, one28s) == (21, 20) and m.num_indexer_layers == 21
    indexer = fours * (128 + 4) / 4
    for kv_dtype in (KvDtype.AUTO, KvDtype.FP8):   # 3,850 bytes a token (old main priced auto as BF16: 6,229)
        assert kv_bytes_per_token(m, kv_dtype, tp=1) == pytest.approx(fours * 584 / 4 + one28s * 584 / 128 + indexer)
        assert fixed_bytes_per_seq(m, kv_dtype, tp=1, pp=1) == pytest.approx(43 * 584 * (128 + 16))  # the window: one entry a token
    assert kv_bytes_per_token(m, KvDtype.BF16, tp=1) == pytest.approx(fours * 512 * BF16 / 4 + one28s * 512 * BF16 / 128 + indexer)
    assert fixed_bytes_per_seq(m, KvDtype.BF16, tp=1, pp=1) == 43 * 512 * BF16 * (128 + 16)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=8) == kv_bytes_per_token(m, KvDtype.AUTO, tp=1)  # one head, replicated
    h, heads, d = 4096, 64, 512
    attention = h * 1024 + 1024 * heads * d + h * d + heads * d * 1024 + 8 * 1024 * h
    assert m.attention_params_per_layer == attention
    # What it still does not use is named: the hash-routed layers (its FP4 experts are priced: test_new_layer_kinds).
    assert any(repr("num_hash_layers") in w for w in m.warnings)


def test_nested_attn_and_ffn_blocks_are_read():
    """DBRX keeps its KV heads in `attn_config` and its experts in `ffn_config` (vLLM dbrx.py reads
    config.attn_config.kv_n_heads and config.ffn_config.moe_num_experts / moe_top_k / ffn_hidden_size), and names its
    heads `n_heads`. Old main refused it: "config.json has attention layers but no num_attention_heads". The nested
    blocks' Hugging Face bookkeeping (`tie_word_embeddings: true` inside them) does not override the top level."""
    m = load("dbrx-instruct-mlx-4bit")
    assert (m.num_heads, m.num_kv_heads, m.head_dim, m.max_context_tokens) == (48, 8, 128, 32768)
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size, m.num_moe_layers) == (16, 4, 10752, 40)
    assert not m.tie_embeddings
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(40, 8, 128, BF16)  # 163,840
    # MLX's own `quantization` block is no checkpoint format vLLM or SGLang loads: named, and priced as BF16.
    assert m.checkpoint is None and any("'quantization'" in w for w in m.warnings)


def test_a_plain_gelu_mlp_is_two_matrices_where_the_models_code_says_so():
    """StarCoder2-15B: Starcoder2MLP is c_fc -> gelu -> c_proj (transformers modeling_starcoder2.py, which vLLM 0.33 runs), with the same `hidden_act` Gemma
    gates with, so no field tells it apart; transformers' Starcoder2Config ties the embeddings by default. Every layer
    slides over 4096 tokens (vLLM passes config.sliding_window to each layer). Old main: 22.0B (gated, untied)."""
    m = load("starcoder2-15b")
    h, layers = 6144, 40
    per_layer = 2 * h * 48 * 128 + 2 * h * 4 * 128 + 2 * h * 24576
    assert m.ffn_matrices == 2 and m.tie_embeddings
    assert m.total_params == layers * per_layer + 49152 * h  # 15.65B (card: "15B")
    assert (m.num_sliding_layers, m.sliding_window) == (40, 4096) and kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == 0
    assert fixed_bytes_per_seq(m, KvDtype.AUTO, tp=1, pp=1) == full_attention_bytes(40, 4, 128, BF16) * (4096 + 16)
    # A gated model with a GELU activation stays gated (Gemma), and a config that gives the field keeps its word.
    assert load("gemma-2-9b").ffn_matrices == 3
    assert from_hf_config({**raw("starcoder2-15b"), "tie_word_embeddings": False}).tie_embeddings is False


@pytest.mark.parametrize("model_type", ["gpt_bigcode", "gpt_neox", "phi", "falcon", "gpt2", "gptj", "opt", "bloom", "mpt"])
def test_the_other_two_matrix_mlp_model_types(model_type):
    cfg = {"model_type": model_type, "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}
    assert from_hf_config(cfg).dense_ffn_params_per_layer == 2 * 256 * 1024


def test_a_sliding_pattern_with_an_fp8_block_checkpoint_and_a_window_shorter_than_the_context():
    """EXAONE-4.0-32B-FP8: `sliding_window_pattern` 4 (transformers Exaone4Config layer_types, which vLLM exaone4.py
    reads: every 4th layer global) and an FP8 128x128 block checkpoint on every Linear; Phi-3-mini-4k: a 2047-token
    `sliding_window` and no layer list, which vLLM applies to every layer (Attention falls back to
    cache_config.sliding_window)."""
    ex = load("exaone-4.0-32b-fp8")
    assert (ex.num_full_attention_layers, ex.num_sliding_layers, ex.sliding_window) == (16, 48, 4096)
    assert kv_bytes_per_token(ex, KvDtype.AUTO, tp=1) == full_attention_bytes(16, 8, 128, BF16)
    assert (ex.total_params - ex.embedding_params) / 1e9 == pytest.approx(30.95, abs=0.01)  # the card's own figure
    h = 5120
    gemms = 64 * (2 * h * 40 * 128 + 2 * h * 8 * 128 + 3 * h * 27392)
    assert weight_bytes_total(ex, Precision.FP8) == pytest.approx(gemms * (1 + 4 / 128**2) + 2 * 102400 * h * 2)
    phi = load("phi-3-mini-4k")
    assert (phi.num_sliding_layers, phi.sliding_window) == (32, 2047) and kv_bytes_per_token(phi, KvDtype.AUTO, tp=1) == 0
    assert fixed_bytes_per_seq(phi, KvDtype.AUTO, tp=1, pp=1) == full_attention_bytes(32, 32, 96, BF16) * (2047 + 16)
    assert phi.warnings == ()


# (model_type, whether its transformers config class ties the embeddings by default: configuration_<model_type>.py)
TIED_BY_DEFAULT = [
    ("gpt2", True), ("opt", True), ("bloom", True), ("falcon", True), ("gpt_bigcode", True), ("mpt", True),
    ("gpt_neox", False), ("phi", False), ("gptj", False),
]


@pytest.mark.parametrize(("model_type", "tied"), TIED_BY_DEFAULT, ids=[t[0] for t in TIED_BY_DEFAULT])
def test_two_matrix_model_types_tie_their_embeddings_as_their_config_class_does(model_type, tied):
    h, vocab, layers = 256, 1000, 2
    cfg = {"model_type": model_type, "num_hidden_layers": layers, "hidden_size": h, "num_attention_heads": 4,
           "intermediate_size": 1024, "vocab_size": vocab}
    m = from_hf_config(cfg)
    assert m.tie_embeddings is tied
    assert m.total_params == layers * (4 * h * h + 2 * h * 1024) + vocab * h * (1 if tied else 2)
    assert any(f"tie_word_embeddings absent: {tied}, as {model_type}'s" in a for a in m.assumptions)


def test_gpt2_small_matches_its_published_124m():
    """openai-community/gpt2 config.json (no tie_word_embeddings field; GPT2Config ties by default and vLLM's gpt2.py
    shares wte with lm_head): 124,439,808 parameters, of which 786,432 are learned position embeddings and 0.12M
    biases and norms that the planner does not count. Old main counted a second 50257 x 768 matrix: 162.1M."""
    cfg = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768,
           "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-05}
    m = from_hf_config(cfg)
    assert m.total_params == 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 50257 * 768
    assert m.total_params / 1e6 == pytest.approx(124.44 - 0.79, abs=0.15)


def test_an_implied_field_yields_to_the_same_field_under_another_name():
    # Llama-4's one shared expert is a default for a config that says nothing; `num_shared_experts` 0 says something.
    cfg = {**raw("llama-4-scout")["text_config"], "num_shared_experts": 0}
    m = from_hf_config(cfg)
    assert m.num_shared_experts == 0 and m.shared_expert_params_per_layer == 0
    assert not any("n_shared_experts absent" in a for a in m.assumptions)


def test_multi_query_configs_cache_one_kv_head():
    """tiiuae/falcon-7b's config.json (`multi_query: true`, `new_decoder_architecture: false`, no KV-head count) and
    bigcode/starcoder's (GPTBigCode, `multi_query: true`): one K and V head for all 71 (48) query heads, as vLLM
    falcon.py and transformers' GPTBigCodeAttention build them. Old main took 71 KV heads: 581,632 bytes a token."""
    falcon = {"alibi": False, "architectures": ["FalconForCausalLM"], "bias": False, "hidden_size": 4544, "model_type": "falcon",
              "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32,
              "parallel_attn": True, "vocab_size": 65024}
    m = from_hf_config(falcon)
    h, d = 4544, 64
    assert m.num_kv_heads == 1 and kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(32, 1, d, BF16)  # 8,192
    assert m.total_params == 32 * (2 * h * h + 2 * h * d + 2 * h * 4 * h) + 65024 * h   # 6.92B, tied (FalconConfig)
    # Falcon-40B's layout: new_decoder_architecture reads its KV heads from num_kv_heads whatever multi_query says.
    assert from_hf_config({**falcon, "new_decoder_architecture": True, "num_kv_heads": 8}).num_kv_heads == 8
    starcoder = {"model_type": "gpt_bigcode", "multi_query": True, "n_embd": 6144, "n_head": 48, "n_inner": 24576, "n_layer": 40,
                 "n_positions": 8192, "vocab_size": 49152}
    assert kv_bytes_per_token(from_hf_config(starcoder), KvDtype.AUTO, tp=1) == full_attention_bytes(40, 1, 128, BF16)
