"""Layer kinds the reader had not met before session 15, read from public config.json files (sources in
tests/planner/data/model_configs/README.md). Expected values are spelt out from each config's own numbers with the
engine's rule, named in each test (vLLM model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator and
MambaStateDtypeCalculator; v1 kv_cache_interface MLAAttentionSpec, FullAttentionSpec), or taken from the published
totals; never read back from the planner. docs/models.md holds the table."""

import pytest

from servingtopology.planner.arch import ModuleGroup, StateKind
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import from_hf_config
from servingtopology.planner.perf.memory import (
    attention_read_bytes,
    fixed_bytes_per_seq,
    group_bytes_per_param,
    kv_bytes_per_token,
    state_bytes_per_seq,
    weight_bytes_total,
)
from tests.planner.model_configs import BF16, full_attention_bytes, load, raw

FP32 = 4


def test_kimi_linear_kda_layers_keep_a_fixed_state_and_its_mla_layers_a_latent():
    """Kimi-Linear-48B-A3B: `linear_attn_config.kda_layers` (counted from 1) run Kimi Delta Attention, the 7
    `full_attn_layers` MLA. vLLM kimi_linear.py: KDA state from MambaStateShapeCalculator.kda_state_shape, conv
    (K-1) x (H·d + 2·H·d) in the model dtype and recurrent H x d x d in FP32 (kda_state_dtype); the MLA layers an
    MLAAttentionSpec of kv_lora_rank + qk_rope_head_dim. Old main read all 27 layers as MLA: 31,104 bytes a token
    and no state."""
    m = load("kimi-linear-48b-a3b")
    assert (m.state_kind, m.num_linear_layers, m.num_attention_layers) == (StateKind.KDA, 20, 7)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == 7 * (512 + 64) * BF16  # 8,064
    heads, d, k = 32, 128, 4
    conv, recurrent = (k - 1) * 3 * heads * d, heads * d * d
    assert state_bytes_per_seq(m, tp=1) == 20 * (conv * BF16 + recurrent * FP32)  # 43.4 MB a sequence
    assert state_bytes_per_seq(m, tp=4) == 20 * (conv / 4 * BF16 + recurrent / 4 * FP32)
    # Weights: KDA q/k/v/o (4·h·H·d), q/k/v convs, f and g low-rank through d, beta (h·H); MLA without a query LoRA.
    h, width = 2304, heads * d
    kda = 4 * h * width + 3 * width * k + 2 * (h * d + d * width) + h * heads
    mla = h * 32 * 192 + h * (512 + 64) + 512 * 32 * (128 + 128) + 32 * 128 * h
    moe = 256 * 3 * h * 1024 + 3 * h * 1024 + h * 256
    assert m.total_params == 20 * kda + 7 * mla + 3 * h * 9216 + 26 * moe + 2 * 163840 * h
    # The card's "48B total, 3B activated"; modeling_kimi.py's module inventory is 49.12B with norms.
    assert m.total_params / 1e9 == pytest.approx(49.12, abs=0.01)
    assert m.active_params_per_token / 1e9 == pytest.approx(3.0, abs=0.15)
    assert m.warnings == ()


