"""Which measured fused-MoE table may time a step's routed experts (issue #35): only the kernel the engine runs
(vLLM's MXFP4 backend per GPU), only the release that ran or a neighbour timing the same kernel, only where the
row's release was recorded; and the table's own rank (the collector's deterministic balanced routing) rescaled to
the step's busiest rank, not counted twice."""

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
    ROOFLINE_PREFIX,
    PerfParams,
    measured_terms,
    moe_format,
    moe_kernel_variants,
    moe_latency_scale,
    step_coefficients,
    step_geometry,
    token_terms,
)

ON = replace(PerfParams(), measured_moe=1.0, measured_allreduce=0.0)
GPT_OSS = resolve_model("openai/gpt-oss-120b")


def _minimax():
    from servingtopology.cli.validate import _resolve_model
    from tests.groundtruth import GROUNDTRUTH

    return _resolve_model("MiniMaxAI/MiniMax-M2.5", GROUNDTRUTH / "models")


def _gpt_oss_terms(gpu: str, engine: Engine, release: str | None) -> str:
    return measured_terms(resolve_gpu(gpu), engine, release, 1, GPT_OSS.hidden_size, ON, model=GPT_OSS,
                          moe_precision=Precision.FP4)["moe"]


# ---------------------------------------------------------------- MXFP4: the backend vLLM runs
@pytest.mark.parametrize(("gpu", "kernel"), [
    ("h100_sxm", "triton_oaitritonmxfp4experts"),   # SM90: OAI Triton kernels
    ("h200_sxm", "triton_oaitritonmxfp4experts"),
    ("b200_sxm", "flashinfer_trtllm_mxfp4_bf16"),   # SM100: FlashInfer TRT-LLM, BF16 activations
    ("b300_sxm", "flashinfer_trtllm_mxfp4_bf16"),   # SM103, the same family (no table of its own)
])
def test_gpt_oss_experts_are_looked_up_as_the_mxfp4_backend_vllm_selects_on_the_gpu(gpu, kernel):
    assert moe_kernel_variants(GPT_OSS, resolve_gpu(gpu), "vllm", Precision.FP4) == ((("w4a16_mxfp4", kernel),), "")


def test_the_newest_tables_time_vllms_own_mxfp4_backend_and_name_it():
    assert _gpt_oss_terms("h200_sxm", Engine.VLLM, None) == "vllm 0.24.0 on h200_sxm, w4a16_mxfp4"
    assert _gpt_oss_terms("b200_sxm", Engine.VLLM, None) == "vllm 0.24.0 on b200_sxm, w4a16_mxfp4"


@pytest.mark.parametrize("gpu", ["h200_sxm", "b200_sxm"])
def test_vllm_0_19_mxfp4_tables_name_no_backend_and_leave_the_roofline(gpu):
    # "vllm_mxfp4_moe" names no backend, and its EP2 rows equal its EP1 rows (the expert map not applied): on H200 its
    # 36 layers at 32 tokens took 23.8 ms against a whole measured step of 16.15 ms. Before, this table priced gpt-oss.
    terms = _gpt_oss_terms(gpu, Engine.VLLM, "0.19.0")
    assert terms.startswith(ROOFLINE_PREFIX) and "vllm_mxfp4_moe" in terms, terms
    got = kernels.moe_s(gpu, "vllm", "0.19.0", dtype="w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=128, moe_tp=1,
                        moe_ep=1, tokens=np.array([8.0]), kernel="flashinfer_trtllm_mxfp4_bf16")
    assert got.source is None and np.isnan(got.time_s).all()


def test_sglang_mxfp4_experts_keep_the_roofline_and_say_why():
    terms = _gpt_oss_terms("h200_sxm", Engine.SGLANG, None)
    assert terms.startswith(ROOFLINE_PREFIX) and "sglang" in terms


