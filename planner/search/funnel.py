"""The funnel's sieve stages 1–5: a short ladder of named stages, each counted and timed.

Called by `decide`. Each stage is a function from the standing candidates (a `Sieve`: typed tables per
layout kind, planner.search.tables and planner.search.pd_space) to the candidates it keeps, the count it admitted and
why it rejected the rest; `run_funnel` walks `LADDER` in order. Replicas are groups (shape × knobs) over a
range of instance counts, each stage keeping a suffix of counts found by bisection; PD pairs, which grow as the
budget squared, are counted without being listed (planner.search.pd_space). Stage 5 also
picks the survivors `decide` refines. Counts are always candidates. Pure numpy; a `progress(stage,
fraction)` callback lets a CLI draw a bar.

To add a rejecting stage (an engine rule, say), write `(Sieve) -> tuple[Sieve, Tally]` that narrows
`sieve.pd.allowed` (prefill shape × decode shape) or `sieve.replicas.first` (the fewest instances standing), or build one with
`reject_pd_shapes`, and insert it into a copy of `LADDER` before stage 5 (`run_funnel(..., ladder=…)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from servingtopology.planner.engines.caps import PdRule, pd_shapes_rejected, problem_caps
from servingtopology.planner.layout import Layout, LayoutKind, Role
from servingtopology.planner.perf.analytic import LoadShape, estimate_aggregated, load_shape
from servingtopology.planner.perf.memory_fit import MemoryShortfall, longest_of, shortfall, tokens_to_hold
from servingtopology.planner.perf.predict import front_end_s, slo_capacity_rps
from servingtopology.planner.problem import FunnelStage, Problem
from servingtopology.planner.search.limits import miss_text
from servingtopology.planner.search.pd_ratio import RANK_TOLERANCE
from servingtopology.planner.search.pd_space import PdSpace, pd_space, pool_tokens
from servingtopology.planner.search.tables import (
    BoolArray,
    FloatArray,
    IntArray,
    KnobAxes,
    PdCandidates,
    ReplicaCandidates,
    RoleParts,
    UnitTable,
    add_reason,
    knob_axes,
    shape_rejection,
    unit_table,
)
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN, load_within, meets_slo_and_load, tpot_within, ttft_within
from servingtopology.planner.workload import Objective

__all__ = ["SLO_MARGIN", "LOAD_MARGIN", "PER_STRUCTURE", "CLOSEST_KEPT", "Survivor", "Miss", "FunnelResult", "Sieve", "Tally", "Stage",
           "LADDER", "MEMORY_STAGE", "engine_ladder",
           "run_funnel", "shape_rejection", "reject_pd_shapes", "Progress", "Clock", "no_clock"]

PER_STRUCTURE = 8   # knob variants kept per structure for the refinement
TIE_SLACK = 1e-6    # relative slack on the tie bound of the second pick (bisection and 9-digit rounding are far below)
TIE_FLOOR_PASSES = 4  # TieFloorToTheBest: at most this many floors (the wide example at 1,024 GPUs under the measured all-reduce fit raises it once)

Progress = Callable[[str, float], None]
# The caller's clock (seconds) for stage timings; the planner never reads the wall clock itself.
Clock = Callable[[], float]


def no_clock() -> float:
    """The default clock: every stage reports 0 s unless the caller passes a real one."""
    return 0.0


@dataclass(frozen=True, slots=True)
class Survivor:
    """A candidate that passed stage 5, with its analytical figures (seconds, requests/s)."""

    layout: Layout
    ttft_s: float
    tpot_s: float
    tpot_mean_s: float
    capacity_rps: float
    pool_tokens: int


@dataclass(frozen=True, slots=True)
class Miss:
    """A candidate that failed stage 4 or 5, with its analytical figures at the load (seconds, requests/s) and
    `miss`: the largest of TTFT×margin/SLO, TPOT×margin/SLO and load/(margin×capacity); 1 would just pass."""

    layout: Layout
    ttft_s: float
    tpot_s: float
    capacity_rps: float
    miss: float


CLOSEST_KEPT = 16   # misses kept for the infeasible advice (planner.search.advice)


@dataclass(slots=True)
class FunnelResult:
    stages: list[FunnelStage]
    candidates_total: int
    survivors: list[Survivor]
    closest_miss: str = ""
    last_stage: str = ""
    survivors_total: int = 0
    notes: list[str] = field(default_factory=list)
    closest: tuple[Miss, ...] = ()   # when nothing survived: the candidates nearest to passing stage 5, nearest first


@dataclass(frozen=True, slots=True)
class Tally:
    """What one stage admitted and why it rejected the others (rejected = entering − admitted)."""

    admitted: int
    reasons: dict[str, int]


@dataclass(frozen=True, slots=True)
class Sieve:
    """The candidates still standing, per layout kind, with what every stage needs to know."""

    problem: Problem
    load: LoadShape
    rate_rps: float
    units: UnitTable
    knobs: KnobAxes
    replicas: ReplicaCandidates | None        # None until stage 2, or when the search excludes replicas
    pd: PdSpace | None                        # None when the search excludes PD
    keep: int = 2000                          # survivors stage 5 picks for `decide`
    exhaustive: bool = False                  # list every passing PD candidate when picking (tests compare)
    survivors: tuple[Survivor, ...] = ()
    survivors_total: int = 0

    @property
    def do_replicas(self) -> bool:
        return LayoutKind.REPLICAS in self.problem.search.layouts


Stage = Callable[[Sieve], tuple[Sieve, Tally]]


# ---------------------------------------------------------------- stage 1
def shape_arithmetic(s: Sieve) -> tuple[Sieve, Tally]:
    """Stage 1: TP divides heads and hidden, PP fits the layers, groups stay inside a node (per structure)."""
    u = s.units
    reasons: dict[str, int] = {}
    k_rep = s.knobs.combinations
    valid = u.shape_valid
    admitted = int(valid[u.shape].sum()) * k_rep if s.do_replicas else 0
    units_per_shape = np.diff(u.shape_start)
    if s.do_replicas:
        for why in {r for r in u.shape_reason if r}:
            add_reason(reasons, why, int(sum(n for n, r in zip(units_per_shape, u.shape_reason, strict=True) if r == why)) * k_rep)
    pd = s.pd
    if pd is not None:
        p_valid = np.broadcast_to(valid[u.shape][:, None, None], pd.p_alive.shape)
        d_valid = np.broadcast_to(valid[u.shape][:, None, None, None], pd.d_alive.shape)
        everything = np.ones_like(pd.allowed)
        for why in {r for r in u.shape_reason if r}:
            is_why = np.array([r == why for r in u.shape_reason])[u.shape]
            add_reason(reasons, why, pd.count(p_mask=np.broadcast_to(is_why[:, None, None], pd.p_alive.shape), allowed=everything))
            add_reason(reasons, why, pd.count(p_mask=p_valid, d_mask=np.broadcast_to(is_why[:, None, None, None], pd.d_alive.shape),
                                              allowed=everything))
        pd = replace(pd, allowed=valid[:, None] & valid[None, :], p_alive=pd.p_alive & p_valid, d_alive=pd.d_alive & d_valid)
        admitted += pd.count()
    return replace(s, pd=pd), Tally(admitted, reasons)


# ---------------------------------------------------------------- stage 2
def gpu_budget(s: Sieve) -> tuple[Sieve, Tally]:
    """Stage 2: the layout's GPUs within the budget; replica groups (shape × knobs, counts 1…n_max) from here on."""
    u, kn = s.units, s.knobs
    reasons: dict[str, int] = {}
    admitted = 0
    replicas = None
    if s.do_replicas:
        vu = np.flatnonzero(u.valid)
        rows = vu[u.gpus[vu] <= s.problem.max_gpus]
        add_reason(reasons, "over the GPU budget", (len(vu) - len(rows)) * kn.combinations)
        replicas = _replica_groups(u, rows, kn)
        admitted += replicas.standing
    pd = s.pd
    if pd is not None:
        before = pd.count()
        pd = replace(pd, budget_gpus=s.problem.max_gpus)
        after = pd.count()
        add_reason(reasons, "over the GPU budget", before - after)
        admitted += after
    return replace(s, replicas=replicas, pd=pd), Tally(admitted, reasons)


