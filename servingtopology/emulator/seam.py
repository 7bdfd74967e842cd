"""The `EngineSimulator` seam: the protocol an emulated instance drives, and the values that cross it.

An instance (emulator/instance.py) submits requests and advances the simulator to the wall-clock offset it has
reached; the simulator answers with finished requests, token counts and gauges, which emulator/exposition.py
turns into the engine's metrics. Implemented by emulator/engine.py's built-in stepper and emulator/replay.py's
chunked replay of the project's simulator (planner/sim). Values only; imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Completion", "EngineSimulator", "Gauges", "Progress"]


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished request, with the times the engine's histograms observe (seconds)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    queue_s: float
    ttft_s: float
    e2e_s: float
    prefill_s: float
    decode_s: float

    @property
    def mean_itl_s(self) -> float:
        return self.decode_s / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@dataclass(frozen=True, slots=True)
class Gauges:
    running: int
    waiting: int
    kv_used_tokens: int
    kv_capacity_tokens: int


@dataclass(slots=True)
class Progress:
    """What happened during one `advance` call."""

    completions: list[Completion] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    steps: int = 0


class EngineSimulator(Protocol):
    """A simulated engine instance driven by the caller's clock (seconds since the instance started).

    `lookahead_s`: how far ahead of the clock arrivals must be submitted (a chunked replay simulates ahead).
    `slowdown`: EngineSlowdown, the step terms (planner.perf.step.STEP_TERMS) this engine runs slower than the model in,
    with their factors (each ≥ 1); set by the instance from the traffic profile's phase before it advances.
    """

    lookahead_s: float
    slowdown: Mapping[str, float]

    def submit(self, *, arrival_s: float, input_tokens: int, output_tokens: int, cached_tokens: int) -> None: ...

    def advance(self, until_s: float) -> Progress: ...

    def gauges(self) -> Gauges: ...