def test_a_configuration_row_is_taken_only_with_the_kernel_that_timed_it():
    # vLLM 0.24.0's w4a16_mxfp4 table on H200 mixes gpt-oss's Triton rows and compressed-tensors' Marlin rows (another
    # model's shape); asking the gpt-oss shape for Marlin finds nothing.
    kw = dict(dtype="w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=128, moe_tp=1, moe_ep=1, tokens=np.array([8.0]))
    assert np.isfinite(kernels.moe_s("h200_sxm", "vllm", "0.24.0", kernel="oaitritonmxfp4experts", **kw).time_s).all()
    marlin = kernels.moe_s("h200_sxm", "vllm", "0.24.0", kernel="marlin", **kw)
    assert marlin.source is None and "oaitritonmxfp4experts" in marlin.reason


# ---------------------------------------------------------------- releases: the one that ran, or the same kernel
@pytest.mark.parametrize(("gpu", "engine", "release", "dtype", "chosen"), [
    ("b200_sxm", "vllm", "0.19.0", "fp8_block", "0.19.0"),      # measured itself
    ("b200_sxm", "vllm", "0.20.0", "fp8_block", "0.19.0"),      # between 0.19.0 and 0.22.0, which time the same kernel
    ("b200_sxm", "vllm", "0.21.0", "fp8_block", "0.22.0"),      # ... the nearer of the two
    ("b200_sxm", "vllm", "0.23.0", "fp8_block", None),          # between 0.22.0 and 0.24.0: the backend changed
    ("b200_sxm", "vllm", "0.17.0", "fp8_block", None),          # older than any measured release: kernel unknown
    ("b200_sxm", "vllm", "0.26.0", "fp8_block", None),          # newer than any
    ("h200_sxm", "sglang", "0.5.9", "fp8_block", None),         # was priced by 0.5.10's table before
    ("h200_sxm", "sglang", "0.5.10.post1", "fp8_block", "0.5.10"),  # a post release of a measured one
    ("h200_sxm", "sglang", "0.5.12", "fp8_block", None),        # 0.5.10 and 0.5.14 disagree
    ("b200_sxm", "vllm", "nightly-5b8c30d62b754b57", "nvfp4", None),  # not a numbered release
    ("h200_sxm", "vllm", None, "fp8_block", "0.24.0"),          # no release named: a plan for a fresh deployment
])
def test_a_moe_table_comes_from_the_release_that_ran_or_a_neighbour_with_the_same_kernel(gpu, engine, release, dtype, chosen):
    got = kernels.moe_release(gpu, engine, release, dtype=dtype)
    assert got.version == chosen, got.reason
    assert got.reason


@pytest.mark.parametrize(("gpu", "a", "b", "dtype", "same"), [
    ("b200_sxm", "0.19.0", "0.22.0", "fp8_block", True),   # Triton fused_moe in both: 90th percentile 6 %
    ("b200_sxm", "0.19.0", "0.22.0", "bfloat16", True),
    ("b200_sxm", "0.22.0", "0.24.0", "fp8_block", False),  # FlashInfer TRT-LLM in 0.24.0: 90th percentile 113 %
    ("h200_sxm", "0.19.0", "0.24.0", "w4a16_mxfp4", False),
    ("h200_sxm", "0.19.0", "0.24.0", "fp8", False),
])
def test_two_releases_time_the_same_kernel_where_their_tables_agree(gpu, a, b, dtype, same):
    assert kernels.same_moe_kernel(gpu, "vllm", a, b, dtype=dtype) is same


def test_a_release_past_a_kernel_change_takes_no_neighbours_table():
    # MiniMax-M2.5's FP8 experts on B200: a vLLM 0.23.0 row took the nearest measured release's table (0.24.0's
    # FlashInfer TRT-LLM kernel) before; 0.22.0 still ran Triton's fused_moe, so which one 0.23.0 ran is unknown.
    kw = dict(dtype="fp8_block", hidden=3072, inter=1536, topk=8, experts=256, moe_tp=1, moe_ep=4, tokens=np.array([16.0]))
    assert np.isfinite(kernels.moe_s("b200_sxm", "vllm", "0.19.0", **kw).time_s).all()
    later = kernels.moe_s("b200_sxm", "vllm", "0.23.0", **kw)
    assert later.source is None and np.isnan(later.time_s).all() and "different kernels" in later.reason


def test_a_row_whose_release_was_not_recorded_keeps_the_roofline_moe():
    # release None plans for the newest release; a measured row with no recorded release says nothing of its kernel.
    mm = _minimax()
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=4.0, pp=1.0, dp=1.0, moe_ep=4.0,
              release=None, tables_for=Engine.VLLM, table_moe=True)
    assert step_geometry(mm, resolve_gpu("b200_sxm"), **kw).moe_log_curve is not None
    assert step_geometry(mm, resolve_gpu("b200_sxm"), release_recorded=False, **kw).moe_log_curve is None


