"""Vectorised analytical estimate of one role's latency and capacity at a load (the funnel's stage 4).

Called by the funnel on numpy arrays of role configurations (one row per distinct instance shape,
count and knobs) and by `decide` on a handful of rows for the SLO-capacity search. It uses the same
`perf.step_time_s` as the simulator. Steady-state queueing formulas, no simulation, no I/O.

Model, per attention-DP rank with per-rank arrival rate λ (requests/s), mean computed prompt I'
(after prefix hits), full prompt I, output O:
- aggregated (chunked prefill mixed with decodes): the step time t solves t = f(prefill = λ·I'·t,
  decode = λ·O·t) (fixed point); capacity is reached when the decode batch hits min(max_num_seqs,
  KV pool / mean context) or the token budget leaves no room for prefill;
- prefill role: prompts batched up to the token budget, capacity = budget tokens per step time / I';
- decode role: the fixed point with no prefill, capped the same way.
TTFT adds a Kingman-style wait (with the arrival CV) at the SLO percentile to the unloaded prefill
time: for replicas the servers are the step's spare token budget and the decode slots (service time
one step); for prefill instances the instance itself (service time one prefill). TPOT at a
percentile adds a spread for chunked-prefill interference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servingtopology.planner.engines.caps import chunk_tokens_per_rank
from servingtopology.planner.engines.defaults import cuda_graph_tokens
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.step import (
    PerfParams,
    StepCoefficients,
    attention_dp_moe_tokens,
    delivery_s,
    evaluate_step_s,
    perf_params,
    step_coefficients,
)
from servingtopology.planner.workload import Workload

__all__ = ["RoleEstimate", "LoadShape", "load_shape", "estimate_aggregated", "estimate_prefill", "estimate_decode",
           "role_coefficients", "FIXED_POINT_ITERATIONS", "Unloaded", "aggregated_unloaded", "prefill_unloaded", "decode_unloaded"]

FIXED_POINT_ITERATIONS = 8
# Relative spread of per-request mean TPOT per unit of the normal quantile (chunked-prefill steps are
# longer than pure-decode ones; requests that overlap more prefills see a higher mean).
TPOT_SPREAD_PER_Z = 0.06


@dataclass(frozen=True, slots=True)
class LoadShape:
    """Scalars of the workload the formulas need (tokens; the quantiles at the SLO percentiles)."""

    input_tokens: float
    computed_input_tokens: float
    output_tokens: float
    input_tokens_at_ttft_pct: float
    longest_request_tokens: float
    longest_prompt_tokens: float
    arrival_cv: float
    z_tpot: float
    ttft_q: float


def load_shape(workload: Workload, *, ttft_percentile: float, tpot_percentile: float) -> LoadShape:
    """Summarise a workload for the analytical formulas."""
    from statistics import NormalDist

    i = workload.input_tokens.expected_tokens
    share = workload.prefix_share
    q_in = workload.input_tokens.quantile(ttft_percentile / 100.0)
    return LoadShape(
        input_tokens=i,
        computed_input_tokens=max(1.0, i * (1.0 - share)),
        output_tokens=max(1.0, workload.output_tokens.expected_tokens),
        input_tokens_at_ttft_pct=max(1.0, q_in * (1.0 - share)),
        longest_request_tokens=workload.input_tokens.p99_tokens + workload.output_tokens.p99_tokens,
        longest_prompt_tokens=workload.input_tokens.p99_tokens,
        arrival_cv=workload.arrival_cv,
        z_tpot=NormalDist().inv_cdf(min(tpot_percentile, 99.99) / 100.0),
        ttft_q=ttft_percentile / 100.0,
    )


@dataclass(frozen=True, slots=True)
class RoleEstimate:
    """Per-row arrays: latency at the SLO percentiles (s), capacity (requests/s for the whole role)."""

    ttft_s: Any
    tpot_s: Any
    tpot_mean_s: Any
    capacity_rps: Any
    utilisation: Any


@dataclass(frozen=True, slots=True)
class _Ctx:
    model: ModelArch
    gpu: Gpu
    precision: Precision
    engine: Engine


def _coefficients(c: _Ctx, kv: KvDtype, tp: Any, pp: Any, dp: Any, moe_ep: Any = None) -> StepCoefficients:
    """The step model's constants for these rows, folded once per estimate (each estimate evaluates a dozen steps).
    `moe_ep`: the GPUs each row's experts are spread over (Parallelism.moe_ep, a pin's own EP); None: the funnel's rule."""
    # The funnel's layouts run MoE experts expert-parallel over tp × dp exactly when attention is data-parallel
    # (Parallelism.ep), as the simulator's InstancePerf does; otherwise the experts are tensor-sharded.
    if not c.model.is_moe:
        moe_ep = 1
    elif moe_ep is None:
        moe_ep = np.where(np.asarray(dp) > 1, np.asarray(tp) * np.asarray(dp), 1)
    params = perf_params()
    arrays = [np.asarray(v) for v in (tp, pp, dp, moe_ep)]
    if max(a.size for a in arrays) > FOLDED_MAX_ROWS:
        return step_coefficients(c.model, c.gpu, precision=c.precision, kv_dtype=kv, engine=c.engine, tp=tp, pp=pp, dp=dp,
                                 moe_ep=moe_ep, params=params)
    key = (id(c.model), id(c.gpu), id(params), c.precision, c.engine, kv, tuple((a.dtype.str, a.shape, a.tobytes()) for a in arrays))
    held = _FOLDED.get(key)
    if held is not None and held[0] is c.model and held[1] is c.gpu and held[2] is params:
        return held[3]
    folded = step_coefficients(c.model, c.gpu, precision=c.precision, kv_dtype=kv, engine=c.engine, tp=tp, pp=pp, dp=dp, moe_ep=moe_ep,
                               params=params)
    if len(_FOLDED) >= FOLDED_KEPT:
        _FOLDED.clear()
    _FOLDED[key] = (c.model, c.gpu, params, folded)
    return folded