def _replica_groups(u: UnitTable, rows: IntArray, kn: KnobAxes) -> ReplicaCandidates:
    """The groups (shape, b, q, f, k) of the units `rows` (within the budget), each standing for its counts 1…n_max."""
    n_max = np.bincount(u.shape[rows], minlength=len(u.shape_tp)).astype(np.int64)
    shapes = np.flatnonzero(n_max)
    sizes = (len(shapes), len(kn.max_num_batched_tokens), len(kn.max_num_seqs), len(kn.memory_fraction), len(kn.kv_dtypes))
    grid = [a.ravel().astype(np.int64) for a in np.meshgrid(shapes, *(np.arange(n) for n in sizes[1:]), indexing="ij")]
    n = len(grid[0])
    nan = np.full(n, np.nan)
    first = np.ones(n, dtype=np.int64)
    return ReplicaCandidates(shape=grid[0], b=grid[1], q=grid[2], f=grid[3], k=grid[4], n_max=n_max[grid[0]], estimated=first > 0,
                             first=first, first_ttft=first, first_tpot=first, first_pass=first, pool_tokens=np.zeros(n), ttft_s=nan,
                             tpot_s=nan, tpot_mean_s=nan, capacity_rps=nan)


# ---------------------------------------------------------------- stage 3
def memory_and_context(s: Sieve) -> tuple[Sieve, Tally]:
    """Stage 3: a KV pool that holds the longest request (prompt, for prefill instances) under each engine's memory knob."""
    reasons: dict[str, int] = {}
    admitted = 0
    replicas = s.replicas
    if replicas is not None:
        u, kn, p = s.units, s.knobs, s.problem
        r = replicas
        mnbt, mns = kn.max_num_batched_tokens[r.b], kn.max_num_seqs[r.q]
        n = r.n_max
        # A pool depends on the instance's shape and knobs, not on how many instances run: once per (shape, knobs).
        nb, nq, nf = len(kn.max_num_batched_tokens), len(kn.max_num_seqs), len(kn.memory_fraction)
        sh, b, q, f = (a.ravel() for a in np.meshgrid(np.arange(len(u.shape_tp)), np.arange(nb), np.arange(nq), np.arange(nf), indexing="ij"))
        per_shape = np.zeros((len(kn.kv_dtypes), len(sh)))
        for i, kv in enumerate(kn.kv_dtypes):
            per_shape[i] = pool_tokens(p, kv, u.shape_tp[sh], u.shape_pp[sh], u.shape_dp[sh], kn.max_num_batched_tokens[b], kn.max_num_seqs[q],
                                       kn.memory_fraction[f])
        pool = per_shape[r.k, ((r.shape * nb + r.b) * nq + r.q) * nf + r.f]
        # The one memory test (planner.perf.memory_fit), as a pinned layout meets it in decide.refuse_pin.
        no_room, short = shortfall(pool, tokens_to_hold(Role.AGGREGATED, longest_of(p)))
        budget = ~no_room & ~short & (mnbt < mns) & (p.engine.value == "vllm")
        standing = r.first <= n
        add_reason(reasons, MemoryShortfall.NO_POOL, int(n[standing & no_room].sum()))
        add_reason(reasons, MemoryShortfall.SHORT, int(n[standing & short].sum()))
        add_reason(reasons, "max_num_batched_tokens below max_num_seqs (vLLM refuses)", int(n[standing & budget].sum()))
        first = np.where(no_room | short | budget, n + 1, r.first)
        replicas = replace(r, pool_tokens=pool, estimated=first <= n, first=first, first_ttft=first, first_tpot=first, first_pass=first)
        admitted += replicas.standing
    pd = s.pd
    if pd is not None:
        entering = pd.count()
        pd = pd.with_memory(s.problem)
        after = pd.count()
        no_pool = pd.count(d_mask=s.pd.d_alive & (pd.d_pool <= 0) if s.pd is not None else None, p_mask=s.pd.p_alive if s.pd else None)
        add_reason(reasons, MemoryShortfall.NO_POOL, no_pool)
        add_reason(reasons, MemoryShortfall.SHORT, entering - after - no_pool)
        admitted += after
    return replace(s, replicas=replicas, pd=pd), Tally(admitted, reasons)


