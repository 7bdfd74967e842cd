"""Performance model: the time of one engine step from FLOPs, bytes and links, with fitted efficiencies.

`StepTimeModel` is the seam the simulator calls once per step; `InstancePerf` implements it for one
engine instance (model, GPU, precision, parallelism). The funnel calls the same arithmetic on numpy
arrays (`step_time_s` accepts arrays for every batch argument and for tp/pp/dp), so the analytical
stage and the simulator cannot drift apart. Efficiency parameters come from data/perf_params.json,
written by benchmarks/fit_perf.py with its provenance; none is keyed by model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any, Protocol

import numpy as np

from .hardware import Gpu, Precision
from .layout import Engine, KvDtype, Parallelism
from .memory import kv_bytes_per_token
from .model import ModelArch

__all__ = ["StepTimeModel", "PerfParams", "perf_params", "InstancePerf", "step_time_s", "kv_transfer_s"]


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
    """Global efficiency curves (fitted, see benchmarks/fit_perf.py); times in seconds."""

    gemm_eff_max: float = 0.70        # best fraction of dense peak FLOP/s a GEMM reaches
    gemm_half_tokens: float = 96.0    # tokens per step at which GEMM efficiency is half of gemm_eff_max
    mem_eff: float = 0.80             # fraction of HBM bandwidth reached streaming weights
    attn_prefill_eff: float = 0.45    # fraction of peak FLOP/s reached by prefill attention
    attn_decode_mem_eff: float = 0.70 # fraction of HBM bandwidth reached reading KV in decode
    link_eff: float = 0.75            # fraction of link bandwidth reached by collectives
    allreduce_latency_s: float = 10e-6
    step_overhead_s: float = 1.5e-3   # scheduling, launch, sampling setup per step
    per_seq_overhead_s: float = 8e-6  # per scheduled sequence per step (sampling, bookkeeping)
    sglang_overhead_scale: float = 0.8  # SGLang's per-step overhead relative to vLLM's
    source: str = "defaults (unfitted)"


@cache
def perf_params() -> PerfParams:
    """Fitted parameters from data/perf_params.json, or the defaults when the file is absent."""
    path = resources.files(__package__).joinpath("data/perf_params.json")
    if not path.is_file():
        return PerfParams()
    raw: dict[str, Any] = json.loads(path.read_text())
    known = {f.name for f in fields(PerfParams)}
    return PerfParams(**{k: v for k, v in raw.get("params", {}).items() if k in known}, source=str(raw.get("source", "")))


def _link_gbps(gpu: Gpu, group: Any) -> Any:
    """Bandwidth (GB/s one way) for a collective over `group` GPUs: scale-up inside a node, the NIC beyond."""
    return np.where(group <= gpu.gpus_per_node, gpu.scaleup_gbps, gpu.nic_gbit / 8.0)


def step_time_s(model: ModelArch, gpu: Gpu, *, precision: Precision, kv_dtype: KvDtype, engine: Engine,
                tp: Any, pp: Any, dp: Any, prefill_tokens: Any, prefill_pairs: Any, decode_tokens: Any,
                decode_context_tokens: Any, params: PerfParams | None = None) -> Any:
    """Step time of one instance for a batch, per attention-DP rank (ranks run in lockstep).

    Pipeline parallelism splits the batch into pp micro-batches over pp stages: the step takes pp stage
    times of a micro-batch plus pp − 1 activation hand-offs (a bubble when the batch is smaller than pp).
    """
    p = params or perf_params()
    tokens = prefill_tokens + decode_tokens
    micro = np.maximum(tokens / pp, 1.0)
    frac = 1.0 / pp  # share of layers per stage
    peak = gpu.peak_tflops(precision) * 1e12
    peak16 = gpu.bf16_tflops * 1e12
    hbm = gpu.hbm_gbps * 1e9
    wb = precision.weight_bytes

    # Dense linear layers (attention projections, dense/shared FFN, router) and the LM head, TP-sharded.
    linear_params = (model.non_expert_params - model.embedding_params) + model.vocab_size * model.hidden_size
    gemm_eff = p.gemm_eff_max * micro / (micro + p.gemm_half_tokens)
    t_lin_c = 2.0 * micro * linear_params * frac / tp / (peak * gemm_eff)
    t_lin_m = linear_params * wb * frac / tp / (hbm * p.mem_eff)
    t_linear = np.maximum(t_lin_c, t_lin_m)

    # Routed experts: all attention-DP ranks' tokens meet in the expert layers, sharded over tp × dp.
    t_moe = 0.0 * tokens
    t_a2a = 0.0 * tokens
    if model.is_moe:
        group = tp * dp
        routed = micro * dp
        e, k = model.num_experts, model.experts_per_token
        active = e * (1.0 - (1.0 - k / e) ** routed)
        moe_layers = model.num_moe_layers * frac
        moe_eff = p.gemm_eff_max * (routed * k / e) / (routed * k / e + p.gemm_half_tokens)
        t_moe_c = 2.0 * routed * k * model.expert_params * moe_layers / group / (peak * np.maximum(moe_eff, 1e-3))
        t_moe_m = active * model.expert_params * wb * moe_layers / group / (hbm * p.mem_eff)
        t_moe = np.maximum(t_moe_c, t_moe_m)
        a2a_bytes = 2.0 * micro * model.hidden_size * 2.0 * k * (group - 1) / np.maximum(group, 1)
        t_a2a = np.where(group > 1, moe_layers * (a2a_bytes / (_link_gbps(gpu, group) * 1e9 * p.link_eff) + 2 * p.allreduce_latency_s), 0.0)

    # Attention: prefill is compute (pairs of query and key tokens), decode reads the KV cache.
    heads = model.num_heads / tp
    qk_v_dim = (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) if model.is_mla else 2 * model.head_dim
    att_layers = model.num_full_attention_layers + model.num_sliding_layers * 0.1
    t_attn_p = 2.0 * heads * qk_v_dim * prefill_pairs / pp * att_layers * frac / (peak16 * p.attn_prefill_eff)
    kv_tok = kv_bytes_per_token(model, kv_dtype, tp=tp, pp=pp)
    t_attn_d_m = decode_context_tokens * kv_tok / (hbm * p.attn_decode_mem_eff) / pp
    if model.is_mla:  # absorbed MLA decode multiplies every head against the latent: compute can dominate
        mla_flops = 2.0 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) * decode_context_tokens * model.num_layers * frac / pp
        t_attn_d = np.maximum(t_attn_d_m, mla_flops / (peak16 * p.attn_prefill_eff))
    else:
        t_attn_d = t_attn_d_m

    # Two all-reduces per layer under TP (ring: 2(n−1)/n of the activations cross each link).
    ar_bytes = micro * model.hidden_size * 2.0
    layers = model.num_layers * frac
    t_tp = np.where(tp > 1, 2.0 * layers * (2.0 * (tp - 1) / tp * ar_bytes / (_link_gbps(gpu, tp) * 1e9 * p.link_eff) + p.allreduce_latency_s), 0.0)

    stage = t_linear + t_moe + t_a2a + t_attn_p + t_attn_d + t_tp
    handoff = (pp - 1) * (micro * model.hidden_size * 2.0 / (gpu.scaleup_gbps * 1e9 * p.link_eff) + p.allreduce_latency_s)
    overhead = p.step_overhead_s * (p.sglang_overhead_scale if engine is Engine.SGLANG else 1.0) + p.per_seq_overhead_s * (decode_tokens + np.minimum(prefill_tokens, 1.0))
    return pp * stage + handoff + overhead


def kv_transfer_s(model: ModelArch, gpu: Gpu, *, kv_dtype: KvDtype, tokens: Any, same_node: bool, params: PerfParams | None = None) -> Any:
    """Time to move one request's KV from a prefill to a decode instance (whole-model bytes at TP 1)."""
    p = params or perf_params()
    nbytes = tokens * kv_bytes_per_token(model, kv_dtype, tp=1, pp=1)
    gbps = gpu.scaleup_gbps if same_node else gpu.nic_gbit / 8.0
    return nbytes / (gbps * 1e9 * p.link_eff) + 50e-6


@dataclass(frozen=True, slots=True)
class InstancePerf:
    """`StepTimeModel` for one engine instance."""

    model: ModelArch
    gpu: Gpu
    precision: Precision
    kv_dtype: KvDtype
    engine: Engine
    parallelism: Parallelism
    params: PerfParams | None = None

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float) -> float:
        par = self.parallelism
        t = step_time_s(self.model, self.gpu, precision=self.precision, kv_dtype=self.kv_dtype, engine=self.engine,
                        tp=par.tp, pp=par.pp, dp=par.dp, prefill_tokens=float(prefill_tokens), prefill_pairs=float(prefill_pairs),
                        decode_tokens=float(decode_tokens), decode_context_tokens=float(decode_context_tokens), params=self.params)
        value = float(t)
        return value if math.isfinite(value) else float("inf")