def test_lfm2_short_conv_layers_keep_only_a_conv_state():
    """LFM2-1.2B: `full_attn_idxs` names the 6 attention layers; the other 10 are gated short convolutions (vLLM lfm2.py
    ShortConv: in_proj h -> 3·conv_dim, a conv of conv_L_cache taps, out_proj), whose state is (L_cache - 1) x conv_dim
    (MambaStateShapeCalculator.short_conv_state_shape). Its MLP is 2/3 of block_ff_dim rounded up to block_multiple_of
    (block_auto_adjust_ff_dim; Lfm2MLP) and its embeddings are tied (Lfm2Config default). Old main: 16 attention
    layers, 32,768 bytes a token, 1.24B."""
    m = load("lfm2-1.2b")
    assert (m.state_kind, m.num_linear_layers, m.num_full_attention_layers) == (StateKind.SHORT_CONV, 10, 6)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(6, 8, 64, BF16)  # 12,288
    assert state_bytes_per_seq(m, tp=1) == 10 * (3 - 1) * 2048 * BF16
    assert state_bytes_per_seq(m, tp=2) == 10 * (3 - 1) * 2048 / 2 * BF16
    h, v = 2048, 65536
    ffn = 3 * h * (256 * -(-(2 * 12288 // 3) // 256))  # 8192 wide
    attention = 2 * h * 32 * 64 + 2 * h * 8 * 64
    conv = h * 3 * 2048 + 2048 * 3 + 2048 * h
    assert m.tie_embeddings and m.total_params == 16 * ffn + 6 * attention + 10 * conv + v * h
    assert m.total_params / 1e9 == pytest.approx(1.17034, rel=1e-3)  # LiquidAI's card: 1,170,340,608 with norms
    # A config that turns the adjustment off keeps its width; one that says the MLP is not SwiGLU gets two matrices.
    assert from_hf_config({**raw("lfm2-1.2b"), "block_auto_adjust_ff_dim": False}).intermediate_size == 12288
    assert from_hf_config({**raw("lfm2-1.2b"), "block_use_swiglu": False}).ffn_matrices == 2


def test_granite_4_h_mamba2_hybrid_with_routed_and_shared_experts():
    """Granite-4.0-H-Tiny (`layer_types` mamba/attention, NoPE attention, 64 experts of `intermediate_size` 512 plus a
    `shared_intermediate_size` 1024 MLP in every layer): vLLM granitemoehybrid.py, Mamba-2 state from
    mamba2_state_shape, conv (K-1) x (H·P + 2·G·N), temporal H x P x N."""
    m = load("granite-4.0-h-tiny")
    assert (m.state_kind, m.num_linear_layers, m.num_full_attention_layers, m.num_moe_layers) == (StateKind.MAMBA2, 36, 4, 40)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(4, 4, 128, BF16)  # 8,192
    conv, temporal = 3 * (48 * 64 + 2 * 1 * 128), 48 * 64 * 128
    assert state_bytes_per_seq(m, tp=1) == 36 * (conv + temporal) * BF16
    assert m.total_params / 1e9 == pytest.approx(6.94, abs=0.01)  # ibm-granite: 7B (6.94B in its safetensors)


def test_smollm3_nope_layers_still_cache_every_layer():
    """SmolLM3-3B: every 4th layer skips RoPE (`no_rope_layers`), but a NoPE layer still caches K and V (vLLM runs it
    through its Llama layers, FullAttentionSpec in all 36). The layout shapes no weight or cache byte: old main warned
    that both fields were not understood."""
    m = load("smollm3-3b")
    assert m.num_full_attention_layers == 36 and m.num_sliding_layers == 0
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(36, 4, 128, BF16)  # 73,728
    h = 2048
    assert m.total_params == 36 * (2 * h * 16 * 128 + 2 * h * 4 * 128 + 3 * h * 11008) + 128256 * h
    assert m.total_params / 1e9 == pytest.approx(3.08, abs=0.01)  # HuggingFaceTB: 3.08B
    assert m.warnings == ()


def test_ernie_moe_layers_run_from_start_to_end_index_with_shared_experts():
    """ERNIE-4.5-21B-A3B (vLLM ernie45_moe.py): a layer is MoE when (i + 1) % moe_layer_interval == 0 and
    moe_layer_start_index <= i <= moe_layer_end_index, else a dense MLP of intermediate_size; Ernie4_5_MoeMoE adds a
    shared MLP of moe_intermediate_size x moe_num_shared_experts. Old main: 28 MoE layers and no shared expert, 21.85B
    with 2.69B active, and four fields named as not understood."""
    m = load("ernie-4.5-21b-a3b")
    assert (m.num_moe_layers, m.num_dense_layers, m.experts_per_token) == (27, 1, 6)
    h, e = 2560, 1536
    attention = 2 * h * 20 * 128 + 2 * h * 4 * 128
    moe = 64 * 3 * h * e + 3 * h * (2 * e) + h * 64
    assert m.total_params == 28 * attention + 3 * h * 12288 + 27 * moe + 103424 * h
    assert m.total_params / 1e9 == pytest.approx(21.8, abs=0.05)  # Baidu: 21B total ("21.8B in all")
    assert m.active_params_per_token / 1e9 == pytest.approx(3.0, abs=0.4)  # "A3B"
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(28, 4, 128, BF16)
    assert m.warnings == ()


def test_hunyuan_per_layer_lists_of_top_k_shared_experts_and_widths():
    """Hunyuan-A13B gives `moe_topk`, `num_shared_expert` and `moe_intermediate_size` as one entry a layer (vLLM
    hunyuan_v1.py indexes them by layer_id) and, with `use_mixed_mlp_moe`, a shared MLP of intermediate_size x
    num_shared_expert. Old main read no top-k and no shared MLP: 1.88B active against the card's 13B."""
    m = load("hunyuan-a13b")
    assert (m.num_moe_layers, m.experts_per_token, m.moe_intermediate_size) == (32, 8, 3072)
    h = 4096
    attention = 2 * h * 32 * 128 + 2 * h * 8 * 128
    expert = 3 * h * 3072
    assert m.total_params == 32 * (attention + 64 * expert + expert + h * 64) + 128167 * h
    assert m.active_params_per_token == 32 * (attention + 8 * expert + expert + h * 64) + 128167 * h
    assert (m.total_params / 1e9, m.active_params_per_token / 1e9) == (pytest.approx(80.0, rel=0.01), pytest.approx(13.0, rel=0.03))
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(32, 8, 128, BF16)
    assert m.warnings == ()
    # A per-layer list that varies is averaged over the MoE layers, and said so.
    varied = from_hf_config({**raw("hunyuan-a13b"), "moe_topk": [8] * 16 + [4] * 16})
    assert varied.experts_per_token == 6 and any("moe_topk differs by layer" in a for a in varied.assumptions)


def test_deepseek_v4_fp4_experts_are_priced_as_mxfp4():
    """DeepSeek-V4's `expert_dtype: fp4`: its experts are packed E2M1 pairs with an E8M0 scale per 32 values (DeepSeek's
    inference model.py builds them as torch.float4_e2m1fn_x2; vLLM's Fp8Config hands `expert_dtype == "fp4"` experts
    to Mxfp4MoEMethod): 0.5 + 1/32 bytes a weight. Old main priced them as BF16 (568 GB of weights) and warned."""
    m = load("deepseek-v4-flash")
    assert m.checkpoint is not None and m.checkpoint.precision is Precision.FP4
    assert m.checkpoint.quantized == {ModuleGroup.ROUTED_EXPERTS}
    experts = m.routed_expert_params_total
    rest = weight_bytes_total(m, Precision.BF16) - experts * 2  # every other group stays BF16 (no quantization_config)
    assert weight_bytes_total(m, Precision.FP4) == pytest.approx(experts * (0.5 + 1 / 32) + rest)
    assert not any("expert_dtype" in w for w in m.warnings)
    # The released checkpoint pairs them with FP8 128x128 blocks on every other Linear (quantization_config fp8):
    # the experts keep their own format beside it.
    cfg = {**raw("deepseek-v4-flash"), "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    both = from_hf_config(cfg)
    assert both.checkpoint is not None and both.checkpoint.precision is Precision.FP8
    assert group_bytes_per_param(both, ModuleGroup.ROUTED_EXPERTS, Precision.FP8) == 0.5 + 1 / 32
    assert group_bytes_per_param(both, ModuleGroup.ATTENTION, Precision.FP8) == 1 + 4 / 128**2


def test_a_gelu_mlp_on_an_unknown_model_type_is_named_as_taken_gated():
    """No field tells a plain GELU MLP (GPT-2, StarCoder2) from a gated one (Gemma): the model code decides. An
    unknown model_type with a GELU activation is taken as gated and the decision record says so; a config that says
    `mlp_gated: false` (or LFM2's `block_use_swiglu: false`) gets two matrices."""
    cfg = {"model_type": "brand_new", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "intermediate_size": 1024, "hidden_act": "gelu"}
    m = from_hf_config(cfg)
    assert m.ffn_matrices == 3 and any("hidden_act gelu" in a and "gated" in a for a in m.assumptions)
    assert from_hf_config({**cfg, "mlp_gated": False}).dense_ffn_params_per_layer == 2 * 256 * 1024
    assert not any("hidden_act" in a for a in from_hf_config({**cfg, "hidden_act": "silu"}).assumptions)


def test_a_gptq_int4_checkpoint_is_priced_as_vllm_allocates_it():
    """A GPTQ int4 `quantization_config` (bits 4, group_size 128, desc_act, sym: the fields AutoGPTQ/GPTQModel write)
    on Llama-3.1-8B: vLLM's GPTQLinearMethod allocates qweight as int32 packing 8 weights (0.5 bytes a weight),
    scales in FP16 per group of 128 input rows (2/128) and qzeros packed the same way per group (0.5/128) for every
    Linear; the LM head stays BF16 (`lm_head` false). g_idx (one int32 per input row, 4/out_features a weight, under
    0.1 %) is not counted."""
    q = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True, "damp_percent": 0.1,
         "checkpoint_format": "gptq", "lm_head": False}
    m = from_hf_config({**raw("llama-3.1-8b-instruct"), "quantization_config": q})
    assert m.checkpoint is not None and m.checkpoint.precision is Precision.INT4
    per_weight = 0.5 + 2 / 128 + 0.5 / 128
    assert m.checkpoint.bytes_per_param == pytest.approx(per_weight)
    h, v = 4096, 128256
    gemms = 32 * (2 * h * 32 * 128 + 2 * h * 8 * 128 + 3 * h * 14336)
    assert weight_bytes_total(m, Precision.INT4) == pytest.approx(gemms * per_weight + 2 * v * h * 2)


def test_hunyuan_cla_layers_keep_no_kv_cache_and_no_kv_projections():
    """Hunyuan-Large (Hunyuan-A52B): `use_cla` with `cla_share_factor` 2. vLLM hunyuan_v1.py builds layer i as
    HunYuanCrossAttention when i % 2 != 0: q_proj and o_proj only, attending over the K and V the layer before computed
    (ENCODER_DECODER attention, no cache of its own for decoder tokens), and skips those layers' k/v weights when loading.
    So 32 of the 64 layers hold KV: the README's "CLA ... a 50% savings in the KV-Cache portion". Old main charged all 64
    (163,840 bytes a token in BF16) and warned that use_cla was not priced."""
    m = load("hunyuan-large-cla")
    assert not any("use_cla" in w for w in m.warnings)
    assert (m.kv_reuse_full_layers, m.kv_reuse_sliding_layers) == (32, 0)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(32, 8, 80, BF16)  # 81,920
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=8) == full_attention_bytes(32, 1, 80, BF16)
    # Decode still reads the shared K and V in every layer.
    assert attention_read_bytes(m, KvDtype.AUTO, tp=1, pp=1).per_context_token == full_attention_bytes(64, 8, 80, BF16)
    no_cla = raw("hunyuan-large-cla")
    no_cla["use_cla"] = False
    plain = from_hf_config(no_cla)
    assert kv_bytes_per_token(plain, KvDtype.AUTO, tp=1) == full_attention_bytes(64, 8, 80, BF16)
    h, kv_heads, head_dim = 6400, 8, 80
    assert plain.total_params - m.total_params == 32 * 2 * h * kv_heads * head_dim  # 262 M of k/v projections
    # The README's "389 billion parameters and 52 billion active".
    assert m.total_params / 1e9 == pytest.approx(389, rel=0.01)
    assert m.active_params_per_token / 1e9 == pytest.approx(52, rel=0.02)


def test_num_kv_shared_layers_hold_no_cache_of_their_own():
    """`num_kv_shared_layers` N (Gemma-3n; transformers Gemma3nTextAttention: layers from num_hidden_layers - N on
    reuse the cache of the last earlier layer of their kind): vLLM gives those layers a `kv_sharing_target_layer_name`
    and no KV cache spec of their own. 35 layers with every 5th global and a 512-token window elsewhere; the last 20
    share (4 global, 16 sliding), so 15 layers keep KV: 3 global, 12 windowed."""
    types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(35)]
    cfg = {"hidden_size": 2048, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
           "intermediate_size": 8192, "vocab_size": 262144, "max_position_embeddings": 32768, "layer_types": types,
           "sliding_window": 512, "num_kv_shared_layers": 20}
    m = from_hf_config(cfg)
    assert (m.kv_reuse_full_layers, m.kv_reuse_sliding_layers) == (4, 16)
    assert kv_bytes_per_token(m, KvDtype.AUTO, tp=1) == full_attention_bytes(3, 2, 256, BF16)
    window = min(512 + 16, 32768)
    assert fixed_bytes_per_seq(m, KvDtype.AUTO, tp=1, pp=1) == full_attention_bytes(12, 2, 256, BF16) * window
    assert m.total_params == from_hf_config({**cfg, "num_kv_shared_layers": 0}).total_params  # k/v projections stay
    assert not any("num_kv_shared_layers" in w for w in m.warnings)


def test_mamba_ssm_dtype_float32_keeps_the_recurrent_state_in_fp32():
    """Qwen3.5 configs say `mamba_ssm_dtype: "float32"`. vLLM's Qwen3_5ForConditionalGenerationConfig.verify_and_update_config
    sets --mamba-ssm-cache-dtype 'auto' to it, and MambaStateDtypeCalculator.gated_delta_net_state_dtype keeps the conv
    state in the model dtype and the recurrent one in that dtype; SGLang's mamba2_state_dtype reads the same field. The
    2B dense fine-tune: 18 Gated DeltaNet layers, 16 key and 16 value heads of 128, conv kernel 4. Old main priced the
    recurrent state in BF16 (9.6 MiB a sequence instead of 18.6)."""
    m = load("ckpt-qwen3.5-2b-dense")
    conv, recurrent = 3 * (2 * 16 * 128 + 16 * 128), 16 * 128 * 128
    assert state_bytes_per_seq(m, tp=1) == 18 * (conv * BF16 + recurrent * FP32)
    assert state_bytes_per_seq(m, tp=2) == 18 * (conv / 2 * BF16 + recurrent / 2 * FP32)
    bf16 = raw("ckpt-qwen3.5-2b-dense")
    bf16["mamba_ssm_dtype"] = "bfloat16"
    assert state_bytes_per_seq(from_hf_config(bf16), tp=1) == 18 * (conv + recurrent) * BF16
    # Qwen3-Next's config has no such field: 'auto', the model dtype (vLLM) as before.
    nxt = load("qwen3-next-80b-a3b")
    assert not nxt.state_ssm_fp32


def test_fp32_state_matches_an_sglang_mamba_pool_log():
    """An SGLang start-up log in the search index (file id 69213517065, a 27B Qwen3.5-shaped model: 64 layers, every 4th
    full attention, 16 key / 48 value heads of 128, conv 4, `mamba_ssm_dtype` float32, TP 1): "Mamba Cache is allocated.
    max_mamba_cache_size: 360, conv_state size: 0.99GB, ssm_state size: 50.77GB" (GiB; SGLang's MambaPool holds
    size + 1 slots)."""
    cfg = raw("ckpt-qwen3.5-2b-dense")
    cfg.update(num_hidden_layers=64, linear_num_value_heads=48, hidden_size=5120,
               layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)])
    m = from_hf_config(cfg)
    per_slot = float(state_bytes_per_seq(m, tp=1))
    assert per_slot * 361 / 2**30 == pytest.approx(50.77 + 0.99, abs=0.01)


