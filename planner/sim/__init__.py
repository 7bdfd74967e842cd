"""Discrete-event, iteration-level simulator of vLLM and SGLang serving: `simulate(layout, ...) -> SimResult`.

Called by the planner's funnel (stage 6), the CLI (`simulate`, `sweep`, `--replay`) and benchmarks.
Pure: requests come as a `RequestSet` (from a Workload, a closed-loop benchmark, or trace rows the
caller has read); step durations come only from a `StepTimeModel` (default `perf.InstancePerf`), pool
sizes from `memory.kv_pool_tokens`. Deterministic under a seed; no clock, no I/O.

    simulate(layout, model=, gpu=, engine=, requests= | workload= (num_requests=, seed=, sessions=),
             precision=None (layout's), router=LEAST_OUTSTANDING, step_model=None, pool_tokens=None,
             same_node=None, transfer_s=None, max_time_s=inf) -> SimResult;  SimResult.summary(slo, warmup_requests=)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, Layout, LayoutKind, Role, RoleLayout
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.perf.step import InstancePerf, StepTimeModel, kv_transfer_s
from servingtopology.planner.sim.cluster import EventLoop
from servingtopology.planner.sim.instance import Instance
from servingtopology.planner.sim.ledger import Ledger
from servingtopology.planner.sim.requests import RequestSet, Sessions, closed_loop, from_rows, from_workload, recorded_latencies
from servingtopology.planner.sim.results import Percentiles, SimResult, SimSummary, percentiles
from servingtopology.planner.sim.router import RouterPolicy
from servingtopology.planner.workload import Workload

__all__ = [
    "simulate", "SimResult", "SimSummary", "Percentiles", "percentiles", "RequestSet", "Sessions", "RouterPolicy",
    "from_workload", "from_rows", "closed_loop", "recorded_latencies", "StepModelFactory", "RememberedSteps",
]

StepModelFactory = Callable[[Role, RoleLayout], StepTimeModel]
MEMO_ENTRIES = 1 << 16     # step times remembered per role of one simulation (~10 MB at most)


class RememberedSteps:
    """A pure `StepTimeModel` with its answers remembered: a simulation asks for the same batch shape again and again
    (fixed lengths, one or two running sequences, the three probes of every decode burst), and the answer is the
    model's own float, so a replay's figures are unchanged. Only for models known to be pure (`InstancePerf`)."""

    __slots__ = ("_decode", "_seen", "decode_probe", "model")

    def __init__(self, model: StepTimeModel) -> None:
        self.model = model
        self._seen: dict[tuple[float, ...], float] = {}  # a batch (4 floats), or a batch and its gathered expert tokens (5)
        self._decode: Callable[[float, float], float] | None = getattr(model, "decode_s", None)  # InstancePerf's, same floats
        # a decode burst's probes (its first, middle and last steps' contexts) are rarely asked twice: the model's own
        # decode_s answers them, without the memo's key and insert (the same floats)
        self.decode_probe: Callable[[float, float], float] = self._decode if self._decode is not None else self.decode_s

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float, moe_tokens: float | None = None) -> float:
        # `moe_tokens`: the attention-DP ranks' gathered tokens (InstancePerf.gathers_experts), a fifth float of the key
        key: tuple[float, ...] = (prefill_tokens, prefill_pairs, decode_tokens, decode_context_tokens) if moe_tokens is None else \
            (prefill_tokens, prefill_pairs, decode_tokens, decode_context_tokens, moe_tokens)
        t = self._seen.get(key)
        if t is None:
            if len(self._seen) >= MEMO_ENTRIES:
                self._seen.clear()
            gathered = {} if moe_tokens is None else {"moe_tokens": moe_tokens}
            t = self._seen[key] = self.model.step_time_s(prefill_tokens=prefill_tokens, prefill_pairs=prefill_pairs,
                                                         decode_tokens=decode_tokens, decode_context_tokens=decode_context_tokens,
                                                         **gathered)
        return t

    @property
    def gathers_experts(self) -> bool:
        """The model's own (InstancePerf.gathers_experts); False for a model that does not say."""
        return bool(getattr(self.model, "gathers_experts", False))

    def batch_s(self, batch: tuple[float, float, float, float]) -> float:
        """`step_time_s` of a `StepBatch` (prefill tokens, prefill pairs, decode tokens, decode context), which is its own key."""
        t = self._seen.get(batch)
        if t is None:
            if len(self._seen) >= MEMO_ENTRIES:
                self._seen.clear()
            t = self._seen[batch] = self.model.step_time_s(prefill_tokens=batch[0], prefill_pairs=batch[1], decode_tokens=batch[2],
                                                           decode_context_tokens=batch[3])
        return t

    def decode_s(self, decoding_tokens: float, context_tokens: float) -> float:
        """`step_time_s` of a pure decode step (the decode bursts' probes), without the keyword call."""
        key = (0.0, 0.0, decoding_tokens, context_tokens)
        t = self._seen.get(key)
        if t is None:
            if self._decode is None:
                return self.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=decoding_tokens,
                                        decode_context_tokens=context_tokens)
            if len(self._seen) >= MEMO_ENTRIES:
                self._seen.clear()
            t = self._seen[key] = self._decode(decoding_tokens, context_tokens)
        return t


