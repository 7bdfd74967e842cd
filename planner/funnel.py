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

from .analytic import load_shape
from .layout import EngineKnobs, Layout, LayoutKind, Parallelism, RoleLayout
from .predict import front_end_s
from .problem import FunnelStage, Problem
from .role_tables import AggTable, PdTables, Units, add_reason, agg_by_kv, agg_table, pd_tables

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
    if m.num_state_layers and m.state_heads % tp:  # vLLM shards Gated DeltaNet / Mamba heads and refuses a remainder
        return "TP does not divide the state-space heads"
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


def _units(problem: Problem) -> Units:
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
    return Units(_ints(tps), _ints(pps), _ints(dps), _ints(counts), np.asarray(valid, dtype=bool), reasons)


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
        add_reason(reasons, r, (n_r * k_agg if do_rep else 0) + (n_r * n_units * k_pd if do_pd else 0))
    if do_pd:  # pairs with an invalid decode shape and a valid prefill shape
        for r in {r for r in units.reason if r}:
            n_r = sum(1 for x in units.reason if x == r)
            add_reason(reasons, r, n_valid * n_r * k_pd)
    admitted1 = (n_valid * k_agg if do_rep else 0) + (n_valid * n_valid * k_pd if do_pd else 0)
    tally.close(0, admitted1, total - admitted1, reasons)

    # ---- stage 2: GPU budget and node fit ----
    vu = np.flatnonzero(units.valid)
    reasons = {}
    rep_units = vu[units.gpus[vu] <= problem.max_gpus] if do_rep else vu[:0]
    add_reason(reasons, "over the GPU budget", (len(vu) - len(rep_units)) * k_agg if do_rep else 0)
    pairs_p: IntArray = np.zeros(0, dtype=np.int64)
    pairs_d: IntArray = np.zeros(0, dtype=np.int64)
    if do_pd and len(vu):
        gp = units.gpus[vu]
        pi, di = np.meshgrid(vu, vu, indexing="ij")
        fits = (gp[:, None] + gp[None, :]) <= problem.max_gpus
        pairs_p, pairs_d = pi[fits], di[fits]
        add_reason(reasons, "over the GPU budget", (fits.size - int(fits.sum())) * k_pd)
    admitted2 = len(rep_units) * k_agg + len(pairs_p) * k_pd
    tally.close(1, admitted2, admitted1 - admitted2, reasons)

    # ---- stage 3: memory and context capacity ----
    mnbt = np.asarray(s.max_num_batched_tokens, dtype=np.float64)
    mns = np.asarray(s.max_num_seqs, dtype=np.float64)
    mem = np.asarray(s.memory_fraction, dtype=np.float64)
    reasons = {}
    longest = shape.longest_request_tokens
    agg = agg_table(problem, units, rep_units, mnbt, mns, mem, longest, reasons) if do_rep else None
    pd = pd_tables(problem, units, pairs_p, pairs_d, mnbt, mns, mem, shape, longest, reasons) if do_pd and len(pairs_p) else None
    admitted3 = (int(agg.ok.sum()) if agg else 0) + (pd.n_ok if pd else 0)
    tally.close(2, admitted3, admitted2 - admitted3, reasons)

    # ---- stage 4: analytical estimate at the spec's load ----
    reasons = {}
    # Client-side TTFT: the engine's plus the front end's (predict.front_end_s).
    cand_ttft: list[Any] = []
    cand_tpot: list[Any] = []
    cand_cap: list[Any] = []
    cand_gpus: list[Any] = []
    cand_ref: list[tuple[str, Any]] = []
    if agg is not None and agg.ok.any():
        idx = np.flatnonzero(agg.ok)
        est = agg_by_kv(problem, agg, idx, shape, rate, s.kv_dtypes)
        cand_ttft.append(est[0] + front_end_s(problem, disaggregated=False))
        cand_tpot.append(est[1])
        cand_cap.append(est[2])
        cand_gpus.append(agg.gpus[idx])
        cand_ref.append(("agg", (idx, est[3])))
    if pd is not None and pd.n_ok:
        ttft, tpot, cap, gpus, ref, tpm = pd.estimate(problem, shape, rate)
        cand_ttft.append(ttft + front_end_s(problem, disaggregated=True))
        cand_tpot.append(tpot)
        cand_cap.append(cap)
        cand_gpus.append(gpus)
        cand_ref.append(("pd", (ref, tpm)))
    ttft_all = np.concatenate(cand_ttft) if cand_ttft else np.zeros(0)
    tpot_all = np.concatenate(cand_tpot) if cand_tpot else np.zeros(0)
    cap_all = np.concatenate(cand_cap) if cand_cap else np.zeros(0)
    gpus_all = np.concatenate(cand_gpus) if cand_gpus else np.zeros(0)
    stable = np.isfinite(ttft_all) & np.isfinite(tpot_all) & (cap_all > rate)
    add_reason(reasons, "overloaded: capacity below the load", int((~stable).sum()))
    tally.close(3, int(stable.sum()), admitted3 - int(stable.sum()), reasons)

    # ---- stage 5: SLO and load feasibility with a margin ----
    reasons = {}
    slo_ttft, slo_tpot = problem.slo.ttft_ms / 1e3, problem.slo.tpot_ms / 1e3
    ok_ttft = ttft_all * SLO_MARGIN <= slo_ttft
    ok_tpot = tpot_all * SLO_MARGIN <= slo_tpot
    ok_load = rate <= LOAD_MARGIN * cap_all
    ok = stable & ok_ttft & ok_tpot & ok_load
    add_reason(reasons, "TTFT over the SLO", int((stable & ~ok_ttft).sum()))
    add_reason(reasons, "TPOT over the SLO", int((stable & ok_ttft & ~ok_tpot).sum()))
    add_reason(reasons, "load above 90% of capacity", int((stable & ok_ttft & ok_tpot & ~ok_load).sum()))
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


def _structure_keys(rows: IntArray, cand_ref: list[tuple[str, Any]], agg: AggTable | None, pd: PdTables | None) -> Any:
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


# ---------------------------------------------------------------- survivors and misses
def _locate(flat: int, cand_ref: list[tuple[str, Any]], sizes: list[int]) -> tuple[str, Any, int]:
    for (kind, ref), n in zip(cand_ref, sizes, strict=True):
        if flat < n:
            return kind, ref, flat
        flat -= n
    raise IndexError(flat)


def _sizes(cand_ref: list[tuple[str, Any]]) -> list[int]:
    return [len(ref[0]) if kind == "agg" else len(ref[0][0]) for kind, ref in cand_ref]


def _layout_at(problem: Problem, kind: str, ref: Any, i: int, agg: AggTable | None, pd: PdTables | None) -> tuple[Layout, int, float]:
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
              agg: AggTable | None, pd: PdTables | None) -> Survivor:
    kind, ref, i = _locate(flat, cand_ref, _sizes(cand_ref))
    layout, pool, tpm = _layout_at(problem, kind, ref, i, agg, pd)
    return Survivor(layout, float(ttft[flat]), float(tpot[flat]), tpm, float(cap[flat]), pool)


def _closest_miss(problem: Problem, stage: str, miss: Any, ttft: Any, tpot: Any, cap: Any, gpus: Any, cand_ref: list[tuple[str, Any]],
                  agg: AggTable | None, pd: PdTables | None, rate: float) -> str:
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