# ---------------------------------------------------------------- stage 4
def analytical_estimate(s: Sieve) -> tuple[Sieve, Tally]:
    """Stage 4: latency and capacity at the spec's load (queueing formulas over perf.step_time_s); the
    load must stay below the capacity. Client-side TTFT: the engine's plus the front end's."""
    reasons: dict[str, int] = {}
    admitted, entering = 0, 0
    p = s.problem
    replicas = s.replicas
    if replicas is not None:
        r = replicas
        entering += r.standing
        # Every test is monotone in the instance count, so each group's first passing count is bisected, not listed.
        first = _first_passing(s, r, r.first, lambda e: e.stable)
        first_ttft = _first_passing(s, r, first, lambda e: e.stable & ttft_within(p.slo, e.ttft_s))
        first_tpot = _first_passing(s, r, first_ttft, lambda e: e.stable & ttft_within(p.slo, e.ttft_s) & tpot_within(p.slo, e.tpot_s))
        first_pass = _first_passing(s, r, first_tpot, lambda e: e.stable & meets_slo_and_load(p.slo, ttft_s=e.ttft_s, tpot_s=e.tpot_s,
                                                                                                rate_rps=s.rate_rps, capacity_rps=e.capacity_rps))
        g = np.flatnonzero(first_pass <= r.n_max)
        ttft, tpot, tpm, cap = (np.full(len(r), np.nan) for _ in range(4))
        e = _estimate_groups(s, r, g, first_pass[g])
        ttft[g], tpot[g], tpm[g], cap[g] = e.ttft_s, e.tpot_s, e.tpot_mean_s, e.capacity_rps
        replicas = replace(r, first=first, first_ttft=first_ttft, first_tpot=first_tpot, first_pass=first_pass, ttft_s=ttft, tpot_s=tpot,
                           tpot_mean_s=tpm, capacity_rps=cap)
        admitted += replicas.standing
    pd = s.pd
    if pd is not None:
        entering += pd.count()
        pd = pd.with_estimates(p, s.load, s.rate_rps, front_end_s=front_end_s(p, disaggregated=True))
        p_stable = pd.p_alive & np.isfinite(pd.p_ttft_s) & (pd.p_capacity_rps > s.rate_rps)
        d_stable = pd.d_alive & np.isfinite(pd.d_ttft_s) & np.isfinite(pd.d_tpot_s) & (pd.d_capacity_rps > s.rate_rps)
        pd = replace(pd, p_alive=p_stable, d_alive=d_stable)
        admitted += pd.count()
    add_reason(reasons, "overloaded: capacity below the load", entering - admitted)
    return replace(s, replicas=replicas, pd=pd), Tally(admitted, reasons)


@dataclass(frozen=True, slots=True)
class _Estimate:
    """Replica figures of some groups at some counts (client-side TTFT), and whether stage 4 keeps them."""

    ttft_s: FloatArray
    tpot_s: FloatArray
    tpot_mean_s: FloatArray
    capacity_rps: FloatArray
    stable: BoolArray


def _estimate_groups(s: Sieve, r: ReplicaCandidates, g: IntArray, count: IntArray) -> _Estimate:
    """The stage-4 estimate of groups `g` at `count` instances each (the figures a listed row would get)."""
    p, kn, u = s.problem, s.knobs, s.units
    ttft, tpot, tpm, cap = (np.full(len(g), np.nan) for _ in range(4))
    for ki, kv in enumerate(kn.kv_dtypes):
        j = np.flatnonzero(r.k[g] == ki)
        if not len(j):
            continue
        gj, sh = g[j], r.shape[g[j]]
        e = estimate_aggregated(p.model, p.gpu, precision=p.precision, engine=p.engine, kv=kv, shape=s.load, rate_rps=s.rate_rps,
                                tp=u.shape_tp[sh], pp=u.shape_pp[sh], dp=u.shape_dp[sh], count=np.asarray(count[j], dtype=np.int64),
                                max_num_seqs=kn.max_num_seqs[r.q[gj]], max_num_batched_tokens=kn.max_num_batched_tokens[r.b[gj]],
                                pool_tokens=r.pool_tokens[gj])
        ttft[j], tpot[j], cap[j], tpm[j] = e.ttft_s, e.tpot_s, e.capacity_rps, e.tpot_mean_s
    ttft = ttft + front_end_s(p, disaggregated=False)
    stable = np.isfinite(ttft) & np.isfinite(tpot) & (cap > s.rate_rps)
    return _Estimate(ttft, tpot, tpm, cap, stable)


