"""SGLang scheduling policy for one rank: separate prefill (extend) and decode batches, token-level pool.

Follows SGLang's scheduler loop (`get_next_batch_to_run`, `PrefillAdder`, `retract_decode`): a prefill
batch runs whenever the queue yields one (decodes wait for it); it is filled FCFS up to
`chunked_prefill_size` new tokens (per attention-DP rank: the server's value // attn_dp_size; the last request chunked) while `max_running_requests` allows and
the pool, less a reserve of `new_token_ratio` × the remaining outputs of running requests, holds the
request and its own reserve. Otherwise every running request decodes; when the pool cannot hold one
more token each, requests with the fewest outputs (longest input on ties) are retracted to recompute.
The ratio starts at 0.7, decays to 0.098 over 600 decode steps and is re-estimated on retraction.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from servingtopology.planner.engines.caps import chunk_tokens_per_rank
from servingtopology.planner.layout import Engine, EngineKnobs
from servingtopology.planner.sim.rank import Rank
from servingtopology.planner.sim.vllm import Planned, batch_of

__all__ = ["SglangPolicy"]

I64 = npt.NDArray[np.int64]
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
DECAY_STEPS = 600
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
MAX_PREFILL_TOKENS = 16384
MAX_BURST_STEPS = 8192
SCALAR_STEPS = 64   # _steps_until_admissible on Python floats up to this many steps (the same operations as on arrays)


class SglangPolicy:
    """SGLang scheduler state of one rank: the new-token ratio that sizes the decode reserve."""

    def __init__(self, knobs: EngineKnobs, *, attn_dp: int = 1) -> None:
        # Under attention DP each rank's chunk is the server's --chunked-prefill-size // --attn-dp-size
        # (engine_caps.chunk_tokens_per_rank, from SGLang's parallel_hook).
        self.chunk = int(chunk_tokens_per_rank(Engine.SGLANG, int(knobs.max_num_batched_tokens), attn_dp))
        self.max_prefill = max(MAX_PREFILL_TOKENS, self.chunk)
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / DECAY_STEPS

    def _reserve(self, rank: Rank, ratio: float) -> float:
        h = rank.high  # every running sequence's slot is below it
        live = rank.active[:h]
        left = np.minimum(rank.out_total[:h][live] - rank.out[:h][live], CLIP_MAX_NEW_TOKENS)
        return float(left.sum()) * ratio

    def _head_fits(self, rank: Rank, rem_total: float, ratio: float) -> tuple[bool, int, int, int]:
        rid = rank.waiting[0]
        hk, hr = rank.hits(rid)
        done = rank.ledger.out_done[rid]
        extend = rank.prompt_of[rid] + done - (hk + hr) * rank.page
        reserve = min(rank.output_of[rid] - done, CLIP_MAX_NEW_TOKENS) * ratio
        return extend + reserve < rem_total, hk, hr, extend

    def schedule(self, rank: Rank, now_s: float) -> Planned:
        """A prefill batch if the queue yields one, else a decode step over every running request."""
        slots: list[int] = []
        news: list[int] = []
        rem_chunk, rem_input = self.chunk, self.max_prefill
        chunked = rank.prefilling_slots()
        blocked_by_chunk = False
        for s in chunked:
            n = min(int(rank.target[s] - rank.nkv[s]), rem_chunk)
            if n <= 0:
                continue
            if not rank.grow(s, n):  # decodes took the room its next chunk needed: retract it
                rank.preempt(s, now_s)
                continue
            slots.append(s)
            news.append(n)
            rem_chunk -= n
            rem_input -= n
            blocked_by_chunk = blocked_by_chunk or n < int(rank.target[s] - rank.nkv[s])
        rem_total = rank.pool.free - self._reserve(rank, self.ratio)
        while rank.waiting and not blocked_by_chunk and rem_chunk > 0 and rem_input > 0 and rank.running < rank.capacity:
            fits, hk, hr, extend = self._head_fits(rank, rem_total, self.ratio)
            if not fits:
                if rank.running == 0 and not slots and extend > rank.pool.total:
                    rank.waiting.popleft()  # larger than the whole pool: never admissible
                    rank.outstanding -= 1
                    continue
                break
            rid = rank.waiting.popleft()
            n = min(extend, rem_chunk)
            slot = rank.admit(rid, hk=hk, hr=hr, now_s=now_s)
            held = hk + hr   # admit set the slot's nkv to held·page and its blocks to held: grow(slot, n) without reading them back
            need = -(-(held * rank.page + n) // rank.page) - held
            if need > 0 and rank.pool.allocate(need):
                rank.blk[slot] = held + need
            elif need > 0:  # reserve arithmetic said yes but the pool is fragmented by pins
                rank.preempt(slot, now_s)
                rank.ledger.preemptions[rid] -= 1
                rank.ledger.preemptions_total -= 1
                rank.ledger.preemption_times_s.pop()
                break
            slots.append(slot)
            news.append(n)
            rem_total -= extend + min(rank.output_of[rid] - rank.ledger.out_done[rid], CLIP_MAX_NEW_TOKENS) * self.ratio
            rem_chunk -= n
            rem_input -= n
            blocked_by_chunk = n < extend
        if slots:
            s_arr, n_arr = np.asarray(slots, dtype=np.int64), np.asarray(news, dtype=np.int64)
            return Planned(batch_of(rank, s_arr, n_arr), s_arr, n_arr)
        return self._decode(rank, now_s)

    def _decode(self, rank: Rank, now_s: float) -> Planned:
        dec = np.flatnonzero(rank.decode_mask())
        retracted = False
        while len(dec) and rank.extra_blocks(dec, 1) > rank.pool.free:
            keys = rank.out[dec] * (1 << 32) - rank.prompt[rank.rid[dec]]
            victim = int(dec[np.argmin(keys)])
            rank.preempt(victim, now_s)
            retracted = True
            dec = np.flatnonzero(rank.decode_mask())
        if retracted and len(dec):
            decoded = float(rank.out[dec].sum())
            max_new = float(rank.out_total[dec].sum())
            self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(dec)) / max(max_new, 1.0))
        if len(dec):
            need = np.maximum(-(-(rank.nkv[dec] + 1) // rank.page) - rank.blk[dec], 0)
            rank.pool.allocate(int(need.sum()))
            rank.blk[dec] += need
            self.after_decode_steps(rank, 1)
        new = np.ones(len(dec), dtype=np.int64)
        return Planned(batch_of(rank, dec, new), dec, new)

    def after_decode_steps(self, rank: Rank, steps: int) -> None:
        self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - self.decay * steps)

    def burst_limit(self, rank: Rank, slots: I64, decoding: int) -> tuple[int, bool]:
        """Decode steps this rank runs before anything changes; zero when the next step is a prefill."""
        # called right after rank.decode_state(): a ready sequence that is not decoding is prefilling (rank.prefilling())
        if decoding == 0 or rank.live_at_decode_state > decoding:
            return 0, False
        if rank.remote and rank.running < rank.capacity and rank.blocks_for(int(rank.prompt[rank.remote[0]])) <= rank.pool.free:
            return 0, False
        out_left = rank.out_total[slots] - rank.out[slots]
        left = int(np.minimum.reduce(out_left))
        if slots is rank.decoding_slots:
            rank.decoding_left = left  # apply_decode of a burst shorter than this finishes nobody
        k_max = min(left, MAX_BURST_STEPS)
        free = rank.pool.free
        if rank.page == 1:
            k_max = min(k_max, free // max(decoding, 1))
        else:
            while k_max > 0 and rank.extra_blocks(slots, k_max) > free:
                k_max //= 2
        if k_max <= 0:
            return 0, False
        open_to_arrivals = not rank.waiting and not rank.remote and rank.running < rank.capacity
        if rank.waiting and rank.running < rank.capacity:
            k_max = min(k_max, self._steps_until_admissible(rank, slots, decoding, k_max))
        return k_max, open_to_arrivals

    def chunk_run_limit(self, rank: Rank) -> tuple[int, int, int]:
        """(steps, slot, chunk): the steps in which `schedule` takes one full chunk of the one prompt this rank is
        prefilling and nothing else, then (slot, chunk) of that prompt; steps 0 when it is not so. A chunk shorter
        than the prompt's rest blocks admission behind it (blocked_by_chunk), so each such step is one chunk, as long
        as the pool holds them all (page 1: a token a block) and no prefilled request waits for room (`remote`)."""
        if rank.remote or self.chunk > self.max_prefill:
            return 0, 0, 0
        pre = rank.prefilling_slots()
        if len(pre) != 1:
            return 0, 0, 0
        slot = pre[0]
        nkv, blk = int(rank.nkv[slot]), int(rank.blk[slot])
        steps = (int(rank.target[slot]) - nkv - 1) // self.chunk   # the rest stays longer than a chunk
        if rank.page != 1 or nkv + steps * self.chunk - blk > rank.pool.free:
            return 0, 0, 0
        return steps, slot, self.chunk

    def decode_run_limit(self, rank: Rank, slots: I64, decoding: int) -> int:
        """Decode steps `schedule` runs on this rank with nothing else changing while another rank prefills: no
        prompt here, nobody queued (no admission to try), no request reaching its last token, the pool holding every
        token (no retraction)."""
        if decoding == 0 or rank.waiting or rank.remote or rank.page != 1 or rank.prefilling():
            return 0
        steps = min(int(np.minimum.reduce(rank.out_total[slots] - rank.out[slots])) - 1, MAX_BURST_STEPS)
        free = rank.pool.free
        slack = rank.blk[slots] - rank.nkv[slots]
        if not slack.any():
            return max(0, min(steps, free // decoding))
        while steps > 0 and rank.extra_blocks(slots, steps) > free:
            steps //= 2
        return max(0, steps)

    def _steps_until_admissible(self, rank: Rank, slots: I64, decoding: int, k_max: int) -> int:
        """Decode steps before the queue head fits (the reserve shrinks as outputs grow and the ratio decays).

        For each k = 0 … k_max: the head's prompt and reserve against the pool left after k steps less the running
        requests' reserve then. Up to SCALAR_STEPS steps (most calls: half answer 0, the median k_max is 3) the same
        float operations run on Python floats, stopping at the first k that fits; beyond that, on arrays."""
        left = np.minimum(rank.out_total[slots] - rank.out[slots], CLIP_MAX_NEW_TOKENS).astype(np.float64)
        if rank.running == decoding:   # every running sequence decodes (slots are all of them): nothing else reserves
            left_others = 0.0
        else:
            others = rank.active.copy()
            others[slots] = False
            left_others = float(np.minimum(rank.out_total[others] - rank.out[others], CLIP_MAX_NEW_TOKENS).sum())
        rid = rank.waiting[0]
        hk, hr = rank.hits(rid)
        done = rank.ledger.out_done[rid]
        extend = float(rank.prompt_of[rid] + done) - (hk + hr) * rank.page
        own_tokens = min(float(rank.output_of[rid] - done), CLIP_MAX_NEW_TOKENS)
        free_now = rank.pool.free   # page 1: one token per sequence per step
        if (k_max + 1) * len(left) < 2_000_000 and float(np.minimum.reduce(left)) < k_max:   # a count runs out within k_max steps
            k = np.arange(0, k_max + 1, dtype=np.float64)
            ratio = np.maximum(MIN_NEW_TOKEN_RATIO, self.ratio - self.decay * k)
            reserve = ratio * (np.maximum(left[None, :] - k[:, None], 0.0).sum(axis=1) + left_others)
        else:   # Σ max(left − k, 0) is Σ left − n·k for every k when no count runs out (k_max ≤ each): whole numbers, exact
            total = float(left.sum())
            if k_max <= SCALAR_STEPS:
                for j in range(k_max + 1):
                    kf = float(j)
                    r = max(MIN_NEW_TOKEN_RATIO, self.ratio - self.decay * kf)
                    if extend + own_tokens * r < (free_now - decoding * kf) - r * (total - decoding * kf + left_others):
                        return j
                return k_max
            k = np.arange(0, k_max + 1, dtype=np.float64)
            ratio = np.maximum(MIN_NEW_TOKEN_RATIO, self.ratio - self.decay * k)
            reserve = ratio * (total - decoding * k + left_others)
        free = free_now - decoding * k
        ok = np.flatnonzero(extend + own_tokens * ratio < free - reserve)
        return int(ok[0]) if len(ok) else k_max
