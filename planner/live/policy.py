"""The replan loop's policy as planner values: how the operator acts on its plans (`Mode`) and the thresholds, durations
and budgets of one loop (`ReplanPolicy`).

Built by the operator from the resource's `spec.policy` (operator/replan.py `policy_from_spec`, durations in seconds);
read by the loop (planner/live/loop.py `step`) and the spec edit's start (operator/rollout.py). Must not: parse text or
know the resource's field spellings beyond the enum values, which are the CRD's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servingtopology.planner.live.drift import DriftPolicy
from servingtopology.planner.live.transition import CapacityDrop

__all__ = ["Mode", "ReplanPolicy"]


class Mode(enum.StrEnum):
    AUTO = "Auto"        # plan and apply
    DRY_RUN = "DryRun"   # plan, write status.proposal and an Event; never touch workloads
    PINNED = "Pinned"    # apply spec.pinned as is; still report its predicted figures


@dataclass(frozen=True, slots=True)
class ReplanPolicy:
    mode: Mode
    interval_s: float
    drift: DriftPolicy
    max_surge_gpus: int = 0
    capacity_drop: CapacityDrop = CapacityDrop.NEVER   # how far a spec edit's transition may lower the floor
    window_intervals: int = 6        # samples kept for the estimate (the last N intervals)
    ready_timeout_s: float = 900.0
    drain_s: float = 60.0
    error_gate: bool = False         # spec.policy.gainWithinError: a gain within the combined uncertainty changes nothing
    error_misses: int = 0            # moves that missed their predicted interval (widen the intervals 1.5× each)