def _first_passing(s: Sieve, r: ReplicaCandidates, lo: IntArray, passes: Callable[[_Estimate], BoolArray]) -> IntArray:
    """Per group, the fewest instances from `lo` on that `passes` (n_max + 1: none), by bisection: `passes` must
    hold for every larger count once it holds (the estimate is monotone in the count)."""
    lo, hi = lo.copy(), r.n_max + 1
    while True:
        g = np.flatnonzero(lo < hi)
        if not len(g):
            return lo
        mid = (lo[g] + hi[g]) // 2
        ok = passes(_estimate_groups(s, r, g, mid))
        hi[g[ok]] = mid[ok]
        lo[g[~ok]] = mid[~ok] + 1


# ---------------------------------------------------------------- stage 5
def slo_and_load(s: Sieve) -> tuple[Sieve, Tally]:
    """Stage 5: TTFT and TPOT × SLO_MARGIN within the SLOs, the load within LOAD_MARGIN of capacity; then
    pick up to `s.keep` survivors for `decide` (see `_pick`)."""
    p, rate = s.problem, s.rate_rps
    slo_ttft = p.slo.ttft_ms / 1e3
    reasons: dict[str, int] = {}
    stable = ttft_ok = tpot_ok = ok_n = 0
    r = s.replicas
    if r is not None:
        stable, ttft_ok, tpot_ok, ok_n = (r.standing_of(r.n_max, first) for first in (r.first, r.first_ttft, r.first_tpot, r.first_pass))
        r = replace(r, first=r.first_pass)
    pd = s.pd
    if pd is not None:
        d_tpot = pd.d_alive & tpot_within(p.slo, pd.d_tpot_s)
        p_load = pd.p_alive & load_within(rate, pd.p_capacity_rps)
        d_load = d_tpot & load_within(rate, pd.d_capacity_rps)
        joint = dict(front_end_s=pd.front_end_s, slo_s=slo_ttft, margin=SLO_MARGIN, gpus_per_node=p.gpu.gpus_per_node)
        stable += pd.count()
        ttft_ok += pd.count_ttft_ok(pd.p_alive, pd.d_alive, **joint)  # type: ignore[arg-type]
        tpot_ok += pd.count_ttft_ok(pd.p_alive, d_tpot, **joint)  # type: ignore[arg-type]
        ok_n += pd.count_ttft_ok(p_load, d_load, **joint)  # type: ignore[arg-type]
        pd = replace(pd, p_alive=p_load, d_alive=d_load)
    add_reason(reasons, "TTFT over the SLO", stable - ttft_ok)
    add_reason(reasons, "TPOT over the SLO", ttft_ok - tpot_ok)
    add_reason(reasons, "load above 90% of capacity", tpot_ok - ok_n)
    s = replace(s, replicas=r, pd=pd, survivors_total=ok_n)
    if ok_n:
        s = replace(s, survivors=_pick(s, keep=s.keep))
    return s, Tally(ok_n, reasons)


MEMORY_STAGE = "3 memory and context"   # a pinned layout's memory refusal names it too (decide.refuse_pin)

LADDER: tuple[tuple[str, Stage], ...] = (
    ("1 shape arithmetic", shape_arithmetic),
    ("2 GPU budget and node fit", gpu_budget),
    (MEMORY_STAGE, memory_and_context),
    ("4 analytical estimate", analytical_estimate),
    ("5 SLO and load feasibility", slo_and_load),
)


def reject_pd_shapes(reason: str, rejects: Callable[[Problem, IntArray, IntArray, IntArray, IntArray, IntArray, IntArray], BoolArray]) -> Stage:
    """A stage that rejects PD candidates whose (prefill shape, decode shape) an engine rule forbids.

    `rejects(problem, p_tp, p_pp, p_dp, d_tp, d_pp, d_dp)` gets one row per shape pair and returns True where
    the pair is forbidden; the stage counts the candidates it removes under `reason`.
    """
    def stage(s: Sieve) -> tuple[Sieve, Tally]:
        reps = s.replicas.standing if s.replicas is not None else 0
        if s.pd is None:
            return s, Tally(reps, {})
        u = s.units
        n = len(u.shape_tp)
        sp, sd = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
        bad = np.asarray(rejects(s.problem, u.shape_tp[sp], u.shape_pp[sp], u.shape_dp[sp], u.shape_tp[sd], u.shape_pp[sd], u.shape_dp[sd]),
                         dtype=bool).reshape(n, n)
        before = s.pd.count()
        pd = replace(s.pd, allowed=s.pd.allowed & ~bad)
        after = pd.count()
        return replace(s, pd=pd), Tally(reps + after, {reason: before - after} if before > after else {})
    return stage


def engine_ladder(problem: Problem, ladder: Sequence[tuple[str, Stage]] = LADDER) -> tuple[tuple[str, Stage], ...]:
    """`ladder` with the PD rules of the problem's engine release (planner.engines.caps) after stage 2 (where the
    replicas are listed and counted), one stage per rule ("2a vLLM 0.11.0 rule"), each counting what it refuses
    as "vLLM 0.11.0: decode TP below prefill TP"."""
    caps = problem_caps(problem)

    def refuses(rule: PdRule) -> Callable[[Problem, IntArray, IntArray, IntArray, IntArray, IntArray, IntArray], BoolArray]:
        def rejects(_problem: Problem, p_tp: IntArray, p_pp: IntArray, _p_dp: IntArray, d_tp: IntArray, d_pp: IntArray,
                    _d_dp: IntArray) -> BoolArray:
            return np.asarray(pd_shapes_rejected(rule, p_tp, p_pp, d_tp, d_pp), dtype=bool)
        return rejects
    rules = [(f"2{chr(ord('a') + i)} {caps.label} rule", reject_pd_shapes(f"{caps.label}: {rule.reason}", refuses(rule)))
             for i, rule in enumerate(caps.pd_rules)]
    return (*ladder[:2], *rules, *ladder[2:])


