"""Layer kinds the reader had not met before session 15, read from public config.json files (sources in
tests/planner/data/model_configs/README.md). Expected values are spelt out from each config's own numbers with the
engine's rule, named in each test (vLLM model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator and
MambaStateDtypeCalculator; v1 kv_cache_interface MLAAttentionSpec, FullAttentionSpec), or taken from the published
totals; never read back from the planner. docs/models.md holds the table."""

import pytest

from servingtopology.planner.arch import StateKind
from servingtopology.planner.layout import KvDtype
from servingtopology.planner.memory import kv_bytes_per_token, state_bytes_per_seq
from servingtopology.planner.model import from_hf_config
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
