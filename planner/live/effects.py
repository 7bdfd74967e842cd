"""What one interval of the replan loop did, as typed effects, each with its reason: the metrics read or missing, too
little data, a calibration point, a judged move, the interval held, drift assessed, and the replan's outcome (kept,
within the error, proposed, blocked, infeasible, a transition started).

Produced by planner/live/loop.py `step`, in the order of its ladder; the operator (operator/replan.py `replan`) turns
each into its condition, Event and status wording. Must not: word an Event or a condition (the reasons here are the
planner's own sentences), or hold anything the next interval needs (that is the memory).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servingtopology.planner.live.calibration import LiveCalibration, LivePoint
from servingtopology.planner.live.drift import DriftVerdict
from servingtopology.planner.live.error_gate import MoveJudgement
from servingtopology.planner.live.transition import TransitionState

__all__ = [
    "Verdict", "AwaitingMetrics", "MetricsMissing", "MetricsFlowing", "TooLittleData", "CalibrationChanged", "MoveJudged",
    "Held", "DriftAssessed", "ReplanInfeasible", "GainWithinError", "PlanKept", "Proposed", "TransitionBlocked",
    "TransitionStarted", "Effect", "Outcome", "verdict_of",
]


class Verdict(enum.StrEnum):
    KEEP = "Keep"                # nothing to change (or not enough data, or metrics down)
    PROPOSE = "Propose"          # DryRun: write status.proposal, Event PlanProposed
    TRANSITION = "Transition"    # Auto: a transition was started (memory.transition); run its steps


@dataclass(frozen=True, slots=True)
class AwaitingMetrics:
    """No sample, and none can exist yet (MetricsGrace, `grace` says why): only the fetch time is remembered."""

    why: str
    grace: str


@dataclass(frozen=True, slots=True)
class MetricsMissing:
    """No sample: nothing is observed or decided until metrics return. `reason` names the failed read; `first` is the
    first interval of this outage (one Event per outage)."""

    why: str
    reason: str
    first: bool


@dataclass(frozen=True, slots=True)
class MetricsFlowing:
    """A sample was read; `back` after an outage."""

    back: bool


@dataclass(frozen=True, slots=True)
class TooLittleData:
    """The window holds too few intervals or requests for an estimate (observe's InsufficientData): nothing is judged."""

    why: str


@dataclass(frozen=True, slots=True)
class CalibrationChanged:
    """SteadyPoints: a steady interval became a calibration point and the live fit was redone (`calibration`: after it).
    Shown through status.calibration, which the memory carries; no Event."""

    point: LivePoint
    calibration: LiveCalibration


@dataclass(frozen=True, slots=True)
class MoveJudged:
    """The first steady interval after a gated move: its measured TPOT against the interval predicted for it. A miss is
    counted (`misses`, this one included): it widens the intervals of the next move's bar."""

    layout: str
    judgement: MoveJudgement
    misses: int


@dataclass(frozen=True, slots=True)
class Held:
    """Observed and recorded, nothing decided: Pinned, a transition in progress, or the caller's reason (`why`)."""

    why: str


@dataclass(frozen=True, slots=True)
class DriftAssessed:
    """Drift's verdict on the interval (planner/live/drift.py): the DriftDetected state, whether to replan now and whether
    a new episode opened (one Warning per episode)."""

    verdict: DriftVerdict


@dataclass(frozen=True, slots=True)
class ReplanInfeasible:
    """`decide` found nothing for the observed load (the stage that removed the last candidates, the closest miss): the
    running layout stays."""

    why: str


@dataclass(frozen=True, slots=True)
class GainWithinError:
    """GainWithinError: the move is worth it by the figures, but its gain is within their combined uncertainty; kept.
    `why` is the gate's sentence, quoting the TPOT intervals it judged by."""

    why: str


@dataclass(frozen=True, slots=True)
class PlanKept:
    """Not worth switching (`why`: worth_switching's reason); the observed workload becomes the one assumed. `drift` is
    the drift verdict's sentence that asked for the replan."""

    why: str
    drift: str


@dataclass(frozen=True, slots=True)
class Proposed:
    """Worth switching, shown only (DryRun, or nothing runs yet)."""

    why: str
    drift: str


@dataclass(frozen=True, slots=True)
class TransitionBlocked:
    """Worth switching, but no transition holds the serving floor within the budget and surge (`why`: the closest miss)."""

    why: str


@dataclass(frozen=True, slots=True)
class TransitionStarted:
    """Worth switching: a transition is declared (memory.transition), holding `floor_rps` at every step."""

    why: str
    drift: str
    transition: TransitionState
    floor_rps: float


Outcome = ReplanInfeasible | GainWithinError | PlanKept | Proposed | TransitionBlocked | TransitionStarted
Effect = (AwaitingMetrics | MetricsMissing | MetricsFlowing | TooLittleData | CalibrationChanged | MoveJudged | Held
          | DriftAssessed | Outcome)


def verdict_of(effects: tuple[Effect, ...]) -> Verdict:
    """The interval's verdict: Propose or Transition when one of those effects is among `effects`, else Keep."""
    for e in effects:
        if isinstance(e, Proposed):
            return Verdict.PROPOSE
        if isinstance(e, TransitionStarted):
            return Verdict.TRANSITION
    return Verdict.KEEP