def run_funnel(problem: Problem, *, progress: Progress | None = None, keep: int = 2000, clock: Clock = no_clock,
               ladder: Sequence[tuple[str, Stage]] | None = None, exhaustive: bool = False) -> FunnelResult:
    """Run the ladder (stages 1–5, by default with the engine release's rules: `engine_ladder`); return the counts
    and up to `keep` survivors, best analytical proxy first.

    `exhaustive` builds every passing PD candidate to pick the survivors instead of only those that can
    make the cut; the result is the same (tests check it), only slower and bounded by chunks, not by size."""
    if problem.workload.arrival_rate_rps is None:
        raise ValueError("run_funnel needs an open-loop workload (arrival_rate_rps)")
    ladder = engine_ladder(problem) if ladder is None else ladder
    t0 = clock()
    kn = knob_axes(problem)
    units = unit_table(problem)
    sieve = Sieve(problem=problem, load=load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile,
                                                    tpot_percentile=problem.slo.tpot_percentile),
                  rate_rps=float(problem.workload.arrival_rate_rps), units=units, knobs=kn, replicas=None,
                  pd=pd_space(units, kn) if LayoutKind.PD in problem.search.layouts else None, keep=keep, exhaustive=exhaustive)
    n_units = len(units.count)
    total = (n_units * kn.combinations if sieve.do_replicas else 0) + (n_units * n_units * kn.combinations if sieve.pd is not None else 0)
    stages: list[FunnelStage] = []
    entering = total
    for i, (name, stage) in enumerate(ladder):
        sieve, tally = stage(sieve)
        now = clock()
        stages.append(FunnelStage(name, tally.admitted, entering - tally.admitted, now - t0, dict(tally.reasons)))
        t0 = now
        entering = tally.admitted
        if progress:
            progress(name, (i + 1) / len(ladder))
    result = FunnelResult(stages=stages, candidates_total=total, survivors=list(sieve.survivors), survivors_total=sieve.survivors_total)
    if not result.survivors:
        result.last_stage = next((st.stage for st in stages if st.admitted == 0), stages[-1].stage)
        result.closest_miss, result.closest = _closest_miss(sieve, result.last_stage)
        stages[-1] = replace(stages[-1], seconds=stages[-1].seconds + clock() - t0)
    return result


# ---------------------------------------------------------------- picking survivors
@dataclass(frozen=True, slots=True)
class _Picks:
    """Candidate rows that may become survivors, with their order and dedup keys (kind 0: replicas, 1: PD)."""

    kind: IntArray
    ident: IntArray          # [n, 6]: replica row, or (prefill unit, decode unit, b, q, f, k)
    per_gpu: FloatArray
    gpus: IntArray
    tiebreak: IntArray
    structure: IntArray
    knob: IntArray
    figures: FloatArray      # [n, 5]: ttft, tpot, tpot mean, capacity, pool

    def take(self, idx: IntArray) -> _Picks:
        return _Picks(self.kind[idx], self.ident[idx], self.per_gpu[idx], self.gpus[idx], self.tiebreak[idx], self.structure[idx],
                      self.knob[idx], self.figures[idx])

    @staticmethod
    def concat(parts: Sequence[_Picks]) -> _Picks:
        return _Picks(*(np.concatenate([getattr(p, f) for p in parts]) for f in _Picks.__dataclass_fields__))


def _round_sig(x: FloatArray, digits: int = 9) -> FloatArray:
    """Round to `digits` significant figures (ties between copies of one structure survive float noise)."""
    mag = np.floor(np.log10(np.maximum(np.abs(x), 1e-300)))
    scale = 10.0 ** (digits - 1 - mag)
    return np.asarray(np.round(x * scale) / scale, dtype=np.float64)


def _knob_ids(kn: KnobAxes, b: IntArray, q: IntArray, f: IntArray, k: IntArray) -> IntArray:
    """One integer per distinct (token budget, max seqs, memory fraction, KV dtype), below kn.combinations."""
    bu, qu, fu = kn.distinct()
    return ((bu[b] * len(kn.max_num_seqs) + qu[q]) * len(kn.memory_fraction) + fu[f]) * len(kn.kv_dtypes) + k


def _replica_picks(s: Sieve, *, min_per_gpu: float = 0.0) -> _Picks:
    """The replica rows that may become survivors: of each instance shape and knobs, the fewest instances that pass
    stage 5 (`_select` keeps one row per structure and knobs, fewest GPUs first; rows run count-major, so the first
    passing row of a (shape, knobs) is its fewest instances), with at least `min_per_gpu` raw capacity per GPU."""
    r = s.replicas
    if r is None or not (r.first <= r.n_max).any():
        return _empty_picks()
    g = np.flatnonzero(r.first <= r.n_max)
    rows = r.row(g, r.first[g], units=s.units, knobs=s.knobs)
    by_row = np.argsort(rows, kind="stable")
    g, rows = g[by_row], rows[by_row]
    knob = _knob_ids(s.knobs, r.b[g], r.q[g], r.f[g], r.k[g])
    _, first = np.unique(r.shape[g] * s.knobs.combinations + knob, return_index=True)
    g, rows = g[np.sort(first)], rows[np.sort(first)]
    gpus = s.units.shape_gpus[r.shape[g]] * r.first[g]
    per_gpu = _round_sig(r.capacity_rps[g] / np.maximum(gpus, 1))
    if min_per_gpu > 0:
        keep = per_gpu >= min_per_gpu
        g, rows, gpus, per_gpu = g[keep], rows[keep], gpus[keep], per_gpu[keep]
    ident = np.zeros((len(g), 6), dtype=np.int64)
    ident[:, 0] = rows
    figs = np.stack([r.ttft_s[g], r.tpot_s[g], r.tpot_mean_s[g], r.capacity_rps[g], r.pool_tokens[g]], axis=1)
    return _Picks(np.zeros(len(g), dtype=np.int64), ident, per_gpu, gpus, rows,
                  -1 - r.shape[g], _knob_ids(s.knobs, r.b[g], r.q[g], r.f[g], r.k[g]), figs)


