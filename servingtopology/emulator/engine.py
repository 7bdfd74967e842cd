"""What an emulated engine computes: the built-in stepper behind the `EngineSimulator` seam (emulator/seam.py),
and `build_simulator`, which picks it or the project's simulator (emulator/replay.py) for an instance's arguments.

`BatchingEngine` is a small continuous-batching stepper (token budget, running cap, KV pool admission, chunked
prefill) priced by the planner's `StepTimeModel`. No clock here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from servingtopology.emulator.command_parser import EngineArgsError, EngineConfig
from servingtopology.emulator.replay import ChunkedReplay
from servingtopology.emulator.seam import Completion, EngineSimulator, Gauges, Progress
from servingtopology.planner.engines.defaults import max_running, memory_fraction, token_budget
from servingtopology.planner.hardware import Gpu, Precision, gpu_for_product, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, Role
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.perf.step import InstancePerf, StepTimeModel, request_overhead_s

__all__ = ["BatchingEngine", "Completion", "EngineSimulator", "Gauges", "Progress", "SimulatorKind", "build_simulator",
           "gpu_for_label"]


@dataclass(slots=True)
class _Request:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    prefilled: int = 0
    generated: int = 0
    admitted_s: float = -1.0
    first_token_s: float = -1.0
    prefill_done_s: float = -1.0
    waited_elsewhere_s: float = 0.0   # time the engine's histograms count before this instance got the request

    @property
    def context_tokens(self) -> int:
        return self.prefilled + self.generated


class BatchingEngine:
    """Continuous batching: each step decodes every running sequence and fills the rest of the token budget with
    prefill chunks, admitting FCFS while the running cap and the KV pool allow. A prefill-role instance stops
    each request after its first token (the KV leaves for a decode instance); a decode-role instance receives
    requests already prefilled."""

    def __init__(self, *, step_model: StepTimeModel, role: Role, max_running: int, token_budget: int,
                 kv_capacity_tokens: int, front_end_s: Callable[[int], float] | None = None,
                 decode_counts_from_arrival: bool = False) -> None:
        if max_running < 1 or token_budget < 1 or kv_capacity_tokens < 1:
            raise ValueError("max_running, token_budget and kv_capacity_tokens must be positive")
        self.step_model = step_model
        # What a request spends in the engine's front end before the scheduler sees it (tokenizing, hand-off);
        # the engine's TTFT histogram counts it from arrival. A decode instance receives requests already served.
        self.front_end_s = front_end_s if front_end_s is not None and role is not Role.DECODE else (lambda _tokens: 0.0)
        self.role = role
        # What a decode engine's TTFT measures: SGLang's router sends a request to prefill and decode at once, so its
        # decode TTFT counts from arrival and includes the prefill and the KV transfer; vLLM's router sends it to
        # decode after prefill returns, so vLLM's decode TTFT starts there (the KV pull and the first step).
        self.decode_counts_from_arrival = decode_counts_from_arrival and role is Role.DECODE
        self.max_running = max_running
        self.token_budget = token_budget
        self.kv_capacity_tokens = kv_capacity_tokens
        self.lookahead_s = 0.0
        self.slowdown: Mapping[str, float] = {}   # EngineSlowdown (seam.EngineSimulator)
        self.now_s = 0.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []

    def submit(self, *, arrival_s: float, input_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        output = 1 if self.role is Role.PREFILL else output_tokens
        request = _Request(arrival_s, input_tokens, output, min(cached_tokens, input_tokens - 1))
        if self.role is Role.DECODE:
            request.prefilled = input_tokens  # the KV arrives from a prefill instance
            request.cached_tokens = input_tokens
            if self.decode_counts_from_arrival:
                # The KV is ready after the prompt's prefill (priced on this instance's shape, as a stand-in for the
                # prefill instance's) and the front end; the engine counts that wait in its TTFT.
                uncached = input_tokens - min(cached_tokens, input_tokens - 1)
                wait = float(self.step_model.step_time_s(prefill_tokens=uncached, prefill_pairs=uncached * uncached / 2,
                                                         decode_tokens=0, decode_context_tokens=0))
                request.arrival_s += wait
                request.waited_elsewhere_s = wait
        self.waiting.append(request)

    def gauges(self) -> Gauges:
        used = sum(r.context_tokens for r in self.running)
        return Gauges(len(self.running), len(self.waiting), min(used, self.kv_capacity_tokens), self.kv_capacity_tokens)

    def _admit(self, now_s: float) -> None:
        used = sum(r.input_tokens + r.generated for r in self.running)
        while self.waiting and self.waiting[0].arrival_s <= now_s and len(self.running) < self.max_running:
            head = self.waiting[0]
            if used + head.input_tokens + 1 > self.kv_capacity_tokens and self.running:
                break
            self.waiting.popleft()
            head.admitted_s = now_s
            if head.prefilled < head.cached_tokens:
                head.prefilled = head.cached_tokens
            self.running.append(head)
            used += head.input_tokens

    def advance(self, until_s: float) -> Progress:
        progress = Progress()
        while True:
            self._admit(self.now_s)
            if not self.running:
                next_arrival = self.waiting[0].arrival_s if self.waiting else None
                if next_arrival is None or next_arrival > until_s:
                    self.now_s = max(self.now_s, until_s)
                    return progress
                self.now_s = max(self.now_s, next_arrival)
                continue
            if self.now_s >= until_s:
                return progress
            self._step(progress)

    def _step(self, progress: Progress) -> None:
        decoding = [r for r in self.running if r.prefilled >= r.input_tokens]
        budget = max(self.token_budget - len(decoding), 0)
        chunks: list[tuple[_Request, int]] = []
        pairs = 0.0
        for r in self.running:
            if r.prefilled < r.input_tokens and budget > 0:
                chunk = min(r.input_tokens - r.prefilled, budget)
                chunks.append((r, chunk))
                pairs += chunk * (r.prefilled + chunk / 2)
                budget -= chunk
        prefill_tokens = sum(c for _, c in chunks)
        duration_s = self.step_model.step_time_s(
            prefill_tokens=prefill_tokens, prefill_pairs=pairs, decode_tokens=len(decoding),
            decode_context_tokens=sum(r.context_tokens for r in decoding),
        )
        # EngineSlowdown: the whole step at the largest factor (never faster than any term's own slowdown would make it).
        end_s = self.now_s + max(duration_s * max((max(f, 1.0) for f in self.slowdown.values()), default=1.0), 1e-4)
        for r, chunk in chunks:
            r.prefilled += chunk
            if r.prefilled >= r.input_tokens:
                r.prefill_done_s = end_s
                r.generated = 1  # the step that finishes the prompt samples the first token
                r.first_token_s = end_s
                progress.generation_tokens += 1
        progress.prompt_tokens += prefill_tokens
        for r in decoding:
            if r.first_token_s < 0:
                r.first_token_s = end_s
                r.prefill_done_s = self.now_s
            r.generated += 1
            progress.generation_tokens += 1
        self.now_s = end_s
        progress.steps += 1
        still: list[_Request] = []
        for r in self.running:
            if r.first_token_s >= 0 and r.generated >= r.output_tokens:
                front = self.front_end_s(r.input_tokens) + r.waited_elsewhere_s
                progress.completions.append(Completion(
                    input_tokens=r.input_tokens, output_tokens=r.output_tokens, cached_tokens=r.cached_tokens,
                    queue_s=r.admitted_s - r.arrival_s, ttft_s=r.first_token_s - r.arrival_s + front, e2e_s=end_s - r.arrival_s + front,
                    prefill_s=r.prefill_done_s - r.admitted_s, decode_s=end_s - r.first_token_s,
                ))
            else:
                still.append(r)
        self.running = still


def gpu_for_label(product: str | None) -> Gpu:
    """The GPU to emulate on a node with this `nvidia.com/gpu.product` label (planner.hardware.gpu_for_product); an
    H100 where the label is missing or the catalog does not know it (an emulator always runs something)."""
    return gpu_for_product(product) or resolve_gpu("h100_sxm")


_KV_DTYPES = {"fp8": KvDtype.FP8, "fp8_e4m3": KvDtype.FP8, "fp8_e5m2": KvDtype.FP8, "bf16": KvDtype.BF16, "bfloat16": KvDtype.BF16}


class SimulatorKind(StrEnum):
    PROJECT = "project"   # planner.sim, replayed in chunks (aggregated instances; PD roles use the built-in)
    BUILTIN = "builtin"   # this module's BatchingEngine


def build_simulator(config: EngineConfig, *, gpu: Gpu, kind: SimulatorKind = SimulatorKind.PROJECT,
                    seed: int = 0) -> EngineSimulator:
    """The simulator for one engine instance as its arguments configure it; EngineArgsError if it cannot load."""
    try:
        model = resolve_model(config.model)
    except Exception as exc:  # InvalidSpec from the catalog: the real engine would fail to load the model too
        raise EngineArgsError(f"model {config.model!r}: {exc}") from None
    attention_tp = config.tp // config.dp if (config.engine is Engine.SGLANG and config.dp_attention) else config.tp
    ranks = config.dp
    parallelism = Parallelism(tp=attention_tp, pp=config.pp, dp=config.dp)
    # what the engine chooses for a flag the command leaves out (planner/engines/defaults.py: the one rule)
    default_budget = int(token_budget(config.engine, gpu, release=config.version))  # the server's flag value; the step model splits it per DP rank
    default_fraction = memory_fraction(config.engine, gpu, release=config.version, tp=attention_tp, pp=config.pp,
                                       dp=config.dp if config.dp_attention else 1)
    knobs = EngineKnobs(
        max_num_seqs=config.max_running or max_running(config.engine, gpu, release=config.version),
        max_num_batched_tokens=config.token_budget or default_budget,
        memory_fraction=config.memory_fraction or default_fraction,
        kv_dtype=_KV_DTYPES.get(config.kv_cache_dtype, KvDtype.AUTO),
    )
    capacity = kv_pool_tokens(model, gpu, engine=config.engine, precision=Precision.BF16, parallelism=parallelism, knobs=knobs)
    if capacity < 1:
        raise EngineArgsError(
            f"{config.model} does not fit: no KV cache left on {gpu.name} with TP{attention_tp} PP{config.pp} "
            f"at memory fraction {knobs.memory_fraction}"
        )
    if kind is SimulatorKind.PROJECT and config.role is Role.AGGREGATED:
        return ChunkedReplay(layout=Layout.replicas(1, parallelism, knobs), model=model, gpu=gpu, engine=config.engine,
                             kv_capacity_tokens=capacity * ranks, seed=seed)
    perf = InstancePerf(model=model, gpu=gpu, precision=Precision.BF16, kv_dtype=knobs.kv_dtype, engine=config.engine,
                        parallelism=parallelism)
    # Approximation: DP ranks are folded into one stepper with summed caps and pools (per-rank admission is not
    # modelled); a request never needs more than one rank's pool here because the profile's lengths are fixed.
    engine = config.engine
    return BatchingEngine(step_model=perf, role=config.role, max_running=knobs.max_num_seqs * ranks,
                          token_budget=knobs.max_num_batched_tokens * ranks, kv_capacity_tokens=capacity * ranks,
                          front_end_s=lambda tokens: float(request_overhead_s(engine, tokens)),
                          decode_counts_from_arrival=engine is Engine.SGLANG)
