"""Predict the figures of given layouts at given loads (vectorised over layouts), and their SLO capacity.

Called by `decide` (refining the funnel's survivors, the pinned and the current layout) and by the
operator's replanning (before/after figures). Layouts are packed once into per-role arrays (grouped by
layout kind and KV dtype) so that a bisection over thousands of layouts costs a few numpy passes.
Uses the analytical estimates of `analytic`; the simulator refines the top K separately. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from servingtopology.planner.layout import EngineKnobs, KvDtype, Layout, LayoutKind, Parallelism, Role
from servingtopology.planner.perf.analytic import (
    LoadShape,
    Unloaded,
    aggregated_unloaded,
    decode_unloaded,
    estimate_aggregated,
    estimate_decode,
    estimate_prefill,
    load_shape,
    prefill_unloaded,
    role_coefficients,
)
from servingtopology.planner.perf.memory import kv_pool_tokens, max_request_tokens
from servingtopology.planner.perf.step import StepCoefficients, delivery_s, kv_transfer_s, request_overhead_s
from servingtopology.planner.problem import Prediction, Problem
from servingtopology.planner.slo import meets_slo_and_load, meets_slo_ms

__all__ = ["Figures", "delivery_ms", "layout_delivery_s", "predict_figures", "slo_capacity_rps", "to_prediction", "front_end_s", "BISECTION_STEPS"]

BISECTION_STEPS = 16
FloatArray = npt.NDArray[np.float64]


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


def _role_arrays(layouts: Sequence[Layout], role: Role) -> dict[str, FloatArray]:
    rs = [lay.roles[role] for lay in layouts]
    return {
        "tp": np.array([r.parallelism.tp for r in rs], dtype=np.float64),
        "pp": np.array([r.parallelism.pp for r in rs], dtype=np.float64),
        "dp": np.array([r.parallelism.dp for r in rs], dtype=np.float64),
        "ep": np.array([r.parallelism.moe_ep for r in rs], dtype=np.float64),   # each layout's own expert parallelism
        "count": np.array([r.count for r in rs], dtype=np.float64),
        "mns": np.array([r.knobs.max_num_seqs for r in rs], dtype=np.float64),
        "mnbt": np.array([r.knobs.max_num_batched_tokens for r in rs], dtype=np.float64),
    }


@dataclass(frozen=True, slots=True)
class _Group:
    """Layouts of one kind and KV dtype, packed as per-role arrays; `index` maps back to the input order."""

    kind: LayoutKind
    kv: KvDtype
    index: npt.NDArray[np.int64]
    roles: dict[Role, dict[str, FloatArray]]
    pool: FloatArray
    transfer_s: FloatArray
    coefficients: dict[Role, StepCoefficients]    # folded once per pack, for every rate the figures are asked at
    unloaded: dict[Role, Unloaded]                # each role's figures without the rate, once per pack likewise


@dataclass(frozen=True, slots=True)
class _Packed:
    shape: LoadShape
    groups: tuple[_Group, ...]
    n: int


def _pack(problem: Problem, layouts: Sequence[Layout]) -> _Packed:
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    buckets: dict[tuple[LayoutKind, KvDtype], list[int]] = {}
    for i, lay in enumerate(layouts):
        main = lay.roles.get(Role.DECODE) or lay.roles[Role.AGGREGATED]
        buckets.setdefault((lay.kind, main.knobs.kv_dtype), []).append(i)
    groups = []
    pools: dict[tuple[Parallelism, EngineKnobs], int] = {}      # one pool per (parallelism, knobs), however many counts share it

    def pool_of(lay: Layout, role: Role) -> int:
        r = lay.roles[role]
        key = (r.parallelism, r.knobs)
        if key not in pools:
            pools[key] = _pool(problem, lay, role)
        return pools[key]

    for (kind, kv), idx in buckets.items():
        members = [layouts[i] for i in idx]
        if kind is LayoutKind.REPLICAS:
            roles = {Role.AGGREGATED: _role_arrays(members, Role.AGGREGATED)}
            pool = np.array([pool_of(lay, Role.AGGREGATED) for lay in members], dtype=np.float64)
            transfer = np.zeros(len(members))
        else:
            roles = {Role.PREFILL: _role_arrays(members, Role.PREFILL), Role.DECODE: _role_arrays(members, Role.DECODE)}
            pool = np.array([pool_of(lay, Role.DECODE) for lay in members], dtype=np.float64)
            same_node = [lay.gpus <= problem.gpu.gpus_per_node for lay in members]
            moved = {same: kv_transfer_s(problem.model, problem.gpu, kv_dtype=kv, tokens=shape.input_tokens, same_node=same)
                     for same in sorted(set(same_node))}    # one transfer time within a node, one across nodes
            transfer = np.array([moved[same] for same in same_node], dtype=np.float64)
        co = {role: role_coefficients(problem.model, problem.gpu, precision=problem.precision, engine=problem.engine, kv=kv, tp=a["tp"],
                                      pp=a["pp"], dp=a["dp"], moe_ep=a["ep"]) for role, a in roles.items()}
        if kind is LayoutKind.REPLICAS:
            a = roles[Role.AGGREGATED]
            unloaded = {Role.AGGREGATED: aggregated_unloaded(co[Role.AGGREGATED], engine=problem.engine, shape=shape, dp=a["dp"],
                                                             max_num_seqs=a["mns"], max_num_batched_tokens=a["mnbt"], pool_tokens=pool)}
        else:
            p, d = roles[Role.PREFILL], roles[Role.DECODE]
            unloaded = {Role.PREFILL: prefill_unloaded(co[Role.PREFILL], engine=problem.engine, shape=shape, dp=p["dp"],
                                                       max_num_batched_tokens=p["mnbt"]),
                        Role.DECODE: decode_unloaded(co[Role.DECODE], shape=shape, max_num_seqs=d["mns"], pool_tokens=pool)}
        groups.append(_Group(kind, kv, np.asarray(idx, dtype=np.int64), roles, pool, transfer, co, unloaded))
    return _Packed(shape, tuple(groups), len(layouts))


def front_end_s(problem: Problem, *, disaggregated: bool) -> float:
    """What a client's TTFT adds to the engine's: perf.request_overhead_s at the prompt length of the TTFT
    percentile (the whole prompt, cached or not: the front end reads all of it). Plans predict client-side TTFT."""
    prompt_tokens = float(problem.workload.input_tokens.quantile(problem.slo.ttft_percentile / 100.0))
    return float(request_overhead_s(problem.engine, prompt_tokens, disaggregated=disaggregated))


def _figures(problem: Problem, packed: _Packed, rates: FloatArray) -> Figures:
    m, g = problem.model, problem.gpu
    out = [np.zeros(packed.n) for _ in range(5)]
    for grp in packed.groups:
        rate = rates[grp.index]
        pe, sh = problem.precision, problem.engine
        if grp.kind is LayoutKind.REPLICAS:
            a = grp.roles[Role.AGGREGATED]
            e = estimate_aggregated(m, g, precision=pe, engine=sh, kv=grp.kv, shape=packed.shape, rate_rps=rate, tp=a["tp"], pp=a["pp"],
                                    dp=a["dp"], count=a["count"], max_num_seqs=a["mns"], max_num_batched_tokens=a["mnbt"], pool_tokens=grp.pool,
                                    coefficients=grp.coefficients[Role.AGGREGATED], unloaded=grp.unloaded[Role.AGGREGATED])
            cols = (e.ttft_s + front_end_s(problem, disaggregated=False), e.tpot_s, e.tpot_mean_s, e.capacity_rps)
        else:
            p, d = grp.roles[Role.PREFILL], grp.roles[Role.DECODE]
            ep = estimate_prefill(m, g, precision=pe, engine=sh, kv=grp.kv, shape=packed.shape, rate_rps=rate, tp=p["tp"], pp=p["pp"],
                                  dp=p["dp"], count=p["count"], max_num_batched_tokens=p["mnbt"], coefficients=grp.coefficients[Role.PREFILL],
                                  unloaded=grp.unloaded[Role.PREFILL])
            ed = estimate_decode(m, g, precision=pe, engine=sh, kv=grp.kv, shape=packed.shape, rate_rps=rate, tp=d["tp"], pp=d["pp"],
                                 dp=d["dp"], count=d["count"], max_num_seqs=d["mns"], pool_tokens=grp.pool,
                                 coefficients=grp.coefficients[Role.DECODE], unloaded=grp.unloaded[Role.DECODE])
            ttft = ep.ttft_s + grp.transfer_s + ed.ttft_s + front_end_s(problem, disaggregated=True)
            cols = (ttft, ed.tpot_s, ed.tpot_mean_s, np.minimum(ep.capacity_rps, ed.capacity_rps))
        for o, v in zip(out, (*cols, grp.pool), strict=True):
            o[grp.index] = v
    return Figures(*out)


def predict_figures(problem: Problem, layouts: Sequence[Layout], rates_rps: Sequence[float]) -> Figures:
    """Analytical figures of each layout at its rate (one rate per layout)."""
    return _figures(problem, _pack(problem, layouts), np.asarray(rates_rps, dtype=np.float64))


def _meets(problem: Problem, f: Figures, rates: FloatArray, *, margin: float, load_margin: float) -> Any:
    return meets_slo_and_load(problem.slo, ttft_s=f.ttft_s, tpot_s=f.tpot_s, rate_rps=rates, capacity_rps=f.capacity_rps, margin=margin,
                              load_margin=load_margin)


def slo_capacity_rps(problem: Problem, layouts: Sequence[Layout], *, margin: float = 1.0, load_margin: float = 1.0) -> Any:
    """The highest request rate at which each layout still meets both SLOs (bisection; 0 if none)."""
    if not layouts:
        return np.zeros(0)
    packed = _pack(problem, layouts)
    hi = np.asarray(_figures(problem, packed, np.full(len(layouts), 1e-3)).capacity_rps, dtype=np.float64)
    hi = np.where(np.isfinite(hi), hi, 0.0)
    lo = np.zeros(len(layouts))
    floor = np.maximum(hi * 1e-3, 1e-6)
    ok_low = _meets(problem, _figures(problem, packed, floor), floor, margin=margin, load_margin=load_margin)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        ok = _meets(problem, _figures(problem, packed, mid), mid, margin=margin, load_margin=load_margin)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(ok_low, lo, 0.0)


def layout_delivery_s(layout: Layout, tpot_mean_s: float) -> float:
    """The delivery part (s) of a layout's TTFT at its mean TPOT (perf.step.delivery_s, for the layout's kind; the
    estimates and the simulator's figures add it alike). 0 where the mean TPOT is not finite (no step to count)."""
    if not math.isfinite(tpot_mean_s):
        return 0.0
    return float(delivery_s(tpot_mean_s, disaggregated=layout.kind is LayoutKind.PD))


