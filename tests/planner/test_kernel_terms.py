"""The step model's measured terms (issue #24): the TP all-reduce from the engines' measured custom all-reduce tables
where they cover the GPU, engine and group, the fitted roofline elsewhere; and which terms came from where."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from servingtopology.planner.engines import kernels
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import PerfParams, fabric_table_gpu, measured_allreduce, measured_terms, step_coefficients

LLAMA70 = resolve_model("meta-llama/Llama-3.1-70B")
ON = replace(PerfParams(), measured_allreduce=1.0)
OFF = replace(PerfParams(), measured_allreduce=0.0)


def _coeffs(gpu: str, params: PerfParams, **kw):
    base = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=np.array([1.0, 2.0, 4.0, 8.0]), pp=1.0, dp=1.0)
    return step_coefficients(LLAMA70, resolve_gpu(gpu), params=params, **(base | kw))


def test_the_measured_allreduce_prices_each_tp_group_from_the_table():
    c = _coeffs("h100_sxm", ON, release="0.14.0")
    reduces = 2.0 * LLAMA70.num_layers
    for i, n in enumerate((2, 4, 8), start=1):
        one_token = kernels.allreduce_s("h100_sxm", "vllm", "0.14.0", gpus=np.array([n]), message_bytes=np.array([LLAMA70.hidden_size * 2.0]))
        assert c.tp_fixed_s[i] == pytest.approx(reduces * float(one_token.time_s[0]), rel=1e-9)
        assert c.tp_s_per_token[i] > 0
    assert c.tp_fixed_s[0] == 0.0 and c.tp_s_per_token[0] == 0.0  # TP1 reduces nothing
    # A larger group costs more per all-reduce, as measured.
    assert c.tp_fixed_s[1] < c.tp_fixed_s[2] < c.tp_fixed_s[3]


def test_without_tables_the_roofline_line_stays():
    on, off = _coeffs("mi300x", ON), _coeffs("mi300x", OFF)  # no MI300X tables
    assert np.array_equal(on.tp_fixed_s, off.tp_fixed_s) and np.array_equal(on.tp_s_per_token, off.tp_s_per_token)
    # TensorRT-LLM rows (an engine given only by its overhead scale) keep the roofline on a covered GPU too.
    trt_on, trt_off = _coeffs("h100_sxm", ON, overhead_scale=2.0), _coeffs("h100_sxm", OFF, overhead_scale=2.0)
    assert np.array_equal(trt_on.tp_fixed_s, trt_off.tp_fixed_s)
    # The switch off: the fitted line, whatever the tables hold.
    assert not np.array_equal(_coeffs("h100_sxm", OFF).tp_fixed_s, _coeffs("h100_sxm", ON).tp_fixed_s)


def test_groups_beyond_a_node_or_over_pcie_are_not_priced_from_one_node_tables():
    fixed, per_tok = measured_allreduce(resolve_gpu("h100_sxm"), Engine.VLLM, None, np.array([16.0]), LLAMA70.hidden_size)
    assert math.isnan(fixed[0]) and math.isnan(per_tok[0])
    fixed, _ = measured_allreduce(resolve_gpu("l40s"), Engine.VLLM, None, np.array([2.0]), LLAMA70.hidden_size)
    assert math.isnan(fixed[0])


def test_measured_terms_name_their_table_and_the_nearest_release():
    terms = measured_terms(resolve_gpu("h200_sxm"), Engine.SGLANG, "0.5.1.post1", 4, LLAMA70.hidden_size, params=ON)
    assert "tp_allreduce" in terms and "sglang" in terms["tp_allreduce"] and "nearest measured release to 0.5.1.post1" in terms["tp_allreduce"]
    assert measured_terms(resolve_gpu("h200_sxm"), Engine.SGLANG, None, 4, LLAMA70.hidden_size, params=OFF) == {}
    assert measured_terms(resolve_gpu("mi300x"), Engine.VLLM, None, 4, LLAMA70.hidden_size, params=ON) == {}


def test_the_decision_record_names_the_measured_terms_of_the_chosen_layout():
    from servingtopology.planner.layout import Layout, LayoutKind, Parallelism, Role, RoleLayout
    from servingtopology.planner.perf.step import pinned_params
    from servingtopology.planner.problem import Problem
    from servingtopology.planner.search.record import step_terms_line
    from servingtopology.planner.workload import LengthDist, Slo, Workload

    problem = Problem(model=LLAMA70, gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16, max_gpus=8,
                      engine_version="0.33.0", workload=Workload(input_tokens=LengthDist.fixed(1000), output_tokens=LengthDist.fixed(100),
                                                                  arrival_rate_rps=1.0), slo=Slo(ttft_ms=2000.0, tpot_ms=100.0))
    tp4 = Layout(kind=LayoutKind.REPLICAS, roles={Role.AGGREGATED: RoleLayout(count=2, parallelism=Parallelism(tp=4))})
    with pinned_params(ON):
        line = step_terms_line(problem, tp4)
    assert "tp_allreduce measured (vllm 0.24.0 on h100_sxm (nearest measured release to 0.33.0))" in line
    with pinned_params(OFF):
        assert "every term from the roofline" in step_terms_line(problem, tp4)


def _deepseek():
    from servingtopology.cli.validate import _resolve_model
    from tests.groundtruth import GROUNDTRUTH

    return _resolve_model("deepseek-ai/DeepSeek-V3", GROUNDTRUTH / "models")


def test_the_measured_moe_term_reads_the_fused_moe_table_at_the_tokens_each_gpu_computes():
    from servingtopology.planner.perf.step import _moe_table_s

    ds = _deepseek()
    on = replace(PerfParams(), measured_moe=1.0)
    c = step_coefficients(ds, resolve_gpu("h200_sxm"), precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG,
                          tp=np.array([8.0, 1.0]), pp=1.0, dp=np.array([1.0, 8.0]), moe_ep=np.array([1.0, 8.0]), params=on, release="0.5.10")
    assert c.moe_log_curve is not None and np.isfinite(c.moe_log_curve.dense()[:, :12]).all()  # 1 … 2,048 tokens measured
    # TP8 experts at 64 tokens: the table's TP8 row at 64 tokens, times the MoE layers.
    one_layer = kernels.moe_s("h200_sxm", "sglang", "0.5.10", dtype="fp8_block", hidden=ds.hidden_size, inter=ds.moe_intermediate_size,
                              topk=ds.experts_per_token, experts=ds.num_experts, moe_tp=8, moe_ep=1, tokens=np.array([64.0]))
    got = _moe_table_s(c.moe_log_curve, np.array([64.0, 64.0]))
    assert got[0] == pytest.approx(ds.num_moe_layers * float(one_layer.time_s[0]), rel=1e-6)
    # Past the measured grid the roofline stays (NaN from the table).
    assert np.isnan(_moe_table_s(c.moe_log_curve, np.array([1e6, 1e6]))).all()


def test_moe_tables_stay_off_without_the_switch_and_for_dense_models_and_uncovered_gpus():
    ds = _deepseek()
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=8.0, pp=1.0, dp=1.0)
    assert step_coefficients(ds, resolve_gpu("h200_sxm"), params=OFF, **kw).moe_log_curve is None
    assert step_coefficients(LLAMA70, resolve_gpu("h200_sxm"), params=replace(OFF, measured_moe=1.0), **kw).moe_log_curve is None
    assert step_coefficients(ds, resolve_gpu("mi300x"), params=replace(OFF, measured_moe=1.0), **kw).moe_log_curve is None
    terms = measured_terms(resolve_gpu("h200_sxm"), Engine.VLLM, None, 8, ds.hidden_size, params=replace(OFF, measured_moe=1.0),
                           model=ds, moe_precision=Precision.FP8)
    assert "moe" in terms and "fp8_block" in terms["moe"]


@pytest.mark.parametrize("params", [OFF, replace(OFF, measured_moe=1.0, measured_allreduce=1.0)])
def test_one_instance_steps_with_and_without_the_measured_terms(params):
    from servingtopology.planner.layout import Parallelism
    from servingtopology.planner.perf.step import InstancePerf, pinned_params

    ds = _deepseek()
    with pinned_params(params):
        inst = InstancePerf(ds, resolve_gpu("h200_sxm"), Precision.FP8, KvDtype.AUTO, Engine.SGLANG, Parallelism(tp=8))
        t = inst.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=32.0, decode_context_tokens=32 * 2000.0)
        arr = step_coefficients(ds, resolve_gpu("h200_sxm"), precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG,
                                tp=np.array([8.0]), pp=1.0, dp=1.0, params=params)
    from servingtopology.planner.perf.step import evaluate_step_s
    vec = evaluate_step_s(arr, prefill_tokens=np.array([0.0]), prefill_pairs=np.array([0.0]), decode_tokens=np.array([32.0]),
                          decode_context_tokens=np.array([64000.0]))
    assert math.isfinite(t) and t == pytest.approx(float(vec[0]), rel=1e-9)


def _minimax():
    from servingtopology.cli.validate import _resolve_model
    from tests.groundtruth import GROUNDTRUTH

    return _resolve_model("MiniMaxAI/MiniMax-M2.5", GROUNDTRUTH / "models")


def test_an_expert_sliced_over_tp_streams_at_the_cost_of_whole_experts_as_the_fused_moe_tables_measure():
    # The tables time an expert sliced over n GPUs as fast as n GPUs holding whole experts (balanced routing), so the
    # roofline charges no narrow-slice penalty to MoE TP: TP4's weight time per expert is a quarter of TP1's.
    ds = _deepseek()
    c = step_coefficients(ds, resolve_gpu("h200_sxm"), precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM,
                          tp=np.array([1.0, 4.0, 8.0]), pp=1.0, dp=1.0, params=OFF)
    assert c.moe_mem_s[1] == pytest.approx(c.moe_mem_s[0] / 4, rel=1e-12)
    assert c.moe_mem_s[2] == pytest.approx(c.moe_mem_s[0] / 8, rel=1e-12)
    assert c.moe_flop_s[2] == pytest.approx(c.moe_flop_s[0] / 8, rel=1e-12)


@pytest.mark.parametrize("tokens", [4.0, 16.0, 64.0, 256.0])
def test_tp_with_expert_parallelism_decodes_slower_than_plain_tp_on_the_same_gpus(tokens):
    # Under EP each GPU holds E / ep whole experts and the step waits for the busiest one (more distinct experts hit, more
    # routed pairs than the mean); plain TP spreads every expert's work evenly. MiniMax-M2.5 on B200, vLLM, TP attention:
    # measured 4-5 % slower with EP at 16-64 clients (silicon_minimax_m25.csv, 0.19.0); predicted faster before the
    # expert width stopped depending on the MoE TP.
    from servingtopology.planner.perf.step import step_time_s

    mm = _minimax()
    t = step_time_s(mm, resolve_gpu("b200_sxm"), precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM,
                    tp=np.array([4.0, 4.0]), pp=1.0, dp=1.0, moe_ep=np.array([1.0, 4.0]), prefill_tokens=np.zeros(2),
                    prefill_pairs=0.0, decode_tokens=tokens, decode_context_tokens=tokens * 1500.0, params=OFF)
    assert t[1] > t[0]


def test_vllm_moe_tables_are_read_at_every_token_the_rank_sees_and_sglangs_at_its_dispatched_share():
    mm = _minimax()
    on = replace(OFF, measured_moe=1.0)
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, tp=np.array([4.0, 4.0]), pp=1.0, dp=1.0,
              moe_ep=np.array([1.0, 4.0]), params=on)
    vllm = step_coefficients(mm, resolve_gpu("b200_sxm"), engine=Engine.VLLM, release="0.19.0", **kw)
    sglang = step_coefficients(mm, resolve_gpu("h200_sxm"), engine=Engine.SGLANG, release="0.5.10", **kw)
    assert np.all(vllm.moe_table_share == 1.0)
    assert np.allclose(sglang.moe_table_share, [1.0, 0.25])


def test_the_dp_exchange_of_an_expert_parallel_layer_is_nccls_all_gather_and_reduce_scatter():
    # Attention DP 4 with EP 4 on one H200 node: per MoE layer an all-gather of the four ranks' BF16 activations and a
    # reduce-scatter of the outputs, timed from NCCL's tables at one token a rank; the fitted exchange latency is not used.
    mm = _minimax()
    gpu = resolve_gpu("h200_sxm")
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1.0, pp=1.0, dp=4.0, moe_ep=4.0)
    on = step_coefficients(mm, gpu, params=replace(PerfParams(), a2a_latency_s=1e-3), **kw)
    off = step_coefficients(mm, gpu, params=replace(PerfParams(), a2a_latency_s=1e-3, measured_exchange=0.0), **kw)
    nbytes = np.array([4.0 * mm.hidden_size * 2.0])
    one = sum(float(kernels.nccl_s("h200_sxm", op=op, gpus=np.array([4.0]), message_bytes=nbytes).time_s[0])
              for op in ("all_gather", "reduce_scatter"))
    assert float(on.a2a_fixed_s) == pytest.approx(mm.num_moe_layers * one, rel=1e-9)
    assert float(off.a2a_fixed_s) == pytest.approx(mm.num_moe_layers * 2.0 * 1e-3, rel=1e-9)
    assert measured_terms(gpu, Engine.VLLM, "0.19.0", 1, mm.hidden_size, model=mm, dp=4, moe_ep=4)["dp_exchange"].startswith("nccl")


@pytest.mark.parametrize(("gpu", "dp", "ep"), [
    ("mi300x", 4.0, 4.0),     # NCCL was not measured on it nor on another GPU of its fabric
    ("h200_sxm", 4.0, 1.0),   # DP without EP: experts sharded over every GPU, another exchange
    ("h200_sxm", 1.0, 4.0),   # EP under TP attention: no exchange of its own
])
def test_the_fitted_exchange_stays_where_no_nccl_table_times_it(gpu, dp, ep):
    mm = _minimax()
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1.0 if dp > 1 else 4.0, pp=1.0, dp=dp, moe_ep=ep)
    on = step_coefficients(mm, resolve_gpu(gpu), params=PerfParams(), **kw)
    off = step_coefficients(mm, resolve_gpu(gpu), params=replace(PerfParams(), measured_exchange=0.0), **kw)
    assert float(on.a2a_fixed_s) == float(off.a2a_fixed_s) and float(on.a2a_s_per_token) == float(off.a2a_s_per_token)



@pytest.mark.parametrize(("gpu", "twin"), [
    ("a100_40gb", "a100_sxm"),  # never measured; the A100-80GB's NVLink 3 switch board: 300 GB/s a direction, 8 GPUs a node
    ("b200_sxm", "b200_sxm"),  # measured itself
    ("h100_sxm", "h100_sxm"),
    ("gb200", "gb200"),        # a 72-GPU NVLink domain, measured itself
    ("mi300x", "mi300x"),      # Infinity Fabric at 448 GB/s: no measured GPU shares that fabric
    ("l40s", "l40s"),          # PCIe: no NVLink fabric to share
])
def test_communication_tables_of_an_unmeasured_gpu_are_its_nvlink_fabrics(gpu, twin):
    assert fabric_table_gpu(gpu) == twin


def test_an_unmeasured_gpus_dp_exchange_and_all_reduce_are_its_fabric_twins_measured_ones():
    # The A100-40GB was never measured; it shares the A100-80GB's NVLink switch board, so its DP4·EP4 exchange and its TP
    # all-reduce are the A100-80GB's measured ones, not the fitted 2 × a2a_latency_s a layer. (B300 took B200's so until
    # stop 57 generated its own tables.)
    mm = _minimax()
    dp_kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1.0, pp=1.0, dp=4.0, moe_ep=4.0)
    small = step_coefficients(mm, resolve_gpu("a100_40gb"), params=replace(PerfParams(), a2a_latency_s=1e-3), **dp_kw)
    big = step_coefficients(mm, resolve_gpu("a100_sxm"), params=replace(PerfParams(), a2a_latency_s=1e-3), **dp_kw)
    assert float(small.a2a_fixed_s) == float(big.a2a_fixed_s) < mm.num_moe_layers * 2.0 * 1e-3
    assert float(small.a2a_s_per_token) == float(big.a2a_s_per_token)
    tp_kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=4.0, pp=1.0, dp=1.0, release="0.19.0")
    on = replace(PerfParams(), measured_allreduce=1.0)
    assert float(step_coefficients(mm, resolve_gpu("a100_40gb"), params=on, **tp_kw).tp_fixed_s) \
        == float(step_coefficients(mm, resolve_gpu("a100_sxm"), params=on, **tp_kw).tp_fixed_s)
    terms = measured_terms(resolve_gpu("a100_40gb"), Engine.VLLM, "0.19.0", 4, mm.hidden_size, on)
    assert terms["tp_allreduce"].endswith("on a100_sxm (nearest measured release to 0.19.0)")


def test_sglangs_dp_exchange_under_expert_parallelism_is_deepeps_low_latency_all_to_all():
    # SGLang's wide-EP decode (DeepSeek on GB300, attention DP 32 with EP 32 in one NVL72 rack): per MoE layer DeepEP's
    # low-latency dispatch and combine, a line through the measured table at 1 and 1,024 tokens a rank. The fitted
    # exchange (here 1 ms a call, twice a layer) is not used. vLLM keeps NCCL's all-gather and reduce-scatter, measured on
    # GB300 over the 4 GPUs of a tray.
    ds = _deepseek()
    gpu = resolve_gpu("gb300")
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG, tp=1.0, pp=1.0, dp=32.0, moe_ep=32.0,
              release="0.5.8.post1")
    on = step_coefficients(ds, gpu, params=replace(PerfParams(), a2a_latency_s=1e-3), **kw)
    off = step_coefficients(ds, gpu, params=replace(PerfParams(), a2a_latency_s=1e-3, measured_exchange=0.0), **kw)
    t = kernels.deepep_s("gb300", "0.5.8.post1", low_latency=True, topk=ds.experts_per_token, experts=ds.num_experts,
                         hidden=float(ds.hidden_size), tokens=np.array([1.0, 1024.0]))
    assert t.source is not None and t.source.version == "0.5.12"  # the nearest measured release
    lo, hi = (float(x) for x in t.time_s)
    assert 20e-6 < lo < hi < 1e-3  # tens of µs at one token, a few hundred at 1,024
    assert float(on.a2a_fixed_s) == pytest.approx(ds.num_moe_layers * lo, rel=1e-9)
    assert float(on.a2a_s_per_token) == pytest.approx(ds.num_moe_layers * (hi - lo) / 1023.0, rel=1e-9)
    assert float(off.a2a_fixed_s) == pytest.approx(ds.num_moe_layers * 2.0 * 1e-3, rel=1e-9)
    terms = measured_terms(gpu, Engine.SGLANG, "0.5.8.post1", 1, ds.hidden_size, model=ds, dp=32, moe_ep=32)
    assert terms["dp_exchange"] == "DeepEP low-latency dispatch + combine, sglang 0.5.12 on gb300 (nearest measured release to 0.5.8.post1)"
    assert measured_terms(gpu, Engine.VLLM, None, 1, ds.hidden_size, model=ds, dp=4, moe_ep=4)["dp_exchange"].startswith("nccl")
    assert "dp_exchange" not in measured_terms(gpu, Engine.VLLM, None, 1, ds.hidden_size, model=ds, dp=32, moe_ep=32)


def test_deepeps_table_covers_measured_routing_shapes_only_and_grows_with_tokens():
    ll = kernels.deepep_s("b200_sxm", None, low_latency=True, topk=8, experts=256, hidden=7168.0, tokens=np.array([1.0, 64.0, 1024.0]))
    normal = kernels.deepep_s("b200_sxm", None, low_latency=False, topk=8, experts=256, hidden=7168.0, tokens=np.array([1.0, 8192.0]))
    assert np.all(np.diff(ll.time_s) > 0) and np.all(np.diff(normal.time_s) > 0)
    assert float(normal.time_s[0]) > float(ll.time_s[0])  # the normal kernels' fixed cost is the larger
    # A hidden size between measured ones interpolates (MiniMax-M2.5's 3,072 between 2,048 and 4,096, top-8 of 256) ...
    mid = kernels.deepep_s("gb300", None, low_latency=True, topk=8, experts=256, hidden=np.array([2048.0, 3072.0, 4096.0]), tokens=64.0)
    assert mid.time_s[0] < mid.time_s[1] < mid.time_s[2]
    # ... a routing shape never measured (gpt-oss-120b: top-4 of 128) is not priced, so the fitted exchange stays.
    gpt = resolve_model("openai/gpt-oss-120b")
    assert math.isnan(float(kernels.deepep_s("gb300", None, low_latency=True, topk=4, experts=128, hidden=2880.0, tokens=8.0).time_s))
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG, tp=1.0, pp=1.0, dp=4.0, moe_ep=4.0)
    on = step_coefficients(gpt, resolve_gpu("gb300"), params=PerfParams(), **kw)
    off = step_coefficients(gpt, resolve_gpu("gb300"), params=replace(PerfParams(), measured_exchange=0.0), **kw)
    assert float(on.a2a_fixed_s) == float(off.a2a_fixed_s)


def test_sglang_keeps_its_default_exchange_where_deepep_cannot_run_and_renders_deepep_where_it_prices_it():
    # DeepEP takes the EP size from the TP size: experts over 2 of 4 attention-DP GPUs (--ep-size 2) keep SGLang's default
    # exchange, priced like vLLM's all-gather and reduce-scatter from NCCL; over all 4, DeepEP. The arguments the operator
    # renders say the same (`sglang_deepep`, one rule).
    from servingtopology.planner.engines.args import engine_args, sglang_deepep
    from servingtopology.planner.layout import Parallelism, Role, RoleLayout

    ds = _deepseek()
    gpu = resolve_gpu("h200_sxm")
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, tp=1.0, pp=1.0, dp=4.0)
    partial = step_coefficients(ds, gpu, engine=Engine.SGLANG, moe_ep=2.0, params=PerfParams(), **kw)
    vllm_partial = step_coefficients(ds, gpu, engine=Engine.VLLM, moe_ep=2.0, params=PerfParams(), **kw)
    full = step_coefficients(ds, gpu, engine=Engine.SGLANG, moe_ep=4.0, params=PerfParams(), **kw)
    assert float(partial.a2a_fixed_s) == float(vllm_partial.a2a_fixed_s)
    assert float(full.a2a_fixed_s) != float(partial.a2a_fixed_s)
    assert sglang_deepep(1, 4, 4, "h200_sxm") and not sglang_deepep(1, 4, 2, "h200_sxm") and not sglang_deepep(4, 1, 4, "h200_sxm")
    assert list(sglang_deepep(np.array([1.0, 1.0]), np.array([4.0, 4.0]), np.array([4.0, 2.0]), "h200_sxm")) == [True, False]
    # A GPU kind DeepEP was never measured on (A100) keeps the default exchange, in the arguments and in the price.
    assert not sglang_deepep(1, 4, 4, "a100_sxm")
    a100 = [step_coefficients(ds, resolve_gpu("a100_sxm"), engine=e, moe_ep=4.0, params=PerfParams(), **kw) for e in (Engine.SGLANG, Engine.VLLM)]
    assert float(a100[0].a2a_fixed_s) == float(a100[1].a2a_fixed_s)

    def args(par, gpu="h200_sxm"):
        return engine_args(Engine.SGLANG, Role.DECODE, RoleLayout(1, par), precision=Precision.FP8, moe=True, gpu=gpu)
    full_args = args(Parallelism.with_ep(tp=1, dp=4, ep=4))
    assert full_args[full_args.index("--moe-a2a-backend") + 1] == "deepep"
    assert "--moe-a2a-backend" not in args(Parallelism.with_ep(tp=1, dp=4, ep=2))
    assert "--moe-a2a-backend" not in args(Parallelism.with_ep(tp=4, ep=4))  # EP under TP attention: no exchange of its own
    assert "--moe-a2a-backend" not in args(Parallelism.with_ep(tp=1, dp=4, ep=4), gpu="a100_sxm")
    assert "--moe-a2a-backend" not in args(Parallelism.with_ep(tp=1, dp=4, ep=4), gpu="")  # GPU kind not known
