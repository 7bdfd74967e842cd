"""The step-time model: physics directions, array/scalar agreement, the fitted parameter file."""

import json
from dataclasses import fields, replace
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype, Parallelism
from servingtopology.planner.model.catalog import model_catalog, resolve_model
from servingtopology.planner.perf.step import InstancePerf, PerfParams, kv_transfer_s, perf_params, pinned_params, step_time_s

from .strategies import gpus, models

H200 = resolve_gpu("h200_sxm")
LLAMA70 = resolve_model("llama-3.1-70b")
DSV3 = resolve_model("deepseek-v3")


def _step(model=LLAMA70, gpu=H200, *, precision=Precision.BF16, tp=1, pp=1, dp=1, moe_ep=1, pre=0.0, pairs=0.0, dec=0.0, ctx=0.0,
          params=None):
    return float(step_time_s(model, gpu, precision=precision, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=tp, pp=pp, dp=dp,
                             prefill_tokens=pre, prefill_pairs=pairs, decode_tokens=dec, decode_context_tokens=ctx,
                             moe_ep=moe_ep, params=params))


def test_decode_step_grows_with_batch_and_with_context():
    small = _step(dec=4, ctx=4 * 1000)
    assert _step(dec=64, ctx=64 * 1000) > small
    assert _step(dec=4, ctx=4 * 8000) > small


def test_small_decode_batches_cost_about_one_weight_read():
    # Llama-3.1-70B BF16 on one H200: 141 GB of weights over 4.8 TB/s is ≥ 29 ms; overheads add a few ms, not 2×.
    t = _step(dec=1, ctx=1000)
    floor = 2 * 70e9 / 4.8e12
    assert floor < t < 2 * floor


def test_fp8_weights_make_memory_bound_decode_faster():
    assert _step(precision=Precision.FP8, dec=4, ctx=4000) < 0.7 * _step(precision=Precision.BF16, dec=4, ctx=4000)


def test_tensor_parallelism_speeds_decode_but_less_than_linearly():
    t1, t8 = _step(tp=1, dec=8, ctx=8000), _step(tp=8, dec=8, ctx=8000)
    assert t8 < t1 / 2
    assert t8 > t1 / 8


def test_prefill_is_compute_bound_and_scales_with_tokens():
    t4k, t8k = _step(pre=4096, pairs=4096 * 2048), _step(pre=8192, pairs=8192 * 4096)
    assert 1.8 < t8k / t4k < 2.6


def test_narrow_slices_cost_more_the_fewer_bits_the_weights_have():
    # Tiles are a fixed number of bytes deep, so a thin FP4 slice wastes more than a BF16 one of the same width:
    # the narrow-width penalty at TP8 (compute-bound prefill, no attention) is largest for FP4.
    b200 = resolve_gpu("b200_sxm")

    def penalty(precision):
        wide = _step(LLAMA70, b200, precision=precision, tp=8, pre=8192, params=PerfParams(narrow_width_cols=1e-9))
        thin = _step(LLAMA70, b200, precision=precision, tp=8, pre=8192, params=PerfParams(narrow_width_cols=64.0))
        return thin / wide

    assert penalty(Precision.FP4) > penalty(Precision.FP8) > penalty(Precision.BF16) > 1.0


def test_expert_parallel_all_to_all_costs_more_across_nodes():
    # DeepSeek-V3 at TP1 × DP8 with EP8: on one 8-GPU node dispatch/combine ride NVLink; on 4-GPU nodes, the NIC.
    one_node = resolve_gpu("b200_sxm")
    two_nodes = resolve_gpu("b200_sxm", gpus_per_node=4)
    args = dict(precision=Precision.FP8, tp=1, dp=8, moe_ep=8, dec=64, ctx=64 * 2000)
    assert _step(DSV3, two_nodes, **args) > _step(DSV3, one_node, **args)


def test_arrays_broadcast_over_candidates():
    tp = np.array([1, 2, 4, 8])
    out = step_time_s(LLAMA70, H200, precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=tp, pp=1, dp=1,
                      prefill_tokens=np.zeros(4), prefill_pairs=0.0, decode_tokens=16.0, decode_context_tokens=16000.0)
    assert out.shape == (4,)
    assert np.all(np.diff(out) < 0)


@settings(max_examples=40, deadline=None)
@given(model=models, gpu=gpus, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2]),
       pre=st.sampled_from([0, 1, 512, 8192]), dec=st.sampled_from([0, 1, 64, 256]), ctx=st.sampled_from([128, 4096]))