# ---------------------------------------------------------------- the table's rank and the step's busiest rank
def _balanced_rank0(tokens: int, experts: int, topk: int, ep: int) -> tuple[int, int]:
    """(routed pairs, distinct experts) of rank 0 of `ep` under the collector's deterministic balanced routing: token i
    takes experts i·s/T + j·s (T < s) or i + j·s (T ≥ s) modulo E, s = ceil(E / k); rank 0 holds experts 0 … E/ep − 1."""
    stride = math.ceil(experts / topk)
    local = experts // ep
    chosen = [int((i * stride / tokens if tokens < stride else i) + j * stride) % experts
              for i in range(tokens) for j in range(topk)]
    mine = [e for e in chosen if e < local]
    return len(mine), len(set(mine))


@pytest.mark.parametrize("tokens", [1, 4, 16, 32, 48, 64, 256])
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_the_tables_rank_computes_its_even_share_each_pair_on_its_own_expert(tokens, ep):
    # MiniMax-M2.5's shape (256 experts, top-8): what `table_rank_scale` takes the timed rank to be.
    pairs, distinct = _balanced_rank0(tokens, 256, 8, ep)
    even = tokens * 8 / ep
    assert pairs == pytest.approx(max(even, 1.0), abs=1.0)
    assert distinct == min(pairs, 256 // ep)


def test_the_measured_moe_term_rescales_the_tables_rank_to_the_busiest_rank():
    # B200 FP8 TP4·EP4 at 16 tokens: the table's rank reads 32 experts (16 × 8 / 4 pairs, each its own), more than the
    # busiest rank under random routing reads (about 29.5 of 64); the rule before scaled the table by busiest / mean
    # random rank (about 25.5 experts) on top, 1.26 times this.
    mm = _minimax()
    gpu = resolve_gpu("b200_sxm")
    kw = dict(precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=4.0, pp=1.0, dp=1.0, moe_ep=4.0, release="0.19.0")
    off = replace(ON, measured_moe=0.0)
    measured, _ = token_terms(step_coefficients(mm, gpu, params=ON, **kw), 16.0)
    roofline, _ = token_terms(step_coefficients(mm, gpu, params=off, **kw), 16.0)
    table = kernels.moe_s("b200_sxm", "vllm", "0.19.0", dtype="fp8_block", hidden=mm.hidden_size, inter=mm.moe_intermediate_size,
                          topk=mm.experts_per_token, experts=mm.num_experts, moe_tp=1, moe_ep=4, tokens=np.array([16.0]))
    table_s = mm.num_moe_layers * float(table.time_s[0])
    c = step_coefficients(mm, gpu, params=off, **kw)
    routed, k = 16.0, c.sharp
    hit = 1.0 - (1.0 - c.topk / c.experts) ** routed
    mean_active = c.local_experts * hit
    active = min(mean_active + c.ep_z * (mean_active * (1.0 - hit)) ** 0.5, c.local_experts)
    busiest = 1.0 + c.ep_z * (c.experts / c.local_experts - 1.0) ** 0.5 / (routed * c.topk) ** 0.5
    busy = ((c.moe_flop_s * (routed * busiest + c.gemm_half_tokens)) ** k + (c.moe_mem_s * active) ** k) ** (1.0 / k)
    pairs, distinct = _balanced_rank0(16, mm.num_experts, mm.experts_per_token, 4)
    assert (pairs, distinct) == (32, 32) and active < distinct
    timed = ((c.moe_flop_s * (routed + c.gemm_half_tokens)) ** k + (c.moe_mem_s * distinct) ** k) ** (1.0 / k)
    assert float(measured) - float(roofline) == pytest.approx(table_s * busy / timed - busy, rel=1e-9)
    # Against plain TP4 the EP rank is still the slower one, as measured (4-5 % at 16-64 clients).
    tp4, _ = token_terms(step_coefficients(mm, gpu, params=ON, **(kw | {"moe_ep": 1.0})), 16.0)
    assert float(measured) > float(tp4)


# ---------------------------------------------------------------- the roofline's fixed MoE cost (declared; off as shipped)
def test_the_declared_moe_layer_latency_adds_once_per_moe_layer_on_the_roofline_and_never_to_a_measured_table():
    model = _minimax()
    tokens = np.array([1.0, 16.0, 256.0])

    def moe_step(params: PerfParams, pp: int = 1) -> np.ndarray:
        c = step_coefficients(model, resolve_gpu("b200_sxm"), precision=Precision.FP8, kv_dtype=KvDtype.AUTO,
                              engine=Engine.VLLM, tp=4, pp=pp, dp=1, params=params, release="0.19.0")
        return np.asarray(token_terms(c, tokens)[0])

    off = replace(PerfParams(), measured_allreduce=0.0, moe_latency_by_format=0.0)  # every format the declared latency
    on = replace(off, moe_layer_latency_s=30e-6)
    assert off.moe_layer_latency_s == 0.0  # the default adds nothing
    # Every MoE layer of the stage pays it once a step, whatever the tokens; a stage holds 1/pp of the layers.
    assert moe_step(on) - moe_step(off) == pytest.approx(np.full(3, model.num_moe_layers * 30e-6), rel=1e-9)
    assert moe_step(on, pp=2) - moe_step(off, pp=2) == pytest.approx(np.full(3, model.num_moe_layers / 2 * 30e-6), rel=1e-9)
    # Where vLLM 0.19.0's B200 table prices the layer, its measured time already holds the fixed cost.
    assert moe_step(replace(on, measured_moe=1.0)) == pytest.approx(moe_step(replace(off, measured_moe=1.0)), rel=1e-12)
    # A dense model has no MoE layer to pay it.
    dense = resolve_model("meta-llama/Llama-3.1-70B")
    c_off, c_on = (step_coefficients(dense, resolve_gpu("h100_sxm"), precision=Precision.BF16, kv_dtype=KvDtype.AUTO,
                                     engine=Engine.VLLM, tp=4, pp=1, dp=1, params=p) for p in (off, on))
    assert np.asarray(token_terms(c_on, tokens)[0]) == pytest.approx(np.asarray(token_terms(c_off, tokens)[0]), rel=0, abs=0)


# ---------------------------------------------------------------- the fixed cost by the experts' format
def _moe_fixed_s(model, precision: Precision, engine: Engine, params: PerfParams, **kw) -> float:
    c = step_coefficients(model, resolve_gpu("b200_sxm"), precision=precision, kv_dtype=KvDtype.AUTO, engine=engine, tp=4, pp=1,
                          dp=1, params=params, release="0.19.0", **kw)
    return float(c.moe_fixed_s)


def test_a_moe_layers_fixed_cost_is_its_formats_as_the_engines_tables_measured_it():
    """planner/data/moe_latency.json: vLLM's block-FP8 layer pays 35.1 µs whatever the tokens, its NVFP4 layer 17.5, SGLang's
    30.3 and 16.4, against 25.6 for every table together (B300, GB200 and GB300 among them since stop 57); the declared
    30 µs is scaled by that ratio."""
    model = _minimax()  # experts stored block-scaled FP8
    on = replace(PerfParams(), moe_layer_latency_s=30e-6)
    layers = model.num_moe_layers
    assert moe_format(model, Precision.FP8) == "fp8_block" and moe_format(model, Precision.FP4) == "nvfp4"
    assert moe_format(GPT_OSS, Precision.FP4) is None  # MXFP4: the kernel vLLM runs depends on the GPU and release
    assert moe_format(replace(model, checkpoint=None), Precision.FP8) == "fp8"  # BF16 weights quantised online: per-tensor
    for precision, engine, t0_us in ((Precision.FP8, Engine.VLLM, 35.1), (Precision.FP4, Engine.VLLM, 17.5),
                                     (Precision.FP8, Engine.SGLANG, 30.3), (Precision.FP4, Engine.SGLANG, 16.4)):
        assert moe_latency_scale(model, precision, engine) == pytest.approx(t0_us / 25.6)
        assert _moe_fixed_s(model, precision, engine, on) == pytest.approx(layers * 30e-6 * t0_us / 25.6, rel=1e-12)
        # The ablation: every format the declared latency.
        assert _moe_fixed_s(model, precision, engine, replace(on, moe_latency_by_format=0.0)) == pytest.approx(layers * 30e-6, rel=1e-12)
    # No tables of the engine (TensorRT-LLM, priced by its overhead scale) or of the format: the declared latency as it is.
    assert moe_latency_scale(model, Precision.FP8, None) == 1.0
    assert _moe_fixed_s(model, Precision.FP8, Engine.VLLM, on, overhead_scale=1.0) == pytest.approx(layers * 30e-6, rel=1e-12)
    assert moe_latency_scale(GPT_OSS, Precision.FP4, Engine.VLLM) == 1.0


def test_the_per_format_fixed_costs_are_what_tools_moe_latency_computes_from_the_shipped_tables():
    """One truth: planner/data/moe_latency.json is tools/moe_latency.py's output on the kernel tables the planner ships (the
    tables' index hashed into it), not a copy that could drift from them."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("moe_latency_tool", root / "tools" / "moe_latency.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert json.loads((root / "planner" / "data" / "moe_latency.json").read_text()) == tool.latency_record(tool.fits())


def test_the_record_names_where_a_moe_layers_fixed_cost_comes_from():
    """measured_terms (the record's "Step time" line) names the format's measured fixed cost where the roofline prices the
    layer, and nothing where a MoE table does (it holds its own), for a dense model, with the switch off or under MXFP4."""
    model = _minimax()
    shipped = replace(PerfParams(), moe_layer_latency_s=30e-6)

    def terms(params: PerfParams, m=model, precision: Precision = Precision.FP8) -> dict[str, str]:
        return measured_terms(resolve_gpu("b200_sxm"), Engine.VLLM, "0.19.0", 4, m.hidden_size, params, model=m,
                              moe_precision=precision, precision=precision)

    assert terms(shipped)["moe_fixed"] == ("vllm fp8_block fused-MoE layers' median fixed cost 35.1 µs, over every table's 25.6 µs, "
                                           "times 30 µs a layer (aiconfigurator-core 0.12.0 tables)")
    assert "nvfp4 fused-MoE layers' median fixed cost 17.5 µs" in terms(shipped, precision=Precision.FP4)["moe_fixed"]
    assert "moe_fixed" not in terms(replace(shipped, moe_latency_by_format=0.0))
    assert "moe_fixed" not in terms(replace(shipped, moe_layer_latency_s=0.0))
    assert "moe_fixed" not in terms(shipped, m=resolve_model("meta-llama/Llama-3.1-70B"))
    assert "moe_fixed" not in terms(shipped, m=GPT_OSS, precision=Precision.FP4)
    priced = terms(replace(shipped, measured_moe=1.0))  # vLLM 0.19.0's B200 block-FP8 table prices MiniMax-M2.5's layers
    assert not priced["moe"].startswith(ROOFLINE_PREFIX) and "moe_fixed" not in priced
