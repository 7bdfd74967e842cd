"""One pool plan as one call on one value: the members' options on the pool's kinds (planner.pool.options.build_pool),
then the allocation (planner.pool.plan.plan_pool).

Called by operator/pool_pass.py, through the operator's plan worker: the call runs in a child process under the plan
budget, as a ServingTopology's plan does, so it must be a module-level function of one picklable value. The options
are the costly part (a funnel per member and kind: 256 members took 31 CPU s). Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import GpuKind, PoolDecision, PoolObjective, plan_pool

__all__ = ["PoolRequest", "plan_request"]


@dataclass(frozen=True, slots=True)
class PoolRequest:
    """What a pool plan is asked: the kinds with their counts and prices, the members, and the pool's policy."""

    kinds: tuple[GpuKind, ...]
    members: tuple[MemberRequest, ...]
    objective: PoolObjective
    budget_per_hour: float | None = None
    mixed: bool = True
    max_kinds_per_member: int | None = None


def plan_request(request: PoolRequest) -> PoolDecision:
    """Plan the pool; InvalidSpec as build_pool and plan_pool raise it (`members[i]` names a member by index)."""
    problem, _ = build_pool(request.kinds, request.members, objective=request.objective, budget_per_hour=request.budget_per_hour,
                            mixed=request.mixed, max_kinds_per_member=request.max_kinds_per_member)
    return plan_pool(problem)
