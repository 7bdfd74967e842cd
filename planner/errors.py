"""The planner's exception tree; every error the planner raises on purpose is one of these.

    PlannerError
     ├── InvalidSpec        the input names something unknown or impossible (permanent)
     ├── Infeasible         the input is valid but no layout meets it (says which stage, closest miss)
     └── InsufficientData   observations too thin to act on (retry later)

The CLI maps InvalidSpec to exit code 2; the operator maps it to Ready=False, reason=InvalidSpec.
"""

from __future__ import annotations

__all__ = ["PlannerError", "InvalidSpec", "Infeasible", "InsufficientData"]


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class InvalidSpec(PlannerError):
    """A field names something unknown or impossible; `field` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Infeasible(PlannerError):
    """No candidate survived; `stage` removed the last ones, `closest_miss` says by how much."""

    def __init__(self, stage: str, closest_miss: str, *, funnel: tuple[object, ...] = ()) -> None:
        super().__init__(f"no feasible layout: the last candidates were removed by stage '{stage}'; closest miss: {closest_miss}")
        self.stage = stage
        self.closest_miss = closest_miss
        self.funnel = funnel  # the FunnelStage rows, so a caller can still print the table


class InsufficientData(PlannerError):
    """Observations are too few or too noisy to estimate a workload from."""