def test_instance_perf_agrees_with_the_array_formula(model, gpu, tp, pp, pre, dec, ctx):
    inst = InstancePerf(model, gpu, Precision.BF16, KvDtype.AUTO, Engine.SGLANG, Parallelism(tp=tp, pp=pp))
    scalar = inst.step_time_s(prefill_tokens=pre, prefill_pairs=pre * ctx, decode_tokens=dec, decode_context_tokens=dec * ctx)
    arr = step_time_s(model, gpu, precision=Precision.BF16, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG, tp=np.array([tp, tp]),
                      pp=np.array([pp, pp]), dp=1, prefill_tokens=np.array([pre, pre]), prefill_pairs=pre * ctx,
                      decode_tokens=dec, decode_context_tokens=dec * ctx)
    assert scalar > 0
    assert scalar == pytest.approx(float(arr[0]), rel=1e-9)


def test_kv_transfer_is_faster_inside_a_node():
    args = dict(kv_dtype=KvDtype.AUTO, tokens=8192)
    assert kv_transfer_s(LLAMA70, H200, same_node=True, **args) < kv_transfer_s(LLAMA70, H200, same_node=False, **args)


def test_fitted_parameter_file_records_its_provenance():
    raw = json.loads(resources.files("servingtopology.planner").joinpath("data/perf_params.json").read_text())
    for key in ("source", "commit", "fitted_at", "rows_used", "fit_error", "params"):
        assert key in raw
    assert set(raw["params"]) <= {f.name for f in fields(PerfParams)}
    assert perf_params().source == raw["source"]


def test_no_parameter_is_keyed_by_a_model_name():
    names = " ".join(f.name for f in fields(PerfParams)).lower()
    for mid, model in model_catalog().items():
        for token in {mid.lower(), model.name.lower().split("/")[-1]}:
            assert token not in names


def test_pinned_parameters_apply_inside_the_block_only():
    shipped = _step(dec=8, ctx=8 * 1000)
    slow = PerfParams(mem_eff=0.3, step_overhead_s=5e-3)
    with pinned_params(slow):
        assert perf_params() is slow
        assert _step(dec=8, ctx=8 * 1000) > shipped
    assert perf_params() is not slow and _step(dec=8, ctx=8 * 1000) == shipped


def test_the_expected_busiest_of_n_gpus_is_the_mean_plus_the_expected_maximum_of_n_normals():
    from servingtopology.planner.perf.step import _max_normal_z
    assert _max_normal_z(1) == 0.0
    assert float(_max_normal_z(8)) == pytest.approx(1.4236, abs=0.02)  # E[max of 8 standard normals]; Blom is within 0.02
    assert np.allclose(_max_normal_z(np.array([1, 2, 8, 8])), [0.0, _max_normal_z(2), _max_normal_z(8), _max_normal_z(8)])


def test_expert_parallel_decode_waits_for_the_gpu_that_drew_the_most_experts():
    from dataclasses import replace

    from servingtopology.planner.perf.step import evaluate_step_s, step_coefficients
    c = step_coefficients(DSV3, resolve_gpu("b200_sxm"), precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG,
                          tp=8, pp=1, dp=1, moe_ep=8)
    args = dict(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=4.0, decode_context_tokens=4 * 2048.0)
    balanced = float(evaluate_step_s(replace(c, ep_z=0.0), **args))
    busiest = float(evaluate_step_s(c, **args))
    assert busiest > balanced * 1.05
    # a long prefill spreads tokens evenly: the imbalance all but vanishes
    big = dict(prefill_tokens=8192.0, prefill_pairs=8192.0 * 4096, decode_tokens=0.0, decode_context_tokens=0.0)
    assert float(evaluate_step_s(c, **big)) == pytest.approx(float(evaluate_step_s(replace(c, ep_z=0.0), **big)), rel=0.03)


def test_a_measured_matmul_throughput_replaces_the_fitted_share_of_the_peak():
    from servingtopology.planner.perf.step import _gemm_eff
    p = PerfParams(gemm_eff_max=0.8)
    assert _gemm_eff(p, resolve_gpu("rtx_4090"), Precision.BF16) == pytest.approx(164.8 / 165)
    assert _gemm_eff(p, H200, Precision.BF16) == pytest.approx(0.8)
    # the card that reaches its whole peak prefills faster than the shared share would say
    llama8 = resolve_model("llama-3.1-8b")
    measured = _step(llama8, resolve_gpu("rtx_4090"), pre=2048.0, pairs=2048.0 * 1024)
    shared = _step(llama8, replace(resolve_gpu("rtx_4090"), matmul_bf16_tflops=0.0), pre=2048.0, pairs=2048.0 * 1024)
    assert measured < 0.85 * shared


