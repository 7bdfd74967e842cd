"""One engine instance: its attention-DP ranks stepping in lockstep, timed by a `StepTimeModel`.

Called by the event loop (cluster.py). A segment is either one step (any batch) or a burst of pure
decode steps during which nothing changes but lengths; a burst's step times come from three model
calls when the model is linear in the summed context (checked), else from one call per step. A burst
that an arrival could join is cut at the step in flight when that arrival lands. Under SGLang attention DP,
while ranks prefill long prompts chunk by chunk beside ranks that decode, a chunk run (ChunkRunAdvance) plans
those steps without the schedulers: still one step a segment, with the same batches, times, gaps and samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servingtopology.planner.engines.defaults import cuda_graph_tokens
from servingtopology.planner.layout import Engine, Role, RoleLayout
from servingtopology.planner.perf.step import StepTimeModel, attention_dp_moe_tokens
from servingtopology.planner.sim.kvcache import KvPool
from servingtopology.planner.sim.ledger import Ledger
from servingtopology.planner.sim.rank import Rank, StepBatch, StepOutcome
from servingtopology.planner.sim.sglang import SglangPolicy
from servingtopology.planner.sim.vllm import Planned, VllmPolicy, admit_remote, finish_step

__all__ = ["Instance"]

MAX_RUN_STEPS = 8192

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class _Burst:
    slots: list[I64]
    counts: list[int]
    ends_s: F64
    durations_s: F64
    steps: int
    open_to_arrivals: bool


@dataclass(slots=True)
class _ChunkRun:
    """Steps determined while some ranks prefill one long prompt each, a full chunk a step, and the others decode or
    idle (ChunkRunAdvance). The prefilling ranks' chunks are applied step by step, as `schedule` and `finish_step`
    would; the decoding ranks' tokens and blocks only when the run ends (`Instance._end_run`), and `extra` says the
    blocks they hold by then, for the timeline."""

    steps: int
    prefill: list[tuple[Rank, int, int]]             # (rank, slot, chunk)
    decode: list[tuple[Rank, SglangPolicy, I64, int, int, I64]]  # (rank, policy, slots, decoding, Σ nkv, blocks after j steps)
    gathered: dict[str, float]                       # every step's `moe_tokens` (the same batches each step), or empty
    done: int = 0
    open: bool = True                                # False once anything outside the run touched the instance

    def extra(self) -> int:
        return sum(int(grown[self.done]) for *_, grown in self.decode)


_STEP_INDEX = np.arange(8193)  # 0, 1, ... for the burst's linear step times (bursts are at most 8,192 steps)
_STEP_INDEX.flags.writeable = False


def _burst_times(model: StepTimeModel, *, decoding: int, context0: int, steps: int,
                 probe: Callable[[float, float], float] | None = None) -> F64:
    """Step times of `steps` decode steps of `decoding` sequences whose summed context starts at context0 (probe: the model's
    `decode_s` when the caller has looked it up)."""
    if probe is None:
        probe = getattr(model, "decode_s", None)   # the same floats without the keyword call
    if probe is None:
        def probe(d: float, context: float) -> float:
            return model.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=d, decode_context_tokens=context)
    d = float(decoding)
    if steps <= 2:
        return np.array([float(probe(d, float(context0 + decoding * j))) for j in range(1, steps + 1)])
    mid_j = (steps + 1) // 2
    first = float(probe(d, float(context0 + decoding)))
    last = float(probe(d, float(context0 + decoding * steps)))
    mid = float(probe(d, float(context0 + decoding * mid_j)))
    expect = first + (last - first) * (mid_j - 1) / (steps - 1)
    if abs(mid - expect) <= 1e-9 * max(abs(mid), 1e-12):
        index = _STEP_INDEX[:steps] if steps <= len(_STEP_INDEX) else np.arange(steps)
        times: F64 = first + (last - first) * index / (steps - 1)
        return times
    return np.array([float(probe(d, float(context0 + decoding * j))) for j in range(1, steps + 1)])


class Instance:
    """An engine instance of a role; `dp` ranks each with its own pool and scheduler."""

    def __init__(self, *, index: int, role: Role, role_layout: RoleLayout, engine: Engine, model: StepTimeModel,
                 pool_tokens: int, ledger: Ledger) -> None:
        knobs = role_layout.knobs
        self.index = index
        self.role = role
        self.model = model
        self._batch_s: Callable[[StepBatch], float] | None = getattr(model, "batch_s", None)  # RememberedSteps': the same floats
        # the burst probe, looked up once (a RememberedSteps' decode_probe: its model's own, unremembered)
        self._decode_s: Callable[[float, float], float] | None = getattr(model, "decode_probe", None) or getattr(model, "decode_s", None)
        self.ledger = ledger
        self.gpus = role_layout.parallelism.gpus
        page = knobs.block_size_tokens if engine is Engine.VLLM else 1
        self.ranks = [
            Rank(index=r, capacity=knobs.max_num_seqs, role=role, ledger=ledger, dedup=engine is not Engine.VLLM,
                 pool=KvPool(pool_tokens // page, page_tokens=page, caching=knobs.enable_prefix_caching))
            for r in range(role_layout.parallelism.dp)
        ]
        self.policies: list[VllmPolicy | SglangPolicy] = [
            VllmPolicy(knobs) if engine is Engine.VLLM else SglangPolicy(knobs, attn_dp=role_layout.parallelism.dp) for _ in self.ranks
        ]
        self._vllm = engine is Engine.VLLM  # VllmPolicy ranks (their after_decode_steps does nothing)
        # Attention-DP ranks of a MoE model: the tokens their experts route in a step follow the engine's gather
        # (`attention_dp_moe_tokens`), not always every rank padded to the largest rank's batch
        self._gather = len(self.ranks) > 1 and bool(getattr(model, "gathers_experts", False))
        self._graph_tokens = float(cuda_graph_tokens(engine, knobs.max_num_seqs, knobs.max_num_batched_tokens))
        self.busy = False
        self.end_s = 0.0
        self.version = 0
        self._burst: _Burst | None = None
        self._run: _ChunkRun | None = None
        self._burst_ranks: list[int] = []
        self._pending = StepOutcome([], [], [])
        self._loading: dict[int, tuple[int, int]] = {}  # rid -> (rank, slot) while its KV arrives
        self.transfers: list[int] = []  # rids whose KV transfer may start now (PD decode)
        self.steps = 0

    # ---- routing -------------------------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return sum(r.outstanding for r in self.ranks)

    def _rank_for(self) -> Rank:
        return min(self.ranks, key=lambda r: (r.outstanding, r.index))

    def enqueue(self, rid: int) -> Rank:
        if self._run is not None:
            self._run.open = False
        rank = self._rank_for()
        rank.waiting.append(rid)
        rank.outstanding += 1
        return rank

    def enqueue_remote(self, rid: int) -> Rank:
        if self._run is not None:
            self._run.open = False
        rank = self._rank_for()
        rank.remote.append(rid)
        rank.outstanding += 1
        return rank

    def kv_arrived(self, rid: int) -> None:
        if self._run is not None:
            self._run.open = False
        r, slot = self._loading.pop(rid)
        self.ranks[r].ready[slot] = True

    # ---- segments ------------------------------------------------------------------------------------
    def _moe_tokens(self, tokens: list[float], extend: bool) -> float | None:
        """The tokens every rank's experts route in a step whose ranks schedule `tokens` (a rank with nothing scheduled: 0),
        where the engine does not pad them to the largest rank's batch; None where it does (the step model's default)."""
        if not self._gather:
            return None
        got = float(attention_dp_moe_tokens(sum(tokens), max(tokens), len(self.ranks), sglang=not self._vllm, extend=extend,
                                            graph_tokens=self._graph_tokens))
        return None if math.isnan(got) else got

    def plan(self, now_s: float, *, horizon_s: float = float("inf")) -> float | None:
        """Start the next segment at now_s; return its end, or None when there is nothing to run."""
        if len(self.ranks) == 1:
            return self._plan_one(now_s, horizon_s)
        if self._run is not None:
            if self._run.open and self._run.done < self._run.steps:
                return self._run_step(now_s)
            self._end_run(now_s)
        if not any(rank.running or rank.waiting or rank.remote for rank in self.ranks):
            # Nothing admitted, queued or arriving: the schedulers below would plan an empty step and change nothing
            # (a PD prefill instance woken by a finished KV transfer, a decode instance between requests).
            self.busy = False
            return None
        for r, rank in enumerate(self.ranks):
            for rid, slot in admit_remote(rank, now_s) if rank.remote else []:
                self._loading[rid] = (r, slot)
                self.transfers.append(rid)
        states = [rank.decode_state() for rank in self.ranks]
        limits = [pol.burst_limit(rank, st[0], st[1]) for pol, rank, st in zip(self.policies, self.ranks, states, strict=True)]
        active = [i for i, st in enumerate(states) if st[1] > 0 or self.ranks[i].running or self.ranks[i].waiting]
        if active and all(limits[i][0] >= 2 for i in active):
            steps = min(limits[i][0] for i in active)
            moe = self._moe_tokens([float(st[1]) for st in states], False)
            probe = None if moe is None else self._gathered_probe(moe)
            each = [_burst_times(self.model, decoding=states[i][1], context0=states[i][2], steps=steps, probe=probe) for i in active]
            times = each[0] if len(each) == 1 else np.max(each, axis=0)
            return self._start_burst(now_s, horizon_s, active, [states[i][0] for i in active], [states[i][1] for i in active],
                                     times, steps, any(limits[i][1] for i in active))
        if not self._vllm and self._start_run(states):
            return self._run_step(now_s)
        planned = [pol.schedule(rank, now_s) for pol, rank in zip(self.policies, self.ranks, strict=True)]
        for _ in range(3):  # a step that only evicted (freeing room) is followed at once by one that runs
            if any(not p.batch.empty for p in planned) or not any(r.running or r.waiting for r in self.ranks):
                break
            planned = [pol.schedule(rank, now_s) for pol, rank in zip(self.policies, self.ranks, strict=True)]
        moe = self._moe_tokens([p.batch.prefill_tokens + p.batch.decode_tokens for p in planned],
                               any(p.batch.prefill_tokens > 0 for p in planned)) if self._gather else None
        gathered = {} if moe is None else {"moe_tokens": moe}
        durations = [self.model.step_time_s(prefill_tokens=p.batch.prefill_tokens, prefill_pairs=p.batch.prefill_pairs,
                                            decode_tokens=p.batch.decode_tokens, decode_context_tokens=p.batch.decode_context_tokens,
                                            **gathered)
                     for p in planned if not p.batch.empty]
        if not durations:
            self.busy = False
            return None
        duration = max(durations)
        end = now_s + duration
        self._finish_single(planned, end, duration)
        self.busy, self.end_s = True, end
        return end

    def _gathered_probe(self, moe: float) -> Callable[[float, float], float]:
        """A decode burst's probe with the ranks' gathered expert tokens (`_moe_tokens`) priced in."""
        step_time_s = self.model.step_time_s

        def probe(d: float, context: float) -> float:
            return step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=d, decode_context_tokens=context,
                               moe_tokens=moe)  # type: ignore[call-arg]
        return probe

    def _start_run(self, states: list[tuple[I64, int, int]]) -> bool:
        """ChunkRunAdvance: whether the next steps are a chunk run of at least 2 steps (then it is set up).

        Every rank is one of: prefilling one prompt whose rest outlasts its chunk (SglangPolicy.chunk_run_limit),
        decoding with nothing queued, no finish and room for every token (decode_run_limit), or idle with nothing
        queued. Anything else (a rank admitting, finishing, retracting, receiving KV) steps one at a time."""
        if all(rank.live_at_decode_state == st[1] for rank, st in zip(self.ranks, states, strict=True)):
            return False   # every running sequence decodes: no rank prefills (decode_state counted them just now)
        prefill: list[tuple[Rank, int, int]] = []
        decode: list[tuple[Rank, SglangPolicy, I64, int, int, I64]] = []
        steps = MAX_RUN_STEPS
        for pol, rank, (slots, decoding, context) in zip(self.policies, self.ranks, states, strict=True):
            assert isinstance(pol, SglangPolicy)
            k, slot, chunk = pol.chunk_run_limit(rank)
            if k > 0:
                prefill.append((rank, slot, chunk))
            elif decoding > 0:
                k = pol.decode_run_limit(rank, slots, decoding)
                decode.append((rank, pol, slots, decoding, context, np.zeros(0, dtype=np.int64)))
            elif rank.waiting or rank.remote or rank.prefilling():
                return False
            else:
                continue   # idle
            if k < 2:
                return False
            steps = min(steps, k)
        if not prefill:
            return False
        j = np.arange(steps + 1, dtype=np.int64)
        for i, (rank, pol, slots, decoding, context, _) in enumerate(decode):
            slack = rank.blk[slots] - rank.nkv[slots]   # page 1: a token a block
            grown = decoding * j if not slack.any() else np.maximum(j[:, None] - slack[None, :], 0).sum(axis=1)
            decode[i] = (rank, pol, slots, decoding, context, grown)
        moe = self._moe_tokens([float(chunk) for _, _, chunk in prefill] + [float(d) for _, _, _, d, _, _ in decode], True)
        self._run = _ChunkRun(steps, prefill, decode, {} if moe is None else {"moe_tokens": moe})
        return True

    def _run_step(self, now_s: float) -> float:
        """The next step of the chunk run: the batches, time, gaps and state changes a scheduled step would have."""
        run = self._run
        assert run is not None
        step_time_s = self.model.step_time_s
        durations = []
        gathered = run.gathered
        for rank, slot, chunk in run.prefill:
            context = int(rank.nkv[slot])
            ok = rank.grow(slot, chunk)
            assert ok, "chunk run over the pool"
            c = float(chunk)
            durations.append(step_time_s(prefill_tokens=c, prefill_pairs=c * (float(context) + c / 2.0), decode_tokens=0.0,
                                         decode_context_tokens=0.0, **gathered))   # batch_of's floats
            rank.nkv[slot] = context + chunk
        run.done += 1
        for _, _, _, decoding, context, _ in run.decode:
            durations.append(step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=float(decoding),
                                         decode_context_tokens=float(context + decoding * run.done), **gathered))
        duration = max(durations)
        end = now_s + duration
        for rank, pol, _, decoding, _, _ in run.decode:
            pol.after_decode_steps(rank, 1)
            self.ledger.gap(duration, decoding)
        self.steps += 1
        self.busy, self.end_s = True, end
        return end

    def _end_run(self, now_s: float) -> None:
        """Apply the chunk run's decode tokens and blocks (what its steps did, one by one) and leave it."""
        run = self._run
        assert run is not None
        for rank, _, slots, _, _, _ in run.decode:
            rank.apply_decode(slots, run.done, now_s, self._pending)
        self._run = None

    def _plan_one(self, now_s: float, horizon_s: float) -> float | None:
        """`plan` of an instance with one rank (the common case), without the per-rank lists."""
        rank, pol = self.ranks[0], self.policies[0]
        if rank.remote:
            for rid, slot in admit_remote(rank, now_s):
                self._loading[rid] = (0, slot)
                self.transfers.append(rid)
        elif not rank.waiting and len(rank.free_slots) == rank.capacity:
            self.busy = False  # nothing admitted, queued or arriving (see plan)
            return None
        if self._vllm:
            assert isinstance(pol, VllmPolicy)
            fits = pol.head_fits(rank)
            burst = not (fits and pol.admits_head(rank, fits))  # else no burst: the step admits
        else:
            fits, burst = None, True
        if burst:
            slots, decoding, context0 = rank.decode_state()
            steps, open_to_arrivals = pol.burst_limit(rank, slots, decoding, head_fits=fits) if isinstance(pol, VllmPolicy) \
                else pol.burst_limit(rank, slots, decoding)
            if steps >= 2 and (decoding > 0 or rank.running or rank.waiting):
                times = _burst_times(self.model, decoding=decoding, context0=context0, steps=steps, probe=self._decode_s)
                return self._start_burst(now_s, horizon_s, [0], [slots], [decoding], times, steps, open_to_arrivals)
        p = pol.schedule(rank, now_s)
        for _ in range(3):  # a step that only evicted (freeing room) is followed at once by one that runs
            b = p.batch
            if b.prefill_tokens != 0 or b.decode_tokens != 0 or not (rank.running or rank.waiting):
                break
            p = pol.schedule(rank, now_s)
        b = p.batch
        if b.prefill_tokens == 0 and b.decode_tokens == 0:
            self.busy = False
            return None
        duration = self._batch_s(b) if self._batch_s is not None else \
            self.model.step_time_s(prefill_tokens=b.prefill_tokens, prefill_pairs=b.prefill_pairs, decode_tokens=b.decode_tokens,
                                   decode_context_tokens=b.decode_context_tokens)
        end = now_s + duration
        finish_step(rank, p, end, self._pending)  # _finish_single of one rank
        if b.decode_tokens:
            self.ledger.gap(duration, b.decode_tokens)
        self.steps += 1
        self.busy, self.end_s = True, end
        return end

    def _start_burst(self, now_s: float, horizon_s: float, active: list[int], slots: list[I64], counts: list[int], times: F64,
                     steps: int, open_to_arrivals: bool) -> float:
        """Begin a burst of `steps` decode steps on the `active` ranks (cut at the horizon)."""
        ends = now_s + times.cumsum()
        if horizon_s != math.inf and ends[-1] > horizon_s:
            steps = max(1, int(np.searchsorted(ends, horizon_s, side="left")) + 1)
            steps = min(steps, len(ends))
            times, ends = times[:steps], ends[:steps]
        self._burst = _Burst(slots, counts, ends, times, steps, open_to_arrivals)
        self._burst_ranks = active
        self.busy, self.end_s = True, float(ends[-1])
        return self.end_s

    def _finish_single(self, planned: list[Planned], end_s: float, duration_s: float) -> None:
        for rank, p in zip(self.ranks, planned, strict=True):
            decoders = int(p.batch.decode_tokens)
            finish_step(rank, p, end_s, self._pending)
            if decoders:
                self.ledger.gap(duration_s, decoders)
        self.steps += 1

    def truncate(self, t_s: float) -> float | None:
        """An arrival at t_s could join: end an open burst after the step in flight. New end or None."""
        b = self._burst
        if b is None or not b.open_to_arrivals or t_s >= self.end_s:
            return None
        k = int(np.searchsorted(b.ends_s, t_s, side="left")) + 1
        if k >= b.steps:
            return None
        b.steps = k
        self.end_s = float(b.ends_s[k - 1])
        return self.end_s

    def cut(self, t_s: float) -> float | None:
        """Like `truncate`, for events every burst must see (a decode's KV has arrived)."""
        b = self._burst
        if b is not None:
            b.open_to_arrivals = True
        return self.truncate(t_s)

    def commit(self) -> StepOutcome:
        """Apply the segment that ends now and hand back what became visible."""
        b = self._burst
        if b is not None and len(self.ranks) == 1:
            rank = self.ranks[0]
            rank.apply_decode(b.slots[0], b.steps, self.end_s, self._pending)
            if not self._vllm:
                self.policies[0].after_decode_steps(rank, b.steps)
            self.ledger.gaps(b.durations_s[:b.steps], b.counts[0])
            self.steps += b.steps
            self._burst = None
        elif b is not None:
            for i, slots, count in zip(self._burst_ranks, b.slots, b.counts, strict=True):
                rank = self.ranks[i]
                rank.apply_decode(slots, b.steps, self.end_s, self._pending)
                self.policies[i].after_decode_steps(rank, b.steps)
                self.ledger.gaps(b.durations_s[:b.steps], count)
            self.steps += b.steps
            self._burst = None
        out = self._pending
        if out.finished or out.prefilled or out.first_tokens:  # else the empty outcome is handed back and kept
            self._pending = StepOutcome([], [], [])
        if len(self.ranks) == 1:
            r = self.ranks[0]
            used, total, running, waiting = r.pool.in_use, r.pool.total, r.running, len(r.waiting) + len(r.remote)
        else:
            used = sum(r.pool.in_use for r in self.ranks) + (self._run.extra() if self._run is not None else 0)
            total = sum(r.pool.total for r in self.ranks)
            running, waiting = sum(r.running for r in self.ranks), sum(len(r.waiting) + len(r.remote) for r in self.ranks)
        self.ledger.sample(self.end_s, self.index, used / total if total else 0.0, running, waiting)
        self.busy = False
        return out

    def release_held(self, rid: int) -> None:
        if self._run is not None:
            self._run.open = False
        for rank in self.ranks:
            if rank.holds(rid):
                rank.release_held(rid)
                return
