"""What the replan loop remembers between intervals (`LoopMemory`): the metric window, drift's state, the deployment's
live calibration, the workload the running plan was made for, the running transition and the last gated move.

Returned by every call of the loop (planner/live/loop.py `step`) and handed back to the next. The operator keeps it in
status.replan (operator/replan.py `ReplanMemory` adds the JSON reading and writing). Must not: read or write JSON,
status or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servingtopology.planner.live.calibration import LiveCalibration
from servingtopology.planner.live.drift import DriftState
from servingtopology.planner.live.observe import MetricSample
from servingtopology.planner.live.transition import Phase, TransitionState
from servingtopology.planner.workload import Workload

__all__ = ["LoopMemory"]


@dataclass(frozen=True, slots=True)
class LoopMemory:
    """The replan loop's memory of earlier intervals (times in seconds since the epoch)."""

    samples: tuple[MetricSample, ...] = ()
    drift: DriftState = field(default_factory=DriftState)
    calibration: LiveCalibration = field(default_factory=LiveCalibration)   # the operator's own fit (planner/live/calibration.py)
    assumed: Workload | None = None          # the workload the running plan was made for (None: the spec's)
    metrics_available: bool | None = None    # None until the first fetch
    last_fetch_s: float | None = None
    transition: TransitionState | None = None
    transition_floor_rps: float = 0.0        # min(load, running capacity) when the transition started
    transition_keeps_serving: bool = True    # serving capacity stays above zero (False: started under capacityDrop Any)
    # The last gain-motivated move and its predicted TPOT interval, as status.replan.move keeps it (JSON: layout, tpotMs
    # {value, low, high}; once judged measuredTpotMs, errorPercent, hit).
    move: dict[str, Any] | None = None
    misses: int = 0                          # moves whose measured TPOT missed the interval: each widens the next bar

    def due(self, now_s: float, interval_s: float) -> bool:
        """Whether a replan interval has passed since the last fetch."""
        return self.last_fetch_s is None or now_s - self.last_fetch_s >= interval_s

    @property
    def transitioning(self) -> bool:
        return self.transition is not None and self.transition.phase not in (Phase.DONE, Phase.FAILED)