# The step model's constants of recent row sets (`_coefficients`), by the identity of the model, GPU and parameters they
# were folded from (held beside them, so an id reused by another object never matches) and the rows' bytes. A pool's
# options fold the same few layouts again and again: 4,691 folds of 920 distinct row sets at 20 members × 4 GPU kinds,
# most of them one row, at ~0.5 ms each. StepCoefficients is frozen and nothing writes into its arrays, so a kept one is
# the same constants a new fold would give. Only small row sets are kept (the funnel's millions of rows are folded once).
FOLDED_KEPT = 1024
FOLDED_MAX_ROWS = 64
_FOLDED: dict[tuple[Any, ...], tuple[ModelArch, Gpu, PerfParams, StepCoefficients]] = {}


def role_coefficients(model: ModelArch, gpu: Gpu, *, precision: Precision, engine: Engine, kv: KvDtype, tp: Any, pp: Any,
                      dp: Any, moe_ep: Any = None) -> StepCoefficients:
    """The step model's constants of these rows, as each estimate folds them (`moe_ep` as `_coefficients` reads it): a
    caller evaluating the same rows at many rates (a bisection) folds them once and passes them as `coefficients`."""
    return _coefficients(_Ctx(model, gpu, precision, engine), kv, tp, pp, dp, moe_ep)


def _f(co: StepCoefficients, pf: Any, pairs: Any, dec: Any, ctx: Any, moe: Any = None) -> Any:
    """perf.step_time_s on folded coefficients (the same arithmetic); `moe` as `evaluate_step_s`'s `moe_tokens`."""
    return evaluate_step_s(co, prefill_tokens=np.asarray(pf, dtype=float), prefill_pairs=pairs, decode_tokens=dec, decode_context_tokens=ctx,
                           moe_tokens=moe)


