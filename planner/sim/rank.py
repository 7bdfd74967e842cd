"""One attention-DP rank's running set, waiting queues and KV pool: the state the scheduler policies act on.

Owned by an `Instance`; the policies in vllm.py and sglang.py decide what runs each step and call the
operations here (admit, grow, preempt, finish). Running sequences live in fixed-size numpy arrays (one
slot per running request) so a decode step over hundreds of sequences costs a few vector operations.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from servingtopology.planner.layout import Role
from servingtopology.planner.sim.kvcache import KvPool
from servingtopology.planner.sim.ledger import Ledger

__all__ = ["Rank", "StepBatch", "StepOutcome"]

I64 = npt.NDArray[np.int64]


class StepBatch(NamedTuple):
    """What one rank computes in one step (the `StepTimeModel` arguments); a named tuple, made once a step."""

    prefill_tokens: float = 0.0
    prefill_pairs: float = 0.0
    decode_tokens: float = 0.0
    decode_context_tokens: float = 0.0

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_tokens == 0


@dataclass(slots=True)
class StepOutcome:
    """Requests whose state changes become visible at the end of the step."""

    finished: list[int]
    prefilled: list[int]  # PD prefill role: prompt done, KV held for transfer
    first_tokens: list[int]


class Rank:
    """Slots of running sequences plus FCFS waiting queues and the pool.

    Per slot: rid, nkv (tokens whose KV is computed), target (tokens to prefill before decoding: prompt
    plus output already produced), out (output tokens produced), out_total (tokens to produce here),
    blk (blocks referenced), hit_k / hit_r (blocks referenced through the shared / own cache key),
    order (admission counter; vLLM preempts the newest), ready (False while KV is still arriving).
    """

    def __init__(self, *, index: int, capacity: int, pool: KvPool, role: Role, ledger: Ledger, dedup: bool = True) -> None:
        self.index = index
        self.dedup = dedup  # a computed copy of cached blocks is freed at once (SGLang's radix insert), else kept (vLLM)
        self._copies_key = -len(ledger.requests) - 1  # keys below every request's own key, one per set of copies freed
        self.capacity = capacity
        self.pool = pool
        self.role = role
        self.ledger = ledger
        self.page = pool.page_tokens
        self.page_0d, self.page_less_1_0d = np.array(self.page), np.array(self.page - 1)  # 0-d: no scalar conversion per op
        req = ledger.requests
        self.prompt = req.prompt_tokens
        self.output = req.output_tokens
        self.key = req.prefix_key
        self.shared_blocks = np.where(req.prefix_key >= 0, req.shared_tokens // pool.page_tokens, 0).astype(np.int64)
        self.prompt_of, self.key_of = ledger.prompt_of, ledger.prefix_key_of  # the same ints as prompt, key
        self.output_of: list[int] = req.output_tokens.tolist()  # the same ints as output
        self.shared_of: list[int] = self.shared_blocks.tolist()
        self.shares = bool((self.shared_blocks > 0).any())  # False: no request has a shared prefix block (share_prefix does nothing)
        cols = np.zeros((9, capacity), dtype=np.int64)
        self.rid, self.nkv, self.target, self.out, self.out_total = cols[0], cols[1], cols[2], cols[3], cols[4]
        self.blk, self.hit_k, self.hit_r, self.order = cols[5], cols[6], cols[7], cols[8]
        self.active = np.zeros(capacity, dtype=bool)
        self.ready = np.zeros(capacity, dtype=bool)
        self.free_slots = list(range(capacity - 1, -1, -1))
        self.admitted: list[int] = []  # the running slots in admission order (ascending `order`), ready or not
        self.waiting: deque[int] = deque()
        self.remote: deque[int] = deque()      # PD decode: prefilled requests waiting for pool room
        self._held_state: dict[int, tuple[int, int, int, int]] = {}
        self._counter = 0
        self.outstanding = 0                   # requests routed here and not yet gone
        self.live_at_decode_state = 0          # ready running sequences when decode_state last looked
        self.decoding_slots: I64 = np.zeros(0, dtype=np.int64)  # decode_state's last slots, and their nkv then
        self.decoding_nkv: I64 = self.decoding_slots
        self.decoding_left = 0  # fewest outputs any of decoding_slots has left (0: not known), set by the burst limits
        # Slots are taken lowest first and reused last-freed first, so every running sequence lies below the
        # highest slot ever taken: the per-step scans look at [:high], not at all `capacity` slots.
        self.high = 0
        self._prefix(0)

    def _prefix(self, high: int) -> None:
        """Views of the per-slot arrays over [:high] (the per-step scans), kept while `high` holds."""
        self.high = high
        self.active_h, self.ready_h = self.active[:high], self.ready[:high]
        self.nkv_h, self.target_h = self.nkv[:high], self.target[:high]

    # ---- queries -------------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return self.capacity - len(self.free_slots)

    def decode_mask(self) -> npt.NDArray[np.bool_]:
        h = self.high
        mask: npt.NDArray[np.bool_] = self.active[:h] & self.ready[:h] & (self.nkv[:h] >= self.target[:h])
        return mask

    def prefilling(self) -> bool:
        """Whether any ready sequence still has prompt tokens to compute."""
        h = self.high
        return bool((self.active[:h] & self.ready[:h] & (self.nkv[:h] < self.target[:h])).any())

    def prefilling_slots(self) -> list[int]:
        h = self.high
        slots: list[int] = np.flatnonzero(self.active[:h] & self.ready[:h] & (self.nkv[:h] < self.target[:h])).tolist()
        return slots

    def kv_used_frac(self) -> float:
        return self.pool.in_use / self.pool.total if self.pool.total else 0.0

    def out_total_for(self, rid: int) -> int:
        return 1 if self.role is Role.PREFILL else int(self.output[rid])

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.page)

    # ---- admission -------------------------------------------------------------------------------------
    def hits(self, rid: int) -> tuple[int, int]:
        """Blocks of `rid` already in the pool: (through its shared key, through its own key)."""
        pool = self.pool
        if not pool.caching:
            return 0, 0
        cap = (self.prompt_of[rid] + self.ledger.out_done[rid] - 1) // self.page  # at least one token is always computed
        sb = self.shared_of[rid] if self.shares else 0
        if sb > 0:
            hk = pool.extent(self.key_of[rid])
            if hk > sb:
                hk = sb
        else:
            hk = 0
        hr = pool.extent(-(rid + 1)) if hk == sb else 0
        room = cap - hk
        if hr > room:
            hr = room
        return (hk if hk < cap else cap), (hr if hr > 0 else 0)  # min(hk, cap), max(0, min(hr, cap − hk))

    def admit(self, rid: int, *, hk: int, hr: int, now_s: float, nkv: int = 0, ready: bool = True) -> int:
        """Put `rid` in a slot, referencing its cached blocks; the caller allocates the rest."""
        slot = self.free_slots.pop()
        if slot >= self.high:
            self._prefix(slot + 1)
        self._counter += 1
        if hk > 0:
            self.pool.acquire(self.key_of[rid], hk)
        if hr > 0:
            self.pool.acquire(-(rid + 1), hr)
        out = self.ledger.out_done[rid]
        self.rid[slot], self.out[slot], self.out_total[slot] = rid, out, 1 if self.role is Role.PREFILL else self.output_of[rid]
        self.target[slot] = self.prompt_of[rid] + out
        self.nkv[slot] = max(nkv, (hk + hr) * self.page)
        self.blk[slot], self.hit_k[slot], self.hit_r[slot] = hk + hr, hk, hr
        self.order[slot] = self._counter
        self.admitted.append(slot)
        self.active[slot], self.ready[slot] = True, ready
        self.ledger.cached_tokens[rid] += (hk + hr) * self.page
        if math.isnan(self.ledger.scheduled_s[rid]):
            self.ledger.scheduled_s[rid] = now_s
        return slot

    def grow(self, slot: int, new_tokens: int) -> bool:
        """Allocate blocks so the slot can hold `new_tokens` more tokens; False if the pool is short."""
        need = self.blocks_for(int(self.nkv[slot]) + new_tokens) - int(self.blk[slot])
        if need > 0:
            if not self.pool.allocate(need):
                return False
            self.blk[slot] += need
        return True

    # ---- leaving ---------------------------------------------------------------------------------------
    def _release_blocks(self, rid: int, nkv: int, blk: int, hk: int, hr: int) -> None:
        """Give a sequence's blocks back: full blocks become cache content, the rest is freed."""
        pool = self.pool
        sb = self.shared_of[rid]
        full = nkv // self.page
        in_shared = min(blk, sb)
        alloc_shared = max(0, in_shared - hk)
        alloc_own = (blk - in_shared) - hr
        moved = 0
        key = self.key_of[rid]
        own_full = max(0, full - sb)
        if self.dedup:
            if sb > 0:
                moved += pool.donate(key, upto_blocks=min(sb, full), from_allocated=alloc_shared)
            moved += pool.donate(-(rid + 1), upto_blocks=own_full, from_allocated=max(0, alloc_own))
            pool.free_allocated(alloc_shared + alloc_own - moved)
            if hk > 0:
                pool.release(key, hk)
            if hr > 0:
                pool.release(-(rid + 1), hr)
            return
        # vLLM frees a request's blocks tail first (SingleTypeKVCacheManager.free, vllm/v1/core/
        # single_type_kv_cache_manager.py): its own blocks reach the free queue before its shared ones, and the
        # full blocks it computed as copies of the key's (never de-duplicated) queue there as cached blocks
        # nobody hits (a key of their own); partial blocks go to the front (BlockPool.free_blocks), here `empty`.
        moved += pool.donate(-(rid + 1), upto_blocks=own_full, from_allocated=max(0, alloc_own))
        if hr > 0:
            pool.release(-(rid + 1), hr)
        if sb > 0:
            grew = pool.donate(key, upto_blocks=min(sb, full), from_allocated=alloc_shared)
            copies = max(0, min(sb, full) - hk) - grew
            if copies > 0:
                self._copies_key -= 1
                grew += pool.donate(self._copies_key, upto_blocks=copies, from_allocated=copies)
            moved += grew
        pool.free_allocated(alloc_shared + alloc_own - moved)
        if hk > 0:
            pool.release(key, hk)

    def _vacate(self, slot: int) -> int:
        rid = int(self.rid[slot])
        self.active[slot] = False
        self.ready[slot] = False
        self.free_slots.append(slot)
        self.admitted.remove(slot)
        self.ledger.out_done[rid] = int(self.out[slot])
        return rid

    def finish(self, slot: int) -> int:
        """The slot's request produced its last token here: free or hold its blocks."""
        rid = self._vacate(slot)
        state = (int(self.nkv[slot]), int(self.blk[slot]), int(self.hit_k[slot]), int(self.hit_r[slot]))
        if self.role is Role.PREFILL and int(self.output[rid]) > 1:
            self._held_state[rid] = state
        else:
            self._release_blocks(rid, *state)
            self.outstanding -= 1
        return rid

    def holds(self, rid: int) -> bool:
        """Whether this rank keeps `rid`'s KV for a transfer to a decode instance."""
        return rid in self._held_state

    def release_held(self, rid: int) -> None:
        """PD prefill: the KV of `rid` has left for the decode instance."""
        state = self._held_state.pop(rid)
        self._release_blocks(rid, *state)
        self.outstanding -= 1

    def preempt(self, slot: int, now_s: float) -> int:
        """Evict a running sequence (recompute later): free its blocks, put it first in the queue."""
        rid = self._vacate(slot)
        self._release_blocks(rid, int(self.nkv[slot]), int(self.blk[slot]), int(self.hit_k[slot]), int(self.hit_r[slot]))
        self.waiting.appendleft(rid)
        self.ledger.preemptions[rid] += 1
        self.ledger.preemptions_total += 1
        self.ledger.preemption_times_s.append(now_s)
        self.ledger.preempted_at_s[rid] = now_s
        return rid

    def share_prefix(self, slot: int, tokens: int | None = None) -> None:
        """A sequence's computed shared-prefix blocks join the cache for others to hit: after its prompt is
        computed, or (vLLM) once `tokens` of it are scheduled, for the full blocks among them."""
        rid = int(self.rid[slot])
        sb = int(self.shared_blocks[rid])
        if sb <= 0 or not self.pool.caching:
            return
        upto = min(sb, (int(self.nkv[slot]) if tokens is None else tokens) // self.page)
        hk = int(self.hit_k[slot])
        if upto <= hk:
            return
        key = int(self.key[rid])
        if not self.dedup and self.pool.extent(key) > hk:
            # vLLM keeps the copies it computed of blocks the key already holds ("we don't de-duplicate the blocks
            # in the cache", BlockPool, vllm/v1/core/block_pool.py) until the request frees them: its blocks stay
            # its own (new content past the key's run joins the cache when it leaves)
            return
        moved = self.pool.donate(key, upto_blocks=upto, from_allocated=upto - hk)
        self.pool.free_allocated(upto - hk - moved)
        self.pool.acquire(key, upto)  # the deeper reference first, so the blocks it keeps stay pinned
        if hk > 0:
            self.pool.release(key, hk)
        self.hit_k[slot] = upto
        # the blocks it referenced beyond `upto` stay allocated; blk is unchanged (now partly pinned)

    # ---- steps -----------------------------------------------------------------------------------------
    def emit_tokens(self, slots: I64, end_s: float, outcome: StepOutcome, *, steps: int = 1) -> None:
        """Slots that completed their prefill or decoded produce one token at `end_s` (after `steps` − 1
        tokens of a decode burst produced on the way)."""
        if len(slots) == 0:
            return
        out = self.out[slots] + steps
        self.out[slots] = out
        led = self.ledger
        for s in slots[out == 1].tolist() if steps == 1 else ():  # after a burst of 2+ steps none is a first token
            rid = int(self.rid[s])
            if math.isnan(led.first_token_s[rid]):
                led.first_token_s[rid] = end_s
                outcome.first_tokens.append(rid)
        done = slots[out >= self.out_total[slots]]
        if len(done):
            self._done(done, end_s, outcome)

    def _done(self, done: I64, end_s: float, outcome: StepOutcome) -> None:
        """The slots `done` produced their last token at end_s."""
        if not self.dedup and len(done) > 1:
            # vLLM finishes a step's requests in its running queue's order (Scheduler.update_from_output walks the
            # step's scheduled requests, running ones in admission order: vllm/v1/core/sched/scheduler.py): their
            # blocks are freed, and their final outputs reach the clients, in that order
            done = done[np.argsort(self.order[done], kind="stable")]
        led = self.ledger
        for s in done.tolist():
            rid = self.finish(s)
            if self.role is Role.PREFILL and int(self.output[rid]) > 1:
                led.prefill_done_s[rid] = end_s
                outcome.prefilled.append(rid)
            else:
                led.finish_s[rid] = end_s
                outcome.finished.append(rid)

    def decode_state(self) -> tuple[I64, int, int]:
        """Decoding slots, their count and the sum of their cached tokens."""
        if self.role is Role.DECODE:
            live = self.active_h & self.ready_h
            self.live_at_decode_state = int(np.count_nonzero(live))
        else:   # ready is active off a PD decode rank, and the active slots are the running ones (all below `high`)
            live = self.active_h
            self.live_at_decode_state = self.capacity - len(self.free_slots)
        slots = (live & (self.nkv_h >= self.target_h)).nonzero()[0]
        nkv = self.nkv[slots]
        self.decoding_slots, self.decoding_nkv, self.decoding_left = slots, nkv, 0
        return slots, len(slots), int(np.add.reduce(nkv))

    def extra_blocks(self, slots: I64, steps: int) -> int:
        """Blocks the decoding slots need to run `steps` more decode steps."""
        if len(slots) == 0 or steps <= 0:
            return 0
        need = -(-(self.nkv[slots] + steps) // self.page) - self.blk[slots]
        return int(np.maximum(need, 0).sum())

    def apply_decode(self, slots: I64, steps: int, end_s: float, outcome: StepOutcome) -> None:
        """Advance decoding slots by `steps` tokens (blocks were checked by the caller)."""
        if steps <= 0 or len(slots) == 0:
            return
        # decode_state's gather when these are its slots: nothing changes a decoding slot's nkv before its burst is applied
        nkv = (self.decoding_nkv if slots is self.decoding_slots else self.nkv[slots]) + steps
        blk = self.blk[slots]
        # blk + max(⌈nkv/page⌉ − blk, 0): extra_blocks' sum (a page of one token: ⌈nkv/1⌉ is nkv)
        grown = np.maximum(blk, nkv) if self.page == 1 else np.maximum(blk, (nkv + self.page_less_1_0d) // self.page_0d)
        ok = self.pool.allocate(int(np.add.reduce(grown - blk)))   # integers: the same count as Σ grown − Σ blk
        assert ok, "decode burst over the pool"
        self.blk[slots] = grown
        self.nkv[slots] = nkv
        self.target[slots] = nkv
        if steps == 1:
            self.emit_tokens(slots, end_s, outcome)
            return
        # emit_tokens after a burst of 2+ steps: no first token among them
        out = self.out[slots] + steps
        self.out[slots] = out
        if slots is self.decoding_slots and steps < self.decoding_left:  # none of them reached its last token
            return
        done = slots[out >= self.out_total[slots]]
        if len(done):
            self._done(done, end_s, outcome)
