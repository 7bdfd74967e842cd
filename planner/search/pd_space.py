"""PD candidates without building them: role rows, the pairs between them, counted and enumerated.

A PD candidate is a prefill row (unit, token budget b, KV dtype k) paired with a decode row (unit, max seqs
q, memory fraction f, same k) whose GPUs fit the budget. They grow as the budget squared (1.5 billion at
1,024 GPUs on the wide preset), so the funnel never lists them: stages count them by prefix sums over
instance counts (units of one shape are ordered by count), stage 5 counts the pairs meeting the TTFT SLO
by a sweep over decode GPUs with sorted thresholds, and only pairs that can still be selected are built,
streamed in bounded chunks. Called by planner.search.funnel; pure numpy, no stage order of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from servingtopology.planner.engines.role_knobs import decode_max_num_batched_tokens, prefill_max_num_seqs
from servingtopology.planner.layout import Role
from servingtopology.planner.perf.analytic import LoadShape, estimate_decode, estimate_prefill
from servingtopology.planner.perf.memory import kv_pool_bytes, pool_tokens_from_bytes
from servingtopology.planner.perf.memory_fit import longest_of, shortfall, tokens_to_hold
from servingtopology.planner.perf.step import kv_transfer_s
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.pd_ratio import balanced_per_gpu
from servingtopology.planner.search.tables import BoolArray, FloatArray, IntArray, KnobAxes, PdCandidates, UnitTable

__all__ = ["PdSpace", "pd_space", "pool_tokens", "CHUNK_ROWS"]

CHUNK_ROWS = 1 << 18      # PD rows built at once (about 30 MB of arrays)
_RECENT_ROWS = 4096       # rows _dominance keeps apart from its merged sorted array
_WEDGE_SLACK = 1e-6       # relative slack on the selection bound (float noise and 9-digit rounding are far below)

Pred = Callable[[FloatArray, FloatArray], BoolArray]


def pool_tokens(problem: Problem, kv: object, tp: object, pp: object, dp: object, mnbt: object, mns: object, mem: object) -> FloatArray:
    """KV tokens one attention-DP rank holds (0 when weights and activations leave nothing)."""
    pool = kv_pool_bytes(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision, tp=tp, pp=pp, dp=dp,
                         max_num_batched_tokens=mnbt, max_num_seqs=mns, memory_fraction=mem)
    # Sliding-window KV and fixed state per running sequence come out of the pool first (memory.pool_tokens_from_bytes).
    tokens = pool_tokens_from_bytes(problem.model, np.maximum(pool, 0.0), kv, tp=tp, pp=pp, max_num_seqs=mns,  # type: ignore[arg-type]
                                    max_num_batched_tokens=mnbt, engine=problem.engine)
    return np.asarray(tokens, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class PdSpace:
    """Prefill rows on the grid [unit, b, k] and decode rows on [unit, q, f, k], with what the stages decided.

    `allowed[sp, sd]` says whether a prefill shape may pair with a decode shape (shape arithmetic and any
    engine rule stage); `budget_gpus` bounds a pair's GPUs once stage 2 ran; `p_alive`/`d_alive` are the
    rows still standing; `p_memory_ok`/`d_memory_ok` what stage 3 kept (stage 5's closest miss looks there).
    Estimates are NaN until stage 4.
    """

    units: UnitTable
    knobs: KnobAxes
    allowed: BoolArray
    budget_gpus: int | None
    p_alive: BoolArray
    d_alive: BoolArray
    p_memory_ok: BoolArray
    d_memory_ok: BoolArray
    p_pool: FloatArray
    d_pool: FloatArray
    p_ttft_s: FloatArray
    p_capacity_rps: FloatArray
    d_ttft_s: FloatArray
    d_tpot_s: FloatArray
    d_tpot_mean_s: FloatArray
    d_capacity_rps: FloatArray
    transfer_s: FloatArray    # [k, same node]
    gpus_per_node: int = 8
    front_end_s: float = 0.0  # what a client's TTFT adds to the engines' (predict.front_end_s), set at stage 4

    # ------------------------------------------------------------ counting
    def count(self, p_mask: BoolArray | None = None, d_mask: BoolArray | None = None, allowed: BoolArray | None = None) -> int:
        """Candidates whose prefill row is in `p_mask`, decode row in `d_mask`, shapes `allowed`, within the budget."""
        p_mask = self.p_alive if p_mask is None else p_mask
        d_mask = self.d_alive if d_mask is None else d_mask
        allowed = self.allowed if allowed is None else allowed
        u = self.units
        wp = p_mask.sum(axis=1)                 # [unit, k]
        wd = d_mask.sum(axis=(1, 2))            # [unit, k]
        gp = u.gpus
        total = 0
        for sd in range(len(u.shape_tp)):
            lo, hi = int(u.shape_start[sd]), int(u.shape_start[sd + 1])
            rows = allowed[u.shape, sd]
            if not rows.any():
                continue
            cum = np.concatenate([np.zeros((1, wd.shape[1]), dtype=np.int64), np.cumsum(wd[lo:hi], axis=0)])
            if self.budget_gpus is None:
                n = np.full(int(rows.sum()), hi - lo)
            else:
                n = np.clip((self.budget_gpus - gp[rows]) // int(u.shape_gpus[sd]), 0, hi - lo)
            total += int((wp[rows] * cum[n]).sum())
        return total

    def count_ttft_ok(self, p_mask: BoolArray, d_mask: BoolArray, *, front_end_s: float, slo_s: float, margin: float,
                      gpus_per_node: int) -> int:
        """Candidates (as `count`) whose client TTFT × margin stays within `slo_s`: prefill + KV transfer
        (NVLink when the pair fits one node, else the NIC) + first decode step + front end."""
        assert self.budget_gpus is not None
        u = self.units
        cols, cls = np.unique(self.allowed.T, axis=0, return_inverse=True)
        cls = cls.ravel()
        total = 0
        for ki in range(len(self.knobs.kv_dtypes)):
            pu, pb = np.nonzero(p_mask[:, :, ki])
            du, dq, df = np.nonzero(d_mask[:, :, :, ki])
            x, gp, sp = self.p_ttft_s[pu, pb, ki], u.gpus[pu], u.shape[pu]
            y, gd, sd = self.d_ttft_s[du, dq, df, ki], u.gpus[du], u.shape[du]

            def passes(tr: float) -> Pred:
                return lambda xv, yv: (((xv + tr) + yv) + front_end_s) * margin <= slo_s

            cross, same = self.transfer_s[ki, 0], self.transfer_s[ki, 1]
            small = min(self.budget_gpus, gpus_per_node)
            for c in range(len(cols)):
                ps, ds = cols[c][sp], cls[sd] == c
                if not ps.any() or not ds.any():
                    continue
                X, GP, Y, GD = x[ps], gp[ps], y[ds], gd[ds]
                total += _dominance(X, GP, Y, GD, self.budget_gpus, passes(cross))
                near_p, near_d = small > GP, small > GD
                if near_p.any() and near_d.any():  # pairs inside one node move the KV over NVLink instead
                    args = (X[near_p], GP[near_p], Y[near_d], GD[near_d], small)
                    total += _dominance(*args, passes(same)) - _dominance(*args, passes(cross))
        return total

    # ------------------------------------------------------------ building rows
    def pairs(self, p_mask: BoolArray, d_mask: BoolArray, *, min_per_gpu: float, max_gpus: int) -> Iterator[PdCandidates]:
        """Every candidate of the masks within `max_gpus` GPUs whose capacity per GPU can reach `min_per_gpu`
        (0: all of them), in chunks of at most about CHUNK_ROWS rows.

        Capacities are linear in instance counts (per-instance capacity × count), so a role pair's capacity
        per GPU at counts (cp, cd) is min(cp·μp, cd·μd) / (cp·gp + cd·gd): at least `min_per_gpu` only inside
        a wedge of cp/cd, and never above the balanced bound (pd_ratio.balanced_per_gpu). Role pairs whose
        bound is lower are skipped whole; the rest contribute only their wedge.
        """
        u = self.units
        starts = u.shape_start[:-1]
        n_units = np.diff(u.shape_start)
        g = u.shape_gpus
        p_role = np.logical_or.reduceat(p_mask, starts, axis=0)          # [shape, b, k]
        d_role = np.logical_or.reduceat(d_mask, starts, axis=0)          # [shape, q, f, k]
        mu_p = np.nan_to_num(self.p_capacity_rps[starts] / u.count[starts, None, None], nan=0.0, posinf=0.0)
        mu_d = np.nan_to_num(self.d_capacity_rps[starts] / u.count[starts, None, None, None], nan=0.0, posinf=0.0)
        tau = min_per_gpu * (1.0 - _WEDGE_SLACK)
        for ki in range(len(self.knobs.kv_dtypes)):
            sp_, b_ = np.nonzero(p_role[:, :, ki])
            sd_, q_, f_ = np.nonzero(d_role[:, :, :, ki])
            if not len(sp_) or not len(sd_):
                continue
            i, j = (a.ravel() for a in np.meshgrid(np.arange(len(sp_)), np.arange(len(sd_)), indexing="ij"))
            sp, b, sd, q, f = sp_[i], b_[i], sd_[j], q_[j], f_[j]
            mp: FloatArray = np.asarray(mu_p[sp, b, ki], dtype=np.float64)
            md: FloatArray = np.asarray(mu_d[sd, q, f, ki], dtype=np.float64)
            keep = self.allowed[sp, sd] & (g[sp] + g[sd] <= max_gpus)
            if tau > 0:
                keep &= balanced_per_gpu(mp, g[sp], md, g[sd]) >= tau
            sp, b, sd, q, f = (a[keep] for a in (sp, b, sd, q, f))
            mp, md = mp[keep], md[keep]
            n_cd = np.minimum(n_units[sd], (max_gpus - g[sp]) // g[sd])
            ends = np.cumsum(n_cd)
            first = 0
            while first < len(n_cd):  # role pairs in slices of about CHUNK_ROWS decode counts
                last = int(np.searchsorted(ends, (ends[first - 1] if first else 0) + CHUNK_ROWS, side="right"))
                last = max(last, first + 1)
                sl = slice(first, last)
                yield from self._wedge(sp[sl], b[sl], sd[sl], q[sl], f[sl], mp[sl], md[sl], n_cd[sl], ki, tau, max_gpus, p_mask, d_mask)
                first = last

    def _wedge(self, sp: IntArray, b: IntArray, sd: IntArray, q: IntArray, f: IntArray, mp: FloatArray, md: FloatArray, n_cd: IntArray,
               ki: int, tau: float, max_gpus: int, p_mask: BoolArray, d_mask: BoolArray) -> Iterator[PdCandidates]:
        u = self.units
        g, n_units = u.shape_gpus, np.diff(u.shape_start)
        r = np.repeat(np.arange(len(sp)), n_cd)
        cd = (np.arange(len(r)) - np.repeat(np.cumsum(n_cd) - n_cd, n_cd) + 1).astype(np.int64)
        gp1, gd1 = g[sp][r], g[sd][r]
        cp_hi = np.minimum(n_units[sp][r], (max_gpus - cd * gd1) // gp1)
        cp_lo = np.ones(len(r), dtype=np.int64)
        if tau > 0:
            with np.errstate(divide="ignore", invalid="ignore"):
                lo = tau * gd1 * cd / (mp[r] - tau * gp1)
                hi = (md[r] - tau * gd1) * cd / (tau * gp1)
            cp_lo = np.maximum(cp_lo, np.ceil(np.nan_to_num(lo * (1.0 - _WEDGE_SLACK), nan=np.inf, posinf=np.inf)).astype(np.int64))
            cp_hi = np.minimum(cp_hi, np.floor(np.clip(np.nan_to_num(hi * (1.0 + _WEDGE_SLACK), nan=-1.0), -1.0, 1e12)).astype(np.int64))
        width = np.maximum(cp_hi - cp_lo + 1, 0)
        ends = np.cumsum(width)
        first = 0
        while first < len(width):
            last = max(int(np.searchsorted(ends, (ends[first - 1] if first else 0) + CHUNK_ROWS, side="right")), first + 1)
            w = width[first:last]
            e = np.repeat(np.arange(first, last), w)
            if len(e):
                cp = cp_lo[e] + (np.arange(len(e)) - np.repeat(np.cumsum(w) - w, w))
                rr = r[e]
                up = u.shape_start[sp[rr]] + cp - 1
                ud = u.shape_start[sd[rr]] + cd[e] - 1
                bb, qq, ff = b[rr], q[rr], f[rr]
                kk = np.full(len(e), ki, dtype=np.int64)
                alive = p_mask[up, bb, kk] & d_mask[ud, qq, ff, kk]
                if alive.any():
                    yield self.candidates(up[alive], ud[alive], bb[alive], qq[alive], ff[alive], kk[alive])
            first = last

    def candidates(self, up: IntArray, ud: IntArray, b: IntArray, q: IntArray, f: IntArray, k: IntArray, *,
                   front_end_s: float | None = None) -> PdCandidates:
        """The rows for these indices, with their figures (client TTFT includes `front_end_s` once stage 4 set it)."""
        u = self.units
        gpus = u.shape_gpus[u.shape[up]] * u.count[up] + u.shape_gpus[u.shape[ud]] * u.count[ud]   # u.gpus of every unit is not needed
        same = (gpus <= self.gpus_per_node).astype(np.int64)
        ttft = self.p_ttft_s[up, b, k] + self.transfer_s[k, same] + self.d_ttft_s[ud, q, f, k]
        fe = self.front_end_s if front_end_s is None else front_end_s
        return PdCandidates(prefill_unit=up, decode_unit=ud, b=b, q=q, f=f, k=k, prefill_count=u.count[up], decode_count=u.count[ud],
                            gpus=gpus, pool_tokens=self.d_pool[ud, q, f, k], ttft_s=ttft + fe,
                            tpot_s=self.d_tpot_s[ud, q, f, k], tpot_mean_s=self.d_tpot_mean_s[ud, q, f, k],
                            capacity_rps=np.minimum(self.p_capacity_rps[up, b, k], self.d_capacity_rps[ud, q, f, k]))

    # ------------------------------------------------------------ stage updates
    def with_memory(self, problem: Problem) -> PdSpace:
        """Pools per row; a prefill row must hold the longest prompt, a decode row the longest request (the one memory
        test, planner.perf.memory_fit, as a pinned layout meets it)."""
        u, kn = self.units, self.knobs
        n_units = len(u.count)
        nb, nq, nf, nk = len(kn.max_num_batched_tokens), len(kn.max_num_seqs), len(kn.memory_fraction), len(kn.kv_dtypes)
        p_pool = np.zeros((n_units, nb, nk))
        d_pool = np.zeros((n_units, nq, nf, nk))
        tp, pp, dp = u.tp, u.pp, u.dp
        mem_max = float(kn.memory_fraction.max())
        for ki, kv in enumerate(kn.kv_dtypes):
            for bi, bv in enumerate(kn.max_num_batched_tokens):
                p_pool[:, bi, ki] = pool_tokens(problem, kv, tp, pp, dp, bv, prefill_max_num_seqs(bv), mem_max)
            for qi, qv in enumerate(kn.max_num_seqs):
                for fi, fv in enumerate(kn.memory_fraction):
                    d_pool[:, qi, fi, ki] = pool_tokens(problem, kv, tp, pp, dp, decode_max_num_batched_tokens(qv), qv, fv)
        longest = longest_of(problem)
        p_ok = ~np.logical_or(*shortfall(p_pool, tokens_to_hold(Role.PREFILL, longest)))
        d_ok = ~np.logical_or(*shortfall(d_pool, tokens_to_hold(Role.DECODE, longest)))
        return replace(self, p_pool=p_pool, d_pool=d_pool, p_memory_ok=self.p_alive & p_ok, d_memory_ok=self.d_alive & d_ok,
                       p_alive=self.p_alive & p_ok, d_alive=self.d_alive & d_ok)

    def with_estimates(self, problem: Problem, load: LoadShape, rate_rps: float, *, front_end_s: float) -> PdSpace:
        """Each role row's analytical figures at the load (once per row, never per pair)."""
        u, kn = self.units, self.knobs
        nb, nq, nf = len(kn.max_num_batched_tokens), len(kn.max_num_seqs), len(kn.memory_fraction)
        shape_p = self.p_pool.shape
        shape_d = self.d_pool.shape
        p_ttft, p_cap = np.full(shape_p, np.inf), np.zeros(shape_p)
        d_ttft, d_tpot, d_tpm, d_cap = (np.full(shape_d, np.inf), np.full(shape_d, np.inf), np.full(shape_d, np.inf), np.zeros(shape_d))
        used = np.flatnonzero(u.valid)
        m, gpu, pe, en = problem.model, problem.gpu, problem.precision, problem.engine
        for ki, kv in enumerate(kn.kv_dtypes):
            uu, bb = (a.ravel() for a in np.meshgrid(used, np.arange(nb), indexing="ij"))
            e = estimate_prefill(m, gpu, precision=pe, engine=en, kv=kv, shape=load, rate_rps=rate_rps, tp=u.tp[uu], pp=u.pp[uu],
                                 dp=u.dp[uu], count=u.count[uu], max_num_batched_tokens=kn.max_num_batched_tokens[bb])
            p_ttft[uu, bb, ki], p_cap[uu, bb, ki] = e.ttft_s, e.capacity_rps
            uu, qq, ff = (a.ravel() for a in np.meshgrid(used, np.arange(nq), np.arange(nf), indexing="ij"))
            e = estimate_decode(m, gpu, precision=pe, engine=en, kv=kv, shape=load, rate_rps=rate_rps, tp=u.tp[uu], pp=u.pp[uu],
                                dp=u.dp[uu], count=u.count[uu], max_num_seqs=kn.max_num_seqs[qq], pool_tokens=self.d_pool[uu, qq, ff, ki])
            d_ttft[uu, qq, ff, ki], d_tpot[uu, qq, ff, ki] = e.ttft_s, e.tpot_s
            d_tpm[uu, qq, ff, ki], d_cap[uu, qq, ff, ki] = e.tpot_mean_s, e.capacity_rps
        transfer = np.zeros((len(kn.kv_dtypes), 2))
        for ki, kv in enumerate(kn.kv_dtypes):
            for same in (0, 1):
                transfer[ki, same] = kv_transfer_s(m, gpu, kv_dtype=kv, tokens=load.input_tokens, same_node=bool(same))
        out = replace(self, p_ttft_s=p_ttft, p_capacity_rps=p_cap, d_ttft_s=d_ttft, d_tpot_s=d_tpot, d_tpot_mean_s=d_tpm,
                      d_capacity_rps=d_cap, transfer_s=transfer, gpus_per_node=problem.gpu.gpus_per_node, front_end_s=front_end_s)
        return out


def pd_space(units: UnitTable, knobs: KnobAxes) -> PdSpace:
    """Every prefill and decode row alive, every valid shape pair allowed, no budget yet."""
    n = len(units.count)
    nb, nq, nf, nk = len(knobs.max_num_batched_tokens), len(knobs.max_num_seqs), len(knobs.memory_fraction), len(knobs.kv_dtypes)
    nan_p, nan_d = np.full((n, nb, nk), np.nan), np.full((n, nq, nf, nk), np.nan)
    ones_p, ones_d = np.ones((n, nb, nk), dtype=bool), np.ones((n, nq, nf, nk), dtype=bool)
    valid = units.shape_valid
    return PdSpace(units=units, knobs=knobs, allowed=np.ones((len(valid), len(valid)), dtype=bool), budget_gpus=None,
                   p_alive=ones_p, d_alive=ones_d, p_memory_ok=ones_p, d_memory_ok=ones_d, p_pool=np.zeros((n, nb, nk)),
                   d_pool=np.zeros((n, nq, nf, nk)), p_ttft_s=nan_p, p_capacity_rps=nan_p, d_ttft_s=nan_d, d_tpot_s=nan_d,
                   d_tpot_mean_s=nan_d, d_capacity_rps=nan_d, transfer_s=np.zeros((nk, 2)))


def _dominance(x: FloatArray, gp: IntArray, y: FloatArray, gd: IntArray, budget: int, passes: Pred) -> int:
    """Pairs (i, j) with gp[i] + gd[j] ≤ budget and passes(x[i], y[j]), where `passes` never turns true as y
    grows: each i's passing y form a prefix of the sorted y (found by bisection, evaluating `passes` itself so
    the float arithmetic is the funnel's), then a sweep over decode GPUs counts them per threshold."""
    if not len(x) or not len(y):
        return 0
    ys = np.sort(y)
    lo, hi = np.full(len(x), -1), np.full(len(x), len(ys))
    while True:
        open_ = hi - lo > 1
        if not open_.any():
            break
        mid = (lo + hi) // 2
        ok = passes(x, ys[np.clip(mid, 0, len(ys) - 1)])
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid, hi)
    thr = np.where(lo >= 0, ys[np.maximum(lo, 0)], -np.inf)
    by_gpus = np.argsort(gd, kind="stable")
    gd_sorted, y_by_gpus = gd[by_gpus], y[by_gpus]
    admitted = np.searchsorted(gd_sorted, budget - gp, side="right")   # decode rows each prefill row may pair with
    order = np.argsort(admitted, kind="stable")
    admitted, thr = admitted[order], thr[order]
    bounds, first = np.unique(admitted, return_index=True)
    last = np.r_[first[1:], len(admitted)]
    # The admitted decode rows, sorted, as a large array merged rarely plus a small one the new rows go into: inserting
    # each bound's rows into one sorted array would copy it once per distinct bound (quadratic in the budget).
    merged, recent = np.zeros(0), np.zeros(0)
    taken = 0
    total = 0
    for bound, s, e in zip(bounds.tolist(), first.tolist(), last.tolist(), strict=True):
        if bound > taken:
            new = np.sort(y_by_gpus[taken:bound])
            recent = np.insert(recent, np.searchsorted(recent, new), new)
            taken = bound
            if len(recent) > _RECENT_ROWS:
                merged, recent = np.sort(np.concatenate([merged, recent]), kind="mergesort"), np.zeros(0)
        if taken:
            q = thr[s:e]
            total += int(np.searchsorted(merged, q, side="right").sum() + np.searchsorted(recent, q, side="right").sum())
    return total