def _one_rank_moe_tokens(co: StepCoefficients, engine: Engine, dp: Any, largest: Any, total: Any, graph_tokens: Any) -> Any:
    """The experts' tokens of a step in which one attention-DP rank carries a prompt chunk (`largest` tokens) and the
    ranks together `total` (step.attention_dp_moe_tokens; NaN where the engine pads every rank to the largest). None where
    no row of `co` is a MoE model under attention DP: the step model's default, at no cost."""
    dp_arr = np.asarray(dp, dtype=float)
    if not np.any(np.asarray(co.moe)) or not np.any(dp_arr > 1.0):
        return None
    shape = np.broadcast_shapes(np.shape(largest), np.shape(total), dp_arr.shape, np.shape(co.dp))
    got = attention_dp_moe_tokens(total, largest, dp_arr, sglang=engine is Engine.SGLANG, extend=True, graph_tokens=graph_tokens)
    return np.broadcast_to(np.asarray(got, dtype=float), shape).copy()


def _wait_quantile_s(rho: Any, service_s: Any, cv: float, q: float) -> Any:
    """Waiting time at quantile q of an M/G/1-like queue (Kingman mean, exponential tail)."""
    rho = np.clip(rho, 0.0, 0.999)
    mean_wait = rho / (1.0 - rho) * (1.0 + cv**2) / 2.0 * service_s
    cond = mean_wait / np.maximum(rho, 1e-9)  # mean wait given that one waits at all
    tail = np.log(np.maximum(rho / (1.0 - q), 1.0))
    return cond * tail


def _pairs(pf: Any, shape: LoadShape) -> Any:
    """Attention work of `pf` prefill tokens from prompts of the workload's shape (cached prefix first)."""
    cached = shape.input_tokens - shape.computed_input_tokens
    return pf * (cached + shape.computed_input_tokens / 2.0)


@dataclass(frozen=True, slots=True)
class Unloaded:
    """What a role's estimate computes without the request rate: a bisection over the rate (predict.slo_capacity_rps)
    computes it once per set of rows and passes it to every estimate, which then gives the same floats as computing it
    itself. Per row."""

    mu: Any         # requests/s one attention-DP rank completes at saturation
    start: Any      # aggregated and decode: one decode's step, where the load's fixed point starts; prefill: the TTFT unloaded


def aggregated_unloaded(co: StepCoefficients, *, engine: Engine, shape: LoadShape, dp: Any, max_num_seqs: Any,
                        max_num_batched_tokens: Any, pool_tokens: Any) -> Unloaded:
    """`estimate_aggregated`'s saturation and first step (its arguments as it reads them)."""
    max_num_batched_tokens = chunk_tokens_per_rank(engine, max_num_batched_tokens, dp)
    ip, o, ctx_mean = shape.computed_input_tokens, shape.output_tokens, shape.input_tokens + shape.output_tokens / 2.0
    b_cap = np.maximum(np.minimum(max_num_seqs, pool_tokens / ctx_mean), 1e-9)
    # Saturation: decode batch at its cap, prefill tokens in proportion, inside the token budget.
    pf_sat = np.minimum(b_cap * ip / o, np.maximum(max_num_batched_tokens - b_cap, 1.0))
    t_sat = _f(co, pf_sat, _pairs(pf_sat, shape), b_cap, b_cap * ctx_mean)
    per_step = np.minimum(b_cap / o, pf_sat / ip)
    return Unloaded(mu=per_step / t_sat, start=_f(co, 0.0, 0.0, 1.0, ctx_mean))