def _roles(layout: Layout) -> tuple[Role, ...]:
    return (Role.AGGREGATED,) if layout.kind is LayoutKind.REPLICAS else (Role.PREFILL, Role.DECODE)


def simulate(layout: Layout, *, model: ModelArch, gpu: Gpu, engine: Engine, requests: RequestSet | None = None,
             workload: Workload | None = None, num_requests: int = 1000, seed: int = 0, sessions: Sessions | None = None,
             precision: Precision | None = None, router: RouterPolicy = RouterPolicy.LEAST_OUTSTANDING,
             step_model: StepModelFactory | None = None, pool_tokens: Mapping[Role, int] | None = None,
             same_node: bool | None = None, transfer_s: Callable[[int], float] | None = None,
             max_time_s: float = math.inf, progress: Callable[[int], None] | None = None) -> SimResult:
    """Replay `requests` (or `num_requests` drawn from `workload` with `seed`) on `layout`.

    pool_tokens overrides the per-rank KV pool of a role (e.g. a recorded vLLM block count); the default
    is the memory model's. same_node says whether PD KV moves over NVLink (default: the whole layout
    fits one node) or the NIC; transfer_s (prompt tokens -> seconds) replaces perf.kv_transfer_s. Requests still running at max_time_s are reported unfinished.
    `progress` hears the count of finished requests as the run goes (every 1 % of them, and at the end): a terminal's
    bar, never a clock (SimulationProgress).
    Raises Infeasible when a role's pool is empty, InvalidSpec when neither requests nor workload is given.
    """
    if requests is None:
        if workload is None:
            raise InvalidSpec("simulation", "give either requests or a workload")
        requests = from_workload(workload, num_requests=num_requests, seed=seed, sessions=sessions)
    prec = precision or layout.precision
    ledger = Ledger(requests)
    instances: dict[Role, list[Instance]] = {}
    index = 0
    for role in _roles(layout):
        rl = layout.roles[role]
        pool = (pool_tokens or {}).get(role)
        if pool is None:
            pool = kv_pool_tokens(model, gpu, engine=engine, precision=prec, parallelism=rl.parallelism, knobs=rl.knobs)
        if pool <= 0:
            raise Infeasible("simulation", f"the {role.value} instances of {layout.label_for(engine)} have no room for KV cache "
                             f"({model.name} on {gpu.id} at {prec.value})")
        perf = step_model(role, rl) if step_model else RememberedSteps(InstancePerf(model, gpu, prec, rl.knobs.kv_dtype, engine, rl.parallelism))
        instances[role] = []
        for _ in range(rl.count):
            instances[role].append(Instance(index=index, role=role, role_layout=rl, engine=engine, model=perf,
                                            pool_tokens=pool, ledger=ledger))
            index += 1
    if layout.kind is LayoutKind.PD:
        front, decode = instances[Role.PREFILL], instances[Role.DECODE]
        near = layout.gpus <= gpu.gpus_per_node if same_node is None else same_node
        kv_dtype = layout.roles[Role.DECODE].knobs.kv_dtype
        prompt = requests.prompt_tokens
        # Every request's transfer time at once: the same element-wise arithmetic as one call per request.
        each_s = None if transfer_s is not None else \
            np.asarray(kv_transfer_s(model, gpu, kv_dtype=kv_dtype, tokens=prompt.astype(np.float64), same_node=near), dtype=np.float64)

        def transfer(rid: int) -> float:
            if each_s is None:
                assert transfer_s is not None
                return transfer_s(int(prompt[rid]))
            return float(each_s[rid])
    else:
        front, decode = instances[Role.AGGREGATED], []

        def transfer(rid: int) -> float:
            return 0.0
    loop = EventLoop(ledger=ledger, front=front, decode=decode, router=router, transfer_s=transfer, max_time_s=max_time_s,
                     progress=progress)
    end = loop.run()
    itl_s, itl_w = ledger.itl()
    return SimResult(
        arrival_s=ledger.arrival_s, scheduled_s=ledger.scheduled_s, first_token_s=ledger.first_token_s,
        finish_s=ledger.finish_s, prompt_tokens=requests.prompt_tokens, output_tokens=requests.output_tokens,
        cached_tokens=ledger.cached_tokens, preemptions=ledger.preemptions, itl_s=itl_s, itl_weight=itl_w,
        timeline=ledger.timeline(), preemption_times_s=np.asarray(ledger.preemption_times_s, dtype=np.float64), gpus=layout.gpus, end_s=end, label=layout.label,
    )
