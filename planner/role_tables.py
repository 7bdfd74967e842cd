"""The funnel's role tables: per-role candidate rows for replicas and for PD pairs, with their KV pools,
memory checks and analytical estimates computed once per distinct role configuration.

Called by planner.funnel (stages 3–4); it owns no stage logic of its own and counts rejections only into
the reasons dictionary it is handed. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .analytic import LoadShape, estimate_aggregated, estimate_decode, estimate_prefill
from .layout import KvDtype
from .memory import kv_pool_bytes, pool_tokens_from_bytes
from .perf import kv_transfer_s
from .problem import Problem

__all__ = ["Units", "AggTable", "PdTables", "add_reason", "agg_table", "agg_by_kv", "pd_tables"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Units:
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


def add_reason(reasons: dict[str, int], key: str, n: float) -> None:
    if n > 0:
        reasons[key] = reasons.get(key, 0) + int(n)


@dataclass(frozen=True, slots=True)
class AggTable:
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
    # Sliding-window KV and fixed state per running sequence come out of the pool first (memory.pool_tokens_from_bytes).
    return pool_tokens_from_bytes(problem.model, np.maximum(pool, 0.0), kv, tp=tp, pp=pp, max_num_seqs=mns, max_num_batched_tokens=mnbt)


def _memory_reasons(problem: Problem, pool: Any, longest: float, mnbt: Any, mns: Any, reasons: dict[str, int], weight: Any = 1) -> Any:
    no_room = pool <= 0
    short = (~no_room) & (pool < longest)
    budget = (~no_room) & (~short) & (mnbt < mns) & (problem.engine.value == "vllm")
    add_reason(reasons, "weights and activations leave no KV pool", float(np.sum(no_room * weight)))
    add_reason(reasons, "KV pool shorter than the longest request", float(np.sum(short * weight)))
    add_reason(reasons, "max_num_batched_tokens below max_num_seqs (vLLM refuses)", float(np.sum(budget * weight)))
    return ~(no_room | short | budget)


def agg_table(problem: Problem, units: Units, rows: IntArray, mnbt: Any, mns: Any, mem: Any, longest: float,
               reasons: dict[str, int]) -> AggTable:
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
    return AggTable(tp, pp, dp, units.count[u], b, q, f, k, pool, ok, units.gpus[u], len(kvs) > 1)


def agg_by_kv(problem: Problem, agg: AggTable, idx: IntArray, shape: LoadShape, rate: float, kvs: tuple[KvDtype, ...]) -> tuple[Any, Any, Any, Any]:
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


@dataclass(slots=True)
class PdTables:
    """Role tables for PD: prefill rows over (unit, token budget, kv), decode rows over (unit, max seqs, memory, kv)."""

    units: Units
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


def pd_tables(problem: Problem, units: Units, pairs_p: IntArray, pairs_d: IntArray, mnbt: Any, mns: Any, mem: Any,
               shape: LoadShape, longest: float, reasons: dict[str, int]) -> PdTables:
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
    add_reason(reasons, "weights and activations leave no KV pool", no_pool)
    add_reason(reasons, "KV pool shorter than the longest request", total - n_ok - no_pool)
    transfer = np.zeros((nk, 2))
    for ki, kv in enumerate(kvs):
        for same in (0, 1):
            transfer[ki, same] = kv_transfer_s(problem.model, problem.gpu, kv_dtype=kv, tokens=shape.input_tokens, same_node=bool(same))
    return PdTables(units, pairs_p, pairs_d, mnbt, mns, mem, p_ok, d_ok, p_pool, d_pool, n_ok, transfer)
