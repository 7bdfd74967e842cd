"""The discrete-event loop: arrivals, instance segments, PD KV transfers, closed-loop clients.

Called by `simulate`. Events are processed in time order (ties by insertion); an instance's segment end
is an event, re-issued with a new version when an arrival cuts a burst short. Idle time costs nothing:
the clock jumps to the next event. An idle instance woken by an event plans its step once every event of
that instant is in, so requests arriving together start together (vLLM's engine core drains its whole
input queue before it schedules a step: `EngineCoreProc._process_input_queue`, vllm/v1/engine/core.py).
Under PD, a request prefilled on a prefill instance is handed to a decode instance (router), which
reserves its KV blocks when its pool has room; the KV then crosses the link (FIFO per prefill instance)
and the first token is delivered when it lands.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from servingtopology.planner.sim.instance import Instance
from servingtopology.planner.sim.ledger import Ledger
from servingtopology.planner.sim.rank import StepOutcome
from servingtopology.planner.sim.router import Router, RouterPolicy

__all__ = ["EventLoop"]

_STEP, _ISSUE, _KV = 0, 1, 2
PROGRESS_SHARE = 0.01   # a progress callback hears of every 1 % of the requests finished (at most ~100 calls a run)


class EventLoop:
    """Runs instances of one deployment over a request set until every request is done or time runs out."""

    def __init__(self, *, ledger: Ledger, front: Sequence[Instance], decode: Sequence[Instance], router: RouterPolicy,
                 transfer_s: Callable[[int], float], max_time_s: float, progress: Callable[[int], None] | None = None) -> None:
        self.ledger = ledger
        self.front = list(front)
        self.decode = list(decode)
        self.every = self.front + self.decode
        self.front_router = Router(router, self.front)
        self.decode_router = Router(RouterPolicy.LEAST_OUTSTANDING if router is RouterPolicy.PREFIX_AFFINITY else router, self.decode)
        self.transfer_s = transfer_s
        self.max_time_s = max_time_s
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._link_free_s = [0.0] * len(self.front)
        self._prefill_of: dict[int, int] = {}
        self._wake: list[Instance] = []  # idle instances woken at the current instant, to plan once it is over
        # SimulationProgress: `progress(finished)` about every PROGRESS_SHARE of the requests, and once at the end.
        self._progress = progress
        self._finished = 0
        self._report_every = max(1, int(len(ledger.requests) * PROGRESS_SHARE))
        self._next_report = self._report_every
        req = ledger.requests
        self._clients: list[deque[int]] = []
        if req.closed_loop:
            self._clients = [deque() for _ in range(req.num_clients)]
            for rid in range(len(req)):
                self._clients[int(req.client[rid])].append(rid)

    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _kick(self, inst: Instance, t: float, *, must_see: bool = False) -> None:
        """Wake an idle instance (it plans once the instant is over), or cut its burst so the news is seen at the
        next step boundary."""
        if not inst.busy:
            if inst not in self._wake:
                self._wake.append(inst)
            return
        new_end = inst.cut(t) if must_see else inst.truncate(t)
        if new_end is not None:
            inst.version += 1
            self._push(new_end, _STEP, self.every.index(inst), inst.version)

    def _plan_woken(self, t: float) -> None:
        """Every event at `t` is in: the idle instances it woke plan their first step."""
        woken, self._wake = self._wake, []
        for inst in woken:
            if inst.busy:
                continue
            end = inst.plan(t, horizon_s=self.max_time_s)
            self._after_plan(inst, t)
            if end is not None:
                inst.version += 1
                self._push(end, _STEP, self.every.index(inst), inst.version)

    def _after_plan(self, inst: Instance, t: float) -> None:
        for rid in inst.transfers:
            p = self._prefill_of[rid]
            start = max(t, self._link_free_s[p])
            done = start + self.transfer_s(rid)
            self._link_free_s[p] = done
            self._push(done, _KV, self.decode.index(inst), rid)
        inst.transfers.clear()

    def _issue(self, rid: int, t: float) -> None:
        self.ledger.arrival_s[rid] = t
        i = self.front_router.pick(int(self.ledger.requests.prefix_key[rid]))
        inst = self.front[i]
        inst.enqueue(rid)
        self._prefill_of[rid] = i
        self._kick(inst, t)

    def _outcome(self, inst: Instance, out: StepOutcome, t: float) -> None:
        req = self.ledger.requests
        for rid in out.prefilled:
            j = self.decode_router.pick(int(req.prefix_key[rid]))
            dec = self.decode[j]
            dec.enqueue_remote(rid)
            self._kick(dec, t)
        if self._clients:
            for rid in out.finished:
                c = int(req.client[rid])
                if self._clients[c]:
                    self._push(t + req.think_s, _ISSUE, self._clients[c].popleft())

    def run(self) -> float:
        """Simulate to completion (or max_time_s); returns the simulated end time."""
        req = self.ledger.requests
        if self._clients:
            for q in self._clients:
                if q:
                    self._push(0.0, _ISSUE, q.popleft())
            arrivals = np.zeros(0)
            order = np.zeros(0, dtype=np.int64)
        else:
            order = np.argsort(req.arrival_s, kind="stable")
            arrivals = req.arrival_s[order]
        arrival_list: list[float] = arrivals.tolist()  # the same floats, read without numpy scalars
        order_list: list[int] = order.tolist()
        ptr, n_open = 0, len(arrival_list)
        now = 0.0
        while True:
            t_arr = arrival_list[ptr] if ptr < n_open else math.inf
            t_ev = self._heap[0][0] if self._heap else math.inf
            t = t_arr if t_arr <= t_ev else t_ev  # min(t_arr, t_ev)
            if self._wake and t > now:
                self._plan_woken(now)
                continue
            if t == math.inf or t > self.max_time_s:
                break
            now = t
            if t_arr <= t_ev:
                self._issue(order_list[ptr], t)
                ptr += 1
                continue
            _, _, kind, a, b = heapq.heappop(self._heap)
            if kind == _ISSUE:
                self._issue(a, t)
            elif kind == _STEP:
                inst = self.every[a]
                if b != inst.version or not inst.busy:
                    continue
                out = inst.commit()
                if self._progress is not None and out.finished:
                    self._count_finished(len(out.finished))
                if out.prefilled or (self._clients and out.finished):  # else _outcome has nothing to hand on
                    self._outcome(inst, out, t)
                end = inst.plan(t, horizon_s=self.max_time_s)
                if inst.transfers:
                    self._after_plan(inst, t)
                if end is not None:
                    inst.version += 1
                    self._push(end, _STEP, a, inst.version)
            else:  # KV landed on decode instance a
                dec = self.decode[a]
                dec.kv_arrived(b)
                self.ledger.first_token_s[b] = t
                src = self.front[self._prefill_of[b]]
                src.release_held(b)
                self._kick(src, t, must_see=True)
                self._kick(dec, t, must_see=True)
        if self._progress is not None:
            self._progress(self._finished)
        return now

    def _count_finished(self, n: int) -> None:
        self._finished += n
        if self._progress is not None and self._finished >= self._next_report:
            self._progress(self._finished)
            self._next_report = self._finished + self._report_every
