"""The project's simulator (planner/sim) behind the emulator's `EngineSimulator` seam, replayed in real time.

planner.sim replays a whole request set at once, so this adapter works in chunks: the instance submits
arrivals `lookahead_s` ahead of the clock; when the clock reaches a chunk, its arrivals are simulated in one
`simulate` call on a one-instance layout, and the results (completions at their finish times, the running/
waiting/KV timeline) are played back as wall time passes. Approximation, stated: each chunk starts on an idle
engine (its tail still contends with the next chunk only through the summed gauges), so an overload shows as
queueing that grows inside each chunk.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servingtopology.emulator.seam import Completion, Gauges, Progress
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, Layout, Role, RoleLayout
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.step import InstancePerf, StepTimeModel, perf_params, request_overhead_s, scaled_terms
from servingtopology.planner.sim import RememberedSteps, RequestSet, simulate

__all__ = ["ChunkedReplay"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _Timeline:
    t_s: F64
    running: F64
    waiting: F64
    kv_used_frac: F64

    def at(self, t_s: float) -> tuple[int, int, float] | None:
        if not len(self.t_s) or t_s < self.t_s[0] or t_s > self.t_s[-1]:
            return None
        i = int(np.searchsorted(self.t_s, t_s, side="right")) - 1
        return int(self.running[i]), int(self.waiting[i]), float(self.kv_used_frac[i])


class ChunkedReplay:
    """One aggregated engine instance simulated by planner.sim, chunk by chunk, replayed against the caller's clock."""

    def __init__(self, *, layout: Layout, model: ModelArch, gpu: Gpu, engine: Engine, kv_capacity_tokens: int,
                 chunk_s: float = 20.0, seed: int = 0) -> None:
        if chunk_s <= 0:
            raise ValueError("chunk_s must be positive")
        self.layout = layout
        self.model = model
        self.gpu = gpu
        self.engine = engine
        self.kv_capacity_tokens = kv_capacity_tokens
        self.chunk_s = chunk_s
        self.lookahead_s = chunk_s
        self.seed = seed
        self.slowdown: Mapping[str, float] = {}   # EngineSlowdown (seam.EngineSimulator), applied to each chunk as it is simulated
        self._pending: list[tuple[float, int, int, int]] = []
        self._next_chunk_s = 0.0
        self._finishing: list[tuple[float, int, Completion]] = []
        self._timelines: list[_Timeline] = []
        self._now_s = 0.0
        self._count = 0

    def submit(self, *, arrival_s: float, input_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        self._pending.append((arrival_s, input_tokens, output_tokens, min(cached_tokens, input_tokens - 1)))

    def advance(self, until_s: float) -> Progress:
        while self._next_chunk_s <= until_s:
            self._simulate_chunk(self._next_chunk_s, self._next_chunk_s + self.chunk_s)
            self._next_chunk_s += self.chunk_s
        progress = Progress()
        while self._finishing and self._finishing[0][0] <= until_s:
            _, _, done = heapq.heappop(self._finishing)
            progress.completions.append(done)
            progress.prompt_tokens += done.input_tokens - done.cached_tokens
            progress.generation_tokens += done.output_tokens
        self._now_s = max(self._now_s, until_s)
        self._timelines = [t for t in self._timelines if len(t.t_s) and t.t_s[-1] >= self._now_s]
        return progress

    def gauges(self) -> Gauges:
        running = waiting = 0
        kv_tokens = 0.0
        for timeline in self._timelines:
            point = timeline.at(self._now_s)
            if point is not None:
                running += point[0]
                waiting += point[1]
                kv_tokens += point[2] * self.kv_capacity_tokens
        return Gauges(running, waiting, min(int(kv_tokens), self.kv_capacity_tokens), self.kv_capacity_tokens)

    def _simulate_chunk(self, start_s: float, end_s: float) -> None:
        due = [r for r in self._pending if r[0] < end_s]
        self._pending = [r for r in self._pending if r[0] >= end_s]
        if not due:
            return
        due.sort()
        arrival = np.array([max(r[0] - start_s, 0.0) for r in due])
        cached = np.array([r[3] for r in due], dtype=np.int64)
        requests = RequestSet(
            arrival_s=arrival,
            prompt_tokens=np.array([r[1] for r in due], dtype=np.int64),
            output_tokens=np.array([r[2] for r in due], dtype=np.int64),
            prefix_key=np.where(cached > 0, 0, -1).astype(np.int64),  # hits modelled as one shared prefix
            shared_tokens=cached,
            client=np.full(len(due), -1, dtype=np.int64),
        )
        slowed = scaled_terms(perf_params(), {t: max(float(f), 1.0) for t, f in self.slowdown.items()})

        def step_model(role: Role, rl: RoleLayout) -> StepTimeModel:
            return RememberedSteps(InstancePerf(self.model, self.gpu, Precision.BF16, rl.knobs.kv_dtype, self.engine,
                                                rl.parallelism, params=slowed))
        result = simulate(self.layout, model=self.model, gpu=self.gpu, engine=self.engine, requests=requests,
                          precision=Precision.BF16, seed=self.seed, step_model=step_model)
        for i in np.flatnonzero(~np.isnan(result.finish_s)):
            first, finish = float(result.first_token_s[i]), float(result.finish_s[i])
            scheduled, arrived = float(result.scheduled_s[i]), float(result.arrival_s[i])
            front = float(request_overhead_s(self.engine, int(result.prompt_tokens[i])))  # the engine's front end
            done = Completion(
                input_tokens=int(result.prompt_tokens[i]), output_tokens=int(result.output_tokens[i]),
                cached_tokens=int(result.cached_tokens[i]), queue_s=scheduled - arrived, ttft_s=first - arrived + front,
                e2e_s=finish - arrived + front, prefill_s=first - scheduled, decode_s=finish - first,
            )
            self._count += 1
            heapq.heappush(self._finishing, (start_s + finish, self._count, done))
        timeline = result.timeline
        if len(timeline.get("t_s", ())):
            self._timelines.append(_Timeline(timeline["t_s"] + start_s, timeline["running"], timeline["waiting"],
                                             timeline["kv_used_frac"]))
