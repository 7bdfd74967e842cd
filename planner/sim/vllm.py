"""vLLM V1 scheduling policy for one rank: continuous batching with a token budget and chunked prefill.

Follows vLLM's `Scheduler.schedule` (v1/core/sched/scheduler.py): running requests first, in admission
order, each taking min(its remaining tokens, what is left of `max_num_batched_tokens`); when a running
request cannot get KV blocks the newest running request is preempted (recompute) until it can; only
in a step without preemption are waiting requests admitted, FCFS, while the budget, `max_num_seqs`
and the pool allow (the head request blocking the queue). Prefix hits count whole blocks; a prompt chunk's
full shared-prefix blocks are hittable from the moment it is scheduled (`share_scheduled`). A waiting
request is admitted only when the blocks of its whole prompt fit in the free pool, not just those of
its first chunk (`whole_prompt_fits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servingtopology.planner.layout import EngineKnobs, Role
from servingtopology.planner.sim.rank import Rank, StepBatch, StepOutcome

__all__ = ["Planned", "VllmPolicy", "admit_remote", "batch_of"]

I64 = npt.NDArray[np.int64]
MAX_BURST_STEPS = 8192


@dataclass(slots=True)
class Planned:
    """One rank's scheduled step: slots, their new tokens, and the model arguments."""

    batch: StepBatch
    slots: I64
    new: I64
    all_live: bool = False   # every slot is running (vLLM's schedule: its preemptions only drop slots after the ones it keeps)


def batch_of(rank: Rank, slots: I64, new: I64) -> StepBatch:
    """Model arguments of a step: prefill chunks with their prior context, decodes with their context."""
    if len(slots) == 0:
        return StepBatch()
    nkv_i = rank.nkv[slots]
    is_pre = nkv_i < rank.target[slots]
    nkv = nkv_i.astype(np.float64)
    if not is_pre.any():  # a pure decode step
        return StepBatch(0.0, 0.0, float(len(slots)), float(np.add.reduce(nkv + 1.0)))
    n_pre = new[is_pre].astype(np.float64)
    pre_tokens = float(np.add.reduce(n_pre))
    pairs = float(np.add.reduce(n_pre * (nkv[is_pre] + n_pre / 2.0)))
    dec = ~is_pre
    return StepBatch(pre_tokens, pairs, float(np.count_nonzero(dec)), float(np.add.reduce(nkv[dec] + 1.0)))


EXACT = float(1 << 51)  # integer (and half-integer) sums below this are exact in float64, whatever the order


def _batch(slots: I64, new: I64, nkv: I64, left: I64, n_add: list[int], k_add: list[int]) -> StepBatch | None:
    """`batch_of` of the running slots (nkv, and left = target − nkv, as scheduled) plus the requests just admitted (all
    prefilling: first chunks n_add over k_add cached tokens), from what `schedule` holds. The model arguments are sums
    of whole tokens (and of token pairs, halves included), exact in float64 below 2**51 in any order, so these are the
    same floats as batch_of's; None past that (the caller asks batch_of)."""
    n = len(slots)
    if n == 0 and not n_add:
        return StepBatch()
    ctx = int(np.add.reduce(nkv)) if n else 0
    pre = (left > 0).nonzero()[0]
    decoders = n - len(pre)
    if decoders == n and not n_add:  # a pure decode step
        return StepBatch(0.0, 0.0, float(n), float(ctx + n)) if ctx + n < EXACT else None
    n_pre, k_pre = (new[pre].tolist(), nkv[pre].tolist()) if len(pre) else ([], [])
    ctx += decoders - sum(k_pre)  # Σ (nkv + 1) over the decoding slots
    tokens = 0
    pairs2 = 0  # twice Σ n·(nkv + n/2) over the prompt chunks
    for c, k in zip(n_pre + n_add, k_pre + k_add, strict=True):
        tokens += c
        pairs2 += c * (2 * k + c)
    if pairs2 >= EXACT or ctx >= EXACT:
        return None
    return StepBatch(float(tokens), pairs2 / 2.0, float(decoders), float(ctx))


