"""Prefill on one GPU kind, decode on another: figures, SLO capacity and the KV link's refusals (the simulation of such a
layout is planner.sim.stage `simulate_mixed`, which reads this module).

Called by planner.pool.options (a member's mixed-kind options), planner.search.decide (a pinned mixed layout) and the
benchmarks. The roles are priced by the same analytical estimates as a one-kind PD layout (planner.perf.analytic), each
on its own GPU; the KV of every request crosses
the network between the two kinds' nodes at the slower NIC (one GPU's NIC per transfer, as perf.kv_transfer_s prices
a cross-node hand-off, FIFO per prefill instance as the simulator runs it). Pure: no clock, no I/O.

Refusals, each named (`MixedRefusal.rule`): `no-nic` (a kind without a NIC cannot hand KV to another kind),
`transfer-floor` (moving the TTFT-percentile prompt's KV at the link's line rate alone takes the TTFT budget the
prefill leaves, or the line rate carries fewer requests' KV per second than one prefill instance produces),
`memory` (a role's pool holds no longest prompt / request), and the engine release's PD rules (planner.engines.caps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servingtopology.planner.engines.caps import pd_rule_violation, problem_caps
from servingtopology.planner.hardware import Gpu, resolve_gpu
from servingtopology.planner.layout import KvDtype, Layout, LayoutKind, Role
from servingtopology.planner.perf.analytic import (
    Unloaded,
    decode_unloaded,
    estimate_decode,
    estimate_prefill,
    load_shape,
    prefill_unloaded,
    role_coefficients,
)
from servingtopology.planner.perf.memory import kv_bytes_per_token, kv_pool_tokens, transfer_floor_s
from servingtopology.planner.perf.memory_fit import memory_refusal
from servingtopology.planner.perf.predict import BISECTION_STEPS, front_end_s
from servingtopology.planner.perf.step import StepCoefficients, perf_params
from servingtopology.planner.problem import Problem
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN, meets_slo_and_load

__all__ = ["MixedRefusal", "MixedFigures", "MixedKinds", "mixed_kinds", "kv_link_transfer_s", "kv_bytes_per_request", "mixed_refusal", "mixed_figures",
           "mixed_slo_capacity_rps", "kv_pool_of", "with_nic"]

TRANSFER_LATENCY_S = 50e-6   # per hand-off, as perf.kv_transfer_s


@dataclass(frozen=True, slots=True)
class MixedRefusal:
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class MixedFigures:
    """Per layout (arrays): client TTFT and TPOT at the SLO percentiles (s), capacity (req/s) and what bounds it, the mean TPOT."""

    ttft_s: Any
    tpot_s: Any
    capacity_rps: Any
    prefill_rps: Any
    decode_rps: Any
    link_rps: Any
    tpot_mean_s: Any   # the decode role's mean TPOT (its mean step)


@dataclass(frozen=True, slots=True)
class MixedKinds:
    """The GPUs of a PD layout whose roles name kinds (RoleLayout.gpu), and the link its KV crosses (Gb/s per GPU)."""

    prefill_gpu: Gpu
    decode_gpu: Gpu
    link_gbit: float


def mixed_kinds(problem: Problem, layout: Layout) -> MixedKinds | None:
    """A PD layout's roles on named GPU kinds other than the problem's GPU alone, or None (replicas; roles on the
    problem's GPU). The problem's own kind keeps its overrides (the spec's nicGbps); another kind is the catalog's. The
    link is the slower NIC of the two (SlowerNicLink)."""
    if layout.kind is not LayoutKind.PD or not layout.kinds_named:
        return None
    kinds = layout.role_gpus(problem.gpu.id)
    if kinds[Role.PREFILL] == kinds[Role.DECODE] == problem.gpu.id:
        return None

    def gpu_of(gid: str) -> Gpu:
        return problem.gpu if gid == problem.gpu.id else resolve_gpu(gid)

    pg, dg = gpu_of(kinds[Role.PREFILL]), gpu_of(kinds[Role.DECODE])
    return MixedKinds(pg, dg, min(pg.nic_gbit, dg.nic_gbit))


def kv_bytes_per_request(problem: Problem, tokens: float) -> float:
    """Bytes of KV one request of `tokens` prompt tokens hands from prefill to decode (the whole model's, at TP 1)."""
    return float(tokens) * float(kv_bytes_per_token(problem.model, problem.search.kv_dtypes[0], tp=1, pp=1))


def kv_link_transfer_s(problem: Problem, tokens: Any, *, link_gbit: float) -> Any:
    """Seconds to move `tokens` prompt tokens' KV over one NIC of `link_gbit` Gb/s at the fitted link efficiency."""
    if link_gbit <= 0:
        return np.full(np.shape(tokens), np.inf) if np.ndim(tokens) else np.inf
    bps = link_gbit / 8.0 * perf_params().link_eff * 1e9
    return np.asarray(tokens, dtype=np.float64) * float(kv_bytes_per_token(problem.model, problem.search.kv_dtypes[0], tp=1, pp=1)) / bps \
        + TRANSFER_LATENCY_S


def kv_pool_of(problem: Problem, gpu: Gpu, layout: Layout, role: Role) -> int:
    """KV tokens one instance of `role` holds on `gpu`."""
    return _pool(problem, gpu, layout, role)


def _pool(problem: Problem, gpu: Gpu, layout: Layout, role: Role) -> int:
    r = layout.roles[role]
    return kv_pool_tokens(problem.model, gpu, engine=problem.engine, precision=problem.precision, parallelism=r.parallelism, knobs=r.knobs)


def mixed_refusal(problem: Problem, layout: Layout, *, prefill_gpu: Gpu, decode_gpu: Gpu, link_gbit: float) -> MixedRefusal | None:
    """Why this mixed-kind PD layout cannot run, or None. `link_gbit`: the per-GPU NIC between the two kinds' nodes."""
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    if link_gbit <= 0:
        return MixedRefusal("no-nic", f"no network between {prefill_gpu.id} and {decode_gpu.id} nodes (a kind without a NIC): the KV cannot move")
    rule = pd_rule_violation(problem_caps(problem), layout)
    if rule is not None:
        return MixedRefusal(f"engine:{rule.id}", f"{problem_caps(problem).label} refuses it: {rule.reason} ({rule.source})")
    short = memory_refusal(problem, layout, gpus={Role.PREFILL: prefill_gpu, Role.DECODE: decode_gpu})
    if short is not None:   # the one memory test, each role on its own kind
        return MixedRefusal("memory", f"{short.field}: {short.reason}")
    tokens = shape.input_tokens_at_ttft_pct
    nbytes = kv_bytes_per_request(problem, tokens)
    floor_s = transfer_floor_s(nbytes, link_gbit=link_gbit)
    budget_s = problem.slo.ttft_ms / 1e3 / SLO_MARGIN - front_end_s(problem, disaggregated=True)
    p = layout.roles[Role.PREFILL]
    idle = estimate_prefill(problem.model, prefill_gpu, precision=problem.precision, engine=problem.engine, kv=p.knobs.kv_dtype, shape=shape,
                            rate_rps=1e-9, tp=p.parallelism.tp, pp=p.parallelism.pp, dp=p.parallelism.dp, count=p.count,
                            max_num_batched_tokens=p.knobs.max_num_batched_tokens)
    left_s = budget_s - float(idle.ttft_s)
    if floor_s >= left_s:
        return MixedRefusal("transfer-floor", f"moving the p{problem.slo.ttft_percentile:g} prompt's KV ({tokens:.0f} tokens, {nbytes / 1e6:.0f} MB) "
                            f"over {link_gbit:g} Gb/s takes at least {floor_s * 1e3:.0f} ms at line rate, more than the "
                            f"{max(left_s, 0.0) * 1e3:.0f} ms of the TTFT SLO ({problem.slo.ttft_ms:g} ms with its margin) the idle "
                            f"prefill on {prefill_gpu.id} leaves")
    # The link's line rate must keep up with what one prefill instance produces, or its GPUs wait on the NIC.
    mean_bytes = kv_bytes_per_request(problem, shape.input_tokens)
    link_rps = link_gbit * 1e9 / 8.0 / mean_bytes / p.count
    prefill_rps = float(idle.capacity_rps) / p.count
    if link_rps < prefill_rps:
        return MixedRefusal("transfer-floor", f"{link_gbit:g} Gb/s carries the KV of {link_rps:.1f} req/s ({mean_bytes / 1e6:.0f} MB each) at line "
                            f"rate, below the {prefill_rps:.1f} req/s one prefill instance on {prefill_gpu.id} "
                            f"({p.parallelism.label_for(problem.engine)}) produces: its GPUs would wait on the NIC")
    return None


def _arrays(layouts: Sequence[Layout], role: Role) -> dict[str, Any]:
    rs = [lay.roles[role] for lay in layouts]
    return {"tp": np.array([r.parallelism.tp for r in rs], dtype=np.float64), "pp": np.array([r.parallelism.pp for r in rs], dtype=np.float64),
            "dp": np.array([r.parallelism.dp for r in rs], dtype=np.float64), "count": np.array([r.count for r in rs], dtype=np.float64),
            "mns": np.array([r.knobs.max_num_seqs for r in rs], dtype=np.float64),
            "mnbt": np.array([r.knobs.max_num_batched_tokens for r in rs], dtype=np.float64),
            "ep": np.array([r.parallelism.moe_ep for r in rs], dtype=np.float64)}


@dataclass(frozen=True, slots=True)
class _Packed:
    """What mixed_figures derives from the layouts alone (role arrays, decode pools, step coefficients): a bisection
    derives it once and asks for figures at every rate."""

    kv: KvDtype
    prefill: dict[str, Any]
    decode: dict[str, Any]
    pool: Any
    prefill_coefficients: StepCoefficients
    decode_coefficients: StepCoefficients
    prefill_unloaded: Unloaded                 # each role's figures without the rate (analytic.Unloaded)
    decode_unloaded: Unloaded


def _pack(problem: Problem, layouts: Sequence[Layout], *, prefill_gpu: Gpu, decode_gpu: Gpu, decode_pool_tokens: Any) -> _Packed:
    kv = layouts[0].roles[Role.DECODE].knobs.kv_dtype
    p, d = _arrays(layouts, Role.PREFILL), _arrays(layouts, Role.DECODE)
    pool = decode_pool_tokens if decode_pool_tokens is not None else \
        np.array([_pool(problem, decode_gpu, lay, Role.DECODE) for lay in layouts], dtype=np.float64)
    m, pe, en = problem.model, problem.precision, problem.engine
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    pc = role_coefficients(m, prefill_gpu, precision=pe, engine=en, kv=kv, tp=p["tp"], pp=p["pp"], dp=p["dp"], moe_ep=p["ep"])
    dc = role_coefficients(m, decode_gpu, precision=pe, engine=en, kv=kv, tp=d["tp"], pp=d["pp"], dp=d["dp"], moe_ep=d["ep"])
    return _Packed(kv, p, d, pool, pc, dc, prefill_unloaded(pc, engine=en, shape=shape, dp=p["dp"], max_num_batched_tokens=p["mnbt"]),
                   decode_unloaded(dc, shape=shape, max_num_seqs=d["mns"], pool_tokens=pool))


def mixed_figures(problem: Problem, layouts: Sequence[Layout], rates_rps: Any, *, prefill_gpu: Gpu, decode_gpu: Gpu,
                  link_gbit: float, decode_pool_tokens: Any = None) -> MixedFigures:
    """Analytical figures of mixed-kind PD layouts (one KV dtype: the decode role's of the first) at one rate each;
    `decode_pool_tokens` (per layout) saves recomputing the decode pools."""
    packed = _pack(problem, layouts, prefill_gpu=prefill_gpu, decode_gpu=decode_gpu, decode_pool_tokens=decode_pool_tokens)
    return _figures(problem, packed, rates_rps, prefill_gpu=prefill_gpu, decode_gpu=decode_gpu, link_gbit=link_gbit)


def _figures(problem: Problem, packed: _Packed, rates_rps: Any, *, prefill_gpu: Gpu, decode_gpu: Gpu, link_gbit: float) -> MixedFigures:
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    rate = np.asarray(rates_rps, dtype=np.float64)
    kv, p, d, pool = packed.kv, packed.prefill, packed.decode, packed.pool
    m, pe, en = problem.model, problem.precision, problem.engine
    ep = estimate_prefill(m, prefill_gpu, precision=pe, engine=en, kv=kv, shape=shape, rate_rps=rate, tp=p["tp"], pp=p["pp"], dp=p["dp"],
                          count=p["count"], max_num_batched_tokens=p["mnbt"], coefficients=packed.prefill_coefficients,
                          unloaded=packed.prefill_unloaded)
    ed = estimate_decode(m, decode_gpu, precision=pe, engine=en, kv=kv, shape=shape, rate_rps=rate, tp=d["tp"], pp=d["pp"], dp=d["dp"],
                         count=d["count"], max_num_seqs=d["mns"], pool_tokens=pool, coefficients=packed.decode_coefficients,
                         unloaded=packed.decode_unloaded)
    transfer = float(kv_link_transfer_s(problem, shape.input_tokens, link_gbit=link_gbit))
    link = p["count"] / transfer   # one transfer at a time per prefill instance (the simulator's FIFO link)
    ttft = ep.ttft_s + transfer + ed.ttft_s + front_end_s(problem, disaggregated=True)
    cap = np.minimum(np.minimum(ep.capacity_rps, ed.capacity_rps), link)
    return MixedFigures(ttft, ed.tpot_s, cap, ep.capacity_rps, ed.capacity_rps, link, ed.tpot_mean_s)


def mixed_slo_capacity_rps(problem: Problem, layouts: Sequence[Layout], *, prefill_gpu: Gpu, decode_gpu: Gpu, link_gbit: float) -> Any:
    """The highest rate at which each layout meets both SLOs with the funnel's margins (bisection, as predict.slo_capacity_rps)."""
    if not layouts:
        return np.zeros(0)
    pool = np.array([_pool(problem, decode_gpu, lay, Role.DECODE) for lay in layouts], dtype=np.float64)
    packed = _pack(problem, layouts, prefill_gpu=prefill_gpu, decode_gpu=decode_gpu, decode_pool_tokens=pool)

    def figures(rate: Any) -> MixedFigures:
        return _figures(problem, packed, rate, prefill_gpu=prefill_gpu, decode_gpu=decode_gpu, link_gbit=link_gbit)

    def meets(rate: Any) -> Any:
        f = figures(rate)
        return meets_slo_and_load(problem.slo, ttft_s=f.ttft_s, tpot_s=f.tpot_s, rate_rps=rate, capacity_rps=f.capacity_rps,
                                  margin=SLO_MARGIN, load_margin=LOAD_MARGIN)

    hi = np.asarray(figures(np.full(len(layouts), 1e-3)).capacity_rps, dtype=np.float64)
    hi = np.where(np.isfinite(hi), hi, 0.0)
    lo = np.zeros(len(layouts))
    floor = np.maximum(hi * 1e-3, 1e-6)
    ok_low = meets(floor)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        ok = meets(mid)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(ok_low, lo, 0.0)


def with_nic(gpu: Gpu, nic_gbit: float) -> Gpu:
    """The GPU with the pool's NIC (0 keeps the catalog's for transfers inside one kind)."""
    return replace(gpu, nic_gbit=nic_gbit) if nic_gbit > 0 else gpu
