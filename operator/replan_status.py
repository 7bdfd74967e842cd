"""The schema of `status.replan` (the replan memory and the running transition) and its strict reader.

Called by operator/replan.py (`ReplanMemory.from_dict` / `read_replan_status`) on every pass. status.replan is
written by the operator, but it comes back through the API server, where anyone with status access (or an
older or newer operator) may have changed it: it is a trust boundary, so it is validated here before it
becomes planner values. Pure: dicts in, a validated model or an error naming the field out.

Sections are judged apart: the metric window, drift, calibration and the assumed workload are advisory (one
that cannot be read starts afresh, and the caller says so); the running transition with its capacity floor is
not (the caller holds the workloads as they are rather than drop it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, KvDtype, LayoutKind, Role
from servingtopology.planner.live.calibration import MAX_LIVE_POINTS, MIN_LIVE_POINTS
from servingtopology.planner.live.drift import Trigger
from servingtopology.planner.live.transition import Mode, Phase
from servingtopology.planner.perf.deployment_fit import MAX_FACTOR, TERMS
from servingtopology.planner.workload import LengthKind

__all__ = ["ReplanStatus", "Unreadable", "TRANSITION_SECTIONS", "validate_replan_status"]

# The sections whose loss would drop a running transition or its capacity floor.
TRANSITION_SECTIONS = ("transition", "transitionFloorRps", "transitionKeepsServing")
_ROLES_OF = {LayoutKind.REPLICAS: {Role.AGGREGATED}, LayoutKind.PD: {Role.PREFILL, Role.DECODE}}


class _Strict(BaseModel):
    # Strict JSON validation: no string-to-number or number-to-bool coercion, no unknown keys, no NaN.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class SampleStatus(_Strict):
    """One metric interval (planner.live.observe.MetricSample's fields, in its own names)."""

    at_s: float
    interval_s: float = Field(gt=0)
    request_rate_rps: float | None = None
    prompt_tokens_rate: float | None = None
    generation_tokens_rate: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    input_tokens_p99: float | None = None
    output_tokens_p99: float | None = None
    prefix_hit_rate: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions_per_s: float | None = None


class DriftStatus(_Strict):
    streak: int = Field(default=0, ge=0)
    calm: int = Field(default=0, ge=0)
    detected: bool = False
    lastChangeS: float | None = None
    trigger: Trigger | None = None
    episode: bool = False      # a DriftDetected Warning was posted and the signals have not been calm since


class IntervalStatus(_Strict):
    value: float = Field(gt=0)
    low: float = Field(ge=0)
    high: float = Field(ge=0)


class MoveStatus(_Strict):
    """The last move made for its gain (issue #27): the layout it moved to, the TPOT interval predicted for it, and once
    judged on the first steady interval after it, what was measured and whether it hit."""

    layout: str = Field(max_length=256)
    tpotMs: IntervalStatus
    measuredTpotMs: float | None = Field(default=None, ge=0)
    errorPercent: float | None = None      # measured / predicted − 1, in %
    hit: bool | None = None
    settledAtS: float | None = Field(default=None, ge=0)   # when the moved layout first ran settled (JudgedOnTheMovedLayout)


class LengthStatus(_Strict):
    kind: LengthKind
    mean: float = Field(ge=0)
    low: int = Field(ge=0)
    high: int = Field(ge=0)
    sigma: float = Field(ge=0)
    values: list[int] = Field(default_factory=list)


class WorkloadStatus(_Strict):
    input: LengthStatus
    output: LengthStatus
    rate: float | None = Field(default=None, ge=0)
    prefix: float = Field(ge=0, le=1)
    cv: float = Field(gt=0)


class RoleStateStatus(_Strict):
    count: int = Field(ge=0)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    ep: bool
    maxNumSeqs: int = Field(ge=1)
    maxNumBatchedTokens: int = Field(ge=1)
    memoryFraction: float = Field(gt=0, le=1)
    kvDtype: KvDtype
    blockSize: int = Field(ge=1)
    prefixCaching: bool
    epSize: int = Field(default=0, ge=0)   # experts over fewer GPUs than tp x dp (SGLang --ep-size); 0: as ep says


class LayoutStateStatus(_Strict):
    kind: LayoutKind
    precision: Precision
    roles: dict[Role, RoleStateStatus]

    @model_validator(mode="after")
    def _roles_match_the_kind(self) -> LayoutStateStatus:
        if set(self.roles) != _ROLES_OF[self.kind]:
            raise ValueError(f"a {self.kind.value} layout has roles {sorted(r.value for r in _ROLES_OF[self.kind])}, "
                             f"not {sorted(r.value for r in self.roles)}")
        return self


class TransitionStatus(_Strict):
    mode: Mode
    phase: Phase
    source: LayoutStateStatus
    target: LayoutStateStatus
    fromSet: str = Field(min_length=1, max_length=63)
    toSet: str = Field(min_length=1, max_length=63)
    desired: dict[str, dict[Role, int]]
    serving: list[str] = Field(min_length=1)
    sinceS: float
    startedS: float
    rolledBack: bool = False
    drainSinceS: float | None = None
    message: str = ""
    engine: Engine = Engine.VLLM   # whose words its messages name the layouts in (absent: written before it was kept)

    @model_validator(mode="after")
    def _sets_are_known(self) -> TransitionStatus:
        unknown = [s for s in self.serving if s not in (self.fromSet, self.toSet)]
        if unknown:
            raise ValueError(f"serving names sets {unknown} that are neither fromSet nor toSet")
        if any(n < 0 for counts in self.desired.values() for n in counts.values()):
            raise ValueError("desired instance counts must be ≥ 0")
        return self


class CalibrationPointStatus(_Strict):
    atS: float
    ttftMs: float = Field(gt=0)
    tpotMs: float = Field(gt=0)
    workload: WorkloadStatus
    layout: LayoutStateStatus


class PerMetric(_Strict):
    ttft: float = Field(ge=0, le=100)
    tpot: float = Field(ge=0, le=100)


class CalibrationFitStatus(_Strict):
    factors: dict[str, float]
    residualBefore: PerMetric
    residualAfter: PerMetric
    ownHalfWidth: PerMetric
    atBound: list[str] = Field(default_factory=list, max_length=len(TERMS))
    fittedAtS: float
    pointsUsed: int = Field(ge=1, le=MAX_LIVE_POINTS)

    @model_validator(mode="after")
    def _known_bounded_terms(self) -> CalibrationFitStatus:
        unknown = sorted(set(self.factors) - set(TERMS))
        if unknown:
            raise ValueError(f"factors: unknown terms {unknown}; known: {', '.join(TERMS)}")
        out = {t: f for t, f in self.factors.items() if not 1.0 / MAX_FACTOR - 1e-9 <= f <= MAX_FACTOR + 1e-9}
        if out:
            raise ValueError(f"factors {out} outside [{1.0 / MAX_FACTOR:g}, {MAX_FACTOR:g}]")
        return self


class LiveCalibrationStatus(_Strict):
    """The operator's own calibration (planner/live/calibration.py): its points and its last fit. Status written by an
    operator before it (the smoothed ratios ttftCorrection / tpotCorrection / samples) is read as no calibration."""

    points: list[CalibrationPointStatus] = Field(default_factory=list, max_length=MAX_LIVE_POINTS)
    fit: CalibrationFitStatus | None = None
    minPoints: int = Field(default=MIN_LIVE_POINTS, ge=MIN_LIVE_POINTS, le=MAX_LIVE_POINTS)
    ttftCorrection: float | None = None   # written before the deployment fit replaced the smoothed ratios; ignored
    tpotCorrection: float | None = None
    samples: int | None = None


class ReplanStatus(_Strict):
    """status.replan as `ReplanMemory.to_dict` writes it."""

    samples: list[SampleStatus] = Field(default_factory=list)
    drift: DriftStatus = Field(default_factory=DriftStatus)
    calibration: LiveCalibrationStatus = Field(default_factory=LiveCalibrationStatus)
    assumed: WorkloadStatus | None = None
    metricsAvailable: bool | None = None
    lastFetchS: float | None = None
    transition: TransitionStatus | None = None
    transitionFloorRps: float | None = Field(default=None, ge=0)
    transitionKeepsServing: bool | None = None   # absent in status written before it existed: read from the floor
    move: MoveStatus | None = None
    misses: int = Field(default=0, ge=0, le=1000)   # moves whose measured TPOT missed the predicted interval

    @model_validator(mode="after")
    def _a_transition_keeps_its_floor(self) -> ReplanStatus:
        if self.transition is not None and self.transitionFloorRps is None:
            raise ValueError("transitionFloorRps: a running transition needs the capacity floor it started with")
        return self


@dataclass(frozen=True, slots=True)
class Unreadable:
    """What of status.replan could not be read: the top-level sections, and one line naming each bad field."""

    sections: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def transition(self) -> bool:
        """Whether the running transition (or its floor) is among them."""
        return any(s in TRANSITION_SECTIONS for s in self.sections)

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


def _where(loc: tuple[Any, ...]) -> str:
    out = "status.replan"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def validate_replan_status(raw: Mapping[str, Any]) -> tuple[ReplanStatus, Unreadable | None]:
    """Validate status.replan; sections that fail are left out of the model (defaults) and named in Unreadable.

    A transition whose floor failed is left out with it (the two are one section to the caller).
    """
    try:
        text = json.dumps(raw, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return ReplanStatus(), Unreadable(tuple(raw), (f"status.replan: not JSON ({exc})",))
    try:
        return ReplanStatus.model_validate_json(text), None
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    problems = tuple(f"{_where(tuple(e['loc']))}: {e['msg']}" for e in errors)
    bad = {str(e["loc"][0]) for e in errors if e["loc"]}
    if not bad or any(not e["loc"] for e in errors):   # a whole-object rule (the floor): the transition's
        bad |= set(TRANSITION_SECTIONS)
    if bad & set(TRANSITION_SECTIONS):
        bad |= set(TRANSITION_SECTIONS)
    kept = {k: v for k, v in raw.items() if k not in bad}
    try:
        model = ReplanStatus.model_validate_json(json.dumps(kept))
    except ValidationError:
        return ReplanStatus(), Unreadable(tuple(sorted(set(raw) | bad)), problems)
    return model, Unreadable(tuple(sorted(bad)), problems)