def finish_step(rank: Rank, planned: Planned, end_s: float, outcome: StepOutcome) -> None:
    """Apply a planned step at its end: tokens computed, prompts completed, tokens emitted."""
    slots, new = planned.slots, planned.new
    if len(slots) == 0:
        return
    live = None if planned.all_live else rank.active[slots]
    if live is not None and np.count_nonzero(live) != len(live):
        slots, new = slots[live], new[live]
    elif planned.batch.prefill_tokens == 0.0:
        # a pure decode step (batch_of found no prompt tokens among these slots, and nothing changed since):
        # every slot computes its last token's KV and emits the next one
        nkv = rank.nkv[slots] + new
        rank.nkv[slots] = nkv
        rank.target[slots] = nkv
        rank.emit_tokens(slots, end_s, outcome)
        return
    nkv0, target = rank.nkv[slots], rank.target[slots]
    nkv = nkv0 + new
    rank.nkv[slots] = nkv
    reached = nkv >= target  # share_prefix and the gaps below change neither nkv nor target
    done_pre = slots[(nkv0 < target) & reached]
    if len(done_pre):
        if rank.shares:
            for s in done_pre.tolist():
                rank.share_prefix(s)
        led = rank.ledger
        at = led.preempted_at_s
        for r in rank.rid[done_pre].tolist():  # a request back from a preemption: the gap its client saw
            t0 = float(at[r])
            if not math.isnan(t0):
                led.gap(end_s - t0)
                at[r] = np.nan
    emit = slots[reached]
    rank.target[emit] = nkv[reached]
    rank.emit_tokens(emit, end_s, outcome)


def admit_remote(rank: Rank, now_s: float) -> list[tuple[int, int]]:
    """PD decode: reserve blocks for prefilled requests (oldest first) while seqs and pool allow; (rid, slot) of each."""
    started: list[tuple[int, int]] = []
    while rank.remote and rank.running < rank.capacity:
        rid = rank.remote[0]
        tokens = int(rank.prompt[rid])
        if rank.blocks_for(tokens) > rank.pool.free:
            break
        rank.remote.popleft()
        slot = rank.admit(rid, hk=0, hr=0, now_s=now_s, nkv=tokens, ready=False)
        rank.target[slot] = tokens
        ok = rank.grow(slot, 0)
        assert ok
        started.append((rid, slot))
    return started


def share_scheduled(rank: Rank, slots: I64, new: I64) -> None:
    """vLLM caches a request's full blocks when it allocates them for the step's tokens, before they are
    computed (`KVCacheManager.allocate_slots` -> `cache_blocks` up to num_computed + num_new tokens,
    vllm/v1/core/kv_cache_manager.py): a request scheduled later, in this step or the next, hits them. The
    prompt chunks scheduled in this step share their full shared-prefix blocks now."""
    if len(slots) == 0:
        return
    nkv = rank.nkv[slots]
    pre = np.flatnonzero((nkv < rank.target[slots]) & (rank.hit_k[slots] < rank.shared_blocks[rank.rid[slots]]))
    for j in pre:
        rank.share_prefix(int(slots[j]), int(nkv[j] + new[j]))