def estimate_aggregated(model: ModelArch, gpu: Gpu, *, precision: Precision, engine: Engine, kv: KvDtype, shape: LoadShape,
                        rate_rps: Any, tp: Any, pp: Any, dp: Any, count: Any, max_num_seqs: Any,
                        max_num_batched_tokens: Any, pool_tokens: Any, moe_ep: Any = None,
                        coefficients: StepCoefficients | None = None, unloaded: Unloaded | None = None) -> RoleEstimate:
    """Replicas with chunked prefill: every array broadcasts; `pool_tokens` is per attention-DP rank; `moe_ep` as
    `_coefficients` reads it; `unloaded` from `aggregated_unloaded` of the same rows (computed here when None)."""
    co = _coefficients(_Ctx(model, gpu, precision, engine), kv, tp, pp, dp, moe_ep) if coefficients is None else coefficients
    if unloaded is None:
        unloaded = aggregated_unloaded(co, engine=engine, shape=shape, dp=dp, max_num_seqs=max_num_seqs,
                                       max_num_batched_tokens=max_num_batched_tokens, pool_tokens=pool_tokens)
    max_num_batched_tokens = chunk_tokens_per_rank(engine, max_num_batched_tokens, dp)   # SGLang: the server's chunk // attn DP
    ip, o, ctx_mean = shape.computed_input_tokens, shape.output_tokens, shape.input_tokens + shape.output_tokens / 2.0
    lam = rate_rps / (count * dp)
    b_cap = np.maximum(np.minimum(max_num_seqs, pool_tokens / ctx_mean), 1e-9)
    mu = unloaded.mu
    # Load: fixed point of the mixed step time.
    t = unloaded.start
    for _ in range(FIXED_POINT_ITERATIONS):
        b = np.minimum(lam * o * t, b_cap)
        pf = np.minimum(lam * ip * t, max_num_batched_tokens)
        t = _f(co, pf, _pairs(pf, shape), np.maximum(b, 1.0), np.maximum(b, 1.0) * ctx_mean)
    rho = lam / mu
    b = np.maximum(np.minimum(lam * o * t, b_cap), 1.0)
    t_dec = _f(co, 0.0, 0.0, b, b * ctx_mean)
    # Unloaded prefill at the percentile's prompt length, chunked by the budget left by decodes.
    room = np.maximum(max_num_batched_tokens - b, 16.0)
    iq = shape.input_tokens_at_ttft_pct
    chunk = np.minimum(iq, room)
    n_chunks = np.ceil(iq / chunk)
    # The new prompt's chunk rides on one attention-DP rank beside the others' decodes: their experts route what the
    # engine gathers (`_one_rank_moe_tokens`), not every rank padded to the chunk's step.
    moe = _one_rank_moe_tokens(co, engine, dp, chunk + b, chunk + dp * b, cuda_graph_tokens(engine, max_num_seqs, max_num_batched_tokens))
    t_chunk = _f(co, chunk, chunk * (shape.input_tokens - ip + iq / 2.0), b, b * ctx_mean, moe)
    ttft0 = n_chunks * t_chunk + t / 2.0
    # Requests wait for a step with room: the prefill budget and the decode slots are the servers.
    rho_wait = np.maximum(lam * ip * t / room, b / b_cap)
    ttft = ttft0 + _wait_quantile_s(np.maximum(rho_wait, rho * (rho >= 1.0)), t, shape.arrival_cv, shape.ttft_q)
    tpot_mean = np.maximum(t, t_dec)
    tpot = tpot_mean + (tpot_mean - t_dec + tpot_mean * TPOT_SPREAD_PER_Z) * max(shape.z_tpot, 0.0)
    # The client has the first token `delivery_s` after the step that computed it (a mean step's multiple).
    ttft = ttft + delivery_s(tpot_mean)
    return RoleEstimate(ttft_s=ttft, tpot_s=tpot, tpot_mean_s=tpot_mean, capacity_rps=mu * count * dp, utilisation=rho)


def prefill_unloaded(co: StepCoefficients, *, engine: Engine, shape: LoadShape, dp: Any, max_num_batched_tokens: Any) -> Unloaded:
    """`estimate_prefill`'s capacity and unloaded TTFT: prompts batched up to the token budget; the percentile's prompt
    in chunks of the budget."""
    max_num_batched_tokens = chunk_tokens_per_rank(engine, max_num_batched_tokens, dp)   # SGLang: the server's chunk // attn DP
    ip = shape.computed_input_tokens
    batch = np.minimum(max_num_batched_tokens, np.maximum(ip, max_num_batched_tokens // max(ip, 1.0) * ip))
    t_batch = _f(co, batch, _pairs(batch, shape), 0.0, 0.0)
    iq = shape.input_tokens_at_ttft_pct
    chunk = np.minimum(iq, max_num_batched_tokens)
    t_chunk = _f(co, chunk, chunk * (shape.input_tokens - ip + iq / 2.0), 0.0, 0.0)
    return Unloaded(mu=batch / ip / t_batch, start=np.ceil(iq / chunk) * t_chunk)


def estimate_prefill(model: ModelArch, gpu: Gpu, *, precision: Precision, engine: Engine, kv: KvDtype, shape: LoadShape,
                     rate_rps: Any, tp: Any, pp: Any, dp: Any, count: Any, max_num_batched_tokens: Any, moe_ep: Any = None,
                     coefficients: StepCoefficients | None = None, unloaded: Unloaded | None = None) -> RoleEstimate:
    """Prefill-only instances of a PD layout: TTFT here excludes the KV transfer and the first decode step; `unloaded`
    from `prefill_unloaded` of the same rows (computed here when None)."""
    co = _coefficients(_Ctx(model, gpu, precision, engine), kv, tp, pp, dp, moe_ep) if coefficients is None else coefficients
    if unloaded is None:
        unloaded = prefill_unloaded(co, engine=engine, shape=shape, dp=dp, max_num_batched_tokens=max_num_batched_tokens)
    lam = rate_rps / (count * dp)
    mu, ttft0 = unloaded.mu, unloaded.start
    rho = lam / mu
    ttft = ttft0 + _wait_quantile_s(rho, ttft0, shape.arrival_cv, shape.ttft_q)
    zero = 0.0 * ttft
    return RoleEstimate(ttft_s=ttft, tpot_s=zero, tpot_mean_s=zero, capacity_rps=mu * count * dp, utilisation=rho)


def decode_unloaded(co: StepCoefficients, *, shape: LoadShape, max_num_seqs: Any, pool_tokens: Any) -> Unloaded:
    """`estimate_decode`'s capacity (the batch at its cap) and one decode's step."""
    o, ctx_mean = shape.output_tokens, shape.input_tokens + shape.output_tokens / 2.0
    b_cap = np.maximum(np.minimum(max_num_seqs, pool_tokens / ctx_mean), 1e-9)
    t_sat = _f(co, 0.0, 0.0, b_cap, b_cap * ctx_mean)
    return Unloaded(mu=b_cap / o / t_sat, start=_f(co, 0.0, 0.0, 1.0, ctx_mean))


def estimate_decode(model: ModelArch, gpu: Gpu, *, precision: Precision, engine: Engine, kv: KvDtype, shape: LoadShape,
                    rate_rps: Any, tp: Any, pp: Any, dp: Any, count: Any, max_num_seqs: Any, pool_tokens: Any, moe_ep: Any = None,
                    coefficients: StepCoefficients | None = None, unloaded: Unloaded | None = None) -> RoleEstimate:
    """Decode-only instances of a PD layout: `ttft_s` holds their first step and the steps before its token reaches
    the client (`delivery_s`; added to the prefill side); `unloaded` from `decode_unloaded` of the same rows
    (computed here when None)."""
    co = _coefficients(_Ctx(model, gpu, precision, engine), kv, tp, pp, dp, moe_ep) if coefficients is None else coefficients
    if unloaded is None:
        unloaded = decode_unloaded(co, shape=shape, max_num_seqs=max_num_seqs, pool_tokens=pool_tokens)
    o, ctx_mean = shape.output_tokens, shape.input_tokens + shape.output_tokens / 2.0
    lam = rate_rps / (count * dp)
    b_cap = np.maximum(np.minimum(max_num_seqs, pool_tokens / ctx_mean), 1e-9)
    mu = unloaded.mu
    t = unloaded.start
    for _ in range(FIXED_POINT_ITERATIONS):
        b = np.maximum(np.minimum(lam * o * t, b_cap), 1.0)
        t = _f(co, 0.0, 0.0, b, b * ctx_mean)
    tpot = t * (1.0 + TPOT_SPREAD_PER_Z * max(shape.z_tpot, 0.0))
    # The first decode step, and the steps before the client has its token: admission into the batch and delivery.
    first = t + delivery_s(t, disaggregated=True)
    return RoleEstimate(ttft_s=first, tpot_s=tpot, tpot_mean_s=t, capacity_rps=mu * count * dp, utilisation=lam / mu)