def _pd_picks(s: Sieve, c: PdCandidates, last: _Picks | None = None, *, min_per_gpu: float = 0.0) -> _Picks:
    """The rows of a PD chunk that pass stage 5 with a capacity per GPU of at least `min_per_gpu`, as picks; with
    `last` (the worst of `keep` picks so far, in the fewest-GPUs order), only rows that sort before it (the others
    can never enter the first `keep`: every pick ahead of them stays ahead)."""
    p = s.problem
    rate = s.rate_rps
    ok = (np.isfinite(c.ttft_s) & np.isfinite(c.tpot_s) & (c.capacity_rps > rate)
          & meets_slo_and_load(p.slo, ttft_s=c.ttft_s, tpot_s=c.tpot_s, rate_rps=rate, capacity_rps=c.capacity_rps))
    per_gpu = _round_sig(c.capacity_rps / np.maximum(c.gpus, 1))
    if min_per_gpu > 0:
        ok &= per_gpu >= min_per_gpu
    if last is not None and ok.any():
        # PD rows follow replica rows on a tie of both keys, and among PD rows the enumeration order decides:
        # keep ties on both keys (the exact order is settled by _select).
        ok &= (c.gpus < last.gpus[0]) | ((c.gpus == last.gpus[0]) & (per_gpu >= last.per_gpu[0]))
    if not ok.any():
        return _empty_picks()
    i = np.flatnonzero(ok)
    u, kn = s.units, s.knobs
    up, ud = c.prefill_unit[i], c.decode_unit[i]
    nb, nq, nf, nk = len(kn.max_num_batched_tokens), len(kn.max_num_seqs), len(kn.memory_fraction), len(kn.kv_dtypes)
    n_units = len(u.count)
    tiebreak = ((((up * n_units + ud) * nb + c.b[i]) * nq + c.q[i]) * nf + c.f[i]) * nk + c.k[i]
    a, b = c.reduced_ratio()
    span = p.max_gpus + 1
    n_shapes = len(u.shape_tp)
    structure = ((u.shape[up] * n_shapes + u.shape[ud]) * span + a[i]) * span + b[i]
    ident = np.stack([up, ud, c.b[i], c.q[i], c.f[i], c.k[i]], axis=1)
    figs = np.stack([c.ttft_s[i], c.tpot_s[i], c.tpot_mean_s[i], c.capacity_rps[i], c.pool_tokens[i]], axis=1)
    return _Picks(np.ones(len(i), dtype=np.int64), ident, per_gpu[i], c.gpus[i], tiebreak, structure,
                  _knob_ids(kn, c.b[i], c.q[i], c.f[i], c.k[i]), figs)


def _empty_picks() -> _Picks:
    z = np.zeros(0, dtype=np.int64)
    return _Picks(z, np.zeros((0, 6), dtype=np.int64), np.zeros(0), z, z, z, z, np.zeros((0, 5)))


def _select(picks: _Picks, *, keep: int, knob_span: int, per_structure: int = PER_STRUCTURE) -> _Picks:
    """In the fewest-GPUs order (fewer GPUs, then the higher capacity per GPU, then replicas before PD, then
    enumeration order), the first row of each distinct (structure, knobs), at most `per_structure` knob variants per
    structure, at most `keep` rows: diverse input for the refinement."""
    if not len(picks.kind):
        return picks
    order = np.lexsort((picks.tiebreak, picks.kind, -picks.per_gpu, picks.gpus))
    # Replica structures are negative, PD ones non-negative; knob ids stay below `knob_span`. Keys are gathered,
    # the rows taken once at the end.
    structure = picks.structure[order]
    _, first = np.unique(structure * knob_span + picks.knob[order], return_index=True)
    first.sort()
    order, structure = order[first], structure[first]
    _, group = np.unique(structure, return_inverse=True)
    group = group.ravel()
    by_group = np.argsort(group, kind="stable")
    sorted_group = group[by_group]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_group)) + 1]
    rank = np.empty(len(group), dtype=np.int64)
    rank[by_group] = np.arange(len(group)) - np.repeat(starts, np.diff(np.r_[starts, len(group)]))
    return picks.take(order[np.flatnonzero(rank < per_structure)[:keep]])


