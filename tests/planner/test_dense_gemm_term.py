"""The step model's dense linear layers from the engines' measured GEMM tables (issue #35 item 1, `measured_gemm`): each
layer's GEMMs at their shapes and weight format, summed per step; the roofline where no table covers the GPU or format."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from servingtopology.planner.engines import kernels
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import (
    PerfParams,
    dense_gemm_shapes,
    evaluate_step_s,
    measured_terms,
    padded_envelope,
    step_coefficients,
    token_terms,
)

LLAMA70 = resolve_model("meta-llama/Llama-3.1-70B")
ON = replace(PerfParams(), measured_gemm=1.0)
OFF = PerfParams()


def _coeffs(model, gpu: str, params: PerfParams, **kw):
    base = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=8.0, pp=1.0, dp=1.0, release="0.18.0")
    return step_coefficients(model, resolve_gpu(gpu), params=params, **(base | kw))


def test_a_llama_layer_is_its_four_projections_and_the_lm_head():
    shapes, why = dense_gemm_shapes(LLAMA70, Precision.FP8, 8)
    assert why == ""
    h, layers = LLAMA70.hidden_size, LLAMA70.num_layers
    q = LLAMA70.num_heads * LLAMA70.head_dim / 8
    kv = 2 * LLAMA70.head_dim * LLAMA70.num_kv_heads / 8
    # An unquantised checkpoint served in FP8: vLLM's online per-tensor FP8 for the layers, the LM head kept in BF16.
    assert shapes == (("fp8", q + kv, h, layers), ("fp8", h, q, layers), ("fp8", 2 * LLAMA70.intermediate_size / 8, h, layers),
                      ("fp8", h, LLAMA70.intermediate_size / 8, layers), ("bfloat16", LLAMA70.vocab_size / 8, h, 1.0))
    # KV heads replicate once TP exceeds them: each GPU still computes one K and one V head.
    wide, _ = dense_gemm_shapes(LLAMA70, Precision.BF16, 16)
    assert wide[0][1] == LLAMA70.num_heads * LLAMA70.head_dim / 16 + 2 * LLAMA70.head_dim


def test_the_step_prices_the_layers_from_the_table_at_its_tokens():
    on = _coeffs(LLAMA70, "h200_sxm", ON)
    shapes, _ = dense_gemm_shapes(LLAMA70, Precision.FP8, 8)
    grid = 2.0 ** np.arange(16)
    for tokens in (1.0, 4.0, 256.0, 8192.0):  # grid points: the interpolation returns the tables' own sum, each GEMM padded
        want = 0.0
        for dtype, n, k, calls in shapes:
            pieces = math.ceil(n / 65536)
            got = kernels.gemm_time_s("h200_sxm", "vllm", "0.18.0", dtype=dtype, m=grid, n=n / pieces, k=k)
            # the least time measured at these tokens or more (padded_envelope); past the table's last m in proportion
            measured = got.time_s[np.isfinite(got.time_s)]
            later = measured[int(np.log2(tokens)):]
            want += calls * pieces * float(later.min() if len(later) else measured[-1] * tokens / grid[len(measured) - 1])
        comm = on.tp_s_per_token * tokens + on.tp_fixed_s  # a dense model's token terms: linear time + the TP all-reduce
        assert float(token_terms(on, tokens)[0]) - comm == pytest.approx(want, rel=1e-9)
    # The tables' small-batch floors lie above the roofline's stream of the weights; large batches near it.
    assert _linear(on, 1.0) > _linear(replace(on, lin_log_curve=None), 1.0)


def _linear(c, tokens: float) -> float:
    """The linear time of `token_terms` (its total less the TP all-reduce it adds for a dense model)."""
    return float(token_terms(c, tokens)[0]) - (c.tp_s_per_token * tokens + c.tp_fixed_s)


def test_where_no_table_covers_the_gpu_or_the_switch_is_off_the_roofline_stays():
    for gpu in ("mi300x", "a100_40gb"):  # no GEMM tables for these GPUs
        on, off = _coeffs(LLAMA70, gpu, ON), _coeffs(LLAMA70, gpu, OFF)
        assert on.lin_log_curve is None
        assert float(token_terms(on, 64.0)[0]) == float(token_terms(off, 64.0)[0])
        assert measured_terms(resolve_gpu(gpu), Engine.VLLM, "0.18.0", 8, LLAMA70.hidden_size, ON, model=LLAMA70,
                              precision=Precision.FP8)["gemm"].startswith("roofline: ")
    assert _coeffs(LLAMA70, "h200_sxm", OFF).lin_log_curve is None
    # An engine known only by its overhead scale (TensorRT-LLM rows) has no tables of its own.
    assert _coeffs(LLAMA70, "h200_sxm", ON, overhead_scale=2.0).lin_log_curve is None


def test_measured_terms_name_the_gemm_tables_and_the_release_they_come_from():
    terms = measured_terms(resolve_gpu("h200_sxm"), Engine.VLLM, "0.18.0", 8, LLAMA70.hidden_size, ON, model=LLAMA70,
                           precision=Precision.FP8)
    assert terms["gemm"].startswith("vllm 0.24.0 on h200_sxm (nearest measured release to 0.18.0)") and "fp8" in terms["gemm"]
    assert "gemm" not in measured_terms(resolve_gpu("h200_sxm"), Engine.VLLM, "0.18.0", 8, LLAMA70.hidden_size, OFF, model=LLAMA70)


def test_a_block_scaled_checkpoint_takes_the_block_scaled_kernels_and_mxfp4_attention_stays_bf16():
    ds = resolve_model("deepseek-ai/DeepSeek-R1")
    shapes, why = dense_gemm_shapes(ds, Precision.FP8, 8)
    assert why == "" and {d for d, *_ in shapes[:4]} == {"fp8_block"}
    # MLA: the fused q_a/kv_a down-projection is replicated on every rank (its n is not divided by TP).
    assert shapes[0][1] == ds.q_lora_rank + ds.kv_lora_rank + ds.qk_rope_head_dim
    oss = resolve_model("openai/gpt-oss-120b")
    shapes, why = dense_gemm_shapes(oss, Precision.FP4, 1)
    assert why == "" and all(d == "bfloat16" for d, *_ in shapes)  # MXFP4 experts only; attention and the head in BF16


def test_steps_past_the_measured_tokens_grow_in_proportion():
    on = _coeffs(LLAMA70, "h200_sxm", ON)
    top = 2.0 ** 15
    lin = [_linear(on, t) for t in (top, 2 * top)]
    assert lin[1] == pytest.approx(2 * lin[0], rel=1e-9)
    # And a whole step stays finite and larger with more tokens.
    steps = [float(evaluate_step_s(on, prefill_tokens=t, prefill_pairs=t * t / 2, decode_tokens=0.0, decode_context_tokens=0.0))
             for t in (1024.0, 4096.0)]
    assert math.isfinite(steps[0]) and steps[1] > steps[0]


def test_a_deployments_gemm_and_weights_factors_move_the_measured_layers_as_they_move_the_rooflines():
    # A measured GEMM time mixes compute and weight streaming: "weights" moves a decode step's layers (weight-bound), "gemm"
    # a long prefill's (compute-bound), and the same factor on both moves every step by exactly that factor.
    on = _coeffs(LLAMA70, "h200_sxm", ON)

    def scaled(**f):
        return _coeffs(LLAMA70, "h200_sxm", replace(ON, step_scales=tuple(f.items())))

    for tokens in (1.0, 8192.0):
        assert _linear(scaled(gemm=1.3, weights=1.3), tokens) == pytest.approx(1.3 * _linear(on, tokens), rel=1e-9)
    decode, prefill = 1.0, 16384.0
    assert _linear(scaled(weights=2.0), decode) / _linear(on, decode) > 1.8
    assert _linear(scaled(weights=2.0), prefill) / _linear(on, prefill) < 1.35
    assert _linear(scaled(gemm=2.0), prefill) / _linear(on, prefill) > 1.8
    assert _linear(scaled(gemm=2.0), decode) / _linear(on, decode) < 1.35


def test_a_gemm_is_never_priced_above_what_padding_it_to_more_tokens_would_cost():
    # vLLM 0.24.0's B200 per-tensor FP8 table for n 8,192 × k 3,072 zig-zags at small m (25.7, 10.0, 17.2, 10.1 µs at 1, 2,
    # 4, 8 tokens): a kernel for 2 rows runs 1 row padded, so one token costs what two do.
    grid = 2.0 ** np.arange(16)
    raw = kernels.gemm_time_s("b200_sxm", "vllm", "0.19.0", dtype="fp8", m=grid, n=8192.0, k=3072.0).time_s
    assert raw[0] > 2.0 * raw[1]
    env = padded_envelope(raw)
    assert env[0] == raw[1] and env[2] == raw[3]
    assert (np.diff(env) >= 0).all() and (env <= raw).all()
    rising = np.array([1.0, 2.0, 2.0, 5.0])
    assert padded_envelope(rising).tolist() == rising.tolist()
    # The step's dense curve is non-decreasing in its tokens wherever a table covers it, though the tables' own sum for
    # Llama-3.1-70B's TP4 rank on B200 is not.
    raw_sum = np.zeros(12)
    for dtype, n, k, calls in dense_gemm_shapes(LLAMA70, Precision.FP8, 4)[0]:
        pieces = math.ceil(n / 65536)
        raw_sum += calls * pieces * kernels.gemm_time_s("b200_sxm", "vllm", "0.19.0", dtype=dtype, m=grid[:12], n=n / pieces, k=k).time_s
    assert (np.diff(raw_sum) < 0).any()
    for tp in (1.0, 4.0, 8.0):
        c = _coeffs(LLAMA70, "b200_sxm", ON, tp=tp, release="0.19.0")
        linear = [_linear(c, t) for t in grid[:12]]
        assert (np.diff(linear) >= 0).all()