def whole_prompt_fits(rank: Rank, rid: int, tokens: int, hk: int, hr: int) -> bool:
    """vLLM's admission gate `--scheduler-reserve-full-isl` (on by default): a waiting or preempted request
    is taken in only if the free pool holds blocks for all its `tokens` (prompt, plus the outputs of a
    preempted one) beyond its prefix hits, not only for the first chunk, so a long prompt is not admitted
    to be preempted half-way (`KVCacheManager.allocate_slots(full_sequence_must_fit=...)`,
    vllm/v1/core/kv_cache_manager.py, vllm-project/vllm PR #37307 merged 2026-03-17; `true` in the 0.19.0
    replay's resolved scheduler_config and the default in 0.32/0.33's parsers, absent from 0.11's). Hit blocks
    that are cached but unreferenced count against the free pool, as vLLM's `get_num_blocks_to_allocate`
    counts them (acquiring them takes them out of the free queue)."""
    pinned_now = (rank.pool.evictable_extent(rank.key_of[rid], hk) if hk else 0) + (
        rank.pool.evictable_extent(-(rid + 1), hr) if hr else 0)
    return -(-tokens // rank.page) - (hk + hr) <= rank.pool.free - pinned_now  # blocks_for(tokens)


class VllmPolicy:
    """vLLM scheduler state of one rank (stateless beyond the knobs)."""

    def __init__(self, knobs: EngineKnobs) -> None:
        self.budget = int(knobs.max_num_batched_tokens)

    def schedule(self, rank: Rank, now_s: float) -> Planned:
        """Choose and reserve this step's batch (preempting or admitting as vLLM would)."""
        # the ready running slots in admission order (what sorting them by rank.order gives); only a PD decode rank
        # holds running slots that are not ready (their KV still arriving)
        order = np.array(rank.admitted, dtype=np.int64)
        if rank.role is Role.DECODE and len(order):
            order = order[rank.ready[order]]
        nkv = rank.nkv[order]
        left = rank.target[order] - nkv  # prompt tokens still to compute (0 for a decoding sequence)
        want = np.maximum(left, 1)
        wanted = int(np.add.reduce(want))  # integers: the last of want's cumulative sums (0 when nothing runs)
        if wanted <= self.budget:  # every running request gets all it wants
            slots, new = order, want
        else:
            took = want.cumsum()
            np.minimum(took, self.budget, out=took)
            new = took.copy()
            new[1:] -= took[:-1]
            keep = int(np.count_nonzero(new))  # the budget runs out at one point: a prefix keeps tokens
            slots, new, nkv, left = order[:keep], new[:keep], nkv[:keep], left[:keep]
        blk = rank.blk[slots]
        need = (nkv + new + rank.page_less_1_0d) // rank.page_0d - blk  # blocks short of ⌈(nkv + new)/page⌉
        np.maximum(need, 0, out=need)
        total = int(np.add.reduce(need))
        preempted = False
        if total <= rank.pool.free:
            rank.pool.allocate(total)
            rank.blk[slots] = blk + need
        else:
            slots, new, preempted = self._allocate_with_preemption(rank, order, slots, new, need, now_s)
            nkv, left = nkv[:len(slots)], left[:len(slots)]  # the running requests kept are a prefix
        if rank.shares and rank.pool.caching:
            share_scheduled(rank, slots, new)
        s_add: list[int] = []
        n_add: list[int] = []
        k_add: list[int] = []
        if not preempted and rank.waiting and rank.free_slots:  # then no request was dropped: the budget used is what the running ones took
            s_add, n_add, k_add = self._admit_queue(rank, self.budget - min(wanted, self.budget), now_s)
        batch = _batch(slots, new, nkv, left, n_add, k_add)
        if s_add:
            slots = np.concatenate([slots, s_add])
            new = np.concatenate([new, n_add])
        if batch is None:  # sums past exact float range: the float arithmetic of batch_of itself
            batch = batch_of(rank, slots, new)
        return Planned(batch, slots, new, all_live=True)

    def _allocate_with_preemption(self, rank: Rank, live: I64, slots: I64, new: I64, need: I64,
                                  now_s: float) -> tuple[I64, I64, bool]:
        """vLLM's loop over running requests in order, preempting the newest until each one's blocks fit.

        `live` is every running request oldest first (a prefix of it is `slots`, whose blocks needed are
        `need`). The newest running request is always the last of `live` not yet preempted, so the running
        set stays a prefix `live[:end]` and the requests kept are a prefix `slots[:i]`. Runs of requests
        whose blocks fit without a preemption are allocated together (one pool call, as the loop would one
        by one: the pool takes empty blocks, then evicts cached ones oldest first), so the Python loop only
        turns where a preemption happens. A preemption changes only the victim, so `need` stays valid.
        """
        pool = rank.pool
        csum = need.cumsum()
        preempted = False
        i, end, n_slots = 0, len(live), len(slots)
        while i < min(n_slots, end):
            stop = min(n_slots, end)
            before = int(csum[i - 1]) if i else 0
            fit = int(csum[i:stop].searchsorted(pool.free + before, side="right"))
            if fit:
                ok = pool.allocate(int(csum[i + fit - 1]) - before)
                assert ok
                i += fit
                continue
            s, n_i = int(slots[i]), int(need[i])
            while not pool.allocate(n_i):
                end -= 1
                victim = int(live[end])
                rid = rank.preempt(victim, now_s)
                preempted = True
                if victim == s:
                    if rank.running == 0 and rank.blocks_for(int(rank.prompt[rid]) + rank.ledger.out_done[rid]) > pool.total:
                        # alone and still too long for the whole pool: it can never run
                        rank.waiting.popleft()
                        rank.outstanding -= 1
                        rank.ledger.preemptions[rid] -= 1
                        rank.ledger.preemptions_total -= 1
                        rank.ledger.preemption_times_s.pop()
                    break
            if rank.active[s]:  # else it was the newest itself: end == i and the loop stops
                i += 1
        kept = min(i, end)
        rank.blk[slots[:kept]] += need[:kept]
        return slots[:kept], new[:kept], preempted

    def _admit_waiting(self, rank: Rank, budget_left: int, now_s: float) -> tuple[list[int], list[int]]:
        slots, news, _ = self._admit_queue(rank, budget_left, now_s)
        return slots, news

    def _admit_queue(self, rank: Rank, budget_left: int, now_s: float) -> tuple[list[int], list[int], list[int]]:
        """Admit from the queue head while budget, seqs and pool allow: slots, their first chunks, their cached tokens."""
        slots: list[int] = []
        news: list[int] = []
        cached: list[int] = []
        while rank.waiting and budget_left > 0 and rank.free_slots:  # a free slot: running < capacity
            rid = rank.waiting[0]
            hk, hr = rank.hits(rid)
            tokens = rank.prompt_of[rid] + rank.ledger.out_done[rid]
            n = min(tokens - (hk + hr) * rank.page, budget_left)
            if not whole_prompt_fits(rank, rid, tokens, hk, hr):
                if rank.running == 0 and rank.blocks_for(tokens) > rank.pool.total:
                    rank.waiting.popleft()  # larger than the whole pool: never admissible
                    rank.outstanding -= 1
                    continue
                break
            slot = rank.admit(rid, hk=hk, hr=hr, now_s=now_s)
            held = hk + hr   # admit set the slot's nkv to held·page and its blocks to held: grow(slot, n) without reading them back
            need = -(-(held * rank.page + n) // rank.page) - held   # the first chunk's blocks are a part of the whole prompt's
            if need > 0:
                ok = rank.pool.allocate(need)
                assert ok
                rank.blk[slot] = held + need
            if hk < rank.shared_of[rid]:
                rank.share_prefix(slot, int(rank.nkv[slot]) + n)  # a request queued behind it may hit them now
            rank.waiting.popleft()
            slots.append(slot)
            news.append(n)
            cached.append((hk + hr) * rank.page)  # the slot's nkv as admit set it
            budget_left -= n
        return slots, news, cached

    def head_admissible(self, rank: Rank, decoding: int) -> bool:
        """Whether the next step would admit the head of the queue (pool and budget as they are now)."""
        if rank.remote:
            rid = rank.remote[0]
            return rank.running < rank.capacity and rank.blocks_for(int(rank.prompt[rid])) <= rank.pool.free
        if not rank.waiting or rank.running >= rank.capacity or self.budget - decoding <= 0:
            return False
        rid = rank.waiting[0]
        hk, hr = rank.hits(rid)
        tokens = rank.prompt_of[rid] + rank.ledger.out_done[rid]
        return whole_prompt_fits(rank, rid, tokens, hk, hr)

    def head_fits(self, rank: Rank) -> bool:
        """Whether the queue head's whole prompt fits the pool as it is (`whole_prompt_fits`); False when nothing waits
        locally (or a PD hand-off does) or no sequence slot is free, where neither `admits_head` nor `head_admissible` asks it."""
        if rank.remote or not rank.waiting or not rank.free_slots:  # no free slot: running == capacity
            return False
        rid = rank.waiting[0]
        hk, hr = rank.hits(rid)
        return whole_prompt_fits(rank, rid, rank.prompt_of[rid] + rank.ledger.out_done[rid], hk, hr)

    def admits_head(self, rank: Rank, head_fits: bool) -> bool:
        """The next step admits the head of the queue whatever runs now (pool and budget as they are; head_fits is
        `head_fits(rank)`): `burst_limit` would give no steps, so the instance may schedule at once. With fewer running
        requests than the budget, every decoding count gives head_admissible's answer, and a queue head that fits ends
        any burst (burst_limit)."""
        return head_fits and rank.running < self.budget

    def burst_limit(self, rank: Rank, slots: I64, decoding: int, *, head_fits: bool | None = None) -> tuple[int, bool]:
        """Steps of pure decode this rank can run unchanged, and whether an arrival could end them early.

        Zero when the next step is not a plain decode step (a prefill in flight, an admissible queue
        head, decodes over the budget, no block for the very next token). head_fits: `head_fits(rank)` when the caller
        has it (the pool unchanged since), so the queue head is not weighed twice.
        """
        # called right after rank.decode_state(): a ready sequence that is not decoding is prefilling
        if decoding == 0 or decoding > self.budget or rank.live_at_decode_state > decoding:
            return 0, False
        if head_fits is None or rank.remote:
            if self.head_admissible(rank, decoding):
                return 0, False
        elif head_fits and self.budget - decoding > 0:  # head_admissible's answer (head_fits is False without a free slot)
            return 0, False
        open_to_arrivals = not rank.waiting and not rank.remote and rank.running < rank.capacity
        return _block_limited_steps(rank, slots), open_to_arrivals

    def after_decode_steps(self, rank: Rank, steps: int) -> None:
        return None


def _block_limited_steps(rank: Rank, slots: I64) -> int:
    """Largest k ≤ the nearest completion such that k decode steps fit in the free blocks.

    Rank.extra_blocks(slots, k) is Σ max(⌈(nkv + k)/page⌉ − blk, 0) = Σ max(⌈(k − r)/page⌉, 0) with
    r = blk·page − nkv, the room left in a slot's blocks. When every r lies in [0, page) (the usual case:
    a slot holds ⌈nkv/page⌉ blocks), each slot takes exactly one block per `page` steps, at steps
    r + 1, r + 1 + page, ...: the F + 1-th block overall (F free) is needed at step
    (F // n)·page + r_(F mod n) + 1 (r sorted), so k = (F // n)·page + r_(F mod n) — one partition
    instead of a bisection. Otherwise the bisection on extra(k) (monotone) gives the same largest k."""
    out_left = rank.out_total[slots] - rank.out[slots]
    left = int(np.minimum.reduce(out_left))
    if slots is rank.decoding_slots:
        rank.decoding_left = left  # apply_decode of a burst shorter than this finishes nobody
    k_max = min(left, MAX_BURST_STEPS)
    if k_max <= 0:
        return 0
    free = rank.pool.free
    page = rank.page
    nkv = rank.decoding_nkv if slots is rank.decoding_slots else rank.nkv[slots]  # decode_state's gather, nothing changed since
    blk = rank.blk[slots]
    room = blk * rank.page_0d - nkv
    n = len(room)
    if int(np.maximum.reduce(room.view(np.uint64))) < page:  # every room in [0, page) (a negative one reads as ≥ 2**63)
        rounds, rest = divmod(free, n)
        if rounds * page >= k_max:
            return k_max
        room.partition(rest)  # room is this call's own array
        k = rounds * page + int(room[rest])
        return min(k, k_max)

    def extra(k: int) -> int:
        return int(np.maximum(-(-(nkv + k) // page) - blk, 0).sum())

    if extra(k_max) <= free:
        return k_max
    lo, hi = 0, k_max  # extra(lo) fits, extra(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo
