"""Predict the figures of given layouts at given loads (vectorised over layouts), and their SLO capacity.

Called by `decide` (refining the funnel's survivors, the pinned and the current layout) and by the
operator's replanning (before/after figures). Uses the analytical estimates of `analytic`; the
simulator refines the top K separately. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .analytic import LoadShape, estimate_aggregated, estimate_decode, estimate_prefill, load_shape
from .layout import Layout, LayoutKind, Role
from .memory import kv_pool_tokens, max_request_tokens
from .perf import kv_transfer_s
from .problem import Prediction, Problem

__all__ = ["Figures", "predict_figures", "slo_capacity_rps", "to_prediction", "BISECTION_STEPS"]

BISECTION_STEPS = 14


@dataclass(frozen=True, slots=True)
class Figures:
    """Arrays, one entry per layout: latencies at the SLO percentiles (s), capacity (requests/s)."""

    ttft_s: Any
    tpot_s: Any
    tpot_mean_s: Any
    capacity_rps: Any
    pool_tokens: Any


def _pool(problem: Problem, layout: Layout, role: Role) -> int:
    r = layout.roles[role]
    return kv_pool_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision,
                          parallelism=r.parallelism, knobs=r.knobs)


def _one(problem: Problem, shape: LoadShape, layout: Layout, rates: Any) -> tuple[Any, Any, Any, Any, int]:
    m, g = problem.model, problem.gpu
    common = {"precision": problem.precision, "engine": problem.engine, "shape": shape, "rate_rps": rates}
    if layout.kind is LayoutKind.REPLICAS:
        r = layout.roles[Role.AGGREGATED]
        par, kn = r.parallelism, r.knobs
        pool = _pool(problem, layout, Role.AGGREGATED)
        e = estimate_aggregated(m, g, kv=kn.kv_dtype, tp=par.tp, pp=par.pp, dp=par.dp, count=r.count, max_num_seqs=kn.max_num_seqs,
                                max_num_batched_tokens=kn.max_num_batched_tokens, pool_tokens=pool, **common)
        return e.ttft_s, e.tpot_s, e.tpot_mean_s, e.capacity_rps, pool
    p, d = layout.roles[Role.PREFILL], layout.roles[Role.DECODE]
    pool_d = _pool(problem, layout, Role.DECODE)
    ep = estimate_prefill(m, g, kv=p.knobs.kv_dtype, tp=p.parallelism.tp, pp=p.parallelism.pp, dp=p.parallelism.dp, count=p.count,
                          max_num_batched_tokens=p.knobs.max_num_batched_tokens, **common)
    ed = estimate_decode(m, g, kv=d.knobs.kv_dtype, tp=d.parallelism.tp, pp=d.parallelism.pp, dp=d.parallelism.dp, count=d.count,
                         max_num_seqs=d.knobs.max_num_seqs, pool_tokens=pool_d, **common)
    same_node = layout.gpus <= g.gpus_per_node
    transfer = kv_transfer_s(m, g, kv_dtype=d.knobs.kv_dtype, tokens=shape.input_tokens, same_node=same_node)
    return ep.ttft_s + transfer + ed.ttft_s, ed.tpot_s, ed.tpot_mean_s, np.minimum(ep.capacity_rps, ed.capacity_rps), pool_d


def predict_figures(problem: Problem, layouts: Sequence[Layout], rates_rps: Sequence[float]) -> Figures:
    """Analytical figures of each layout at its rate (one rate per layout)."""
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    out = [_one(problem, shape, lay, np.float64(rate)) for lay, rate in zip(layouts, rates_rps, strict=True)]
    cols = list(zip(*out, strict=True)) if out else [(), (), (), (), ()]
    arr = [np.asarray(c, dtype=np.float64) for c in cols]
    return Figures(*arr)


def _meets(problem: Problem, f: Figures, rates: Any, *, margin: float, load_margin: float) -> Any:
    return ((f.ttft_s * margin <= problem.slo.ttft_ms / 1e3) & (f.tpot_s * margin <= problem.slo.tpot_ms / 1e3)
            & (rates <= load_margin * f.capacity_rps))


def slo_capacity_rps(problem: Problem, layouts: Sequence[Layout], *, margin: float = 1.0, load_margin: float = 1.0) -> Any:
    """The highest request rate at which each layout still meets both SLOs (bisection; 0 if none)."""
    if not layouts:
        return np.zeros(0)
    hi = np.asarray(predict_figures(problem, layouts, [1e-3] * len(layouts)).capacity_rps, dtype=np.float64)
    lo = np.zeros(len(layouts))
    ok_low = _meets(problem, predict_figures(problem, layouts, list(np.maximum(hi * 1e-3, 1e-3))), np.maximum(hi * 1e-3, 1e-3),
                    margin=margin, load_margin=load_margin)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        ok = _meets(problem, predict_figures(problem, layouts, list(mid)), mid, margin=margin, load_margin=load_margin)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(ok_low, lo, 0.0)


def to_prediction(problem: Problem, layout: Layout, *, ttft_s: float, tpot_s: float, tpot_mean_s: float, capacity_rps: float,
                  slo_capacity_rps: float, pool_tokens: int, source: str = "analytical") -> Prediction:
    """Assemble a Prediction at the problem's load from figures."""
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    meets = ttft_s * 1e3 <= problem.slo.ttft_ms and tpot_s * 1e3 <= problem.slo.tpot_ms and rate < capacity_rps
    role = layout.roles.get(Role.DECODE) or layout.roles[Role.AGGREGATED]
    longest = max_request_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision,
                                 parallelism=role.parallelism, knobs=role.knobs)
    served = min(rate, capacity_rps)
    return Prediction(
        ttft_ms=ttft_s * 1e3,
        tpot_ms=tpot_s * 1e3,
        throughput_tok_s=served * problem.workload.output_tokens.expected_tokens,
        capacity_rps=slo_capacity_rps,
        goodput_rps=rate if meets else 0.0,
        goodput_per_gpu=slo_capacity_rps / max(layout.gpus, 1),
        tokens_per_s_per_user=1.0 / tpot_mean_s if tpot_mean_s > 0 else 0.0,
        kv_pool_tokens=int(pool_tokens),
        max_request_tokens=longest,
        meets_slo=bool(meets),
        source=source,
    )
