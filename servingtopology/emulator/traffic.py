"""A scripted traffic profile for the emulator: phases of offered load that follow each other in time.

Parsed from a mapping (the CLI reads the YAML/JSON file) and queried with a time offset, so it is pure: the
caller owns the clock. Used by emulator/instance.py to draw arrivals for its share of the load. Rates are
for the whole deployment (one group of engine pods); each instance takes rate / instances of its role.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servingtopology.planner.perf.step import STEP_TERMS

__all__ = ["MAX_BURSTINESS", "Phase", "TrafficProfile", "TrafficProfileError", "arrival_gap_s"]

MAX_BURSTINESS = 1000.0   # gaps' coefficient of variation 1/√1000 ≈ 0.03: all but regular; a bound on what a profile may ask


class TrafficProfileError(ValueError):
    """The profile is malformed; the message names the phase and field."""


@dataclass(frozen=True, slots=True)
class Phase:
    """Constant offered load for `duration_s` (None: until the profile changes)."""

    rate_rps: float
    input_tokens: int
    output_tokens: int
    duration_s: float | None = None
    prefix_hit_ratio: float = 0.0
    # EngineSlowdown: the emulated engines run this many times slower than the model in these step terms
    # (planner.perf.step.STEP_TERMS: gemm, weights, attention, communication, overhead); each factor at least 1, so the
    # emulator can be made slower than the model predicts, never faster (more lenient) than it.
    slowdown: tuple[tuple[str, float], ...] = ()
    # Gamma-distributed gaps between arrivals of shape `burstiness`, as `vllm bench serve --burstiness` draws them
    # (vllm/benchmarks/serve.py: gamma with shape = burstiness, scale = 1 / (rate × burstiness)): 1 is a Poisson process,
    # below 1 burstier, above 1 more regular (the gaps' coefficient of variation is 1/√burstiness).
    burstiness: float = 1.0


def arrival_gap_s(rng: np.random.Generator, rate_rps: float, burstiness: float = 1.0) -> float:
    """One gap (s) between arrivals at `rate_rps` (> 0): exponential for burstiness 1 (the draw Poisson arrivals always
    made, so a seed gives the same arrivals as before), gamma of shape `burstiness` otherwise; the mean is 1 / rate."""
    if burstiness == 1.0:
        return float(rng.exponential(1.0 / rate_rps))
    return float(rng.gamma(burstiness, 1.0 / (rate_rps * burstiness)))


@dataclass(frozen=True, slots=True)
class TrafficProfile:
    """Phases in order; after the last one ends the profile loops if `loop`, else the last phase holds."""

    phases: tuple[Phase, ...]
    loop: bool = False

    def phase_at(self, elapsed_s: float) -> Phase:
        """The phase in force `elapsed_s` seconds after the profile started."""
        if elapsed_s < 0:
            raise ValueError("elapsed_s must be non-negative")
        total_s = sum(p.duration_s or 0.0 for p in self.phases)
        if self.loop and total_s > 0 and all(p.duration_s for p in self.phases):
            elapsed_s %= total_s
        t = 0.0
        for phase in self.phases:
            if phase.duration_s is None or elapsed_s < t + phase.duration_s:
                return phase
            t += phase.duration_s
        return self.phases[-1]

    @staticmethod
    def constant(*, rate_rps: float, input_tokens: int, output_tokens: int, prefix_hit_ratio: float = 0.0) -> TrafficProfile:
        """A profile with one phase that never ends."""
        return TrafficProfile((Phase(rate_rps, input_tokens, output_tokens, None, prefix_hit_ratio),))

    @staticmethod
    def from_mapping(raw: Mapping[str, Any]) -> TrafficProfile:
        """Builds a profile from `{"phases": [{"rate_rps", "input_tokens", "output_tokens", "duration_s"?, …}], "loop"?}`."""
        phases_raw = raw.get("phases")
        if not isinstance(phases_raw, Sequence) or isinstance(phases_raw, str) or not phases_raw:
            raise TrafficProfileError("phases: a non-empty list is required")
        phases = tuple(_phase(i, p) for i, p in enumerate(phases_raw))
        loop = raw.get("loop", False)
        if not isinstance(loop, bool):
            raise TrafficProfileError("loop: must be true or false")
        return TrafficProfile(phases, loop)


def _number(where: str, raw: Mapping[str, Any], key: str, *, minimum: float, integer: bool = False,
            default: float | None = None) -> float:
    value = raw.get(key, default)
    if value is None:
        raise TrafficProfileError(f"{where}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and int(value) != value):
        raise TrafficProfileError(f"{where}.{key}: must be a {'whole ' if integer else ''}number, got {value!r}")
    if value < minimum:
        raise TrafficProfileError(f"{where}.{key}: must be at least {minimum}, got {value}")
    return float(value)


def _phase(index: int, raw: Any) -> Phase:
    where = f"phases[{index}]"
    if not isinstance(raw, Mapping):
        raise TrafficProfileError(f"{where}: must be a mapping")
    known = {"rate_rps", "input_tokens", "output_tokens", "duration_s", "prefix_hit_ratio", "slowdown", "burstiness"}
    extra = sorted(set(raw) - known)
    if extra:
        raise TrafficProfileError(f"{where}: unknown field(s) {', '.join(extra)}; allowed: {', '.join(sorted(known))}")
    hit = _number(where, raw, "prefix_hit_ratio", minimum=0.0, default=0.0)
    if hit >= 1.0:
        raise TrafficProfileError(f"{where}.prefix_hit_ratio: must be below 1, got {hit}")
    burstiness = _number(where, raw, "burstiness", minimum=0.01, default=1.0)
    if burstiness > MAX_BURSTINESS:
        raise TrafficProfileError(f"{where}.burstiness: must be at most {MAX_BURSTINESS:g}, got {burstiness:g}")
    duration = raw.get("duration_s")
    return Phase(
        rate_rps=_number(where, raw, "rate_rps", minimum=0.0),
        input_tokens=int(_number(where, raw, "input_tokens", minimum=1, integer=True)),
        output_tokens=int(_number(where, raw, "output_tokens", minimum=1, integer=True)),
        duration_s=None if duration is None else _number(where, raw, "duration_s", minimum=0.001),
        prefix_hit_ratio=hit,
        slowdown=_slowdown(where, raw.get("slowdown")),
        burstiness=burstiness,
    )


def _slowdown(where: str, raw: Any) -> tuple[tuple[str, float], ...]:
    """EngineSlowdown: `{term: factor ≥ 1}` over planner.perf.step.STEP_TERMS."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise TrafficProfileError(f"{where}.slowdown: must be a mapping of step terms ({', '.join(STEP_TERMS)}) to factors ≥ 1")
    unknown = sorted(str(k) for k in raw if k not in STEP_TERMS)
    if unknown:
        raise TrafficProfileError(f"{where}.slowdown: unknown step term(s) {', '.join(unknown)}; allowed: {', '.join(STEP_TERMS)}")
    return tuple(sorted((str(k), _number(f"{where}.slowdown", raw, k, minimum=1.0)) for k in raw))