def _pick(s: Sieve, *, keep: int) -> tuple[Survivor, ...]:
    """Up to `keep` survivors for `decide`, fewest GPUs first, exactly as if every passing candidate were listed
    and `_select`ed.

    Why fewest GPUs first, for both objectives: `decide` ranks by the objective and gives a tie (goodput per GPU
    within RANK_TOLERANCE of the best) to fewer GPUs, so the layouts it can choose are the smallest ones near the
    best score. Survivors used to be the `keep` highest by raw capacity per GPU, a proxy with no tie: finer P:D
    ratios, which need more GPUs, always edge it up, and their number grows as the budget squared, so at large
    budgets they filled every place and the layouts the objective prefers never reached `decide` (a larger
    budget chose a worse layout). In this order a larger budget only appends larger layouts after the same ones.

    Goodput per GPU picks twice: the first `keep` candidates give the best goodput per GPU among them (B, the
    objective itself: predict.slo_capacity_rps with the stage-5 margins, as `decide` refines it); candidates whose
    raw capacity per GPU × LOAD_MARGIN (an upper bound of their goodput per GPU) is under (1 − RANK_TOLERANCE)·B
    can never tie with the best, so the second pass leaves them out and reaches further up in GPUs.
    PD candidates are built only up to γ GPUs (γ = 8, 16, 32, … the budget) until `keep` picks lie within γ."""
    p = s.problem
    chosen = _fewest_gpus(s, keep=keep, min_per_gpu=0.0)
    built: dict[tuple[int, ...], Layout] = {}
    parts = RoleParts()
    if p.objective is not Objective.MIN_GPUS and len(chosen.kind):
        # TieFloorToTheBest: the pass above the floor can reach a layout better than B (further up in GPUs), which
        # raises the floor; repeated until B holds (B only grows: the best so far stays among the first picks).
        found = 0.0
        for _ in range(TIE_FLOOR_PASSES):
            layouts = _layouts_of(s, chosen, built, parts)
            best = float(np.max(slo_capacity_rps(p, layouts, margin=SLO_MARGIN, load_margin=LOAD_MARGIN) / chosen.gpus))
            if best <= found:
                break
            found = best
            floor = _round_sig(np.array([(1.0 - RANK_TOLERANCE) * best / LOAD_MARGIN * (1.0 - TIE_SLACK)]))[0]
            if floor <= 0:
                break
            chosen = _fewest_gpus(s, keep=keep, min_per_gpu=float(floor))
    out = []
    for lay, (ttft, tpot, tpm, cap, pool) in zip(_layouts_of(s, chosen, built, parts), chosen.figures.tolist(), strict=True):
        out.append(Survivor(lay, float(ttft), float(tpot), float(tpm), float(cap), int(pool)))
    return tuple(out)


def _fewest_gpus(s: Sieve, *, keep: int, min_per_gpu: float) -> _Picks:
    """The first `keep` picks in the fewest-GPUs order among candidates of at least `min_per_gpu` raw capacity per GPU."""
    p = s.problem
    reps = _replica_picks(s, min_per_gpu=min_per_gpu)
    span = s.knobs.combinations
    pd = s.pd
    if pd is None:
        return _select(reps, keep=keep, knob_span=span)
    levels = [p.max_gpus] if s.exhaustive else sorted({min(p.max_gpus, 8 << i) for i in range(max(1, p.max_gpus.bit_length()))})
    # Replica and PD structures never coincide, so the replicas' own first `keep` are all they can add (and a budget's
    # worth of replica rows is not sorted again at every γ).
    reps = _select(reps, keep=keep, knob_span=span)
    chosen = reps
    for gamma in levels:
        chosen = reps
        for chunk in pd.pairs(pd.p_alive, pd.d_alive, min_per_gpu=min_per_gpu, max_gpus=gamma):
            last = chosen.take(np.array([len(chosen.kind) - 1])) if len(chosen.kind) >= keep else None
            chosen = _select(_Picks.concat([chosen, _pd_picks(s, chunk, last, min_per_gpu=min_per_gpu)]), keep=keep, knob_span=span)
        # Picks within γ are exact (every PD candidate of γ GPUs or fewer was listed); enough of them end the search.
        if gamma >= p.max_gpus or int((chosen.gpus <= gamma).sum()) >= keep:
            break
    return chosen


def _layouts_of(s: Sieve, picks: _Picks, built: dict[tuple[int, ...], Layout], parts: RoleParts) -> list[Layout]:
    """The layout each pick stands for, in order; `built` (by kind and ident) holds those made before and takes the new
    ones, so the two passes of `_pick` build each layout once; `parts` shares their roles. The PD rows are gathered in
    one `candidates` call."""
    keys: list[tuple[int, ...]] = [(k, *row) for k, row in zip(picks.kind.tolist(), picks.ident.tolist(), strict=True)]
    todo = [i for i, key in enumerate(keys) if key not in built]
    pd_rows = [i for i in todo if keys[i][0] != 0]
    if pd_rows:
        assert s.pd is not None
        ident = picks.ident[np.asarray(pd_rows, dtype=np.int64)]
        cands = s.pd.candidates(*(ident[:, j] for j in range(6)))
        for j, i in enumerate(pd_rows):
            built[keys[i]] = cands.layout(j, units=s.units, knobs=s.knobs, problem=s.problem, parts=parts)
    for i in todo:
        if keys[i][0] == 0:
            assert s.replicas is not None
            built[keys[i]] = s.replicas.layout(keys[i][1], units=s.units, knobs=s.knobs, problem=s.problem, parts=parts)
    return [built[key] for key in keys]


