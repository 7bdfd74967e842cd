"""Transitions in the reconcile's terms: start one for a changed plan, name its sets after what really runs,
and the plan a finished one leaves in status.

Called by the reconcile (operator/reconcile.py); the steps themselves are planner/live/transition.py's, taken one
per pass through operator/replan.py's `transition_step`. Pure: values in, values out (time in seconds is an
argument); it never talks to the API server and never writes Events (it returns their wording).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from servingtopology.operator.api.resource import PlanStatus, ProposalStatus
from servingtopology.operator.plan_status import ArgsOf, layout_from_plan, plan_status
from servingtopology.operator.replan import Predictor, ReplanMemory, ReplanPolicy, transition_problem
from servingtopology.planner.errors import InsufficientData
from servingtopology.planner.layout import Layout
from servingtopology.planner.live.observe import observe
from servingtopology.planner.live.replan_decision import capacity_of
from servingtopology.planner.live.transition import Budget, StartVerdict, start_requested
from servingtopology.planner.live.transition import set_name as layout_set_name
from servingtopology.planner.problem import Problem

__all__ = ["Started", "running_set", "rebase_sets", "load_rps", "start_for_change", "finished_plan"]


@dataclass(frozen=True, slots=True)
class Started:
    """A spec edit's change, decided: the memory (with the transition when one starts), the planner's verdict
    (StartVerdict: FloorKept, FloorLowered, FloorDroppedToZero, or not started: FloorWouldDrop, OverBudget) and
    its sentence (empty when the full floor is kept)."""

    memory: ReplanMemory
    verdict: StartVerdict
    message: str = ""

    @property
    def started(self) -> bool:
        return self.verdict in (StartVerdict.FLOOR_KEPT, StartVerdict.FLOOR_LOWERED, StartVerdict.FLOOR_DROPPED)

    @property
    def warning(self) -> str:
        """The Warning to post with TransitionStarted when the floor is lower than the full one (empty otherwise)."""
        return self.message if self.verdict in (StartVerdict.FLOOR_LOWERED, StartVerdict.FLOOR_DROPPED) else ""


def running_set(plan: PlanStatus) -> str:
    """The set the plan runs as (status.plan.set; plans written before sets existed: the layout's hash)."""
    return plan.set or layout_set_name(layout_from_plan(plan))


def rebase_sets(memory: ReplanMemory, running: str) -> ReplanMemory:
    """Name the transition's sets after the set that really runs, not after the layout's hash.

    The planner names sets by layout shapes; a plan adopted under another name (an older operator, or a
    target that took a suffix) keeps its objects only if the transition starts from that name.
    """
    state = memory.transition
    if state is None or state.from_set == running:
        return memory
    old = state.from_set
    to_set = running if state.to_set == old else (state.to_set if state.to_set != running else state.to_set + "b")
    desired = {running if k == old else k: v for k, v in state.desired.items()}
    state = replace(state, from_set=running, to_set=to_set, desired=desired,
                    serving=tuple(running if s == old else s for s in state.serving))
    return replace(memory, transition=state)


def load_rps(memory: ReplanMemory, problem: Problem) -> float:
    """The load a transition must keep carrying: the observed rate while metrics flow, else the spec's."""
    if memory.metrics_available and memory.samples:
        try:
            return float(observe(memory.samples).workload.workload.arrival_rate_rps or 0.0)
        except InsufficientData:
            pass
    return float(problem.workload.arrival_rate_rps or 0.0)


def start_for_change(memory: ReplanMemory, *, problem: Problem, current: Layout, target: Layout, running: str,
                     policy: ReplanPolicy, now_s: float) -> Started:
    """Decide the transition a changed plan (a spec edit) asks for.

    The floor is min(load, the running layout's capacity), above zero. The transition planner's `start_requested`
    keeps it, or (no step sequence keeps it inside the GPU budget plus surge) lowers it only as far as
    `policy.capacity_drop` (spec.policy.capacityDrop) allows; otherwise nothing starts (FloorWouldDrop, or OverBudget
    when no sequence exists at all) and the caller keeps the running layout, naming the GPUs the move needs.
    """
    # OneCapacityModel: judged as every step of it will be (the live calibration's factors; `assumed` is reset below).
    capacity = capacity_of(transition_problem(replace(memory, assumed=None), problem))
    budget = Budget(max_gpus=problem.max_gpus, surge_gpus=policy.max_surge_gpus,
                    floor_rps=min(load_rps(memory, problem), capacity(current)),
                    ready_timeout_s=policy.ready_timeout_s, drain_s=policy.drain_s)
    requested = start_requested(current, target, budget=budget, capacity=capacity, now_s=now_s, engine=problem.engine,
                                allow=policy.capacity_drop)
    if requested.state is None:
        return Started(memory, requested.verdict, requested.message)
    started = replace(memory, transition=requested.state, transition_floor_rps=requested.floor_rps, assumed=None,
                      transition_keeps_serving=requested.verdict is not StartVerdict.FLOOR_DROPPED)
    return Started(rebase_sets(started, running), requested.verdict, requested.message)


def finished_plan(memory: ReplanMemory, proposal: ProposalStatus | None, *, problem: Problem, predict: Predictor, args_of: ArgsOf,
                  now: datetime, generation: int) -> PlanStatus:
    """The plan a finished transition leaves running: its proposal, or (status lost) the target re-predicted."""
    state = memory.transition
    assert state is not None
    if proposal is not None and proposal.layout == state.target.label_for(problem.engine) and proposal.gpus == state.target.gpus:
        fields = {k: getattr(proposal, k) for k in PlanStatus.model_fields}
        return PlanStatus(**{**fields, "set": state.to_set})
    plan = plan_status(predict(problem, state.target), engine=problem.engine, args_of=args_of, reasons=[state.message], now=now, generation=generation)
    return plan.model_copy(update={"set": state.to_set})
