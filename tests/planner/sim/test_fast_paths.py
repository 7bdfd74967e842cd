"""The simulator's fast paths give bit-for-bit the results of the straightforward code they replaced.

SGLang's admission horizon (`SglangPolicy._steps_until_admissible`) likewise against the plain (k_max + 1) × n matrix
of outputs left and one array comparison over every k, on closed loops with a queue and a PD pair.

The references below are the plain versions (a bisection of numpy probes for a decode burst's block limit;
a mask-and-argmax per preemption victim with blocks re-derived per run; the general step finish; a decode
burst through `extra_blocks` and a separate output update). Swapping them back in must change no array of
the `SimResult` on preemption-heavy runs (vLLM, with and without prefix caching) and a prefill-heavy one.
"""

from __future__ import annotations

import numpy as np
import pytest

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import SimResult, closed_loop, simulate
from servingtopology.planner.sim import instance as instance_mod
from servingtopology.planner.sim import sglang as sglang_mod
from servingtopology.planner.sim import vllm as vllm_mod
from servingtopology.planner.sim.rank import Rank, StepOutcome
from servingtopology.planner.sim.vllm import Planned, VllmPolicy, batch_of
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

I64 = np.ndarray


def _ref_block_limited_steps(rank: Rank, slots: I64) -> int:
    out_left = rank.out_total[slots] - rank.out[slots]
    k_max = int(min(int(out_left.min()), vllm_mod.MAX_BURST_STEPS))
    free = rank.pool.free
    if k_max <= 0:
        return 0
    nkv, blk, page = rank.nkv[slots], rank.blk[slots], rank.page

    def extra(k: int) -> int:
        return int(np.maximum(-(-(nkv + k) // page) - blk, 0).sum())

    if extra(k_max) <= free:
        return k_max
    lo, hi = 0, k_max
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def _ref_schedule(self: VllmPolicy, rank: Rank, now_s: float) -> Planned:
    act = np.flatnonzero(rank.active & rank.ready)
    order = act[np.argsort(rank.order[act], kind="stable")]
    want = np.maximum(rank.target[order] - rank.nkv[order], 1)
    took = np.minimum(np.cumsum(want), self.budget)
    new = took.copy()
    new[1:] -= took[:-1]
    keep = new > 0
    slots, new = order[keep], new[keep]
    need = np.maximum(-(-(rank.nkv[slots] + new) // rank.page) - rank.blk[slots], 0)
    total = int(need.sum())
    preempted = False
    if total <= rank.pool.free:
        rank.pool.allocate(total)
        rank.blk[slots] += need
    else:
        slots, new, preempted = _ref_allocate_with_preemption(rank, slots, new, now_s)
    used = int(new.sum())
    if not preempted:
        s_add, n_add = self._admit_waiting(rank, self.budget - used, now_s)
        if s_add:
            slots = np.concatenate([slots, np.asarray(s_add, dtype=np.int64)])
            new = np.concatenate([new, np.asarray(n_add, dtype=np.int64)])
    return Planned(batch_of(rank, slots, new), slots, new)


def _ref_allocate_with_preemption(rank: Rank, slots: I64, new: I64, now_s: float) -> tuple[I64, I64, bool]:
    kept: list[I64] = []
    kept_new: list[I64] = []
    preempted = False
    i, n_slots = 0, len(slots)
    while i < n_slots:
        rest = slots[i:]
        alive = rank.active[rest]
        run = len(rest) if alive.all() else int(np.argmin(alive))
        if run == 0:
            i += 1
            continue
        cand, cand_new = rest[:run], new[i:i + run]
        need = np.maximum(-(-(rank.nkv[cand] + cand_new) // rank.page) - rank.blk[cand], 0)
        fit = int(np.searchsorted(np.cumsum(need), rank.pool.free, side="right"))
        if fit:
            assert rank.pool.allocate(int(need[:fit].sum()))
            rank.blk[cand[:fit]] += need[:fit]
            kept.append(cand[:fit])
            kept_new.append(cand_new[:fit])
            i += fit
            continue
        s, n = int(slots[i]), int(new[i])
        while not rank.grow(s, n):
            live = np.flatnonzero(rank.active & rank.ready)
            victim = int(live[np.argmax(rank.order[live])])
            rid = rank.preempt(victim, now_s)
            preempted = True
            if victim == s:
                if rank.running == 0 and rank.blocks_for(int(rank.prompt[rid] + rank.ledger.out_done[rid])) > rank.pool.total:
                    rank.waiting.popleft()
                    rank.outstanding -= 1
                    rank.ledger.preemptions[rid] -= 1
                    rank.ledger.preemptions_total -= 1
                    rank.ledger.preemption_times_s.pop()
                break
        if rank.active[s]:
            kept.append(slots[i:i + 1])
            kept_new.append(new[i:i + 1])
        i += 1
    if not kept:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), preempted
    return np.concatenate(kept), np.concatenate(kept_new), preempted


def _ref_finish_step(rank: Rank, planned: Planned, end_s: float, outcome: StepOutcome) -> None:
    slots, new = planned.slots, planned.new
    if len(slots) == 0:
        return
    live = rank.active[slots]
    slots, new = slots[live], new[live]
    was_pre = rank.nkv[slots] < rank.target[slots]
    rank.nkv[slots] += new
    done_pre = slots[was_pre & (rank.nkv[slots] >= rank.target[slots])]
    for s in done_pre:
        rank.share_prefix(int(s))
    led = rank.ledger
    rids = rank.rid[done_pre]
    back = rids[~np.isnan(led.preempted_at_s[rids])]
    for r in back:
        led.gap(end_s - float(led.preempted_at_s[r]))
        led.preempted_at_s[r] = np.nan
    emit = slots[rank.nkv[slots] >= rank.target[slots]]
    rank.target[emit] = rank.nkv[emit]
    rank.emit_tokens(emit, end_s, outcome)


def _ref_apply_decode(self: Rank, slots: I64, steps: int, end_s: float, outcome: StepOutcome) -> None:
    if steps <= 0 or len(slots) == 0:
        return
    assert self.pool.allocate(self.extra_blocks(slots, steps))
    self.blk[slots] = np.maximum(self.blk[slots], -(-(self.nkv[slots] + steps) // self.page))
    self.nkv[slots] += steps
    self.target[slots] = self.nkv[slots]
    if steps > 1:
        self.out[slots] += steps - 1
    self.emit_tokens(slots, end_s, outcome)


def _runs() -> list[SimResult]:
    gpu = resolve_gpu("h100_sxm")
    knobs = EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048)
    no_cache = EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048, enable_prefix_caching=False)
    model = resolve_model("llama-2-7b")
    tight = {Role.AGGREGATED: 12_000}  # room for about a third of 64 sequences of 600 tokens: preemptions every few steps
    w = Workload(LengthDist(LengthKind.LOGNORMAL, 800.0, sigma=0.7), LengthDist(LengthKind.LOGNORMAL, 200.0, sigma=0.6),
                 arrival_rate_rps=30.0)
    return [
        simulate(Layout.replicas(1, Parallelism(), knobs), model=model, gpu=gpu, engine=Engine.VLLM, pool_tokens=tight,
                 requests=closed_loop(clients=64, input_tokens=300, output_tokens=300, num_requests=400)),
        simulate(Layout.replicas(1, Parallelism(), no_cache), model=model, gpu=gpu, engine=Engine.VLLM, pool_tokens=tight,
                 requests=closed_loop(clients=64, input_tokens=300, output_tokens=300, num_requests=400)),
        simulate(Layout.replicas(2, Parallelism(), knobs), model=model, gpu=gpu, engine=Engine.VLLM, pool_tokens={Role.AGGREGATED: 40_000},
                 workload=w, num_requests=400, seed=3),
    ]


def _arrays(r: SimResult) -> dict[str, np.ndarray]:
    out = {name: np.asarray(getattr(r, name)) for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "cached_tokens",
                                                          "preemptions", "itl_s", "itl_weight", "preemption_times_s")}
    out.update({f"timeline.{k}": v for k, v in r.timeline.items()})
    out["end_s"] = np.asarray(r.end_s)
    return out


def test_fast_paths_match_the_plain_code_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _runs()
    assert all(int(r.preemptions.sum()) > 50 for r in fast[:2]), [int(r.preemptions.sum()) for r in fast]
    monkeypatch.setattr(vllm_mod, "_block_limited_steps", _ref_block_limited_steps)
    monkeypatch.setattr(VllmPolicy, "schedule", _ref_schedule)
    monkeypatch.setattr(instance_mod, "finish_step", _ref_finish_step)
    monkeypatch.setattr(Rank, "apply_decode", _ref_apply_decode)
    plain = _runs()
    for f, p in zip(fast, plain, strict=True):
        fa, pa = _arrays(f), _arrays(p)
        for name in fa:
            assert np.array_equal(fa[name], pa[name], equal_nan=True), name


@pytest.mark.parametrize("seed", range(20))
def test_block_limit_closed_form_is_the_bisection(seed: int) -> None:
    """Random running sets (rooms inside and outside [0, page), free pools small and large): same largest k."""
    rng = np.random.default_rng(seed)
    from servingtopology.planner.sim.kvcache import KvPool
    from servingtopology.planner.sim.ledger import Ledger
    from servingtopology.planner.sim.requests import RequestSet

    n = int(rng.integers(1, 40))
    page = int(rng.choice([1, 16, 32]))
    reqs = RequestSet(np.zeros(n), np.full(n, 100, dtype=np.int64), np.full(n, 5000, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                      np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
    pool = KvPool(100_000, page_tokens=page, caching=False)
    rank = Rank(index=0, capacity=n, pool=pool, role=Role.AGGREGATED, ledger=Ledger(reqs))
    slots = np.arange(n)
    rank.nkv[:] = rng.integers(1, 3000, n)
    rank.blk[:] = -(-rank.nkv // page) + (rng.integers(0, 3, n) if seed % 3 == 0 else 0)
    rank.out[:] = rng.integers(0, 100, n)
    rank.out_total[:] = rank.out + rng.integers(1, 9000, n)
    pool.allocate(int(pool.total - rng.integers(0, 4 * n + 1) * (1 if seed % 2 else 10)))
    assert vllm_mod._block_limited_steps(rank, slots) == _ref_block_limited_steps(rank, slots)


def _ref_steps_until_admissible(self: sglang_mod.SglangPolicy, rank: Rank, slots: I64, decoding: int, k_max: int) -> int:
    k = np.arange(0, k_max + 1, dtype=np.float64)
    ratio = np.maximum(sglang_mod.MIN_NEW_TOKEN_RATIO, self.ratio - self.decay * k)
    clip = sglang_mod.CLIP_MAX_NEW_TOKENS
    left = np.minimum(rank.out_total[slots] - rank.out[slots], clip).astype(np.float64)
    others = rank.active.copy()
    others[slots] = False
    left_others = float(np.minimum(rank.out_total[others] - rank.out[others], clip).sum())
    reserve = ratio * (np.maximum(left[None, :] - k[:, None], 0.0).sum(axis=1) + left_others)
    free = rank.pool.free - decoding * k
    rid = rank.waiting[0]
    hk, hr = rank.hits(rid)
    extend = float(rank.prompt[rid] + rank.ledger.out_done[rid]) - (hk + hr) * rank.page
    own = min(float(rank.output[rid] - rank.ledger.out_done[rid]), clip) * ratio
    ok = np.flatnonzero(extend + own < free - reserve)
    return int(ok[0]) if len(ok) else k_max


def _sglang_runs() -> list[SimResult]:
    gpu = resolve_gpu("h100_sxm")
    knobs = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)
    w = Workload(LengthDist(LengthKind.LOGNORMAL, 2000.0, sigma=0.7), LengthDist(LengthKind.LOGNORMAL, 300.0, sigma=0.6),
                 arrival_rate_rps=40.0)
    return [
        # a queue behind 256 running sequences (most calls), and short outputs beside long prompts (k_max past SCALAR_STEPS)
        simulate(Layout.replicas(1, Parallelism(), knobs), model=resolve_model("llama-3.1-8b"), gpu=gpu, engine=Engine.SGLANG,
                 requests=closed_loop(clients=300, input_tokens=1000, output_tokens=1000, num_requests=900)),
        simulate(Layout.replicas(1, Parallelism(), knobs), model=resolve_model("llama-2-7b"), gpu=gpu, engine=Engine.SGLANG,
                 requests=closed_loop(clients=300, input_tokens=500, output_tokens=2000, num_requests=600)),
        simulate(Layout.pd(RoleLayout(1, Parallelism(tp=4), knobs), RoleLayout(1, Parallelism(tp=4), knobs)), model=resolve_model("llama-3.1-70b"),
                 gpu=gpu, engine=Engine.SGLANG, workload=w, num_requests=600, seed=1),
    ]


def test_sglang_admission_horizon_matches_the_plain_matrix_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    fast_fn = sglang_mod.SglangPolicy._steps_until_admissible

    def counting(self: sglang_mod.SglangPolicy, rank: Rank, slots: I64, decoding: int, k_max: int) -> int:
        got = fast_fn(self, rank, slots, decoding, k_max)
        want = _ref_steps_until_admissible(self, rank, slots, decoding, k_max)
        assert got == want, (len(seen), k_max, got, want)   # every call, not only the runs' arrays
        seen.append((k_max, got))
        return got

    monkeypatch.setattr(sglang_mod.SglangPolicy, "_steps_until_admissible", counting)
    fast = _sglang_runs()
    k_maxes = np.array([k for k, _ in seen])
    answers = np.array([a for _, a in seen])
    # both branches and both kinds of answer are exercised: within SCALAR_STEPS and past it, admissible and not
    assert (k_maxes <= sglang_mod.SCALAR_STEPS).any() and (k_maxes > sglang_mod.SCALAR_STEPS).any(), np.bincount(np.minimum(k_maxes, 100))
    assert (answers == 0).any() and ((answers > 0) & (answers < k_maxes)).any() and (answers == k_maxes).any()
    monkeypatch.setattr(sglang_mod.SglangPolicy, "_steps_until_admissible", _ref_steps_until_admissible)
    plain = _sglang_runs()
    for f, p in zip(fast, plain, strict=True):
        fa, pa = _arrays(f), _arrays(p)
        for name in fa:
            assert np.array_equal(fa[name], pa[name], equal_nan=True), name