# ---------------------------------------------------------------- the closest miss
def _closest_miss(s: Sieve, stage: str) -> tuple[str, tuple[Miss, ...]]:
    """The candidate nearest to passing stage 5 among those that passed stage 3 (how far short, in %), and up to
    CLOSEST_KEPT of the nearest, nearest first (one per structure)."""
    p, rate = s.problem, s.rate_rps
    slo_t, slo_p = p.slo.ttft_ms / 1e3, p.slo.tpot_ms / 1e3
    best: tuple[float, int, int] | None = None   # (miss, kind, tiebreak)
    best_layout: tuple[Layout, float, float, float] | None = None
    near: list[tuple[float, int, int, Miss]] = []

    def consider(miss: FloatArray, kind: int, tiebreak: IntArray, make: Callable[[int], tuple[Layout, float, float, float]]) -> None:
        nonlocal best, best_layout
        finite = np.isfinite(miss)
        if not finite.any():
            return
        m = np.where(finite, miss, np.inf)
        order = np.lexsort((tiebreak, m))
        j = int(order[0])
        cand = (float(m[j]), kind, int(tiebreak[j]))
        if best is None or cand < best:
            best, best_layout = cand, make(j)
        for k in order[: CLOSEST_KEPT * PER_STRUCTURE]:
            if not np.isfinite(m[k]) or (len(near) >= CLOSEST_KEPT * PER_STRUCTURE and (float(m[k]), kind, int(tiebreak[k])) >= near[-1][:3]):
                break
            layout, ttft, tpot, cap = make(int(k))
            near.append((float(m[k]), kind, int(tiebreak[k]), Miss(layout, ttft, tpot, cap, float(m[k]))))
            near.sort(key=lambda e: e[:3])
            del near[CLOSEST_KEPT * PER_STRUCTURE:]

    def miss_of(ttft: FloatArray, tpot: FloatArray, cap: FloatArray) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(np.maximum.reduce([ttft * SLO_MARGIN / slo_t, tpot * SLO_MARGIN / slo_p, rate / np.maximum(LOAD_MARGIN * cap, 1e-12)]))

    r = s.replicas
    if r is not None and stage[0] in "45":
        # Nothing survived: every count of the groups stage 3 kept is estimated here, as a listed row would have been.
        kept = np.flatnonzero(r.estimated)
        group = np.repeat(kept, r.n_max[kept])
        count = np.arange(len(group), dtype=np.int64) - np.repeat(np.cumsum(r.n_max[kept]) - r.n_max[kept], r.n_max[kept]) + 1
        e = _estimate_groups(s, r, group, count)
        rows = r.row(group, count, units=s.units, knobs=s.knobs)
        fin = np.flatnonzero(np.isfinite(e.capacity_rps) | np.isfinite(e.ttft_s))
        if len(fin):
            rt, rp, rc, ri = e.ttft_s[fin], e.tpot_s[fin], e.capacity_rps[fin], rows[fin]
            consider(miss_of(rt, rp, rc), 0, ri,
                     lambda j: (r.layout(int(ri[j]), units=s.units, knobs=s.knobs, problem=p), float(rt[j]), float(rp[j]), float(rc[j])))
    pd = s.pd
    if pd is not None and stage[0] in "45":
        u, kn = s.units, s.knobs
        nb, nq, nf, nk = len(kn.max_num_batched_tokens), len(kn.max_num_seqs), len(kn.memory_fraction), len(kn.kv_dtypes)
        p_rows, d_rows = pd.p_memory_ok, pd.d_memory_ok
        if best is not None:
            # Bounds from one side each (the other side's TTFT share is ≥ 0, min(capacities) ≤ either): rows
            # whose bound already exceeds the best replica miss cannot hold a closer PD candidate.
            tr_min = float(pd.transfer_s.min())
            with np.errstate(divide="ignore", invalid="ignore"):
                lb_p = np.maximum(((pd.p_ttft_s + tr_min) + pd.front_end_s) * SLO_MARGIN / slo_t,
                                  rate / np.maximum(LOAD_MARGIN * pd.p_capacity_rps, 1e-12))
                lb_d = np.maximum.reduce([((pd.d_ttft_s + tr_min) + pd.front_end_s) * SLO_MARGIN / slo_t, pd.d_tpot_s * SLO_MARGIN / slo_p,
                                          rate / np.maximum(LOAD_MARGIN * pd.d_capacity_rps, 1e-12)])
            p_rows, d_rows = p_rows & ~(lb_p > best[0]), d_rows & ~(lb_d > best[0])
        for c in pd.pairs(p_rows, d_rows, min_per_gpu=0.0, max_gpus=p.max_gpus):
            tb = ((((c.prefill_unit * len(u.count) + c.decode_unit) * nb + c.b) * nq + c.q) * nf + c.f) * nk + c.k
            def make(j: int, c: PdCandidates = c) -> tuple[Layout, float, float, float]:
                return c.layout(j, units=u, knobs=kn, problem=p), float(c.ttft_s[j]), float(c.tpot_s[j]), float(c.capacity_rps[j])

            consider(miss_of(c.ttft_s, c.tpot_s, c.capacity_rps), 1, tb, make)
    if best is not None and best_layout is not None:
        layout, ttft, tpot, cap = best_layout
        return miss_text(p, label=layout.label_for(p.engine), gpus=layout.gpus, ttft_s=ttft, tpot_s=tpot, capacity_rps=cap), _one_per_structure(near)
    m, g = p.model, p.gpu
    if stage.startswith("1") or stage.startswith("2"):
        return f"the smallest valid instance needs more than the {p.max_gpus}-GPU budget or does not fit a {g.gpus_per_node}-GPU node", ()
    return f"no layout within {p.max_gpus} × {g.id} holds {m.name}'s weights plus the longest request's KV", ()


def _one_per_structure(near: list[tuple[float, int, int, Miss]]) -> tuple[Miss, ...]:
    """The nearest misses, the first knob variant of each structure, at most CLOSEST_KEPT."""
    out: list[Miss] = []
    seen: set[str] = set()
    for *_, m in near:
        if m.layout.structure not in seen:
            seen.add(m.layout.structure)
            out.append(m)
    return tuple(out[:CLOSEST_KEPT])