def test_sglang_keeps_mamba2_and_gated_deltanet_state_in_fp32_unless_the_config_says():
    """SGLang python/sglang/srt/configs/mamba_utils.py `mamba2_state_dtype`: the conv state in BF16, the temporal
    (recurrent) state float32 by default, then the config's `mamba_ssm_dtype`, then SGLANG_MAMBA_SSM_DTYPE; the Mamba-2 and
    Gated DeltaNet configs (Qwen3-Next, Falcon-H1, Nemotron-H) size their MambaPool with it. vLLM keeps 'auto' (the model
    dtype) for a config that names nothing. Qwen3-Next-80B at TP 1: 36 GDN layers of 32 value heads x 128 x 128; a
    Qwen3-Next SGLang run in the index measured ~73.6 MiB a mamba slot (file id 66621302680). Old main charged SGLang the
    BF16 state (37.7 MiB)."""
    m = load("qwen3-next-80b-a3b")
    conv, recurrent = 3 * (2 * 16 * 128 + 32 * 128), 32 * 128 * 128
    assert state_bytes_per_seq(m, tp=1) == 36 * (conv + recurrent) * BF16
    sglang = state_bytes_per_seq(m, tp=1, engine=Engine.SGLANG)
    assert sglang == 36 * (conv * BF16 + recurrent * FP32)
    assert sglang / 2**20 == pytest.approx(73.6, abs=0.2)
    # A config that names a 16-bit state keeps it under SGLang; KDA and short convolutions are unchanged.
    named = raw("qwen3-next-80b-a3b")
    named["mamba_ssm_dtype"] = "bfloat16"
    assert state_bytes_per_seq(from_hf_config(named), tp=1, engine=Engine.SGLANG) == 36 * (conv + recurrent) * BF16
    for name in ("kimi-linear-48b-a3b", "lfm2-1.2b", "jamba-v0.1"):
        other = load(name)
        assert state_bytes_per_seq(other, tp=1, engine=Engine.SGLANG) == state_bytes_per_seq(other, tp=1)
    # The pool an SGLang rank sets aside per running sequence follows (memory.pool_tokens_from_bytes).
    assert fixed_bytes_per_seq(m, KvDtype.AUTO, tp=1, pp=1, engine=Engine.SGLANG) == sglang