def test_decode_rows_beside_a_prefill_chunk_reread_kv_where_the_gpu_says_so():
    from servingtopology.planner.perf.step import step_coefficients
    llama8 = resolve_model("llama-3.1-8b")

    def coeffs(gpu, model=llama8):
        return step_coefficients(model, gpu, precision=Precision.BF16, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1, pp=1, dp=1)
    c = coeffs(resolve_gpu("rtx_4090"))
    assert float(c.attn_mixed_ctx_s) == pytest.approx(float(c.attn_ctx_s) * 0.23 * (32 / 8 - 1))
    assert float(coeffs(H200).attn_mixed_ctx_s) == 0.0
    assert float(coeffs(resolve_gpu("rtx_pro_6000"), DSV3).attn_mixed_ctx_s) == 0.0  # MLA decode runs its own kernel
    gpu = resolve_gpu("rtx_4090")
    dec = dict(dec=32.0, ctx=32 * 2048.0)
    alone = _step(llama8, gpu, **dec) - _step(llama8, gpu)
    beside = _step(llama8, gpu, pre=16.0, pairs=16.0 * 8, **dec) - _step(llama8, gpu, pre=16.0, pairs=16.0 * 8)
    assert beside > alone * 1.2


def test_expert_parallel_under_tp_attention_exchanges_nothing_beyond_the_tp_all_reduce():
    # SGLang's and vLLM's EP without DP attention: every GPU holds every token, computes its local experts and the
    # outputs are summed by the same all-reduce TP experts use; no dispatch/combine. Under DP attention they exchange.
    from servingtopology.planner.perf.step import step_coefficients
    b200 = resolve_gpu("b200_sxm")

    def coeffs(dp, ep):
        return step_coefficients(DSV3, b200, precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG,
                                 tp=8 // dp, pp=1, dp=dp, moe_ep=ep)
    tp_experts, ep_experts = coeffs(1, 1), coeffs(1, 8)
    assert float(ep_experts.a2a_fixed_s) == 0.0 and float(ep_experts.a2a_s_per_token) == 0.0
    assert float(ep_experts.tp_fixed_s) == float(tp_experts.tp_fixed_s)
    assert float(ep_experts.tp_s_per_token) == float(tp_experts.tp_s_per_token)
    dp_ep = coeffs(8, 8)
    assert float(dp_ep.a2a_fixed_s) > 0.0 and float(dp_ep.a2a_s_per_token) > 0.0


def test_serial_per_sequence_cpu_is_paid_by_each_dp_ranks_own_engine():
    # `seq_serial_s`: CPU work per scheduled sequence that the GPU waits for, in the engine process that schedules it.
    # Plain TP's one engine pays it for every sequence; under attention DP each rank's engine for its own share only.
    b200 = resolve_gpu("b200_sxm")
    off = PerfParams(seq_serial_s=0.0)
    on = PerfParams(seq_serial_s=20e-6)
    n = 256.0
    tp = dict(precision=Precision.FP8, tp=8, dp=1, moe_ep=1, dec=n, ctx=n * 1500)
    dp = dict(precision=Precision.FP8, tp=1, dp=8, moe_ep=8, dec=n / 8, ctx=n / 8 * 1500)  # per-rank batch
    tp_extra = _step(DSV3, b200, params=on, **tp) - _step(DSV3, b200, params=off, **tp)
    dp_extra = _step(DSV3, b200, params=on, **dp) - _step(DSV3, b200, params=off, **dp)
    assert tp_extra == pytest.approx(20e-6 * n, rel=1e-9)
    assert dp_extra == pytest.approx(20e-6 * n / 8, rel=1e-9)
    # the scalar step model (the simulator's) adds the same: its decode probe and its full step agree with the formula
    inst = InstancePerf(DSV3, b200, Precision.FP8, KvDtype.AUTO, Engine.VLLM, Parallelism(tp=8), params=on)
    full = inst.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=n, decode_context_tokens=n * 1500)
    assert full == pytest.approx(_step(DSV3, b200, params=on, **tp), rel=1e-12)
    assert inst.decode_s(n, n * 1500) == full
    # SGLang's overlap scheduler hides its CPU work: the term is vLLM's
    sglang = [float(step_time_s(DSV3, b200, precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG, tp=8, pp=1, dp=1,
                                prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=n, decode_context_tokens=n * 1500, params=p))
              for p in (off, on)]
    assert sglang[0] == sglang[1]
