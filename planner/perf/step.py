"""Performance model: the time of one engine step from FLOPs, bytes and links, with fitted efficiencies.

`StepTimeModel` is the seam the simulator calls once per step; `InstancePerf` implements it for one
engine instance (model, GPU, precision, parallelism). The funnel calls the same arithmetic on numpy
arrays (`step_time_s` accepts arrays for every batch argument and for tp/pp/dp/moe_ep), so the analytical
stage and the simulator cannot drift apart. Efficiency parameters come from data/perf_params.json,
written by benchmarks/fit_perf.py with its provenance; none is keyed by model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from functools import cache
from importlib import resources
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np

from servingtopology.planner.arch import ModuleGroup
from servingtopology.planner.engines import kernels
from servingtopology.planner.engines.args import sglang_deepep
from servingtopology.planner.hardware import Gpu, Link, Precision, gpu_catalog
from servingtopology.planner.layout import Engine, KvDtype, Parallelism
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.memory import attention_read_bytes, expert_weight_bytes, group_bytes_per_param, kv_bytes_per_token, linear_weight_bytes

__all__ = ["delivery_steps", "delivery_s", "StepTimeModel", "PerfParams", "perf_params", "pinned_params", "scaled_terms", "STEP_TERMS", "NOT_FITTED",
           "StepGeometry", "step_geometry", "fold_coefficients", "concat_geometry",
           "load_params", "fit_record", "InstancePerf", "step_time_s",
           "kv_transfer_s", "StepCoefficients",
           "step_coefficients", "evaluate_step_s", "request_overhead_s", "allreduce_s", "measured_allreduce", "measured_exchange", "measured_terms",
           "ROOFLINE_PREFIX", "moe_kernel_variants", "VLLM_MXFP4_KERNEL",
           "fabric_table_gpu",
           "KERNEL_ENGINES", "PCIE_BUS_EFF"]


class StepTimeModel(Protocol):
    """Duration of one engine step (one forward pass over the scheduled batch), in seconds.

    prefill_tokens: new prompt tokens computed this step (after prefix-cache hits).
    prefill_pairs: Σ over prefill chunks of chunk × (cached context before it + chunk / 2): attention work.
    decode_tokens: sequences decoding one token this step.
    decode_context_tokens: Σ of those sequences' context lengths (KV read).
    """

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float) -> float: ...


@dataclass(frozen=True, slots=True)
class PerfParams:
    """Global efficiency curves (fitted, see benchmarks/fit_perf.py); times in seconds.

    Step-time terms come first. The TTFT terms (`*ttft*`, result delay, PD admission) are latency a request
    sees off the GPU's step loop; `*bench_requests_per_client`, `arrival_burst` and `queue_factor` describe
    the closed-loop benchmarks the rows were measured with. Those are read by planner.perf.closed_loop and
    planner.fidelity.benchmark_cases, not by `step_time_s`.
    """

    gemm_eff_max: float = 0.70          # best fraction of dense BF16 peak FLOP/s a GEMM reaches
    gemm_half_tokens: float = 64.0      # tokens per step at which GEMM compute efficiency is half its best
    # FP8 GEMMs reach this share of the BF16 efficiency. Declared from measurements, not fitted: on Hopper (1,979 TFLOP/s
    # FP8 dense peak) DeepGEMM's block-scaled FP8 GEMMs reach "1350+ FP8 TFLOPS" (deepseek-ai/DeepGEMM README), 0.68 of
    # the peak, against the 0.8 share a large BF16 GEMM reaches (`gemm_eff_max`, the MAMF pin): 0.68 / 0.8 = 0.85.
    # (Per-tensor cuBLASLt FP8 at 8192³ reaches ~1,610 TFLOP/s, 0.81 of the peak, so 0.85 is the block-scaled floor.)
    # Fitted, it was pinned only by the one dense FP8 family: MoE families pin the product fp8 × `moe_eff_scale`, so
    # with Llama-3.1-70B left out the fold drifted to 0.44 and predicted its TTFT 69 % high.
    fp8_eff_scale: float = 0.85
    fp4_eff_scale: float = 0.60         # FP4 GEMMs likewise (block scales, immature kernels)
    moe_eff_scale: float = 0.70         # grouped expert GEMMs relative to dense GEMMs
    mem_eff: float = 0.80               # fraction of HBM bandwidth reached streaming weights
    roofline_sharpness: float = 2.0     # p of the p-norm joining compute and memory time (∞ = max)
    narrow_width_cols: float = 64.0     # GEMMs whose per-GPU output width is w columns run (1 + this / w) slower
    attn_prefill_eff: float = 0.45      # fraction of BF16 peak FLOP/s reached by prefill attention
    attn_decode_mem_eff: float = 0.70   # fraction of HBM bandwidth reached reading KV in decode
    link_eff: float = 0.75              # fraction of link bandwidth reached by collectives
    allreduce_latency_s: float = 10e-6  # fixed cost of one TP all-reduce over NVLink (two GPUs' worth: see the next)
    allreduce_peer_latency_s: float = 0.0  # NVLink: added per GPU beyond two (each rank signals and reads every peer)
    a2a_latency_s: float = 20e-6        # fixed cost of one expert-parallel dispatch or combine
    layer_overhead_s: float = 15e-6     # per layer and step: norms, rotary, activations, launches
    step_overhead_s: float = 1.5e-3     # scheduling, launch, sampling setup per step
    per_seq_overhead_s: float = 8e-6    # CPU time per scheduled sequence per step, overlapped with the GPU's work
    # CPU time per scheduled sequence per step that the GPU waits for (not hidden under the previous step): the engine
    # process's per-request work between two forward passes (the scheduler's request loop, input preparation: block
    # tables, slot mappings, positions, sampling metadata; the output update of each request). Paid by the process that
    # schedules the sequences: one engine core per attention-DP rank (vLLM runs each DP rank as its own engine-core process,
    # docs/serving/data_parallel_deployment.md, and `vllm serve` starts one API server per DP rank by default; SGLang one
    # scheduler per DP rank), so under attention DP each rank pays it for its own sequences only, while plain TP's one
    # engine pays it for every sequence (issue #35: from 256 to 512 clients MiniMax-M2.5's TPOT grows 43–67 µs per added
    # sequence under TP2/TP4 and 34–36 µs under DP2/DP4 on B200). vLLM's only: SGLang's overlap scheduler hides its CPU
    # work under the GPU's. 0: the term is off (the shipped fit predates it).
    seq_serial_s: float = 0.0
    sglang_overhead_scale: float = 0.8  # SGLang's per-step overhead relative to vLLM's
    trtllm_overhead_scale: float = 0.5  # TensorRT-LLM's (C++ runtime) relative to vLLM's; used by calibration only
    ttft_overhead_s: float = 0.03       # per request before its first token: HTTP, tokenizer, scheduler hand-off (vLLM)
    sglang_ttft_overhead_s: float = 0.1
    trtllm_ttft_overhead_s: float = 0.05
    disagg_ttft_overhead_s: float = 0.05  # PD: bootstrap and KV-transfer handshake on top of the bytes
    ttft_s_per_input_token: float = 2e-6  # per prompt token off the GPU: tokenizing, prefix hashing, payload (vLLM, TRT-LLM)
    sglang_ttft_s_per_input_token: float = 5e-6  # SGLang: the radix-tree match and insert walk the prompt in Python
    result_delay_steps: float = 1.0     # steps between a token's compute and its delivery (overlapped output processing)
    pd_admission_steps: float = 2.0     # PD: decode steps before a transferred request joins the decode batch
    bench_requests_per_client: float = 10.0  # benchmark length: requests each client sends (start-up wave weight) where the
                                             # caller does not say (planner.fidelity.benchmark_cases states it per harness)
    # Share of a rank's clients whose prefills collide in one step beyond what the token budget admits. Declared 0,
    # not fitted: the start-up wave is weighed in separately (planner.perf.closed_loop), and the wave's prompts enter
    # through the budget a step at a time, so in steady state their re-arrivals stay spread over steps as the
    # budget spread them (a step's prefill batch is the arriving tokens, at least one prompt's chunk). Fitted, it
    # sat on its floor in the fit on every row and in four of five folds, and in the fifth drifted to 0.2.
    arrival_burst: float = 0.0
    queue_factor: float = 1.0           # scale of the prefill queueing delay
    # 1: a TP all-reduce inside an NVLink node costs what the engine's custom all-reduce measured (planner/engines/kernels.py,
    # the aiconfigurator-core tables) wherever a table covers the GPU, engine and group; 0: the fitted roofline line
    # (allreduce_latency_s, link_eff) everywhere. A switch, not fitted: the ablation in benchmarks/README flips it.
    measured_allreduce: float = 0.0
    # 1: a MoE layer's routed experts cost what the engine's fused-MoE kernel measured at the layer's configuration
    # (hidden, expert width, top-k, experts, MoE TP, MoE EP) and weight format, interpolated in the tokens each GPU
    # computes, where a table covers them (kernels.moe_s): a table of the release that ran or of a neighbour timing the
    # same kernel (kernels.moe_release), timed with the kernel the engine runs (moe_kernel_variants); 0: the fitted
    # roofline (moe_eff_scale, mem_eff).
    measured_moe: float = 0.0
    # 1: under attention DP, a MoE layer's exchange (the all-gather of every DP rank's tokens before the experts and the
    # reduce-scatter of their outputs after, vLLM's default DP + EP dispatch) costs what NCCL measured for those messages
    # (planner/engines/kernels.py `nccl_s`) wherever a table covers the GPU and the group; 0: the fitted exchange
    # (a2a_latency_s, link_eff) everywhere. A switch, not fitted.
    measured_exchange: float = 1.0
    # Fixed cost of one MoE layer's routed experts on the roofline (where no measured table prices the layer): the fused
    # MoE kernel's routing, alignment and launches, which a layer pays whatever the tokens. Declared from the measured
    # fused-MoE tables (tools/moe_latency.py: every table of aiconfigurator-core 0.12.0 fitted as t0 + bytes / (eta · HBM)
    # at 1–64 tokens; t0 of one layer 16–45 µs); 0: the term is off. The shipped fit declares 30 µs (benchmarks/README), every
    # table's median; a layer pays it times its engine's measured t0 for the experts' format over that median
    # (`moe_latency_scale`: vLLM block FP8 1.31, NVFP4 0.66, ...) where `moe_latency_by_format` is on.
    moe_layer_latency_s: float = 0.0
    # 1: a MoE layer's fixed cost is its format's (`moe_latency_scale`); 0: every format pays `moe_layer_latency_s` (the
    # ablation). A switch, not fitted.
    moe_latency_by_format: float = 1.0
    # 1: a step's dense linear layers (attention projections, dense and shared-expert FFNs, routers, LM head) cost what the
    # engine's GEMM tables measured at each layer's shape and weight format on this GPU (kernels.gemm_time_s, the nearest
    # measured release), summed per step and interpolated in the step's tokens (`measured_dense_curve`), in place of the
    # fitted roofline (gemm_eff_max and the format scales, gemm_half_tokens, narrow_width_cols, mem_eff, roofline_sharpness);
    # 0: the roofline everywhere. A switch, not fitted (on in the shipped fit): the ablation in benchmarks/README flips it.
    measured_gemm: float = 0.0
    # 1: a decode step's attention over the full-attention layers (GQA/MHA, not MLA, windows or indexers) costs what the
    # engine's decode-attention tables measured at the layer's head counts, head size and KV dtype
    # (kernels.generation_attention_s): per layer a fixed cost at the step's decode batch plus a cost per cached token
    # read (`measured_decode_attention`), in place of the roofline's context read at `attn_decode_mem_eff`; 0: the
    # roofline everywhere. A switch, not fitted (on in the shipped fit).
    measured_decode_attention: float = 0.0
    source: str = "defaults (unfitted)"
    # A deployment fit applied to these parameters (planner.perf.deployment_fit.with_factors), carried with them so that
    # every prediction given them is the corrected one: `step_scales`, the factor of each step-term group (`STEP_TERMS`)
    # that `step_coefficients` multiplies; `applied_factors`, the Problem factors already folded in (never twice).
    step_scales: tuple[tuple[str, float], ...] = ()
    applied_factors: tuple[tuple[str, float], ...] = ()


NOT_FITTED = ("step_scales", "applied_factors")  # PerfParams fields a deployment fit sets; no parameter file holds them


def load_params(raw: dict[str, Any]) -> PerfParams:
    """Parameters from a parsed parameter file (the layout benchmarks/fit_perf.py writes); unknown keys are ignored."""
    known = {f.name for f in fields(PerfParams)} - {"source", *NOT_FITTED}
    values: dict[str, Any] = {k: float(v) for k, v in raw.get("params", {}).items() if k in known}
    return PerfParams(**values, source=str(raw.get("source", "")))


@cache
def fit_record() -> dict[str, Any]:
    """The shipped parameter file as written by benchmarks/fit_perf.py (provenance and the fit's own figures,
    leave-one-model-out included); empty when there is none."""
    path = resources.files("servingtopology.planner").joinpath("data/perf_params.json")
    if not path.is_file():
        return {}
    raw: dict[str, Any] = json.loads(path.read_text())
    return raw


@cache
def _fitted_params() -> PerfParams:
    raw = fit_record()
    return load_params(raw) if raw else PerfParams()


# The innermost pinned parameters, per thread and asyncio task (a context variable): the operator predicts on several
# reconcile threads at once, each resource with its own deployment fit (deployment_fit.problem_factors pins the factored
# parameters here for code that reads `perf_params()`); tests pin the parameters their scenarios were written against.
_PINNED: ContextVar[tuple[PerfParams, ...]] = ContextVar("pinned_params", default=())


@contextmanager
def pinned_params(params: PerfParams) -> Iterator[PerfParams]:
    """Use `params` wherever the fitted parameters would be read, inside the block.

    For callers that must not follow a refit: tests of the operator's mechanics whose scenarios were
    written against one calibration, or a comparison of a site's own calibration with the shipped one.
    Per thread (and asyncio task): another thread's block never sees `params`.
    """
    token = _PINNED.set((*_PINNED.get(), params))
    try:
        yield params
    finally:
        _PINNED.reset(token)


def perf_params() -> PerfParams:
    """The parameters in use: the innermost `pinned_params`, else data/perf_params.json, else the defaults."""
    pinned = _PINNED.get()
    return pinned[-1] if pinned else _fitted_params()


# A deployment's measured correction of the step model (planner.perf.deployment_fit): a time factor per group of terms of
# `StepCoefficients`, applied to every coefficient `step_coefficients` folds from parameters carrying `step_scales`.
STEP_TERMS: dict[str, tuple[str, ...]] = {
    "gemm": ("lin_flop_s", "moe_flop_s"),
    "weights": ("lin_mem_s", "moe_mem_s"),
    "attention": ("attn_pair_s", "attn_ctx_s", "attn_mixed_ctx_s", "attn_capped_pair_s", "attn_capped_ctx_s", "attn_seq_s"),
    "communication": ("a2a_s_per_token", "a2a_fixed_s", "tp_s_per_token", "tp_fixed_s", "handoff_s_per_token", "handoff_fixed_s"),
    "overhead": ("layer_fixed_s", "moe_fixed_s", "step_fixed_s", "per_seq_s", "seq_serial_s"),
}


def scaled_terms(params: PerfParams, scales: Mapping[str, float]) -> PerfParams:
    """`params` with the step model's term groups (`STEP_TERMS`) multiplied by `scales` (1 = as modelled), in place of any
    scales they carried. The measured GEMM and MoE curves take "gemm" and "weights" by the roofline's split of their term
    (`_measured_rescale`); the measured decode attention takes "attention"."""
    unknown = set(scales) - set(STEP_TERMS)
    if unknown:
        raise ValueError(f"unknown step terms {sorted(unknown)}; known: {sorted(STEP_TERMS)}")
    return replace(params, step_scales=tuple((str(t), float(f)) for t, f in scales.items()))


def _apply_term_scales(c: StepCoefficients, scales: Mapping[str, float]) -> StepCoefficients:
    changed: dict[str, Any] = {}
    for term, f in scales.items():
        if f != 1.0:
            for name in STEP_TERMS[term]:
                changed[name] = getattr(c, name) * f
    if "attention" in scales and scales["attention"] != 1.0 and c.dec_attn_curve is not None:
        changed["dec_attn_curve"] = _curve_map(c.dec_attn_curve, lambda v: v * scales["attention"])
    # The measured GEMM and MoE curves take "gemm" and "weights" as the roofline's split of the same term would
    # (`_measured_rescale`, in `token_terms`): a kernel time mixes compute and weight streaming.
    if scales.get("gemm", 1.0) != 1.0 or scales.get("weights", 1.0) != 1.0:
        changed["gemm_scale"] = float(scales.get("gemm", 1.0))
        changed["weights_scale"] = float(scales.get("weights", 1.0))
    return replace(c, **changed) if changed else c


# Collectives over PCIe (planner.hardware.Link), set from published measurements rather than fitted: the
# calibration rows all ran on NVLink systems. benchmarks/README.md ("Communication over PCIe") checks them.
# Bus bandwidth of a large NCCL all-reduce over a PCIe link: 37.6–41.7 GB/s on 7–8 RTX PRO 6000 over PCIe 5.0 x16
# (63 GB/s; voipmonitor/rtx6kpro hardware/pcie-bandwidth.md, nccl-tests all_reduce_perf), 0.63 of the link.
PCIE_BUS_EFF = 0.63
# Small-message NCCL all-reduce over PCIe peer-to-peer, a + b·n for n GPUs: 15.9 µs on 4 RTX A5000 (NVIDIA/nccl issue
# #757, 8 B), ≈ 22 µs on 4 PCIe cards (flashinfer-ai/flashinfer PR #5023: NCCL reduce-scatter 8.3 + all-gather 13.6 µs
# for one 4096-wide BF16 row), 24 µs on 8 RTX PRO 6000 (rtx6kpro, 256 B–64 KB), 36 µs on 16 (local-inference-lab/b12x
# PR #139, one 7168-wide row).
PCIE_P2P_AR_BASE_S = 14e-6
PCIE_P2P_AR_PER_GPU_S = 1.4e-6
# Without peer-to-peer NCCL stages every exchange in pinned host memory (SHM transport): one exchange between two
# RTX 4090 takes 11.9 µs (tinygrad/open-gpu-kernel-modules issue #17, alltoall_perf 8 B, P2P disabled), so an
# all-reduce (reduce-scatter + all-gather) ≈ 24 µs on 2; 42 µs on 8 RTX 4090 (NVIDIA/nccl issue #1530, 8 B).
PCIE_HOST_AR_BASE_S = 18e-6
PCIE_HOST_AR_PER_GPU_S = 3e-6
# vLLM's and SGLang's custom all-reduce (one-shot, every GPU reads its peers) runs over PCIe peer-to-peer only on
# exactly two GPUs: vLLM custom_all_reduce.py disables it "on more than two PCIe-only GPUs" (vllm-project/vllm issue
# #56128). 7.5 µs for 256 B–1 KB with a PCIe one-shot kernel (rtx6kpro, "Custom Allreduce vs NCCL").
PCIE_CUSTOM_AR_S = 7.5e-6


def _link_bps(gpu: Gpu, group: Any, p: PerfParams) -> Any:
    """Bytes/s a collective over `group` GPUs moves per GPU and direction: the scale-up link inside a node (NVLink at
    the fitted `link_eff`, PCIe at the measured bus efficiency), the NIC beyond."""
    intra = gpu.nvlink_gbps * p.link_eff if gpu.scaleup_link is Link.NVLINK else gpu.pcie_gbps * PCIE_BUS_EFF
    return np.where(group <= gpu.gpus_per_node, intra, gpu.nic_gbit / 8.0 * p.link_eff) * 1e9


def _allreduce_latency_s(gpu: Gpu, group: Any, p: PerfParams) -> Any:
    """Fixed cost of one small all-reduce over `group` GPUs, by the link they share.

    NVLink: the one-shot custom all-reduce (vLLM/SGLang custom_all_reduce) has every rank write a flag to and read
    the buffer of each of its n − 1 peers, and NCCL's NVLS/ring steps grow with the ranks too, so the cost is the
    fitted `allreduce_latency_s` on two GPUs plus the fitted `allreduce_peer_latency_s` per GPU beyond two (an
    H100 NVSwitch node measures ≈ 6 µs on 2 GPUs and more on 8 with NVLS, NVIDIA/nccl issue #1259; the same
    straight line in n as the PCIe constants below). PCIe: the custom
    all-reduce on two peer-to-peer GPUs, else NCCL, whose cost grows with the GPUs (constants above). Across nodes
    each doubling beyond one node adds a tree hop.
    """
    n = np.minimum(group, gpu.gpus_per_node)
    link = gpu.scaleup_link
    if link is Link.NVLINK:
        intra = p.allreduce_latency_s + p.allreduce_peer_latency_s * np.maximum(n - 2.0, 0.0)
    elif link is Link.PCIE_P2P:
        intra = np.where(n <= 2, PCIE_CUSTOM_AR_S, PCIE_P2P_AR_BASE_S + PCIE_P2P_AR_PER_GPU_S * n)
    else:
        intra = PCIE_HOST_AR_BASE_S + PCIE_HOST_AR_PER_GPU_S * n
    hops = 1.0 + np.log2(np.maximum(group / gpu.gpus_per_node, 1.0))
    return intra * hops


def _exchange_latency_s(gpu: Gpu, group: Any, p: PerfParams) -> Any:
    """Fixed cost of one point-to-point or all-to-all exchange (EP dispatch or combine, a PP hand-off): the fitted
    `a2a_latency_s` on NVLink, half an all-reduce (one of its two phases) over PCIe."""
    if gpu.scaleup_link is Link.NVLINK:
        return p.a2a_latency_s + 0.0 * np.asarray(group, dtype=float)
    return 0.5 * _allreduce_latency_s(gpu, np.maximum(group, 2), p)


# Message sizes (in tokens of BF16 activations) through which the measured all-reduce line is drawn: one token (the
# latency a decode step of few sequences sees) and 2,048 (a prefill chunk), so a step's tokens interpolate between them.
_AR_LINE_TOKENS = (1.0, 2048.0)
KERNEL_ENGINES = {Engine.VLLM: "vllm", Engine.SGLANG: "sglang"}


@cache
def fabric_table_gpu(gpu_id: str) -> str:
    """The GPU whose measured communication tables (the engines' custom all-reduce, NCCL) time this GPU's collectives.

    Itself where any table measured it; else the measured GPU of the same scale-up fabric: NVLink at the same per-GPU
    bandwidth through a switch of the same node size (gpus.toml). A small collective's time is the fabric's (the
    switch's hops, the peers' flags, the link's bytes), not the compute die's: the A100-40GB runs the A100-80GB's NVLink
    switch board (300 GB/s a direction, 8 GPUs a node) and was never measured, so it takes the A100-80GB's tables (B300
    took B200's so until its own were generated). None matching: the GPU's own id (no table; the caller keeps the
    fitted terms)."""
    measured = {row[0] for row in kernels.coverage()}
    if gpu_id in measured:
        return gpu_id
    catalog = gpu_catalog()
    gpu = catalog.get(gpu_id)
    if gpu is None or gpu.scaleup_link is not Link.NVLINK:
        return gpu_id
    twins = sorted(g.id for g in catalog.values() if g.id in measured and g.scaleup_link is Link.NVLINK
                   and g.nvlink_gbps == gpu.nvlink_gbps and g.gpus_per_node == gpu.gpus_per_node)
    return twins[0] if twins else gpu_id


@cache
def _measured_allreduce_line(gpu_id: str, engine: str, release: str, n: int, hidden: int) -> tuple[float, float, str]:
    """(fixed s, s per token, source) of one all-reduce over n GPUs from the measured custom all-reduce table of the
    engine's nearest measured release; NaN where no table covers it (the caller keeps the roofline)."""
    if n < 2:
        return 0.0, 0.0, ""
    lo, hi = (t * hidden * 2.0 for t in _AR_LINE_TOKENS)
    got = kernels.allreduce_s(gpu_id, engine, release or None, gpus=np.array([n, n], dtype=float), message_bytes=np.array([lo, hi]))
    t_lo, t_hi = (float(x) for x in got.time_s)
    if not (math.isfinite(t_lo) and math.isfinite(t_hi)) or got.source is None:
        return math.nan, math.nan, ""
    return t_lo, max(t_hi - t_lo, 0.0) / (_AR_LINE_TOKENS[1] - _AR_LINE_TOKENS[0]), got.source.describe()


def measured_allreduce(gpu: Gpu, engine: Engine | None, release: str | None, tp: Any, hidden: int) -> tuple[Any, Any]:
    """Measured (fixed, per-token) time of one TP all-reduce per element of `tp`; NaN where no table covers it: another
    engine, a GPU without tables, a group beyond one node or over PCIe."""
    name = KERNEL_ENGINES.get(engine) if engine is not None else None
    arr = np.asarray(tp, dtype=float)
    fixed, per_tok = np.full(arr.shape, np.nan), np.full(arr.shape, np.nan)
    if name is None or gpu.scaleup_link is not Link.NVLINK:
        return fixed, per_tok
    for n in np.unique(arr):
        if not (2 <= n <= gpu.gpus_per_node):
            continue
        f, t, _ = _measured_allreduce_line(fabric_table_gpu(gpu.id), name, release or "", int(n), int(hidden))
        fixed = np.where(arr == n, f, fixed)
        per_tok = np.where(arr == n, t, per_tok)
    return fixed, per_tok


# The NCCL collectives of one MoE layer's exchange under attention DP, in the order a step runs them.
_EXCHANGE_OPS = ("all_gather", "reduce_scatter")
# Tokens a rank sends through which SGLang's DeepEP line is drawn: the low-latency kernels' measured range.
_DEEPEP_LINE_TOKENS = (1.0, 1024.0)


@cache
def _measured_exchange_line(gpu_id: str, dp: int, hidden: int, deepep: bool = False, release: str = "", topk: int = 0,
                            experts: int = 0) -> tuple[float, float, str]:
    """(fixed s, s per token of one rank, source) of one MoE layer's exchange over `dp` attention-DP ranks whose experts
    are expert-parallel; NaN where no table covers it.

    `deepep` (SGLang where it runs DeepEP, `_uses_deepep`): DeepEP's dispatch and combine, the low-latency kernels
    it runs for decode batches, from the measured table of the nearest release at 1 and 1,024 tokens a rank. The table
    was measured on one node (a GB200/GB300 tray, an HGX board); it prices any EP width inside the NVLink domain, since
    a rank sends the same bytes however many ranks hold the experts (each token to the ranks of its top-k). The
    prefill of a disaggregated prefill instance runs DeepEP's normal kernels, whose per-token cost the same line meets
    within 15 % at 8,192 tokens (B200, GB300: 0.21–0.27 against 0.24 µs a token of DeepSeek-V3's shape); their larger
    fixed cost (80 against 35 µs a layer) is not charged, and is small beside a prefill chunk's GEMMs.
    Else (vLLM's `allgather_reducescatter` all-to-all backend; SGLang's default exchange): an all-gather of every rank's BF16 activations (dp ×
    tokens × hidden × 2 bytes gathered, each rank padded to the largest rank's tokens) and a reduce-scatter of the
    experts' outputs, from NCCL's measured tables at 1 and 2,048 tokens a rank."""
    if deepep:
        got = kernels.deepep_s(gpu_id, release or None, low_latency=True, topk=topk, experts=experts,
                               hidden=float(hidden), tokens=np.array(_DEEPEP_LINE_TOKENS))
        if got.source is None or not np.isfinite(got.time_s).all():
            return math.nan, math.nan, ""
        t_lo, t_hi = (float(x) for x in got.time_s)
        return (t_lo, max(t_hi - t_lo, 0.0) / (_DEEPEP_LINE_TOKENS[1] - _DEEPEP_LINE_TOKENS[0]),
                f"DeepEP low-latency dispatch + combine, {got.source.describe()}")
    per_rank = np.array([t * dp * hidden * 2.0 for t in _AR_LINE_TOKENS])
    total = np.zeros(2)
    source = ""
    for op in _EXCHANGE_OPS:
        got = kernels.nccl_s(gpu_id, op=op, gpus=np.array([dp, dp], dtype=float), message_bytes=per_rank)
        if got.source is None or not np.isfinite(got.time_s).all():
            return math.nan, math.nan, ""
        total = total + got.time_s
        source = source or got.source.describe()
    t_lo, t_hi = (float(x) for x in total)
    return t_lo, max(t_hi - t_lo, 0.0) / (_AR_LINE_TOKENS[1] - _AR_LINE_TOKENS[0]), source


def _uses_deepep(engine: Engine | None, tp: Any, dp: Any, ep: Any, gpu: Gpu) -> Any:
    """Whether the instance's exchange is DeepEP's: SGLang where `planner.engines.args.sglang_deepep` says it runs it (the
    rule the rendered `--moe-a2a-backend deepep` follows); elementwise like it."""
    return np.logical_and(sglang_deepep(tp, dp, ep, gpu.id), engine is Engine.SGLANG)


def measured_exchange(gpu: Gpu, engine: Engine | None, tp: Any, dp: Any, ep: Any, hidden: int, *, release: str | None = None,
                      topk: int = 0, experts: int = 0) -> tuple[Any, Any]:
    """Measured (fixed, per-token) time of one MoE layer's attention-DP exchange per candidate (`_measured_exchange_line`);
    NaN where no table covers it: an engine without tables, no attention DP, experts not expert-parallel, an instance
    beyond one NVLink domain (a node; an NVL72 rack) or off NVLink, a GPU the exchange was not measured on, a routing
    shape (top-k of `experts`) DeepEP's table lacks.

    Only DP with EP: DP without EP shards every expert over the tp × dp GPUs and exchanges otherwise (each rank's tokens
    sent to all, the outputs all-reduced), which these tables do not time; it keeps the fitted exchange."""
    t_arr, d_arr, e_arr = np.broadcast_arrays(np.asarray(tp, dtype=float), np.asarray(dp, dtype=float), np.asarray(ep, dtype=float))
    fixed, per_tok = np.full(t_arr.shape, np.nan), np.full(t_arr.shape, np.nan)
    if engine not in KERNEL_ENGINES or gpu.scaleup_link is not Link.NVLINK:
        return fixed, per_tok
    deepep = np.broadcast_to(_uses_deepep(engine, t_arr, d_arr, e_arr, gpu), t_arr.shape)
    for d in np.unique(d_arr):
        if d < 2:
            continue
        inside = (d_arr == d) & (e_arr > 1) & (t_arr * d_arr <= gpu.gpus_per_node)
        for uses_deepep in (False, True):
            these = inside & (deepep == uses_deepep)
            if not these.any():
                continue
            f, t, _ = _measured_exchange_line(fabric_table_gpu(gpu.id), int(d), int(hidden), uses_deepep, release or "", int(topk),
                                              int(experts))
            fixed = np.where(these, f, fixed)
            per_tok = np.where(these, t, per_tok)
    return fixed, per_tok


ROOFLINE_PREFIX = "roofline: "  # a switched-on measured term that no table may price, with the reason after it


def measured_terms(gpu: Gpu, engine: Engine | None, release: str | None, tp: int, hidden: int, params: PerfParams | None = None, *,
                   model: ModelArch | None = None, moe_precision: Precision | None = None, dp: int = 1, moe_ep: int = 1,
                   precision: Precision | None = None, kv_dtype: KvDtype | None = None) -> dict[str, str]:
    """Which step terms of one instance come from measured kernel tables, with their source; the rest are roofline.
    `model` (with its experts' precision and the instance's dp and EP degree) adds the MoE term: where `measured_moe` is on
    and no table may time it, its value is `ROOFLINE_PREFIX` and the reason (the release rule, the kernel the engine runs).
    `model` with the dense weights' `precision` (the experts' where not given) adds the dense GEMM term (`measured_gemm`)."""
    p = params or perf_params()
    out: dict[str, str] = {}
    name = KERNEL_ENGINES.get(engine) if engine is not None else None
    if name is None:
        return out
    if p.measured_allreduce >= 0.5 and tp >= 2 and gpu.scaleup_link is Link.NVLINK and tp <= gpu.gpus_per_node:
        f, _, source = _measured_allreduce_line(fabric_table_gpu(gpu.id), name, release or "", int(tp), int(hidden))
        if math.isfinite(f):
            out["tp_allreduce"] = source
    if p.measured_exchange >= 0.5 and model is not None and model.is_moe and dp >= 2 and moe_ep >= 2 \
            and tp * dp <= gpu.gpus_per_node and gpu.scaleup_link is Link.NVLINK:
        _, _, source = _measured_exchange_line(fabric_table_gpu(gpu.id), int(dp), int(hidden), bool(_uses_deepep(engine, tp, dp, moe_ep, gpu)),
                                               release or "", int(model.experts_per_token), int(model.num_experts))
        if source:
            out["dp_exchange"] = source
    if p.measured_gemm >= 0.5 and model is not None:
        _, source, reason = measured_dense_curve(model, gpu, engine, release, precision or moe_precision or Precision.BF16, tp)
        out["gemm"] = source or f"{ROOFLINE_PREFIX}{reason}"
    if p.measured_decode_attention >= 0.5 and model is not None:
        _, source, reason = measured_decode_attention(model, gpu, engine, release, kv_dtype or KvDtype.AUTO, tp)
        out["decode_attention"] = source or f"{ROOFLINE_PREFIX}{reason}"
    if p.measured_moe >= 0.5 and model is not None and model.is_moe:
        group = tp * dp
        ep = min(moe_ep, group)
        _, source, reason = measured_moe_curve(model, gpu, engine, release, moe_precision or Precision.BF16, group // max(ep, 1), ep)
        out["moe"] = source or f"{ROOFLINE_PREFIX}{reason}"
    # The roofline's MoE layers pay a fixed cost from the tables by format (a measured MoE table holds its own).
    if model is not None and out.get("moe", ROOFLINE_PREFIX).startswith(ROOFLINE_PREFIX):
        fixed = moe_fixed_source(model, moe_precision or Precision.BF16, engine, p)
        if fixed:
            out["moe_fixed"] = fixed
    return out


def moe_fixed_source(model: ModelArch, mp: Precision, engine: Engine | None, params: PerfParams) -> str:
    """Where the roofline's fixed cost of a MoE layer comes from (`moe_latency_scale`), "" where it is not measured: a dense
    model, the latency off or not by format, no table of the engine or the format."""
    found = _format_t0_us(model, mp, engine)
    if not model.is_moe or params.moe_layer_latency_s <= 0.0 or params.moe_latency_by_format < 0.5 or found is None:
        return ""
    name, fmt, t0, every = found
    tables = _moe_latency_record()["kernel_tables"]
    return (f"{name} {fmt} fused-MoE layers' median fixed cost {t0:g} µs, over every table's {every:g} µs, "
            f"times {params.moe_layer_latency_s * 1e6:g} µs a layer ({tables['distribution']} {tables['version']} tables)")


def allreduce_s(gpu: Gpu, group: Any, nbytes: Any, params: PerfParams | None = None) -> Any:
    """Time of one all-reduce of `nbytes` per GPU over `group` GPUs (ring: 2(n−1)/n of the bytes cross each link),
    exactly as the step model charges it."""
    p = params or perf_params()
    n = np.asarray(group, dtype=float)
    return np.where(n > 1, _allreduce_latency_s(gpu, n, p) + nbytes * 2.0 * (n - 1) / n / _link_bps(gpu, n, p), 0.0)


def _compute_peak(gpu: Gpu, precision: Precision) -> float:
    """FLOP/s a GEMM in `precision` can use: native peak, or BF16 for weight-only formats (FP4 on Hopper)."""
    native = float(getattr(gpu, f"{precision.value}_tflops", 0.0)) if precision is not Precision.INT4 else 0.0
    return (native if native > 0 else gpu.bf16_tflops) * 1e12


def _gemm_eff(p: PerfParams, gpu: Gpu, precision: Precision) -> float:
    """Share of the peak a large GEMM reaches: measured where gpus.toml has it, else the fitted `gemm_eff_max`."""
    native = precision is not Precision.BF16 and float(getattr(gpu, f"{precision.value}_tflops", 0.0)) > 0
    scale = {Precision.FP8: p.fp8_eff_scale, Precision.FP4: p.fp4_eff_scale}.get(precision, 1.0) if native else 1.0
    best = gpu.matmul_bf16_tflops / gpu.bf16_tflops if gpu.matmul_bf16_tflops > 0 else p.gemm_eff_max
    return best * scale


def _narrow_cols(p: PerfParams, precision: Precision) -> float:
    """Per-GPU GEMM width (columns) at which a slice runs twice as slow as a wide one, for `precision`.

    Tensor-core tiles are a fixed number of bytes deep (128 B of K per stage on Hopper and Blackwell:
    64 BF16, 128 FP8 or 256 FP4 elements), so a slice narrower than a few tiles wastes more of each tile the
    fewer bits its weights have: the width is counted in bytes and `narrow_width_cols` is its BF16 value.
    """
    return p.narrow_width_cols * 2.0 / max(precision.weight_bytes, 0.5)


@dataclass(frozen=True, slots=True)
class CurveRows:
    """Measured curves kept once per distinct shape: `rows` (the distinct shapes × the curve's grid) and each candidate's
    row in `index` (an integer array of the candidates' shape). The funnel's millions of candidates share a few dozen
    (TP, PP, EP) shapes, so a candidate costs one index rather than a curve of 16–24 floats; a candidate's value is
    `rows[index]` exactly (`dense`), so every interpolation gives the floats the dense curve gives."""

    rows: Any
    index: Any

    def dense(self) -> Any:
        """The curve of every candidate, (*candidates, *grid)."""
        return self.rows[self.index]

    def with_rows(self, rows: Any) -> CurveRows:
        return CurveRows(rows, self.index)


SMALL_DISTINCT = 512  # up to this many candidates `_distinct` sorts them in Python (fewer numpy calls than the lookup tables)


def _distinct(*keys: Any) -> tuple[list[tuple[float, ...]], Any]:
    """The distinct combinations of the broadcast `keys` (each an array of small values per candidate), in sorted order,
    and each candidate's position among them (an int array of the broadcast shape)."""
    arrays = np.broadcast_arrays(*(np.asarray(k, dtype=float) for k in keys))
    if arrays[0].size <= SMALL_DISTINCT:  # a few candidates (a pool member's funnel, one instance): in Python, the same answer
        rows = list(zip(*(a.ravel().tolist() for a in arrays), strict=True))
        combos = sorted(set(rows))
        at = {c: i for i, c in enumerate(combos)}
        return combos, np.array([at[r] for r in rows], dtype=np.int64).reshape(arrays[0].shape)
    code = np.zeros(arrays[0].shape, dtype=np.int64)
    values: list[Any] = []
    for a in arrays:
        v, inverse = _small_unique(a)
        code = code * len(v) + inverse
        values.append(v)
    used, index = _small_unique(code)
    combos = []
    for c in used.tolist():
        combo = []
        for v in reversed(values):
            c, at = divmod(c, len(v))
            combo.append(float(v[at]))
        combos.append(tuple(reversed(combo)))
    return combos, index.reshape(code.shape)


def _small_unique(a: Any) -> tuple[Any, Any]:
    """`np.unique(a, return_inverse=True)` (the inverse in `a`'s shape), by a lookup table where `a` holds small
    non-negative integers (layout degrees, row numbers): linear in the candidates rather than a sort."""
    a = np.asarray(a)
    if a.size and a.min() >= 0 and a.max() < 1 << 20 and (a.dtype.kind in "iu" or bool((a == np.floor(a)).all())):
        ints = a.astype(np.int64)
        present = np.zeros(int(ints.max()) + 1, dtype=bool)
        present[ints] = True
        at = np.cumsum(present) - 1
        return np.flatnonzero(present).astype(a.dtype), at[ints]
    v, inverse = np.unique(a, return_inverse=True)
    return v, inverse.reshape(a.shape)


def _curve_points(curve: Any, i: Any) -> tuple[Any, Any]:
    """A curve's values at grid points `i` and `i + 1` of its last axis, per candidate (broadcast with `i`): a 1-D curve
    (one instance), `CurveRows`, or a dense array (*candidates, grid)."""
    if isinstance(curve, CurveRows):
        flat = curve.rows.ravel()
        at = curve.index * curve.rows.shape[-1] + i  # broadcast: each candidate's point in its row
        return flat[at], flat[at + 1]
    c = np.asarray(curve, dtype=float)
    if c.ndim == 1:
        return c[i], c[i + 1]
    i_b = np.broadcast_to(i, c.shape[:-1])
    at = np.arange(i_b.size).reshape(i_b.shape) * c.shape[-1] + i_b  # each row's point, in the flattened curve
    flat = c.ravel()
    return flat[at], flat[at + 1]


def _curve_map(curve: Any, fn: Callable[[Any], Any]) -> Any:
    """`fn` applied to every value of a curve (`CurveRows` or an array)."""
    return curve.with_rows(fn(curve.rows)) if isinstance(curve, CurveRows) else fn(curve)


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """Per-instance constants of the step-time formula (floats or arrays, one per candidate).

    Times are seconds per token, per pair, per context token or per step, for one pipeline stage.
    """

    lin_flop_s: Any        # dense GEMM compute time per token at full efficiency
    lin_mem_s: Any         # dense weight streaming time per step
    moe_flop_s: Any        # routed-expert compute time per routed token (dp ranks' tokens all arrive)
    moe_mem_s: Any         # time to stream one active local expert in all MoE layers
    local_experts: Any     # routed experts held per GPU (E / ep)
    ep_z: Any              # expected maximum of ep standard normals (0 without EP): the busiest GPU's excess load
    dp: Any
    experts: float
    topk: float
    a2a_s_per_token: Any   # EP/DP dispatch+combine bytes time per token of this rank
    a2a_fixed_s: Any
    attn_pair_s: Any       # prefill attention time per (query, key) pair
    attn_ctx_s: Any        # decode attention time per context token
    attn_mixed_ctx_s: Any  # extra decode attention time per context token when a prefill chunk shares the step
    attn_capped_pair_s: Any  # prefill attention time per pair, at most `attn_cap_tokens` keys per query (window, DSA top-k)
    attn_capped_ctx_s: Any  # decode attention time per context token, at most `attn_cap_tokens` per sequence
    attn_cap_tokens: float
    attn_seq_s: Any        # decode time per sequence that does not grow with context (fixed state read and written)
    tp_s_per_token: Any    # TP all-reduce bandwidth time per token
    tp_fixed_s: Any
    handoff_s_per_token: Any
    handoff_fixed_s: Any
    layer_fixed_s: Any
    pp: Any
    step_fixed_s: Any      # per candidate where the engines differ (concatenated geometries), else a float
    per_seq_s: Any
    gemm_half_tokens: float
    sharp: float
    # ln(seconds) of all MoE layers' routed experts at 2^i tokens (i = 0 … MOE_GRID − 1) per candidate, measured
    # (kernels.moe_s); NaN where no table covers the candidate or the token count. None: the roofline everywhere.
    moe_log_curve: Any = None
    # Share of the tokens all DP ranks route that the measured table's token count is (kernels.moe_s): 1 for vLLM's
    # tables, which route every token over all experts and time one rank's E / ep of them (expert_map); 1 / ep for
    # SGLang's, which time one EP rank computing its dispatched tokens × top-k pairs.
    moe_table_share: Any = 1.0
    # The roofline's fixed cost of all the stage's MoE layers per step (PerfParams.moe_layer_latency_s · MoE layers / pp;
    # a measured table's time holds its own).
    moe_fixed_s: Any = 0.0
    # CPU time per scheduled sequence per step on the step's critical path, in the rank's own engine process (PerfParams.seq_serial_s)
    seq_serial_s: Any = 0.0
    # False for a dense model: every expert and exchange term is exactly zero, so `token_terms` skips them (the same sum).
    # A flag per candidate where the geometries of several models were concatenated (`concat_geometry`).
    moe: Any = True
    # ln(seconds) of the stage's dense linear layers at 2^i tokens per candidate, measured (`measured_dense_curve`); NaN
    # where no table covers the candidate. None: the roofline everywhere.
    lin_log_curve: Any = None
    # The stage's full-attention decode time per candidate at 2^i decode sequences (`measured_decode_attention`): [..., 0, i]
    # the fixed seconds, [..., 1, i] seconds per cached token read; NaN where no table covers it. None: the roofline.
    dec_attn_curve: Any = None
    # A deployment's "gemm" and "weights" factors (STEP_TERMS), kept for the measured GEMM and MoE curves (`token_terms`).
    gemm_scale: float = 1.0
    weights_scale: float = 1.0


# Token counts (per GPU, before top-k routing) at which the measured MoE curve is kept: 1, 2, 4, …, 32,768.
MOE_GRID = 16
_MOE_DTYPES = {Precision.BF16: ("bfloat16",), Precision.FP8: ("fp8_block", "fp8"), Precision.INT4: ("int4_wo",)}

# CUDA compute capability family of the catalog's NVIDIA GPUs (NVIDIA's CUDA GPU list): what the engines' kernel choices test.
_CUDA_FAMILY = {"a100_sxm": 80, "a100_40gb": 80, "l40s": 89, "rtx_4090": 89, "h100_sxm": 90, "h100_pcie": 90, "h200_sxm": 90,
                "b200_sxm": 100, "b300_sxm": 100, "gb200": 100, "gb300": 100, "rtx_pro_6000": 120}
# The MXFP4 expert kernel vLLM runs for an MXFP4 checkpoint (gpt-oss), by compute capability family, as the part of the
# kernel's name the aiconfigurator tables record. vLLM's oracle (vllm 0.32.0, model_executor/layers/fused_moe/oracle/
# mxfp4.py: select_mxfp4_moe_backend over _get_priority_backends_for_gpt_oss, each backend's _supports_current_device)
# takes the first backend the GPU supports: FLASHINFER_TRTLLM_MXFP4_BF16 on the SM100 family (TrtLlmMxfp4Experts:
# is_device_capability_family(100) with FlashInfer); on SM90 the TRT-LLM and AITER backends do not apply and TRITON
# (OAI triton_kernels, 9.0 <= capability < 13.0) comes next. The collector of the 0.24.0 tables builds vLLM's own FusedMoE
# with Mxfp4Config and lets vLLM choose, and records exactly these two (H100/H200: ..._triton_oaitritonmxfp4experts...,
# B200: ..._flashinfer_trtllm_mxfp4_bf16_...). vLLM 0.19.0's tables name no backend ("vllm_mxfp4_moe") and time EP 2 as
# EP 1 (the expert map not applied), so the kernel filter leaves them out.
VLLM_MXFP4_KERNEL = {90: "triton_oaitritonmxfp4experts", 100: "flashinfer_trtllm_mxfp4_bf16"}


def moe_kernel_variants(model: ModelArch, gpu: Gpu, engine: str, mp: Precision) -> tuple[tuple[tuple[str, str | None], ...], str]:
    """The measured (dtype, kernel) variants a checkpoint's routed experts run as on `gpu` under `engine` (kernel None: any
    the table timed), most specific first; empty with the reason where no table times the kernel the engine runs."""
    if mp is Precision.FP4:
        ck = model.checkpoint
        if ck is None or ck.method != "mxfp4":
            return (("nvfp4", None),), ""
        if engine != "vllm":
            return (), f"which MXFP4 expert kernel {engine} runs is not established here"
        family = _CUDA_FAMILY.get(gpu.id)
        kernel = VLLM_MXFP4_KERNEL.get(family) if family is not None else None
        if kernel is None:
            return (), f"vLLM's MXFP4 expert backend on {gpu.id} has no measured table"
        return (("w4a16_mxfp4", kernel),), ""
    dtypes = _MOE_DTYPES.get(mp, ())
    return tuple((d, None) for d in dtypes), "" if dtypes else f"no table times {mp.value} experts"


@cache
def _moe_curve_scalar(gpu_id: str, engine: str, release: str, variants: tuple[tuple[str, str | None], ...],
                      config: tuple[int, ...]) -> tuple[tuple[float, ...], str, str]:
    """ln(seconds) of one MoE layer at 2^i tokens from the first measured variant that covers `config`, its source, and
    why none did ("" when one did)."""
    tokens = np.exp2(np.arange(MOE_GRID, dtype=float))
    reasons = []
    for dtype, kernel in variants:
        got = kernels.moe_s(gpu_id, engine, release or None, dtype=dtype, hidden=config[0], inter=config[1], topk=config[2],
                            experts=config[3], moe_tp=config[4], moe_ep=config[5], tokens=tokens, kernel=kernel)
        if got.source is not None and np.isfinite(got.time_s[0]):
            with np.errstate(divide="ignore", invalid="ignore"):
                return tuple(float(v) for v in np.log(got.time_s)), f"{got.source.describe()}, {dtype}", ""
        reasons.append(got.reason or f"no {engine} {dtype} table on {gpu_id} measured this configuration")
    return tuple([math.nan] * MOE_GRID), "", "; ".join(reasons)


def measured_moe_curve(model: ModelArch, gpu: Gpu, engine: Engine | None, release: str | None, mp: Precision, moe_tp: Any,
                       moe_ep: Any) -> tuple[CurveRows, str, str]:
    """ln(seconds) of all of the model's MoE layers at 2^i tokens per candidate (rows of NaN where not covered), the
    source of the first covered row ("" when none), and why the first uncovered one has no table."""
    name = KERNEL_ENGINES.get(engine) if engine is not None else None
    shapes, index = _distinct(moe_tp, moe_ep)
    rows = np.full((len(shapes), MOE_GRID), np.nan)
    curve = CurveRows(rows, index)
    if name is None or not model.is_moe:
        return curve, "", "no measured tables of this engine"
    variants, why = moe_kernel_variants(model, gpu, name, mp)
    if not variants:
        return curve, "", why
    source = reason = ""
    layers = float(model.num_moe_layers)
    for row, (mt, me) in enumerate(shapes):
        config = (model.hidden_size, model.moe_intermediate_size, model.experts_per_token, model.num_experts, int(mt), int(me))
        values, where, why = _moe_curve_scalar(gpu.id, name, release or "", variants, config)
        if where:
            source = source or where
            rows[row] = np.asarray(values) + math.log(layers)
        else:
            reason = reason or why
    return curve, source, reason


@cache
def _moe_latency_record() -> Mapping[str, Any]:
    """planner/data/moe_latency.json (tools/moe_latency.py --write): the fused-MoE tables' fixed cost by engine and format."""
    record: Mapping[str, Any] = json.loads(resources.files("servingtopology.planner").joinpath("data/moe_latency.json").read_text())
    return record


def moe_format(model: ModelArch, mp: Precision) -> str | None:
    """The measured tables' format of the routed experts served at `mp` (`_gemm_table_dtype`'s rule for the experts): BF16;
    FP8 block-scaled where the checkpoint stores the experts so, else per-tensor FP8; NVFP4; INT4 weight-only. None for an
    MXFP4 checkpoint, whose expert kernel vLLM chooses by GPU and release (`VLLM_MXFP4_KERNEL`; the 0.19.0 tables time
    another), and for a format no table times."""
    ck = model.checkpoint
    stored = ck is not None and ck.covers(ModuleGroup.ROUTED_EXPERTS) and ck.precision is mp
    if mp is Precision.BF16:
        return "bfloat16"
    if mp is Precision.FP8:
        return "fp8_block" if stored and ck is not None and ck.bytes_per_param > 1.0 else "fp8"
    if mp is Precision.FP4:
        return None if stored and ck is not None and ck.method == "mxfp4" else "nvfp4"
    if mp is Precision.INT4:
        return "int4_wo"
    return None


def moe_latency_scale(model: ModelArch, mp: Precision, engine: Engine | None) -> float:
    """A MoE layer's fixed cost over `PerfParams.moe_layer_latency_s` (declared as every measured table's median t0): the
    median t0 of `engine`'s measured fused-MoE kernels in the experts' format (`moe_format`), pooled over the GPUs and
    releases measured, over the all-table median. 1 where the engine has no tables (TensorRT-LLM here) or none times the
    format. The formats' kernels differ in what they pay whatever the tokens: vLLM's block-FP8 layer 35.1 µs (activation
    quantisation per token group, scales per 128 × 128 block), its NVFP4 17.5, BF16 26.9; SGLang's 30.3, 16.4, 24.9;
    every table 25.6 µs (H100, H200, B200, B300, A100, GB200, GB300)."""
    found = _format_t0_us(model, mp, engine)
    return 1.0 if found is None else found[2] / found[3]


def _format_t0_us(model: ModelArch, mp: Precision, engine: Engine | None) -> tuple[str, str, float, float] | None:
    """(engine, format, its median t0 in µs, every table's) from planner/data/moe_latency.json; None where the engine has no
    tables or none times the experts' format (`moe_format`). What `moe_latency_scale` charges and `moe_fixed_source` says."""
    name = KERNEL_ENGINES.get(engine) if engine is not None else None
    fmt = moe_format(model, mp)
    if name is None or fmt is None:
        return None
    record = _moe_latency_record()
    t0 = record["t0_us"].get(name, {}).get(fmt)
    return None if t0 is None else (name, fmt, float(t0), float(record["all_t0_us"]))


def _moe_table_s(curve: Any, tokens: Any) -> Any:
    """exp of the curve interpolated linearly in log2(tokens) (NaN outside the measured grid or the table)."""
    pos = np.log2(np.maximum(np.asarray(tokens, dtype=float), 1.0))
    inside = pos <= MOE_GRID - 1
    pos = np.minimum(pos, MOE_GRID - 1 - 1e-9)
    i = np.floor(pos).astype(np.int64)
    frac = pos - i
    lo, hi = _curve_points(curve, i)
    return np.where(inside, np.exp(lo * (1.0 - frac) + hi * frac), np.nan)


def _gemm_table_dtype(model: ModelArch, group: ModuleGroup, precision: Precision) -> str | None:
    """The GEMM tables' dtype of `group`'s weights served at `precision` (the format `memory.group_bytes_per_param` prices):
    BF16 where the group stays in 16 bits; FP8 block-scaled where the checkpoint stores the group so, else per-tensor FP8
    (vLLM's online FP8, ModelOpt); NVFP4. None where no table times the format (MXFP4 or INT4 dense weights)."""
    if group_bytes_per_param(model, group, precision) >= 2.0:
        return "bfloat16"
    ck = model.checkpoint
    stored = ck is not None and ck.covers(group) and ck.precision is precision
    if precision is Precision.FP8:
        return "fp8_block" if stored and ck is not None and ck.bytes_per_param > 1.0 else "fp8"
    if precision is Precision.FP4 and (not stored or (ck is not None and ck.method == "nvfp4")):
        return "nvfp4"
    return None


def dense_gemm_shapes(model: ModelArch, precision: Precision, tp: float) -> tuple[tuple[tuple[str, float, float, float], ...], str]:
    """The GEMMs of one step's dense linear layers on one GPU of a TP group of `tp`, each as (the tables' dtype, n, k, calls
    per step over the whole model): n the GPU's output columns, k its inputs, every one at the step's tokens. Empty, with
    the reason, where a layer kind is not enumerated here (linear-attention mixers, indexers, per-layer head counts,
    compressed or shared KV projections) or a format has no table; the roofline prices those models' linear layers.

    Attention (GQA): the fused q/k/v projection (KV heads replicated where TP exceeds them, as vLLM does) and the output
    projection. MLA: the fused q_a and kv_a down-projections, replicated on every rank, then q_b, kv_b and o, sharded.
    Gated FFNs (dense layers, shared experts): the fused gate/up and the down projection. The router (BF16, replicated)
    and the LM head, at every token of the step as the roofline counts them."""
    if (model.linear_mixer_params or model.num_indexer_layers or model.query_heads_total or model.kv_reuse_drops_kv_proj
            or model.compressed_kv_values_per_token or (model.q_lora_rank and not model.is_mla)):
        return (), "this model's linear layers are not enumerated as GEMMs here"
    h = float(model.hidden_size)
    t = float(tp)
    shapes: list[tuple[ModuleGroup | None, float, float, float]] = []
    attn = float(model.num_attention_layers)
    heads = max(model.num_heads / t, 1.0)
    if model.is_mla:
        qk = float(model.qk_nope_head_dim + model.qk_rope_head_dim)
        if model.q_lora_rank:
            shapes += [(ModuleGroup.ATTENTION, float(model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim), h, attn),
                       (ModuleGroup.ATTENTION, heads * qk, float(model.q_lora_rank), attn)]
        else:
            shapes += [(ModuleGroup.ATTENTION, heads * qk, h, attn),
                       (ModuleGroup.ATTENTION, float(model.kv_lora_rank + model.qk_rope_head_dim), h, attn)]
        shapes += [(ModuleGroup.ATTENTION, heads * (model.qk_nope_head_dim + model.v_head_dim), float(model.kv_lora_rank), attn),
                   (ModuleGroup.ATTENTION, h, heads * model.v_head_dim, attn)]
    else:
        q_cols = heads * model.head_dim * (2 if model.attn_output_gate else 1)
        kv_cols = 2.0 * model.head_dim * max(model.num_kv_heads / t, 1.0)
        shapes += [(ModuleGroup.ATTENTION, q_cols + kv_cols, h, attn), (ModuleGroup.ATTENTION, h, heads * model.head_dim, attn)]
    gate = model.ffn_matrices - 1.0  # the fused gate/up projection's width in FFN widths (1: a plain up projection)
    ffns: tuple[tuple[ModuleGroup, int, int], ...] = (
        (ModuleGroup.DENSE_FFN, model.intermediate_size, model.num_dense_layers),
        (ModuleGroup.SHARED_EXPERTS, model.shared_expert_intermediate_size or model.num_shared_experts * model.moe_intermediate_size,
         model.num_moe_layers))
    for ffn, width, layers in ffns:
        if width and layers:
            shapes += [(ffn, gate * width / t, h, float(layers)), (ffn, h, width / t, float(layers))]
    if model.num_moe_layers:
        shapes.append((None, float(model.num_experts), h, float(model.num_moe_layers)))  # the router, BF16 on every rank
    shapes.append((ModuleGroup.LM_HEAD, model.vocab_size / t, h, 1.0))
    out = []
    for group, n, k, calls in shapes:
        dtype = "bfloat16" if group is None else _gemm_table_dtype(model, group, precision)
        if dtype is None:
            return (), f"no GEMM table times {group.value if group else 'router'} weights in this format"
        out.append((dtype, n, k, calls))
    return tuple(out), ""


GEMM_TABLE_MAX_N = 65536.0  # the widest n the GEMM tables measured (kernels.gemm_time_s)
# Which table times an engine's GEMMs of a format where its own table for that format does not time the kernel a serving
# step runs. vLLM 0.24.0's block-FP8 GEMM tables are flat in m at 58–62 µs (H100, H200) and 170–280 µs (B200) from 1 to
# 256 tokens, whatever the shape (2048 × 3072 as 7168 × 8192), 7–30× its per-tensor FP8 table at decode sizes: a fixed
# cost per call that a CUDA-graph step does not pay (MiniMax-M2.5's block-FP8 rows on B200 TP4 measure a whole decode
# step of 9.5 ms, where 124 such calls would take 21 ms). SGLang's tables time both formats on the same GPUs, and there
# block-FP8 runs at 0.8–1.3× per-tensor FP8 (the same FP8 tensor-core work, scales on 128 × 128 blocks): vLLM's
# block-FP8 GEMMs take its per-tensor FP8 table.
GEMM_TABLE_DTYPE = {("vllm", "fp8_block"): "fp8"}


def padded_envelope(times: Any) -> Any:
    """A GEMM's measured times at rising m made non-decreasing: each point the least time measured at that m or any larger.

    Any kernel that multiplies m' rows multiplies m ≤ m' rows padded to m', in the same time, and an engine does pad: vLLM
    runs a decode step as the CUDA graph captured at the next size up. The GEMM tables are not monotone in m: vLLM 0.24.0's
    B200 per-tensor FP8 GEMM of n 8,192 × k 3,072 reads 25.7, 10.0, 17.2, 10.1, 17.5, 10.7, 17.5, 10.9 µs at m = 1 … 128,
    every even power of two 1.6–2.6× the odd one beside it; Llama-3.1-8B, Qwen3-8B and Llama-3.1-70B on H100, H200, B200 and
    A100 under vLLM and SGLang at TP 1–8 each have such a dip, 1–26 % of the step's GEMM time. Read as measured, a TP1 rank of MiniMax-M2.5 paid 3.5 ms for
    its dense GEMMs at one token and 1.8 ms at two, which priced attention-DP layouts against TP at the dips."""
    t = np.asarray(times, dtype=float)
    return np.fmin.accumulate(t[::-1])[::-1]


@cache
def _dense_curve_scalar(gpu_id: str, engine: str, release: str, shapes: tuple[tuple[str, float, float, float], ...]) -> tuple[tuple[float, ...], str, str]:
    """ln(seconds) of all of `shapes` at 2^i tokens from the engine's GEMM tables, its source, and why no table covered them
    ("" when one did). Past the largest measured m of a release (SGLang 0.5.6.post2's H100 tables stop at 8,192) a GEMM is
    compute-bound: its time grows in proportion to m from the last measured point."""
    tokens = np.exp2(np.arange(MOE_GRID, dtype=float))
    total = np.zeros(MOE_GRID)
    source = ""
    for dtype, n_all, k, calls in shapes:
        # Wider than the tables (the LM head of a 128k–200k vocabulary on one GPU): as column blocks of at most 65,536.
        pieces = math.ceil(n_all / GEMM_TABLE_MAX_N)
        n = n_all / pieces
        dtype = GEMM_TABLE_DTYPE.get((engine, dtype), dtype)
        got = kernels.gemm_time_s(gpu_id, engine, release or None, dtype=dtype, m=tokens, n=n, k=k)
        finite = np.isfinite(got.time_s)
        if got.source is None or not finite[0]:
            return tuple([math.nan] * MOE_GRID), "", f"no {engine} {dtype} GEMM table on {gpu_id} measured n={n:g}, k={k:g}"
        last = MOE_GRID - 1 if finite.all() else int(np.argmin(finite)) - 1  # the last of the measured run from m = 1
        times = np.where(np.arange(MOE_GRID) <= last, got.time_s, got.time_s[last] * tokens / tokens[last])
        total = total + calls * pieces * padded_envelope(times)
        source = source or f"{got.source.describe()} GEMMs, {dtype}"
    return tuple(float(v) for v in np.log(total)), source, ""


def measured_dense_curve(model: ModelArch, gpu: Gpu, engine: Engine | None, release: str | None, precision: Precision,
                         tp: Any) -> tuple[CurveRows, str, str]:
    """ln(seconds) of a step's dense linear layers (`dense_gemm_shapes`, the whole model) at 2^i tokens per candidate (rows
    of NaN where no table covers them), the source of the first covered row ("" when none), and why the first uncovered
    one has no table."""
    name = KERNEL_ENGINES.get(engine) if engine is not None else None
    tps, index = _distinct(tp)
    rows = np.full((len(tps), MOE_GRID), np.nan)
    curve = CurveRows(rows, index)
    if name is None:
        return curve, "", "no measured tables of this engine"
    source = reason = ""
    for row, (t,) in enumerate(tps):
        shapes, why = dense_gemm_shapes(model, precision, t)
        if not shapes:
            reason = reason or why
            continue
        values, where, why = _dense_curve_scalar(gpu.id, name, release or "", shapes)
        if where:
            source = source or where
            rows[row] = np.asarray(values)
        else:
            reason = reason or why
    return curve, source, reason


def _dense_table_s(curve: Any, tokens: Any) -> Any:
    """The dense curve at `tokens` (`_moe_table_s`'s interpolation); past its last grid point (32,768 tokens) in proportion
    to the tokens, as a compute-bound GEMM grows."""
    top = 2.0 ** (MOE_GRID - 1)
    t = np.asarray(tokens, dtype=float)
    return _moe_table_s(curve, np.minimum(t, top)) * np.maximum(t / top, 1.0)


ATTN_GRID = 12  # decode batch sizes 1, 2, 4, …, 2,048 at which the measured decode attention is kept (the tables' batch axis)
_KV_TABLE_DTYPE = {KvDtype.AUTO: "bfloat16", KvDtype.BF16: "bfloat16", KvDtype.FP8: "fp8"}


@cache
def _decode_attention_scalar(gpu_id: str, engine: str, release: str, kv_dtype: str, head_dim: int, kv_heads: int,
                             heads: float) -> tuple[tuple[float, ...], tuple[float, ...], str, str]:
    """One layer's decode attention from the tables at 2^i sequences: the chord through the shortest and the longest cache
    measured at that batch (the tables stop near 2^21 cached tokens), as the fixed seconds and the seconds per cached
    token; its source, and why none covered it ("" when one did). Exact at both ends; between them small batches run up
    to ~10 % above the chord (their time is concave in the cache length)."""
    batch = np.exp2(np.arange(ATTN_GRID, dtype=float))
    kv_len = np.exp2(np.arange(1, 13, dtype=float))  # 2 … 4,096, the tables' grid
    got = kernels.generation_attention_s(gpu_id, engine, release or None, kv_dtype=kv_dtype, head_dim=head_dim, kv_heads=kv_heads,
                                         heads=heads, batch=batch[:, None], kv_len=kv_len[None, :])
    t = got.time_s
    if got.source is None or not np.isfinite(t[:, :2]).all():
        none = tuple([math.nan] * ATTN_GRID)
        return none, none, "", (f"no {engine} decode-attention table on {gpu_id} measured head size {head_dim}, {kv_heads} KV and "
                                f"{heads:g} query heads a GPU, {kv_dtype} cache")
    floor, slope = np.full(ATTN_GRID, np.nan), np.full(ATTN_GRID, np.nan)
    for i in range(ATTN_GRID):
        hi = np.flatnonzero(np.isfinite(t[i]))[-1]
        per_token = max((t[i, hi] - t[i, 0]) / (batch[i] * (kv_len[hi] - kv_len[0])), 0.0)
        slope[i] = per_token
        floor[i] = max(t[i, 0] - per_token * batch[i] * kv_len[0], 0.0)
    return tuple(float(v) for v in floor), tuple(float(v) for v in slope), f"{got.source.describe()} decode attention, {kv_dtype}", ""


def measured_decode_attention(model: ModelArch, gpu: Gpu, engine: Engine | None, release: str | None, kv_dtype: KvDtype,
                              tp: Any) -> tuple[CurveRows, str, str]:
    """The full-attention layers' decode attention of the whole model at 2^i sequences per candidate, [..., 0, :] fixed
    seconds and [..., 1, :] seconds per cached token (NaN where not covered), the source of the first covered candidate,
    and why the first uncovered one has no table. MLA, sliding-window, indexed and fixed-state layers keep the roofline."""
    name = KERNEL_ENGINES.get(engine) if engine is not None else None
    tps, index = _distinct(tp)
    rows = np.full((len(tps), 2, ATTN_GRID), np.nan)
    curve = CurveRows(rows, index)
    if name is None:
        return curve, "", "no measured tables of this engine"
    layers = 0 if (model.is_mla or model.has_indexer) else model.num_full_attention_layers
    if not layers:
        return curve, "", "no full-attention GQA layers (MLA, windows and indexers keep the roofline)"
    source = reason = ""
    for row, (t,) in enumerate(tps):
        kv_heads = max(model.num_kv_heads // int(t), 1)  # replicated where TP exceeds them: one a GPU
        floor, slope, where, why = _decode_attention_scalar(gpu.id, name, release or "", _KV_TABLE_DTYPE[kv_dtype], model.head_dim,
                                                            kv_heads, max(model.num_heads / t, 1.0))
        if where:
            source = source or where
            rows[row] = np.array([floor, slope]) * layers
        else:
            reason = reason or why
    return curve, source, reason


def _decode_attention_table_s(curve: Any, sequences: Any, context_tokens: Any) -> Any:
    """Decode attention of `sequences` reading `context_tokens` cached tokens in all: the fixed cost and the cost per token
    interpolated linearly in log2(sequences); past 2,048 sequences the fixed cost in proportion; 0 without sequences."""
    top = ATTN_GRID - 1
    seqs = np.asarray(sequences, dtype=float)
    pos = np.log2(np.maximum(seqs, 1.0))
    beyond = np.maximum(seqs / 2.0**top, 1.0)
    pos = np.minimum(pos, top - 1e-9)
    i = np.floor(pos).astype(np.int64)
    frac = pos - i
    if isinstance(curve, CurveRows):  # a row's floors then its slopes
        flat = curve.rows.ravel()
        at = curve.index * (2 * ATTN_GRID) + i
        f_lo, f_hi, s_lo, s_hi = flat[at], flat[at + 1], flat[at + ATTN_GRID], flat[at + ATTN_GRID + 1]
    else:
        c = np.asarray(curve, dtype=float)
        f_lo, f_hi = _curve_points(c[..., 0, :], i)
        s_lo, s_hi = _curve_points(c[..., 1, :], i)
    f = f_lo * (1.0 - frac) + f_hi * frac
    s = s_lo * (1.0 - frac) + s_hi * frac
    return np.where(seqs > 0, f * beyond + s * np.asarray(context_tokens, dtype=float), 0.0)


def _decode_attention_float(floor: Sequence[float], slope: Sequence[float], sequences: float, context_tokens: float) -> float:
    """`_decode_attention_table_s` of one instance's curve on floats: the same operations in the same order."""
    if not sequences > 0:
        return 0.0
    top = ATTN_GRID - 1
    pos = math.log2(sequences if sequences > 1.0 else 1.0)
    beyond = sequences / 2.0**top
    beyond = beyond if beyond > 1.0 else 1.0
    pos = pos if pos < top - 1e-9 else top - 1e-9
    i = int(pos)  # pos >= 0: the floor
    frac = pos - i
    f = floor[i] * (1.0 - frac) + floor[i + 1] * frac
    s = slope[i] * (1.0 - frac) + slope[i + 1] * frac
    return f * beyond + s * context_tokens


def step_coefficients(model: ModelArch, gpu: Gpu, *, precision: Precision, kv_dtype: KvDtype, engine: Engine,
                      tp: Any, pp: Any, dp: Any, moe_ep: Any = 1, moe_precision: Precision | None = None,
                      overhead_scale: float | None = None, params: PerfParams | None = None,
                      release: str | None = None, kernel_engine: Engine | None = None) -> StepCoefficients:
    """Fold model, GPU and parallelism into the constants `evaluate_step_s` needs (arrays broadcast).

    `kernel_engine` and `release`: whose measured kernel tables price the terms they cover (`measured_terms`);
    None: the engine's own tables, of its newest measured release. An engine without tables (TRT-LLM in calibration)
    passes `overhead_scale` and gets the roofline unless `kernel_engine` names one.
    `moe_ep` is the expert-parallel degree of the expert layers (1 = experts tensor-sharded over tp × dp).
    `overhead_scale` overrides the engine's per-step overhead scale (an engine outside `Engine`, e.g. TRT-LLM).
    Two steps: `step_geometry` (what no fitted parameter changes) and `fold_coefficients` (the parameters).
    """
    p = params or perf_params()
    # Whose measured kernel tables price the terms they cover: an engine given only by its overhead scale has none.
    tables_for = kernel_engine if kernel_engine is not None else (engine if overhead_scale is None else None)
    g = step_geometry(model, gpu, precision=precision, kv_dtype=kv_dtype, engine=engine, tp=tp, pp=pp, dp=dp, moe_ep=moe_ep,
                      moe_precision=moe_precision, release=release, tables_for=tables_for, table_allreduce=p.measured_allreduce >= 0.5,
                      table_exchange=p.measured_exchange >= 0.5, table_moe=p.measured_moe >= 0.5,
                      table_gemm=p.measured_gemm >= 0.5, table_decode_attention=p.measured_decode_attention >= 0.5)
    return fold_coefficients(g, p, overhead_scale)


def _link_geometry(gpu: Gpu, group: Any) -> tuple[Any, Any]:
    """`_link_bps` without its fitted efficiency: (GB/s before `link_eff`, whether `link_eff` applies) per element."""
    nvlink = gpu.scaleup_link is Link.NVLINK
    intra = gpu.nvlink_gbps if nvlink else gpu.pcie_gbps * PCIE_BUS_EFF
    inside = np.asarray(group) <= gpu.gpus_per_node
    return np.where(inside, intra, gpu.nic_gbit / 8.0), np.where(inside, nvlink, True)


def _link_fold(base: Any, fitted: Any, p: PerfParams) -> Any:
    """`_link_bps` from `_link_geometry`: the same products, so the same floats."""
    return np.where(fitted, base * p.link_eff, base) * 1e9


def _allreduce_geometry(gpu: Gpu, group: Any) -> tuple[Any, Any, Any]:
    """`_allreduce_latency_s` without its fitted latencies: (GPUs beyond two on NVLink, the unfitted intra-node cost where
    the link is not NVLink (NaN on NVLink), the tree hops) per element."""
    n = np.minimum(group, gpu.gpus_per_node)
    link = gpu.scaleup_link
    if link is Link.NVLINK:
        const = np.nan + 0.0 * n
    elif link is Link.PCIE_P2P:
        const = np.where(n <= 2, PCIE_CUSTOM_AR_S, PCIE_P2P_AR_BASE_S + PCIE_P2P_AR_PER_GPU_S * n)
    else:
        const = PCIE_HOST_AR_BASE_S + PCIE_HOST_AR_PER_GPU_S * n
    hops = 1.0 + np.log2(np.maximum(group / gpu.gpus_per_node, 1.0))
    return np.maximum(n - 2.0, 0.0), const, hops


def _allreduce_fold(extra: Any, const: Any, hops: Any, p: PerfParams) -> Any:
    intra = np.where(np.isnan(const), p.allreduce_latency_s + p.allreduce_peer_latency_s * extra, const)
    return intra * hops


def _exchange_geometry(gpu: Gpu, group: Any) -> Any:
    """`_exchange_latency_s` where it is not fitted (off NVLink); NaN on NVLink (the fitted `a2a_latency_s`)."""
    if gpu.scaleup_link is Link.NVLINK:
        return np.nan + 0.0 * np.asarray(group, dtype=float)
    return 0.5 * _allreduce_latency_s(gpu, np.maximum(group, 2), PerfParams())


def _exchange_fold(const: Any, p: PerfParams) -> Any:
    return np.where(np.isnan(const), p.a2a_latency_s, const)


def _gemm_geometry(gpu: Gpu, precision: Precision) -> tuple[float, float, float, float]:
    """`_compute_peak` and `_gemm_eff` without the fitted shares: (peak FLOP/s, measured best share or NaN, which fitted
    scale applies (0 none, 1 `fp8_eff_scale`, 2 `fp4_eff_scale`), the bytes `_narrow_cols` divides by)."""
    native = precision is not Precision.BF16 and float(getattr(gpu, f"{precision.value}_tflops", 0.0)) > 0
    kind = {Precision.FP8: 1.0, Precision.FP4: 2.0}.get(precision, 0.0) if native else 0.0
    best = gpu.matmul_bf16_tflops / gpu.bf16_tflops if gpu.matmul_bf16_tflops > 0 else math.nan
    return _compute_peak(gpu, precision), best, kind, max(precision.weight_bytes, 0.5)


def _gemm_fold(peak: Any, best: Any, kind: Any, p: PerfParams) -> Any:
    """`_compute_peak(gpu, precision) * _gemm_eff(p, gpu, precision)` from `_gemm_geometry`."""
    scale = np.where(kind == 1.0, p.fp8_eff_scale, np.where(kind == 2.0, p.fp4_eff_scale, 1.0))
    return peak * (np.where(np.isnan(best), p.gemm_eff_max, best) * scale)


def _stage_curve(curve: CurveRows, pp: Any, group: Any, *, log: bool) -> CurveRows | None:
    """A measured whole-model curve as one pipeline stage's, 1/pp of the layers, a row per distinct (curve, pp) and an
    index of the candidates' shape (that of `group`); `log`: the curve holds ln(seconds). None where no candidate is
    covered."""
    if not np.isfinite(curve.rows).any():
        return None
    index, stages, _ = np.broadcast_arrays(curve.index, np.asarray(pp, dtype=float), np.asarray(group, dtype=float))
    pairs, at = _distinct(index, stages)
    rows = np.stack([curve.rows[int(row)] - np.log(p) if log else curve.rows[int(row)] / p for row, p in pairs])
    return CurveRows(rows, at)


@dataclass(frozen=True, slots=True)
class StepGeometry:
    """What `step_coefficients` folds that no fitted parameter changes (the model's, GPU's and layout's shapes, the
    measured kernel tables' times), per candidate. `fold_coefficients` prices it with parameters; one geometry serves
    every parameter set a fit tries, and geometries of several instances concatenate (`concat_geometry`) so that one
    fold prices them all. Each field is the part of a coefficient's expression before its first fitted factor, so the
    fold performs the same floating-point operations in the same order: the same floats as folding in one pass."""

    # Coefficients no parameter touches (StepCoefficients' fields of the same names).
    local_experts: Any
    ep_z: Any
    dp: Any
    experts: Any
    topk: Any
    pp: Any
    attn_cap_tokens: Any
    moe_log_curve: Any
    moe_table_share: Any
    moe: Any
    lin_log_curve: Any
    dec_attn_curve: Any
    # Dense linear layers: 2 · params / pp / tp, weight bytes / pp / tp, hidden / tp; the GEMM peak (`_gemm_geometry`).
    lin_flops: Any
    lin_bytes: Any
    hidden_per_tp: Any
    lin_peak: Any
    lin_best: Any
    lin_kind: Any
    lin_width: Any
    hbm: Any
    # Routed experts: 2 · k · expert params · layers / group, expert bytes · layers / MoE TP, the expert width.
    moe_flops: Any
    moe_bytes: Any
    moe_inter: Any
    moe_peak: Any
    moe_best: Any
    moe_kind: Any
    moe_width: Any
    # Exchange: bytes a token moves, the link (`_link_geometry`) of the group, 2 · MoE layers where it has a fixed cost,
    # `_exchange_geometry` of the group; measured exchange terms (NaN: the fitted ones).
    a2a_bytes: Any
    group_link: Any
    group_link_fitted: Any
    a2a_fixed_layers: Any
    moe_layers: Any  # MoE layers of the stage (0 for a dense model)
    moe_latency_scale: Any  # a MoE layer's fixed cost over `moe_layer_latency_s` (`moe_latency_scale`)
    group_exchange: Any
    x_fixed: Any
    x_tok: Any
    # Attention: FLOPs per pair (full and capped layers), their peak; bytes read per context token (full, capped), per
    # sequence; absorbed-MLA FLOPs per context token (for full or capped layers, else 0); the GQA re-read factors.
    pair_flops: Any
    pair_peak: Any
    capped_pair_flops: Any
    peak16: Any
    read_ctx: Any
    read_capped: Any
    read_seq: Any
    mla_ctx_flops: Any
    mla_capped_flops: Any
    mixed_reread: Any
    mixed_heads: Any
    # TP all-reduces: where tp > 1, the bytes a token moves, the link, `_allreduce_geometry`, the all-reduces per step and
    # the measured terms (NaN: the fitted ones).
    tp_multi: Any
    tp_bytes: Any
    tp_link: Any
    tp_link_fitted: Any
    ar_extra: Any
    ar_const: Any
    ar_hops: Any
    reduces: Any
    m_fixed: Any
    m_tok: Any
    # Pipeline hand-offs: where pp > 1, the bytes a token moves over the instance's link, whether it is NVLink, the
    # unfitted exchange latency off NVLink.
    pp_multi: Any
    handoff_bytes: Any
    pp_link: Any
    pp_link_fitted: Any
    pp_nvlink: Any
    pp_exchange: Any
    layers: Any
    sglang: Any  # the engine's per-step overhead is SGLang's (`sglang_overhead_scale`)


def step_geometry(model: ModelArch, gpu: Gpu, *, precision: Precision, kv_dtype: KvDtype, engine: Engine, tp: Any, pp: Any, dp: Any,
                  moe_ep: Any = 1, moe_precision: Precision | None = None, release: str | None = None, tables_for: Engine | None = None,
                  table_allreduce: bool = False, table_exchange: bool = True, table_moe: bool = False,
                  release_recorded: bool = True, table_gemm: bool = False, table_decode_attention: bool = False) -> StepGeometry:
    """The parameter-free part of `step_coefficients` (same arguments; `tables_for`: whose measured kernel tables price the
    terms they cover, None for none; `table_*`: the `measured_*` switches of PerfParams). `release_recorded` False: a
    measured row whose engine release nobody recorded; release None then stands for the newest measured release
    everywhere but in the MoE term, which takes a table only from the release that ran (kernels.moe_release)."""
    mp = moe_precision or precision
    frac = 1.0 / pp
    peak16 = gpu.bf16_tflops * 1e12
    hbm = gpu.hbm_gbps * 1e9
    lin_peak, lin_best, lin_kind, lin_width = _gemm_geometry(gpu, precision)
    moe_peak, moe_best, moe_kind, moe_width = _gemm_geometry(gpu, mp)

    # Dense linear layers (attention projections, dense/shared FFN, router) and the LM head, TP-sharded.
    linear_params = (model.non_expert_params - model.embedding_params) + model.vocab_size * model.hidden_size
    lin_flops = 2.0 * linear_params * frac / tp
    lin_bytes = linear_weight_bytes(model, precision) * frac / tp

    group = tp * dp
    ep = np.minimum(moe_ep, group)
    moe_tp = group / ep
    zero = 0.0 * group
    group_link, group_link_fitted = _link_geometry(gpu, group)
    if model.is_moe:
        moe_layers = model.num_moe_layers * frac
        # An expert's GEMMs are charged the width of the whole expert, whatever the MoE TP: the measured fused-MoE
        # kernels (planner/data/kernels, balanced routing, 8–64 tokens) run an expert sliced over n GPUs as fast as
        # n GPUs holding whole experts (MoE TP n against EP n: median ratio 1.02 over 4,476 vLLM shape points; the width
        # constant it implies is 14 B, against the 132 B a dense FP8 GEMM's slices pay). A grouped GEMM tiles over
        # tokens × experts, not over one expert's columns, so the dense slices' tile waste does not apply to it.
        moe_inter: Any = float(model.moe_intermediate_size)
        moe_flops = 2.0 * model.experts_per_token * model.expert_params * moe_layers / group
        moe_bytes = expert_weight_bytes(model, precision, mp) * moe_layers / moe_tp
        # EP under DP attention: each token is dispatched (FP8, 1 byte) to and combined (BF16, 2 bytes) from the
        # distinct remote GPUs holding its k experts. DP attention without EP: tokens are all-gathered and
        # reduce-scattered (BF16). EP under TP attention (dp = 1) exchanges nothing of its own: every GPU already
        # holds every token, computes its local experts and the outputs are summed by the TP all-reduce that TP
        # experts use too (SGLang FusedMoE.forward: `if reduce_results and (moe_tp_size > 1 or moe_ep_size > 1):
        # tensor_model_parallel_all_reduce`, sgl-project/sglang python/sglang/srt/layers/moe/fused_moe_triton/layer.py;
        # vLLM likewise uses its all2all manager only when data_parallel_size > 1).
        k = model.experts_per_token
        exchanged = (ep > 1) & (dp > 1)
        remote = np.where(exchanged, ep * (1.0 - (1.0 - 1.0 / np.maximum(ep, 1)) ** k) * (ep - 1) / np.maximum(ep, 1), 0.0)
        gathered = np.where((ep <= 1) & (dp > 1), 2.0 * 2.0 * (dp - 1) / dp, 0.0)
        a2a_bytes = moe_layers * model.hidden_size * (3.0 * remote + gathered)
        a2a_fixed_layers = np.where(dp > 1, moe_layers * 2.0, zero)
        local = model.num_experts / ep
        stage_moe_layers = moe_layers + zero
    else:  # every expert term folds to exactly 0 (0 / a finite peak, 0 · a finite latency)
        moe_flops = moe_bytes = a2a_bytes = a2a_fixed_layers = stage_moe_layers = zero
        moe_inter = 1.0
        local = zero
    ep_z = _max_normal_z(ep) if model.is_moe else zero

    # Attention: prefill is compute (pairs of query and key tokens), decode reads the KV cache. Sliding-window
    # layers and DSA's sparse attention see at most `cap` keys per query (planner.perf.memory.attention_read_bytes);
    # fixed-state layers read and write their state once per sequence and step.
    heads = np.maximum(model.num_heads / tp, 1.0)
    qk_v_dim = (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) if model.is_mla else 2 * model.head_dim
    read = attention_read_bytes(model, kv_dtype, tp=tp, pp=pp, engine=engine)
    capped_layers = (model.num_attention_layers if model.has_indexer else model.num_sliding_layers) * frac
    full_layers = (0 if model.has_indexer else model.num_full_attention_layers) * frac
    pair_flops = 2.0 * heads * qk_v_dim * full_layers
    pair_peak: Any = peak16
    capped_pair_flops = 2.0 * heads * qk_v_dim * capped_layers
    if model.has_indexer:  # the indexer scores every (query, key) pair: index heads × index dim, in FP8
        pair_flops = 2.0 * model.index_n_heads * model.index_head_dim * model.num_indexer_layers * frac + 0.0 * heads
        pair_peak = _compute_peak(gpu, Precision.FP8)
    mla_ctx_flops: Any = 0.0
    mla_capped_flops: Any = 0.0
    if model.is_mla:  # absorbed MLA decode multiplies every local head against the latent: compute can dominate
        mla_flops = 2.0 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) * model.num_attention_layers * frac
        if model.has_indexer:
            mla_capped_flops = mla_flops
        else:
            mla_ctx_flops = mla_flops
        mixed_reread, mixed_heads = 0.0, 0.0
    else:  # beside a prefill chunk, each query head of a GQA group may read the group's KV again (see gpus.toml)
        mixed_reread, mixed_heads = gpu.mixed_kv_reread, model.num_heads / max(model.num_kv_heads, 1) - 1.0

    # Two all-reduces per layer under TP (ring: 2(n−1)/n of the activations cross each link); in MoE layers
    # whose experts are expert-parallel under DP attention the combine replaces the second one.
    layers = model.num_layers * frac
    reduces = 2.0 * layers - np.where((ep > 1) & (dp > 1), model.num_moe_layers * frac, 0.0)
    # The link is the one the tp GPUs share (planner.hardware.Link): NVLink, PCIe with or without peer-to-peer, a NIC.
    tp_bytes = reduces * 2.0 * (tp - 1) / tp * model.hidden_size * 2.0
    tp_link, tp_link_fitted = _link_geometry(gpu, tp)
    ar_extra, ar_const, ar_hops = _allreduce_geometry(gpu, tp)
    nan = np.nan + zero
    m_fixed = m_tok = x_fixed = x_tok = nan
    if table_allreduce:  # the engine's measured custom all-reduce where a table covers it
        m_f, m_t = measured_allreduce(gpu, tables_for, release, tp, model.hidden_size)
        m_fixed = np.where(np.isfinite(m_f), reduces * np.nan_to_num(m_f), np.nan)
        m_tok = np.where(np.isfinite(m_t), reduces * np.nan_to_num(m_t), np.nan)
    pp_link, pp_link_fitted = _link_geometry(gpu, tp * dp * pp)
    if table_exchange and model.is_moe:
        # Measured where the engine's exchange is timed for the group (`measured_exchange`: SGLang's DeepEP all-to-all,
        # vLLM's all-gather and reduce-scatter over NCCL), per MoE layer, in place of the fitted exchange.
        x_f, x_t = measured_exchange(gpu, tables_for, tp, dp, ep, model.hidden_size, release=release, topk=model.experts_per_token,
                                     experts=model.num_experts)
        x_fixed = np.where(np.isfinite(x_f), model.num_moe_layers * frac * np.nan_to_num(x_f), np.nan)
        x_tok = np.where(np.isfinite(x_t), model.num_moe_layers * frac * np.nan_to_num(x_t), np.nan)
    moe_curve = None
    if table_moe and model.is_moe and release_recorded:
        moe_curve = _stage_curve(measured_moe_curve(model, gpu, tables_for, release, mp, moe_tp, ep)[0], pp, group, log=True)
    lin_curve = attn_curve = None
    if table_gemm:
        lin_curve = _stage_curve(measured_dense_curve(model, gpu, tables_for, release, precision, tp)[0], pp, group, log=True)
    if table_decode_attention:
        attn_curve = _stage_curve(measured_decode_attention(model, gpu, tables_for, release, kv_dtype, tp)[0], pp, group, log=False)
    table_share = (1.0 + zero) if tables_for is Engine.VLLM else 1.0 / np.maximum(ep, 1)
    return StepGeometry(
        local_experts=local, ep_z=ep_z, dp=dp, experts=float(max(model.num_experts, 1)), topk=float(model.experts_per_token), pp=pp,
        attn_cap_tokens=min(read.cap_tokens, 1e15), moe_log_curve=moe_curve, moe_table_share=table_share, moe=model.is_moe,
        lin_log_curve=lin_curve, dec_attn_curve=attn_curve,
        lin_flops=lin_flops, lin_bytes=lin_bytes, hidden_per_tp=model.hidden_size / tp, lin_peak=lin_peak, lin_best=lin_best,
        lin_kind=lin_kind, lin_width=lin_width, hbm=hbm,
        moe_flops=moe_flops, moe_bytes=moe_bytes, moe_inter=moe_inter, moe_peak=moe_peak, moe_best=moe_best, moe_kind=moe_kind,
        moe_width=moe_width, a2a_bytes=a2a_bytes, group_link=group_link, group_link_fitted=group_link_fitted,
        a2a_fixed_layers=a2a_fixed_layers, moe_layers=stage_moe_layers,
        moe_latency_scale=moe_latency_scale(model, mp, tables_for) if model.is_moe else 1.0, group_exchange=_exchange_geometry(gpu, group),
        x_fixed=x_fixed, x_tok=x_tok,
        pair_flops=pair_flops, pair_peak=pair_peak, capped_pair_flops=capped_pair_flops, peak16=peak16,
        read_ctx=read.per_context_token, read_capped=read.capped_per_token, read_seq=read.per_sequence,
        mla_ctx_flops=mla_ctx_flops, mla_capped_flops=mla_capped_flops, mixed_reread=mixed_reread, mixed_heads=mixed_heads,
        tp_multi=np.asarray(tp) > 1, tp_bytes=tp_bytes, tp_link=tp_link, tp_link_fitted=tp_link_fitted, ar_extra=ar_extra,
        ar_const=ar_const, ar_hops=ar_hops, reduces=reduces, m_fixed=m_fixed, m_tok=m_tok,
        pp_multi=np.asarray(pp) > 1, handoff_bytes=model.hidden_size * 2.0, pp_link=pp_link, pp_link_fitted=pp_link_fitted,
        pp_nvlink=gpu.scaleup_link is Link.NVLINK, pp_exchange=_exchange_geometry(gpu, tp * dp * pp), layers=layers,
        sglang=engine is Engine.SGLANG,
    )


def fold_coefficients(g: StepGeometry, p: PerfParams, overhead_scale: Any = None) -> StepCoefficients:
    """`step_coefficients` from its geometry and the parameters. `overhead_scale`: the per-step overhead scale of an
    engine outside `Engine` (per element where geometries were concatenated; NaN: the engine's own)."""
    lin_peak = _gemm_fold(g.lin_peak, g.lin_best, g.lin_kind, p)
    narrow = 1.0 + p.narrow_width_cols * 2.0 / g.lin_width / g.hidden_per_tp
    lin_flop_s = g.lin_flops / lin_peak * narrow
    lin_mem_s = g.lin_bytes / (g.hbm * p.mem_eff) * narrow
    moe_peak = _gemm_fold(g.moe_peak, g.moe_best, g.moe_kind, p) * p.moe_eff_scale
    moe_narrow = 1.0 + p.narrow_width_cols * 2.0 / g.moe_width / g.moe_inter
    moe_flop_s = g.moe_flops / moe_peak * moe_narrow
    moe_mem_s = g.moe_bytes / (g.hbm * p.mem_eff) * moe_narrow
    group_bps = _link_fold(g.group_link, g.group_link_fitted, p)
    a2a_tok = g.a2a_bytes / group_bps
    a2a_fixed = g.a2a_fixed_layers * _exchange_fold(g.group_exchange, p)
    a2a_fixed = np.where(np.isnan(g.x_fixed), a2a_fixed, g.x_fixed)
    a2a_tok = np.where(np.isnan(g.x_tok), a2a_tok, g.x_tok)

    attn_pair_s = g.pair_flops / (g.pair_peak * p.attn_prefill_eff)
    attn_capped_pair_s = g.capped_pair_flops / (g.peak16 * p.attn_prefill_eff)
    decode_bw = g.hbm * p.attn_decode_mem_eff
    mla_s_ctx = g.mla_ctx_flops / (g.peak16 * p.attn_prefill_eff)
    mla_s_capped = g.mla_capped_flops / (g.peak16 * p.attn_prefill_eff)
    attn_ctx_s = np.maximum(g.read_ctx / decode_bw, mla_s_ctx)
    attn_capped_ctx_s = np.maximum(g.read_capped / decode_bw, mla_s_capped)
    attn_seq_s = g.read_seq / decode_bw
    attn_mixed_ctx_s = attn_ctx_s * g.mixed_reread * g.mixed_heads

    tp_tok = np.where(g.tp_multi, g.tp_bytes / _link_fold(g.tp_link, g.tp_link_fitted, p), 0.0)
    tp_fixed = np.where(g.tp_multi, g.reduces * _allreduce_fold(g.ar_extra, g.ar_const, g.ar_hops, p), 0.0)
    tp_fixed = np.where(np.isnan(g.m_fixed), tp_fixed, g.m_fixed)
    tp_tok = np.where(np.isnan(g.m_tok), tp_tok, g.m_tok)
    handoff_tok = np.where(g.pp_multi, g.handoff_bytes / _link_fold(g.pp_link, g.pp_link_fitted, p), 0.0)
    handoff_fixed = np.where(g.pp_multi, np.where(g.pp_nvlink, 2.0 * p.allreduce_latency_s, g.pp_exchange), 0.0)
    engine_scale = np.where(g.sglang, p.sglang_overhead_scale, 1.0)
    scale: Any = engine_scale if overhead_scale is None else np.where(np.isnan(overhead_scale), engine_scale, overhead_scale)
    scale = float(scale) if np.ndim(scale) == 0 else scale
    # SGLang's overlap scheduler (on by default) prepares the next batch on the CPU while the GPU runs this one: none of its
    # per-sequence CPU work is waited for (`seq_serial_s` is vLLM's, and a TensorRT-LLM row's by its overhead scale).
    serial: Any = p.seq_serial_s * np.where(g.sglang, 0.0, scale)
    serial = float(serial) if np.ndim(serial) == 0 else serial
    coeffs = StepCoefficients(
        lin_flop_s=lin_flop_s, lin_mem_s=lin_mem_s, moe_flop_s=moe_flop_s, moe_mem_s=moe_mem_s, local_experts=g.local_experts, dp=g.dp,
        experts=g.experts, topk=g.topk, a2a_s_per_token=a2a_tok,
        a2a_fixed_s=a2a_fixed, ep_z=g.ep_z, attn_pair_s=attn_pair_s, attn_ctx_s=attn_ctx_s, attn_mixed_ctx_s=attn_mixed_ctx_s,
        attn_capped_pair_s=attn_capped_pair_s, attn_capped_ctx_s=attn_capped_ctx_s, attn_cap_tokens=g.attn_cap_tokens,
        attn_seq_s=attn_seq_s, tp_s_per_token=tp_tok, tp_fixed_s=tp_fixed,
        handoff_s_per_token=handoff_tok, handoff_fixed_s=handoff_fixed, layer_fixed_s=p.layer_overhead_s * g.layers,
        pp=g.pp, step_fixed_s=p.step_overhead_s * scale, per_seq_s=p.per_seq_overhead_s * scale,
        moe_fixed_s=g.moe_layers * (g.moe_latency_scale if p.moe_latency_by_format >= 0.5 else 1.0) * p.moe_layer_latency_s,
        seq_serial_s=serial,
        gemm_half_tokens=p.gemm_half_tokens, sharp=p.roofline_sharpness, moe_log_curve=g.moe_log_curve, moe_table_share=g.moe_table_share,
        moe=g.moe, lin_log_curve=g.lin_log_curve, dec_attn_curve=g.dec_attn_curve,
    )
    return _apply_term_scales(coeffs, dict(p.step_scales)) if p.step_scales else coeffs


# The geometry's measured curves and the shape of one candidate's curve (the others are one value per candidate).
CURVES = {"moe_log_curve": (MOE_GRID,), "lin_log_curve": (MOE_GRID,), "dec_attn_curve": (2, ATTN_GRID)}


def concat_geometry(parts: Sequence[tuple[StepGeometry, int]]) -> StepGeometry:
    """Geometries of several instances (`n` candidates each) as one, a candidate per element: one fold prices them all, and
    every candidate's coefficients are the floats its own geometry folds to (the fold is elementwise)."""
    values: dict[str, Any] = {}
    for f in fields(StepGeometry):
        if f.name in CURVES:
            curves = [(getattr(g, f.name), n) for g, n in parts]
            if all(c is None for c, _ in curves):
                values[f.name] = None
                continue
            rows, index, offset = [], [], 0
            for c, n in curves:
                part = CurveRows(np.full((1, *CURVES[f.name]), np.nan), np.zeros((), dtype=np.int64)) if c is None else c
                rows.append(part.rows)
                index.append(np.broadcast_to(part.index, (n,)) + offset)
                offset += len(part.rows)
            values[f.name] = CurveRows(np.concatenate(rows), np.concatenate(index))
        else:
            values[f.name] = np.concatenate([np.broadcast_to(np.asarray(getattr(g, f.name)), (n,)) for g, n in parts])
    return StepGeometry(**values)


def _fmax(a: float, b: float) -> float:
    return a if a > b else b


def _fmin(a: float, b: float) -> float:
    return a if a < b else b


@cache
def _max_normal_z_scalar(n: int) -> float:
    """Expected maximum of n independent standard normals (Blom's approximation; 0 for n ≤ 1)."""
    return 0.0 if n <= 1 else NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _max_normal_z(n: Any) -> Any:
    """`_max_normal_z_scalar` over a scalar or an array of group sizes (few distinct values)."""
    arr = np.asarray(n)
    if arr.ndim == 0:
        return _max_normal_z_scalar(int(arr))
    values, inverse = np.unique(arr.astype(np.int64), return_inverse=True)
    return np.array([_max_normal_z_scalar(int(v)) for v in values])[inverse].reshape(arr.shape)


def evaluate_step_s(c: StepCoefficients, *, prefill_tokens: Any, prefill_pairs: Any, decode_tokens: Any,
                    decode_context_tokens: Any, maximum: Callable[[Any, Any], Any] = np.maximum,
                    minimum: Callable[[Any, Any], Any] = np.minimum, moe_tokens: Any = None) -> Any:
    """Step time from folded coefficients; plain arithmetic so floats and arrays both work.

    Pipeline parallelism splits the batch into pp micro-batches over pp stages: the step takes pp stage
    times of a micro-batch (coefficients are per stage) plus pp − 1 activation hand-offs.
    Linear time is the p-norm of compute and weight-streaming time (a smooth roofline).
    `moe_tokens`: the tokens every attention-DP rank together routes to the experts this step (see `token_terms`).
    """
    base, handoff = token_terms(c, prefill_tokens + decode_tokens, maximum=maximum, minimum=minimum, moe_tokens=moe_tokens)
    return step_from_token_terms(c, base, handoff, prefill_tokens=prefill_tokens, prefill_pairs=prefill_pairs,
                                 decode_tokens=decode_tokens, decode_context_tokens=decode_context_tokens,
                                 maximum=maximum, minimum=minimum)


def table_rank_scale(c: StepCoefficients, routed: Any, t_moe: Any, *, maximum: Callable[[Any, Any], Any] = np.maximum,
                     minimum: Callable[[Any, Any], Any] = np.minimum) -> Any:
    """This step's MoE time over the measured table's, both by the roofline: `t_moe` (the busiest EP rank under uniformly
    random top-k routing of `routed` tokens) over the rank the table timed.

    The collector's "balanced" routing (aiconfigurator collector/helper.py `balanced_logits`) is deterministic: token i
    takes experts i·s/T + j·s (T < s) or i + j·s (T >= s) modulo E, s = ceil(E / k). So the rank it times (rank 0 of
    vLLM's expert map; SGLang's rank of E / ep experts) computes exactly its even share of the routed pairs,
    routed · k / ep, each on its own expert until all E / ep are hit: no imbalance, and more experts read than random
    routing hits (MiniMax-M2.5, 16 tokens: 128 of 256 experts against 102 expected). Scaling the table by the busiest
    rank over random routing's mean rank (the rule before) counted that coverage and the imbalance on top of it.
    """
    k = c.sharp
    pairs = maximum(routed * c.topk * c.local_experts / c.experts, 1.0)  # the timed rank's routed pairs (at least one)
    t_table = ((c.moe_flop_s * (routed + c.gemm_half_tokens))**k + (c.moe_mem_s * minimum(pairs, c.local_experts))**k) ** (1.0 / k)
    return t_moe / maximum(t_table, 1e-30)


def _measured_rescale(c: StepCoefficients, t_scaled: Any, compute_s: Any, weights_s: Any) -> Any:
    """The factor a deployment's "gemm" and "weights" scales make of a measured kernel time: the roofline of the same term
    with its scaled compute and weight-streaming parts over the roofline without the scales. Where the roofline puts a step
    in weight streaming (a decode step's GEMMs) "weights" moves the measured time, where in compute "gemm" does; equal
    scales move it by exactly that factor."""
    k = c.sharp
    unscaled = ((compute_s / c.gemm_scale) ** k + (weights_s / c.weights_scale) ** k) ** (1.0 / k)
    return t_scaled / unscaled


def attention_dp_moe_tokens(total: Any, largest: Any, ranks: Any, *, sglang: Any, extend: Any, graph_tokens: Any) -> Any:
    """The tokens every attention-DP rank's experts route in one step where the engine does not pad the ranks' batches to
    the largest rank's; NaN where it does (`token_terms`' default: `ranks` × the largest rank's tokens). Arrays broadcast.

    `total`: the ranks' scheduled tokens summed; `largest`: the largest rank's; `extend`: whether any rank carries a prompt
    chunk; `graph_tokens`: the most tokens a rank runs as a CUDA graph (planner.engines.defaults.cuda_graph_tokens).
      - SGLang (srt/layers/dp_attention.py, `DpPaddingMode.get_dp_padding_mode`): a step with a prompt chunk on any rank
        gathers the ranks' tokens unpadded (SUM_LEN); a decode step pads every rank to the largest (MAX_LEN) unless that
        gathers at least twice the sum (sum × 2 <= largest × ranks: SUM_LEN).
      - vLLM (v1/worker/dp_utils.py, `_synchronize_dp_ranks`): the ranks are padded to the largest only when every rank runs
        the step as a CUDA graph (the synchronized mode is the ranks' minimum); a step of more than `graph_tokens` tokens on
        any rank runs eagerly, and its experts see each rank's own tokens, all-gathered.
    """
    total, largest, ranks = (np.asarray(v, dtype=float) for v in (total, largest, ranks))
    sum_len = np.where(np.asarray(sglang, dtype=bool), np.asarray(extend, dtype=bool) | (2.0 * total <= largest * ranks),
                       largest > np.asarray(graph_tokens, dtype=float))
    return np.where(sum_len & (ranks > 1.0), total, np.nan)


def token_terms(c: StepCoefficients, tokens: Any, *, maximum: Callable[[Any, Any], Any] = np.maximum,
                minimum: Callable[[Any, Any], Any] = np.minimum, moe_tokens: Any = None) -> tuple[Any, Any]:
    """The part of `evaluate_step_s` that depends on the step's token count only: the stage's linear, expert and
    communication time (their sum, in that order) and the pipeline hand-offs. A scalar step model remembers it per
    token count (`InstancePerf`); `step_from_token_terms` adds the rest, so the sum is `evaluate_step_s`'s own.

    Attention-DP ranks run in lockstep and the step is the slowest rank's: `tokens` is that rank's batch, which sets the
    dense GEMMs. The experts see every rank's tokens, gathered: by default dp × `tokens` (every rank padded to the
    largest rank's tokens, as vLLM pads a step it runs as a CUDA graph, and the closed form for ranks holding equal
    batches); `moe_tokens` gives the gathered count where the ranks' batches differ and are not padded (a step with a
    prefill chunk on one rank runs eagerly: the others route only their own decodes)."""
    micro = maximum(tokens / c.pp, 1.0)
    k = c.sharp
    rescaled = c.gemm_scale != 1.0 or c.weights_scale != 1.0
    measured_lin = None if c.lin_log_curve is None else _dense_table_s(c.lin_log_curve, micro)
    covered = None if measured_lin is None else np.isfinite(measured_lin)
    if covered is not None and covered.all() and not rescaled:  # measured where a GEMM table covers the candidate's layers
        t_linear = measured_lin
    else:
        t_lin_c = c.lin_flop_s * (micro + c.gemm_half_tokens)
        t_linear = (t_lin_c**k + c.lin_mem_s**k) ** (1.0 / k)
        if covered is not None:
            if rescaled:
                measured_lin = measured_lin * _measured_rescale(c, t_linear, t_lin_c, c.lin_mem_s)
            t_linear = np.where(covered, measured_lin, t_linear)
    handoff = (c.pp - 1) * (c.handoff_s_per_token * micro + c.handoff_fixed_s)
    one_kind = isinstance(c.moe, (bool, np.bool_))  # else a flag per candidate (geometries of several models concatenated)
    if one_kind and not c.moe:
        # A dense model: the expert time and the exchange are +0 exactly (their coefficients are 0), so adding them
        # changes no bit of the sum; skipping them is most of the step's arithmetic.
        return t_linear + (c.tp_s_per_token * micro + c.tp_fixed_s), handoff
    routed = micro * c.dp if moe_tokens is None else maximum(moe_tokens / c.pp, 1.0)
    own = None  # where `moe_tokens` is NaN: not given for that candidate, so the default gathered count
    if isinstance(moe_tokens, np.ndarray) and np.isnan(moe_tokens).any():
        own = np.isnan(moe_tokens)
        routed = np.where(own, micro * c.dp, routed)
    # Distinct local experts hit by `routed` tokens choosing top-k of E (uniform routing), and the routed tokens a GPU
    # computes: under EP each GPU's share is random and the step waits for the busiest one, mean + z·σ over ep GPUs.
    hit = 1.0 - (1.0 - c.topk / c.experts) ** routed
    mean_active = c.local_experts * hit
    active = minimum(mean_active + c.ep_z * (mean_active * (1.0 - hit)) ** 0.5, c.local_experts)
    busiest = 1.0 + c.ep_z * (c.experts / maximum(c.local_experts, 1.0) - 1.0) ** 0.5 / maximum(routed * c.topk, 1.0) ** 0.5
    t_moe_c = c.moe_flop_s * (routed * busiest + c.gemm_half_tokens)
    t_moe_m = c.moe_mem_s * active
    t_moe = (t_moe_c**k + t_moe_m**k) ** (1.0 / k)
    if c.moe_log_curve is not None:
        # Measured where a table covers it, at the tokens the table counts (`moe_table_share` of the tokens every DP rank
        # routes), scaled by this step's rank over the table's own rank, both by the roofline (`table_rank_scale`); the
        # table's time holds the layers' fixed cost, the roofline's adds it.
        measured = _moe_table_s(c.moe_log_curve, routed * c.moe_table_share) * table_rank_scale(c, routed, t_moe, maximum=maximum,
                                                                                                  minimum=minimum)
        if rescaled:
            measured = measured * _measured_rescale(c, t_moe, t_moe_c, t_moe_m)
        t_moe = np.where(np.isfinite(measured), measured, t_moe + c.moe_fixed_s)
    else:
        t_moe = t_moe + c.moe_fixed_s
    exchanged = micro if moe_tokens is None else routed / c.dp  # the exchange's bytes: a rank's share of the gathered tokens
    if own is not None:
        exchanged = np.where(own, micro, exchanged)
    t_comm = c.a2a_s_per_token * exchanged + c.a2a_fixed_s + c.tp_s_per_token * micro + c.tp_fixed_s
    if one_kind:
        return t_linear + t_moe + t_comm, handoff
    return np.where(c.moe, t_linear + t_moe + t_comm, t_linear + (c.tp_s_per_token * micro + c.tp_fixed_s)), handoff


def step_from_token_terms(c: StepCoefficients, base: Any, handoff: Any, prefill_tokens: Any, prefill_pairs: Any,
                          decode_tokens: Any, decode_context_tokens: Any, maximum: Callable[[Any, Any], Any] = np.maximum,
                          minimum: Callable[[Any, Any], Any] = np.minimum) -> Any:
    """`evaluate_step_s` given `token_terms` of the step's tokens: attention, fixed costs and the scheduler's CPU."""
    mixed = (prefill_tokens > 0) * 1.0  # 1 when the step carries a prefill chunk
    if c.dec_attn_curve is None:
        t_attn = c.attn_pair_s * prefill_pairs / c.pp + (c.attn_ctx_s + mixed * c.attn_mixed_ctx_s) * decode_context_tokens / c.pp
    else:  # the full-attention layers' decode measured where a table covers the candidate
        measured = _decode_attention_table_s(c.dec_attn_curve, decode_tokens / c.pp, decode_context_tokens / c.pp)
        t_attn = (c.attn_pair_s * prefill_pairs / c.pp + measured + mixed * c.attn_mixed_ctx_s * decode_context_tokens / c.pp)
        covered = np.isfinite(measured)
        if not covered.all():
            t_attn = np.where(covered, t_attn, c.attn_pair_s * prefill_pairs / c.pp
                              + (c.attn_ctx_s + mixed * c.attn_mixed_ctx_s) * decode_context_tokens / c.pp)
    t_attn = t_attn + (c.attn_capped_pair_s * minimum(prefill_pairs, c.attn_cap_tokens * prefill_tokens)
                       + c.attn_capped_ctx_s * minimum(decode_context_tokens, c.attn_cap_tokens * decode_tokens)
                       + c.attn_seq_s * decode_tokens) / c.pp
    stage = base + t_attn + c.layer_fixed_s
    seqs = decode_tokens + mixed  # a prefill finishing this step samples one more token
    # The scheduler's per-sequence CPU work (batch bookkeeping, detokenizing, streaming) runs while the GPU
    # computes (vLLM's async scheduling, SGLang's overlap scheduler): the step is the longer of the two. The part the GPU
    # waits for (`seq_serial_s`) adds, per sequence of this rank's engine.
    return maximum(c.pp * stage + handoff, c.per_seq_s * seqs) + c.step_fixed_s + c.seq_serial_s * seqs


def step_time_s(model: ModelArch, gpu: Gpu, *, precision: Precision, kv_dtype: KvDtype, engine: Engine,
                tp: Any, pp: Any, dp: Any, prefill_tokens: Any, prefill_pairs: Any, decode_tokens: Any,
                decode_context_tokens: Any, params: PerfParams | None = None, moe_ep: Any = 1,
                moe_precision: Precision | None = None, overhead_scale: float | None = None) -> Any:
    """Step time of one instance for a batch, per attention-DP rank (ranks run in lockstep).

    Batch arguments are per DP rank; the expert layers see all dp ranks' tokens. Vectorised: every
    argument after `engine` may be a numpy array (broadcast together).
    """
    c = step_coefficients(model, gpu, precision=precision, kv_dtype=kv_dtype, engine=engine, tp=tp, pp=pp, dp=dp,
                          moe_ep=moe_ep, moe_precision=moe_precision, overhead_scale=overhead_scale, params=params)
    return evaluate_step_s(c, prefill_tokens=np.asarray(prefill_tokens, dtype=float), prefill_pairs=prefill_pairs,
                           decode_tokens=decode_tokens, decode_context_tokens=decode_context_tokens)


def request_overhead_s(engine: Engine, input_tokens: Any, *, disaggregated: bool = False, params: PerfParams | None = None) -> Any:
    """Latency a request sees before its first token off the GPU's step loop: HTTP, tokenizing, the hand-off
    to the scheduler, prefix matching over the prompt, and for PD the bootstrap of the KV transfer.

    Fitted on the silicon benchmarks, which time TTFT at the client; the planner adds it to the TTFT it
    predicts so a plan's figures and `servingtopology validate` mean the same thing. The simulator's own
    TTFT is the engine's (from queued to first token, as vLLM's request records time it).
    """
    p = params or perf_params()
    if engine is Engine.SGLANG:
        base, per_token = p.sglang_ttft_overhead_s, p.sglang_ttft_s_per_input_token
    else:
        base, per_token = p.ttft_overhead_s, p.ttft_s_per_input_token
    return base + per_token * input_tokens + (p.disagg_ttft_overhead_s if disaggregated else 0.0)


def delivery_steps(*, disaggregated: Any = False, recv_interval: Any = 1.0, params: PerfParams | None = None) -> Any:
    """Engine steps a first token waits after the step that computes it (or, on PD, after its prefill) before the
    client has it: half of SGLang's intake interval (`--scheduler-recv-interval`: an arrival waits for the next
    intake), `result_delay_steps` of output processing overlapped with the following steps, and on PD
    `pd_admission_steps` before the transferred request joins the decode batch. Times the mean step of the instance
    that delivers it, the result is part of a client's TTFT: the benchmark estimator (planner.perf.closed_loop), the
    analytical estimate (planner.perf.analytic) and the simulator's figures (planner.sim.stage) count it alike."""
    p = params or perf_params()
    recv = np.maximum(np.asarray(recv_interval, dtype=float), 1.0)
    return 0.5 * (recv - 1.0) + p.result_delay_steps + np.where(disaggregated, p.pd_admission_steps, 0.0)


def delivery_s(mean_step_s: Any, *, disaggregated: Any = False, params: PerfParams | None = None) -> Any:
    """The part of a client's TTFT after the engine's first token: `delivery_steps` (at the default intake) times the
    delivering instance's mean step, its mean TPOT. Plans count it (`estimate_aggregated`, `estimate_decode`, the
    simulator's `slo_figures`, a benchmark client's simulated point). The engine's own TTFT histogram is taken part
    of the way: vLLM observes it when the front end's output loop receives a step's outputs (v1/metrics/stats.py,
    IterationStats: that moment less the arrival), before detokenizing and streaming. The fitted steps are not split
    at that point, so the live comparisons leave them all out (`Prediction.engine_ttft_ms`,
    `live.calibration.analytic_point`) and the live fit's request-overhead factor takes what the engine's figure holds."""
    return delivery_steps(disaggregated=disaggregated, params=params) * mean_step_s


def kv_transfer_s(model: ModelArch, gpu: Gpu, *, kv_dtype: KvDtype, tokens: Any, same_node: bool, params: PerfParams | None = None) -> Any:
    """Time to move one request's KV from a prefill to a decode instance (whole-model bytes at TP 1)."""
    p = params or perf_params()
    nbytes = tokens * kv_bytes_per_token(model, kv_dtype, tp=1, pp=1)
    bps = _link_bps(gpu, 1 if same_node else gpu.gpus_per_node + 1, p)
    return nbytes / bps + 50e-6


def _scalar(x: Any) -> Any:
    """A one-instance coefficient as a float (a measured curve as its one row, an array; None and flags stay as they are)."""
    if x is None or isinstance(x, bool):
        return x
    if isinstance(x, CurveRows):
        return np.asarray(x.rows[int(np.ravel(x.index)[0])], dtype=float)
    return float(x) if np.ndim(x) == 0 else x


TOKEN_TERMS_ENTRIES = 1 << 14  # token counts whose `token_terms` one InstancePerf remembers


@dataclass(frozen=True, slots=True)
class InstancePerf:
    """`StepTimeModel` for one engine instance; folds the coefficients once so each step costs a few µs."""

    model: ModelArch
    gpu: Gpu
    precision: Precision
    kv_dtype: KvDtype
    engine: Engine
    parallelism: Parallelism
    params: PerfParams | None = None
    moe_ep: int | None = None
    _coeffs: StepCoefficients | None = field(default=None, init=False, repr=False, compare=False)
    # token count -> `token_terms` (the pow-heavy part of a step, the same floats for every batch of that many tokens)
    _terms: dict[Any, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    # `step_from_token_terms`' constants of a pure decode step (no prefill tokens or pairs), folded once (`decode_s`)
    _decode: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)
    # The measured decode attention's fixed seconds and seconds per cached token at 2^i sequences (`measured_decode_attention`),
    # as floats; None where the roofline prices it
    _dec_attn: tuple[tuple[float, ...], tuple[float, ...]] | None = field(default=None, init=False, repr=False, compare=False)
    # `mixed * attn_mixed_ctx_s` of a pure decode step (mixed = 0.0), the factor of its context term beside the measured attention
    _dec_mixed: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        par = self.parallelism
        ep = self.moe_ep if self.moe_ep is not None else par.moe_ep
        c = step_coefficients(self.model, self.gpu, precision=self.precision, kv_dtype=self.kv_dtype, engine=self.engine,
                              tp=par.tp, pp=par.pp, dp=par.dp, moe_ep=ep, params=self.params)
        scalar = StepCoefficients(**{f.name: _scalar(getattr(c, f.name)) for f in fields(StepCoefficients)})
        object.__setattr__(self, "_coeffs", scalar)
        c = scalar
        if c.dec_attn_curve is not None:
            curve = np.asarray(c.dec_attn_curve, dtype=float)
            object.__setattr__(self, "_dec_attn", (tuple(float(v) for v in curve[0]), tuple(float(v) for v in curve[1])))
            object.__setattr__(self, "_dec_mixed", (0.0 > 0) * 1.0 * c.attn_mixed_ctx_s)
        # the terms of step_from_token_terms that a pure decode step (prefill_tokens = prefill_pairs = 0.0, so mixed = 0.0)
        # multiplies by zero, evaluated here with the same operations: decode_s's floats are _step_s's, bit for bit
        mixed = (0.0 > 0) * 1.0
        object.__setattr__(self, "_decode", (
            c.attn_pair_s * 0.0 / c.pp, c.attn_ctx_s + mixed * c.attn_mixed_ctx_s,
            c.attn_capped_pair_s * _fmin(0.0, c.attn_cap_tokens * 0.0), c.attn_capped_ctx_s, c.attn_cap_tokens, c.attn_seq_s,
            c.pp, c.layer_fixed_s, c.per_seq_s, c.step_fixed_s, mixed, c.seq_serial_s))

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float, moe_tokens: float | None = None) -> float:
        """`moe_tokens`: the tokens every attention-DP rank's experts route this step where the ranks are not padded to the
        largest rank's batch (`attention_dp_moe_tokens`); None: they are (the default of `token_terms`)."""
        return self._step_s(float(prefill_tokens), float(prefill_pairs), float(decode_tokens), float(decode_context_tokens),
                            None if moe_tokens is None else float(moe_tokens))

    @property
    def gathers_experts(self) -> bool:
        """Whether the ranks' gathered tokens can price a step differently from the padded default: a MoE model under
        attention DP (the simulator passes `moe_tokens` only then)."""
        return bool(self.model.is_moe) and self.parallelism.dp > 1

    def decode_s(self, decoding_tokens: float, context_tokens: float) -> float:
        """`step_time_s` of a pure decode step (the simulator's decode-burst probes): `_step_s(0.0, 0.0, d, context)` with the
        terms a decode step zeroes folded at construction (`_decode`), the rest the same operations in the same order."""
        d, ctx = float(decoding_tokens), float(context_tokens)
        tokens = 0.0 + d
        terms = self._terms.get(tokens)
        if terms is None:
            return self._step_s(0.0, 0.0, d, ctx)
        z_pairs, k_ctx, z_capped_pairs, capped_ctx_s, cap, seq_s, pp, layer_fixed_s, per_seq_s, step_fixed_s, mixed, serial_s = self._decode
        capped = cap * d
        dec = self._dec_attn
        if dec is None:
            t_attn = z_pairs + k_ctx * ctx / pp
        else:  # _step_s's measured decode attention with prefill_pairs = mixed = 0.0
            t_attn = z_pairs + _decode_attention_float(dec[0], dec[1], d / pp, ctx / pp) + self._dec_mixed * ctx / pp
        t_attn = t_attn + (z_capped_pairs + capped_ctx_s * (ctx if ctx < capped else capped) + seq_s * d) / pp  # _fmin
        stage = terms[0] + t_attn + layer_fixed_s
        busy = pp * stage + terms[1]
        seqs = d + mixed
        cpu = per_seq_s * seqs
        value = float((busy if busy > cpu else cpu) + step_fixed_s + serial_s * seqs)  # _fmax
        return value if math.isfinite(value) else float("inf")

    def _step_s(self, prefill_tokens: float, prefill_pairs: float, decode_tokens: float, decode_context_tokens: float,
                moe_tokens: float | None = None) -> float:
        """`evaluate_step_s` on floats, its token-count part remembered (the same arithmetic, so the same float)."""
        c = self._coeffs
        assert c is not None
        tokens = prefill_tokens + decode_tokens
        key: Any = tokens if moe_tokens is None else (tokens, moe_tokens)
        terms = self._terms.get(key)
        if terms is None:
            if len(self._terms) >= TOKEN_TERMS_ENTRIES:
                self._terms.clear()
            terms = self._terms[key] = token_terms(c, tokens, maximum=_fmax, minimum=_fmin, moe_tokens=moe_tokens)
        # step_from_token_terms(c, terms[0], terms[1], ..., _fmax, _fmin) written out: the same operations in the same order
        # (so the same float), without its three min/max calls
        mixed = (prefill_tokens > 0) * 1.0
        t_attn = c.attn_pair_s * prefill_pairs / c.pp + (c.attn_ctx_s + mixed * c.attn_mixed_ctx_s) * decode_context_tokens / c.pp
        dec = self._dec_attn
        if dec is not None:  # step_from_token_terms' measured decode attention, on floats
            t_attn = (c.attn_pair_s * prefill_pairs / c.pp + _decode_attention_float(dec[0], dec[1], decode_tokens / c.pp,
                                                                                     decode_context_tokens / c.pp)
                      + mixed * c.attn_mixed_ctx_s * decode_context_tokens / c.pp)
        cap_pairs = c.attn_cap_tokens * prefill_tokens
        cap_ctx = c.attn_cap_tokens * decode_tokens
        t_attn = t_attn + (c.attn_capped_pair_s * (prefill_pairs if prefill_pairs < cap_pairs else cap_pairs)
                           + c.attn_capped_ctx_s * (decode_context_tokens if decode_context_tokens < cap_ctx else cap_ctx)
                           + c.attn_seq_s * decode_tokens) / c.pp
        stage = terms[0] + t_attn + c.layer_fixed_s
        busy = c.pp * stage + terms[1]
        seqs = decode_tokens + mixed
        cpu = c.per_seq_s * seqs
        value = float((busy if busy > cpu else cpu) + c.step_fixed_s + c.seq_serial_s * seqs)
        return value if math.isfinite(value) else float("inf")