def delivery_ms(layout: Layout, tpot_mean_s: float) -> float:
    """`layout_delivery_s` in ms: Prediction.delivery_ms."""
    return layout_delivery_s(layout, tpot_mean_s) * 1e3


def to_prediction(problem: Problem, layout: Layout, *, ttft_s: float, tpot_s: float, tpot_mean_s: float, capacity_rps: float,
                  slo_capacity_rps: float, pool_tokens: int, source: str = "analytical") -> Prediction:
    """Assemble a Prediction at the problem's load from figures."""
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    meets = meets_slo_ms(problem.slo, ttft_ms=ttft_s * 1e3, tpot_ms=tpot_s * 1e3) and rate < capacity_rps
    role = layout.roles.get(Role.DECODE) or layout.roles[Role.AGGREGATED]
    longest = max_request_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision,
                                 parallelism=role.parallelism, knobs=role.knobs)
    # The pool as the engine reports it (vLLM in whole blocks), the figure the record and a start-up log show; the
    # vectorised `pool_tokens` of the funnel is the same pool before the block rounding.
    pool = kv_pool_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision,
                          parallelism=role.parallelism, knobs=role.knobs) if pool_tokens > 0 else 0
    served = min(rate, capacity_rps)
    return Prediction(
        ttft_ms=ttft_s * 1e3,
        tpot_ms=tpot_s * 1e3,
        throughput_tok_s=served * problem.workload.output_tokens.expected_tokens,
        capacity_rps=slo_capacity_rps,
        goodput_rps=rate if meets else 0.0,
        goodput_per_gpu=slo_capacity_rps / max(layout.gpus, 1),
        tokens_per_s_per_user=1.0 / tpot_mean_s if tpot_mean_s > 0 else 0.0,
        kv_pool_tokens=int(pool),
        max_request_tokens=longest,
        meets_slo=bool(meets),
        source=source,
        delivery_ms=delivery_ms(layout, tpot_mean_s),
        front_end_ms=front_end_s(problem, disaggregated=layout.kind is LayoutKind.PD) * 1e3,
    )
