"""The planner's exception tree; every error the planner raises on purpose is one of these.

    PlannerError
     ├── InvalidSpec        the input names something unknown or impossible (permanent)
     ├── Infeasible         the input is valid but no layout meets it (says which stage, closest miss)
     └── InsufficientData   observations too thin to act on (retry later)

The CLI maps InvalidSpec to exit code 2; the operator maps it to Ready=False, reason=InvalidSpec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .advice import InfeasibleAdvice

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
    """No candidate survived; `stage` removed the last ones, `closest_miss` says by how much, `advice` (planner.advice)
    what would make it feasible; the message carries all three, so a condition built from str(error) does too."""

    def __init__(self, stage: str, closest_miss: str, *, funnel: tuple[object, ...] = (), advice: InfeasibleAdvice | None = None) -> None:
        message = f"no feasible layout: the last candidates were removed by stage '{stage}'; closest miss: {closest_miss}"
        if advice is not None:
            message += "; to make it feasible: " + "; ".join(advice.lines())
        super().__init__(message)
        self.stage = stage
        self.closest_miss = closest_miss
        self.funnel = funnel  # the FunnelStage rows, so a caller can still print the table
        self.advice = advice


class InsufficientData(PlannerError):
    """Observations are too few or too noisy to estimate a workload from."""
