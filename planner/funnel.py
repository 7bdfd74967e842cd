"""The funnel's sieve stages 1–5: enumerate candidate layouts and remove them, cheapest test first.

Called by `decide`. Candidates are (layout kind, per-role shape and count, engine knobs). Stages 1–2
depend only on the structure (shape, count), so they run on structural rows weighted by how many knob
combinations each stands for; stages 3–5 run on every candidate, with the expensive arithmetic done
once per distinct role configuration (role tables) and gathered per candidate. Counts reported are
always candidates. Pure numpy; a `progress(stage, fraction)` callback lets a CLI draw a bar.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .analytic import LoadShape, estimate_aggregated, estimate_decode, estimate_prefill, load_shape
from .layout import EngineKnobs, KvDtype, Layout, LayoutKind, Parallelism, RoleLayout
from .memory import kv_bytes_per_token, kv_pool_bytes
from .perf import kv_transfer_s, request_overhead_s
from .problem import FunnelStage, Problem

__all__ = ["SLO_MARGIN", "LOAD_MARGIN", "Survivor", "FunnelResult", "run_funnel", "shape_rejection", "Progress", "Clock", "no_clock"]

SLO_MARGIN = 1.10   # predicted latency × margin must stay within the SLO
LOAD_MARGIN = 0.90  # the load must stay under this share of the predicted capacity
PER_STRUCTURE = 8   # knob variants kept per structure for the refinement

Progress = Callable[[str, float], None]
# The caller's clock (seconds) for stage timings; the planner never reads the wall clock itself.
Clock = Callable[[], float]


def no_clock() -> float:
    """The default clock: every stage reports 0 s unless the caller passes a real one."""
    return 0.0
IntArray = npt.NDArray[np.int64]

STAGES = ("1 shape arithmetic", "2 GPU budget and node fit", "3 memory and context", "4 analytical estimate",
          "5 SLO and load feasibility")


@dataclass(frozen=True, slots=True)
class Survivor:
    """A candidate that passed stage 5, with its analytical figures (seconds, requests/s)."""

    layout: Layout
    ttft_s: float
    tpot_s: float
    tpot_mean_s: float
    capacity_rps: float
    pool_tokens: int


@dataclass(slots=True)
class FunnelResult:
    stages: list[FunnelStage]
    candidates_total: int
    survivors: list[Survivor]
    closest_miss: str = ""
    last_stage: str = ""
    survivors_total: int = 0
    notes: list[str] = field(default_factory=list)


def shape_rejection(problem: Problem, tp: int, pp: int, dp: int) -> str | None:
    """Why an instance shape is impossible for this model and node, or None."""
    m, gpu, s = problem.model, problem.gpu, problem.search
    if m.num_heads % tp:
        return "TP does not divide the attention heads"
    if m.hidden_size % tp:
        return "TP does not divide the hidden size"
    if not m.is_mla and m.num_kv_heads % tp and tp % m.num_kv_heads:
        return "TP and the KV heads do not divide one another"
    if pp > m.num_layers:
        return "PP exceeds the layers"
    if dp > 1 and not (m.is_moe or m.is_mla):
        return "attention DP needs an MoE or MLA model"
    group = tp * dp
    if group > gpu.gpus_per_node and not s.allow_cross_node_tp:
        return "TP×DP group spans nodes"
    if group * pp > gpu.gpus_per_node and gpu.gpus_per_node % group:
        return "pipeline stages do not tile whole nodes"
    return None


@dataclass(frozen=True, slots=True)
class _Units:
    """Structural rows (shape, count) of one role kind."""

    tp: IntArray
    pp: IntArray
    dp: IntArray
    count: IntArray
    valid: npt.NDArray[np.bool_]
    reason: list[str | None]

    @property
    def gpus(self) -> IntArray:
        return self.tp * self.pp * self.dp * self.count


def _units(problem: Problem) -> _Units:
    s = problem.search
    tps, pps, dps, counts, valid, reasons = [], [], [], [], [], []
    for tp, pp, dp in itertools.product(s.tp, s.pp, s.dp):
        why = shape_rejection(problem, tp, pp, dp)
        g = tp * pp * dp
        for c in range(1, max(1, problem.max_gpus // g) + 1):
            tps.append(tp)
            pps.append(pp)
            dps.append(dp)
            counts.append(c)
            valid.append(why is None)
            reasons.append(why)
    return _Units(_ints(tps), _ints(pps), _ints(dps), _ints(counts), np.asarray(valid, dtype=bool), reasons)


def _round_sig(x: Any, digits: int = 9) -> Any:
    """Round to `digits` significant figures (ties between copies of one structure survive float noise)."""
    mag = np.floor(np.log10(np.maximum(np.abs(x), 1e-300)))
    scale = 10.0 ** (digits - 1 - mag)
    return np.round(x * scale) / scale


def _ints(values: list[int]) -> IntArray:
    return np.asarray(values, dtype=np.int64)


class _Tally:
    def __init__(self, progress: Progress | None, clock: Clock) -> None:
        self.stages: list[FunnelStage] = []
        self.progress = progress
        self.clock = clock
        self.t0 = clock()

    def close(self, idx: int, admitted: int, rejected: int, reasons: dict[str, int]) -> None:
        now = self.clock()
        self.stages.append(FunnelStage(STAGES[idx], int(admitted), int(rejected), now - self.t0, dict(reasons)))
        self.t0 = now
        if self.progress:
            self.progress(STAGES[idx], (idx + 1) / len(STAGES))


def _add(reasons: dict[str, int], key: str, n: float) -> None:
    if n > 0:
        reasons[key] = reasons.get(key, 0) + int(n)


def run_funnel(problem: Problem, *, progress: Progress | None = None, keep: int = 2000, clock: Clock = no_clock) -> FunnelResult:
    """Run stages 1–5; return the counts and up to `keep` survivors, best analytical proxy first."""
    if problem.workload.arrival_rate_rps is None:
        raise ValueError("run_funnel needs an open-loop workload (arrival_rate_rps)")
    s = problem.search
    rate = float(problem.workload.arrival_rate_rps)
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    tally = _Tally(progress, clock)
    units = _units(problem)
    n_kv, n_mnbt, n_mns, n_mem = len(s.kv_dtypes), len(s.max_num_batched_tokens), len(s.max_num_seqs), len(s.memory_fraction)
    k_agg = n_kv * n_mnbt * n_mns * n_mem
    k_pd = n_kv * n_mnbt * n_mns * n_mem  # prefill: token budget; decode: max seqs × memory fraction; shared KV dtype
    do_rep = LayoutKind.REPLICAS in s.layouts
    do_pd = LayoutKind.PD in s.layouts
    n_units = len(units.count)

    # ---- stage 1: shape arithmetic (per structural row, weighted by knob combinations) ----
    total = (n_units * k_agg if do_rep else 0) + (n_units * n_units * k_pd if do_pd else 0)
    reasons: dict[str, int] = {}
    n_valid = int(units.valid.sum())
    for r in {r for r in units.reason if r}:
        n_r = sum(1 for x in units.reason if x == r)
        _add(reasons, r, (n_r * k_agg if do_rep else 0) + (n_r * n_units * k_pd if do_pd else 0))
    if do_pd:  # pairs with an invalid decode shape and a valid prefill shape
        for r in {r for r in units.reason if r}:
            n_r = sum(1 for x in units.reason if x == r)
            _add(reasons, r, n_valid * n_r * k_pd)
    admitted1 = (n_valid * k_agg if do_rep else 0) + (n_valid * n_valid * k_pd if do_pd else 0)
    tally.close(0, admitted1, total - admitted1, reasons)

    # ---- stage 2: GPU budget and node fit ----
    vu = np.flatnonzero(units.valid)
    reasons = {}
    rep_units = vu[units.gpus[vu] <= problem.max_gpus] if do_rep else vu[:0]
    _add(reasons, "over the GPU budget", (len(vu) - len(rep_units)) * k_agg if do_rep else 0)
    pairs_p: IntArray = np.zeros(0, dtype=np.int64)
    pairs_d: IntArray = np.zeros(0, dtype=np.int64)
    if do_pd and len(vu):
        gp = units.gpus[vu]
        pi, di = np.meshgrid(vu, vu, indexing="ij")
        fits = (gp[:, None] + gp[None, :]) <= problem.max_gpus
        pairs_p, pairs_d = pi[fits], di[fits]
        _add(reasons, "over the GPU budget", (fits.size - int(fits.sum())) * k_pd)
    admitted2 = len(rep_units) * k_agg + len(pairs_p) * k_pd
    tally.close(1, admitted2, admitted1 - admitted2, reasons)

    # ---- stage 3: memory and context capacity ----
    mnbt = np.asarray(s.max_num_batched_tokens, dtype=np.float64)
    mns = np.asarray(s.max_num_seqs, dtype=np.float64)
    mem = np.asarray(s.memory_fraction, dtype=np.float64)
    reasons = {}
    longest = shape.longest_request_tokens
    agg = _agg_table(problem, units, rep_units, mnbt, mns, mem, longest, reasons) if do_rep else None
    pd = _pd_tables(problem, units, pairs_p, pairs_d, mnbt, mns, mem, shape, longest, reasons) if do_pd and len(pairs_p) else None
    admitted3 = (int(agg.ok.sum()) if agg else 0) + (pd.n_ok if pd else 0)
    tally.close(2, admitted3, admitted2 - admitted3, reasons)

    # ---- stage 4: analytical estimate at the spec's load ----
    reasons = {}
    # Client-side TTFT: the engine's plus the front end's per-request overhead (perf.request_overhead_s).
    prompt_q = float(problem.workload.input_tokens.quantile(problem.slo.ttft_percentile / 100.0))
    cand_ttft: list[Any] = []
    cand_tpot: list[Any] = []
    cand_cap: list[Any] = []
    cand_gpus: list[Any] = []
    cand_ref: list[tuple[str, Any]] = []
    if agg is not None and agg.ok.any():
        idx = np.flatnonzero(agg.ok)
        est = _agg_by_kv(problem, agg, idx, shape, rate, s.kv_dtypes)
        cand_ttft.append(est[0] + request_overhead_s(problem.engine, prompt_q))
        cand_tpot.append(est[1])
        cand_cap.append(est[2])
        cand_gpus.append(agg.gpus[idx])
        cand_ref.append(("agg", (idx, est[3])))
    if pd is not None and pd.n_ok:
        ttft, tpot, cap, gpus, ref, tpm = pd.estimate(problem, shape, rate)
        cand_ttft.append(ttft + request_overhead_s(problem.engine, prompt_q, disaggregated=True))
        cand_tpot.append(tpot)
        cand_cap.append(cap)
        cand_gpus.append(gpus)
        cand_ref.append(("pd", (ref, tpm)))
    ttft_all = np.concatenate(cand_ttft) if cand_ttft else np.zeros(0)
    tpot_all = np.concatenate(cand_tpot) if cand_tpot else np.zeros(0)
    cap_all = np.concatenate(cand_cap) if cand_cap else np.zeros(0)
    gpus_all = np.concatenate(cand_gpus) if cand_gpus else np.zeros(0)
    stable = np.isfinite(ttft_all) & np.isfinite(tpot_all) & (cap_all > rate)
    _add(reasons, "overloaded: capacity below the load", int((~stable).sum()))
    tally.close(3, int(stable.sum()), admitted3 - int(stable.sum()), reasons)

    # ---- stage 5: SLO and load feasibility with a margin ----
    reasons = {}
    slo_ttft, slo_tpot = problem.slo.ttft_ms / 1e3, problem.slo.tpot_ms / 1e3
    ok_ttft = ttft_all * SLO_MARGIN <= slo_ttft
    ok_tpot = tpot_all * SLO_MARGIN <= slo_tpot
    ok_load = rate <= LOAD_MARGIN * cap_all
    ok = stable & ok_ttft & ok_tpot & ok_load
    _add(reasons, "TTFT over the SLO", int((stable & ~ok_ttft).sum()))
    _add(reasons, "TPOT over the SLO", int((stable & ok_ttft & ~ok_tpot).sum()))
    _add(reasons, "load above 90% of capacity", int((stable & ok_ttft & ok_tpot & ~ok_load).sum()))
    tally.close(4, int(ok.sum()), int(stable.sum()) - int(ok.sum()), reasons)

    result = FunnelResult(stages=tally.stages, candidates_total=total, survivors=[], survivors_total=int(ok.sum()))
    miss = np.maximum.reduce([ttft_all * SLO_MARGIN / slo_ttft, tpot_all * SLO_MARGIN / slo_tpot, rate / np.maximum(LOAD_MARGIN * cap_all, 1e-12)]) \
        if len(ttft_all) else np.zeros(0)
    if not ok.any():
        result.last_stage = next((st.stage for st in tally.stages if st.admitted == 0), STAGES[-1])
        result.closest_miss = _closest_miss(problem, result.last_stage, miss, ttft_all, tpot_all, cap_all, gpus_all, cand_ref, agg, pd, rate)
        return result
    # Proxy order: goodput-per-GPU by capacity per GPU; min-gpus by GPUs then capacity per GPU.
    # Rounded so that copies of one structure (equal per-GPU figures) tie and the fewest GPUs come first.
    per_gpu = np.where(ok, _round_sig(cap_all / np.maximum(gpus_all, 1)), -np.inf)
    gpus_key = np.where(ok, gpus_all, np.iinfo(np.int64).max)
    if problem.objective.value == "min-gpus":
        order = np.lexsort((-per_gpu, gpus_key))
    else:
        order = np.lexsort((gpus_key, -per_gpu))
    order = order[: int(ok.sum())]  # ok rows sort first (their keys are finite)
    for flat in _select(_structure_keys(order, cand_ref, agg, pd), order, keep=keep, per_structure=PER_STRUCTURE):
        result.survivors.append(_survivor(problem, int(flat), ttft_all, tpot_all, cap_all, cand_ref, agg, pd))
    return result


def _structure_keys(rows: IntArray, cand_ref: list[tuple[str, Any]], agg: _AggTable | None, pd: _PdTables | None) -> Any:
    """Integer keys per candidate row: column 0 is the kind, columns 1–9 the structure (shapes and, for
    PD, the reduced P:D ratio), columns 10–13 the knobs. Replica counts are left out on purpose."""
    keys = np.zeros((len(rows), 14), dtype=np.int64)
    sizes = _sizes(cand_ref)
    start = 0
    for (kind, ref), n in zip(cand_ref, sizes, strict=True):
        sel = (rows >= start) & (rows < start + n)
        local = rows[sel] - start
        if kind == "agg" and agg is not None:
            j = ref[0][local]
            cols = [np.zeros_like(j), agg.tp[j], agg.pp[j], agg.dp[j], 0 * j, 0 * j, 0 * j, 0 * j, 0 * j, 0 * j,
                    agg.mnbt[j], agg.mns[j], np.round(agg.mem[j] * 1000), agg.kv_index[j]]
        elif pd is not None:
            (pair, b, q, f, k), _ = ref
            pair, b, q, f, k = pair[local], b[local], q[local], f[local], k[local]
            u = pd.units
            up, ud = pd.pairs_p[pair], pd.pairs_d[pair]
            g = np.gcd(u.count[up], u.count[ud])
            cols = [np.ones_like(up), u.tp[up], u.pp[up], u.dp[up], u.tp[ud], u.pp[ud], u.dp[ud], u.count[up] // g, u.count[ud] // g,
                    0 * up, pd.mnbt[b], pd.mns[q], np.round(pd.mem[f] * 1000), k]
        else:
            cols = []
        for c, col in enumerate(cols):
            keys[sel, c] = np.asarray(col, dtype=np.float64).astype(np.int64)
        start += n
    return keys


def _select(keys: Any, rows: IntArray, *, keep: int, per_structure: int) -> IntArray:
    """The first row of each distinct (structure, knobs) in preference order, at most `per_structure`
    knob variants per structure, at most `keep` rows: diverse input for the SLO-capacity refinement."""
    if len(rows) == 0:
        return rows
    _, first = np.unique(keys, axis=0, return_index=True)
    first.sort()
    distinct = rows[first]
    _, group = np.unique(keys[first][:, :10], axis=0, return_inverse=True)
    group = group.ravel()
    by_group = np.argsort(group, kind="stable")
    sorted_group = group[by_group]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_group)) + 1]
    lengths = np.diff(np.r_[starts, len(group)])
    rank = np.empty(len(group), dtype=np.int64)
    rank[by_group] = np.arange(len(group)) - np.repeat(starts, lengths)
    return distinct[rank < per_structure][:keep]


# ---------------------------------------------------------------- replicas table
@dataclass(frozen=True, slots=True)
class _AggTable:
    tp: Any
    pp: Any
    dp: Any
    count: Any
    mnbt: Any
    mns: Any
    mem: Any
    kv_index: Any
    pool: Any
    ok: Any
    gpus: Any
    kv_varies: bool


def _grid(*axes: Any) -> list[Any]:
    return [a.ravel() for a in np.meshgrid(*axes, indexing="ij")]


def _pool_tokens(problem: Problem, kv: KvDtype, tp: Any, pp: Any, dp: Any, mnbt: Any, mns: Any, mem: Any) -> Any:
    pool = kv_pool_bytes(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision, tp=tp, pp=pp, dp=dp,
                         max_num_batched_tokens=mnbt, max_num_seqs=mns, memory_fraction=mem)
    return np.floor(np.maximum(pool, 0.0) / kv_bytes_per_token(problem.model, kv, tp=tp, pp=pp))


def _memory_reasons(problem: Problem, pool: Any, longest: float, mnbt: Any, mns: Any, reasons: dict[str, int], weight: Any = 1) -> Any:
    no_room = pool <= 0
    short = (~no_room) & (pool < longest)
    budget = (~no_room) & (~short) & (mnbt < mns) & (problem.engine.value == "vllm")
    _add(reasons, "weights and activations leave no KV pool", float(np.sum(no_room * weight)))
    _add(reasons, "KV pool shorter than the longest request", float(np.sum(short * weight)))
    _add(reasons, "max_num_batched_tokens below max_num_seqs (vLLM refuses)", float(np.sum(budget * weight)))
    return ~(no_room | short | budget)


def _agg_table(problem: Problem, units: _Units, rows: IntArray, mnbt: Any, mns: Any, mem: Any, longest: float,
               reasons: dict[str, int]) -> _AggTable:
    kvs = problem.search.kv_dtypes
    u, b, q, f, k = _grid(rows, mnbt, mns, mem, np.arange(len(kvs)))
    u = u.astype(np.int64)
    k = k.astype(np.int64)
    tp, pp, dp = units.tp[u], units.pp[u], units.dp[u]
    pool = np.zeros(len(u))
    for i, kv in enumerate(kvs):
        sel = k == i
        pool[sel] = _pool_tokens(problem, kv, tp[sel], pp[sel], dp[sel], b[sel], q[sel], f[sel])
    ok = _memory_reasons(problem, pool, longest, b, q, reasons)
    return _AggTable(tp, pp, dp, units.count[u], b, q, f, k, pool, ok, units.gpus[u], len(kvs) > 1)


def _agg_by_kv(problem: Problem, agg: _AggTable, idx: IntArray, shape: LoadShape, rate: float, kvs: tuple[KvDtype, ...]) -> tuple[Any, Any, Any, Any]:
    out = [np.zeros(len(idx)) for _ in range(4)]
    for i, kv in enumerate(kvs):
        sel = agg.kv_index[idx] == i
        j = idx[sel]
        est = estimate_aggregated(problem.model, problem.gpu, precision=problem.precision, engine=problem.engine, kv=kv, shape=shape,
                                  rate_rps=rate, tp=agg.tp[j], pp=agg.pp[j], dp=agg.dp[j], count=agg.count[j], max_num_seqs=agg.mns[j],
                                  max_num_batched_tokens=agg.mnbt[j], pool_tokens=agg.pool[j])
        for o, v in zip(out, (est.ttft_s, est.tpot_s, est.capacity_rps, est.tpot_mean_s), strict=True):
            o[sel] = v
    return out[0], out[1], out[2], out[3]


# ---------------------------------------------------------------- PD tables
@dataclass(slots=True)
class _PdTables:
    """Role tables for PD: prefill rows over (unit, token budget, kv), decode rows over (unit, max seqs, memory, kv)."""

    units: _Units
    pairs_p: IntArray
    pairs_d: IntArray
    mnbt: Any
    mns: Any
    mem: Any
    p_ok: Any        # [unit, mnbt, kv]
    d_ok: Any        # [unit, mns, mem, kv]
    p_pool: Any
    d_pool: Any
    n_ok: int
    kv_transfer_s: Any  # [kv, same_node]

    def estimate(self, problem: Problem, shape: LoadShape, rate: float) -> tuple[Any, Any, Any, Any, Any, Any]:
        u = self.units
        n_units = len(u.count)
        kvs = problem.search.kv_dtypes
        nb, nq, nf, nk = len(self.mnbt), len(self.mns), len(self.mem), len(kvs)
        p_ttft = np.full((n_units, nb, nk), np.inf)
        p_cap = np.zeros((n_units, nb, nk))
        d_ttft = np.full((n_units, nq, nf, nk), np.inf)
        d_tpot = np.full((n_units, nq, nf, nk), np.inf)
        d_tpm = np.full((n_units, nq, nf, nk), np.inf)
        d_cap = np.zeros((n_units, nq, nf, nk))
        used_p = np.unique(self.pairs_p)
        used_d = np.unique(self.pairs_d)
        for ki, kv in enumerate(kvs):
            uu, bb = (a.ravel() for a in np.meshgrid(used_p, np.arange(nb), indexing="ij"))
            e = estimate_prefill(problem.model, problem.gpu, precision=problem.precision, engine=problem.engine, kv=kv, shape=shape,
                                 rate_rps=rate, tp=u.tp[uu], pp=u.pp[uu], dp=u.dp[uu], count=u.count[uu], max_num_batched_tokens=self.mnbt[bb])
            p_ttft[uu, bb, ki] = e.ttft_s
            p_cap[uu, bb, ki] = e.capacity_rps
            uu, qq, ff = (a.ravel() for a in np.meshgrid(used_d, np.arange(nq), np.arange(nf), indexing="ij"))
            e = estimate_decode(problem.model, problem.gpu, precision=problem.precision, engine=problem.engine, kv=kv, shape=shape,
                                rate_rps=rate, tp=u.tp[uu], pp=u.pp[uu], dp=u.dp[uu], count=u.count[uu], max_num_seqs=self.mns[qq],
                                pool_tokens=self.d_pool[uu, qq, ff, ki])
            d_ttft[uu, qq, ff, ki] = e.ttft_s
            d_tpot[uu, qq, ff, ki] = e.tpot_s
            d_tpm[uu, qq, ff, ki] = e.tpot_mean_s
            d_cap[uu, qq, ff, ki] = e.capacity_rps
        # Expand pairs × knobs into candidates (only memory-feasible ones).
        ref = self._expand()
        pair, b, q, f, k = ref
        up, ud = self.pairs_p[pair], self.pairs_d[pair]
        same = (u.gpus[up] + u.gpus[ud]) <= problem.gpu.gpus_per_node
        ttft = p_ttft[up, b, k] + self.kv_transfer_s[k, same.astype(np.int64)] + d_ttft[ud, q, f, k]
        tpot = d_tpot[ud, q, f, k]
        cap = np.minimum(p_cap[up, b, k], d_cap[ud, q, f, k])
        gpus = u.gpus[up] + u.gpus[ud]
        return ttft, tpot, cap, gpus, ref, d_tpm[ud, q, f, k]

    def _expand(self) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray]:
        ok_p = self.p_ok[self.pairs_p]  # [pair, mnbt, kv]
        ok_d = self.d_ok[self.pairs_d]  # [pair, mns, mem, kv]
        both = ok_p[:, :, None, None, :] & ok_d[:, None, :, :, :]
        pair, b, q, f, k = np.nonzero(both)
        return pair, b, q, f, k


def _pd_tables(problem: Problem, units: _Units, pairs_p: IntArray, pairs_d: IntArray, mnbt: Any, mns: Any, mem: Any,
               shape: LoadShape, longest: float, reasons: dict[str, int]) -> _PdTables:
    kvs = problem.search.kv_dtypes
    n_units = len(units.count)
    nb, nq, nf, nk = len(mnbt), len(mns), len(mem), len(kvs)
    p_pool = np.zeros((n_units, nb, nk))
    d_pool = np.zeros((n_units, nq, nf, nk))
    tp, pp, dp = units.tp, units.pp, units.dp
    for ki, kv in enumerate(kvs):
        for bi, b in enumerate(mnbt):
            # Prefill instances hold prompts only; they run at the largest memory fraction offered.
            p_pool[:, bi, ki] = _pool_tokens(problem, kv, tp, pp, dp, b, np.minimum(256.0, b), float(mem.max()))
        for qi, q in enumerate(mns):
            for fi, f in enumerate(mem):
                d_pool[:, qi, fi, ki] = _pool_tokens(problem, kv, tp, pp, dp, np.maximum(q, 2048.0), q, f)
    p_ok = (p_pool > 0) & (p_pool >= shape.longest_prompt_tokens)  # prefill instances hold prompts until their KV moves
    d_ok = (d_pool > 0) & (d_pool >= longest)
    # Count candidates per pair passing both roles, per KV dtype; attribute failures to a reason.
    n_p_ok = p_ok[pairs_p].sum(axis=1)                 # [pair, kv]
    n_d_ok = d_ok[pairs_d].sum(axis=(1, 2))            # [pair, kv]
    n_ok = int((n_p_ok * n_d_ok).sum())
    total = len(pairs_p) * nb * nq * nf * nk
    no_pool = int(((d_pool[pairs_d] <= 0).sum(axis=(1, 2)) * nb).sum())
    _add(reasons, "weights and activations leave no KV pool", no_pool)
    _add(reasons, "KV pool shorter than the longest request", total - n_ok - no_pool)
    transfer = np.zeros((nk, 2))
    for ki, kv in enumerate(kvs):
        for same in (0, 1):
            transfer[ki, same] = kv_transfer_s(problem.model, problem.gpu, kv_dtype=kv, tokens=shape.input_tokens, same_node=bool(same))
    return _PdTables(units, pairs_p, pairs_d, mnbt, mns, mem, p_ok, d_ok, p_pool, d_pool, n_ok, transfer)


# ---------------------------------------------------------------- survivors and misses
def _locate(flat: int, cand_ref: list[tuple[str, Any]], sizes: list[int]) -> tuple[str, Any, int]:
    for (kind, ref), n in zip(cand_ref, sizes, strict=True):
        if flat < n:
            return kind, ref, flat
        flat -= n
    raise IndexError(flat)


def _sizes(cand_ref: list[tuple[str, Any]]) -> list[int]:
    return [len(ref[0]) if kind == "agg" else len(ref[0][0]) for kind, ref in cand_ref]


def _layout_at(problem: Problem, kind: str, ref: Any, i: int, agg: _AggTable | None, pd: _PdTables | None) -> tuple[Layout, int, float]:
    kvs = problem.search.kv_dtypes
    if kind == "agg":
        assert agg is not None
        j = int(ref[0][i])
        par = Parallelism(tp=int(agg.tp[j]), pp=int(agg.pp[j]), dp=int(agg.dp[j]), ep=bool(agg.dp[j] > 1 and problem.model.is_moe))
        knobs = EngineKnobs(max_num_seqs=int(agg.mns[j]), max_num_batched_tokens=int(agg.mnbt[j]), memory_fraction=float(agg.mem[j]),
                            kv_dtype=kvs[int(agg.kv_index[j])])
        return Layout.replicas(int(agg.count[j]), par, knobs, problem.precision), int(agg.pool[j]), float(ref[1][i])
    assert pd is not None
    (pair, b, q, f, k), tpm = ref
    u = pd.units
    up, ud = int(pd.pairs_p[pair[i]]), int(pd.pairs_d[pair[i]])
    kv = kvs[int(k[i])]
    mnbt_p = int(pd.mnbt[b[i]])
    mns_d = int(pd.mns[q[i]])
    mem_d = float(pd.mem[f[i]])
    p_role = RoleLayout(int(u.count[up]), Parallelism(tp=int(u.tp[up]), pp=int(u.pp[up]), dp=int(u.dp[up]), ep=bool(u.dp[up] > 1 and problem.model.is_moe)),
                        EngineKnobs(max_num_seqs=min(256, mnbt_p), max_num_batched_tokens=mnbt_p, memory_fraction=float(pd.mem.max()), kv_dtype=kv))
    d_role = RoleLayout(int(u.count[ud]), Parallelism(tp=int(u.tp[ud]), pp=int(u.pp[ud]), dp=int(u.dp[ud]), ep=bool(u.dp[ud] > 1 and problem.model.is_moe)),
                        EngineKnobs(max_num_seqs=mns_d, max_num_batched_tokens=max(mns_d, 2048), memory_fraction=mem_d, kv_dtype=kv))
    return Layout.pd(p_role, d_role, problem.precision), int(pd.d_pool[ud, q[i], f[i], k[i]]), float(tpm[i])


def _survivor(problem: Problem, flat: int, ttft: Any, tpot: Any, cap: Any, cand_ref: list[tuple[str, Any]],
              agg: _AggTable | None, pd: _PdTables | None) -> Survivor:
    kind, ref, i = _locate(flat, cand_ref, _sizes(cand_ref))
    layout, pool, tpm = _layout_at(problem, kind, ref, i, agg, pd)
    return Survivor(layout, float(ttft[flat]), float(tpot[flat]), tpm, float(cap[flat]), pool)


def _closest_miss(problem: Problem, stage: str, miss: Any, ttft: Any, tpot: Any, cap: Any, gpus: Any, cand_ref: list[tuple[str, Any]],
                  agg: _AggTable | None, pd: _PdTables | None, rate: float) -> str:
    if len(miss) and np.isfinite(miss).any():
        flat = int(np.nanargmin(np.where(np.isfinite(miss), miss, np.inf)))
        kind, ref, i = _locate(flat, cand_ref, _sizes(cand_ref))
        layout, _, _ = _layout_at(problem, kind, ref, i, agg, pd)
        return (f"{layout.label} on {layout.gpus} GPUs: p{problem.slo.ttft_percentile:g} TTFT {ttft[flat] * 1e3:.0f} ms "
                f"(SLO {problem.slo.ttft_ms:g}), p{problem.slo.tpot_percentile:g} TPOT {tpot[flat] * 1e3:.1f} ms (SLO {problem.slo.tpot_ms:g}), "
                f"capacity {cap[flat]:.1f} req/s for a load of {rate:g} req/s; {100 * (miss[flat] - 1):.0f}% short")
    m, g = problem.model, problem.gpu
    if stage.startswith("1") or stage.startswith("2"):
        return f"the smallest valid instance needs more than the {problem.max_gpus}-GPU budget or does not fit a {g.gpus_per_node}-GPU node"
    return f"no layout within {problem.max_gpus} × {g.id} holds {m.name}'s weights plus the longest request's KV"
