"""The plan worker: a plan runs in a child process under a wall-time and a memory budget; over budget it is killed
and reported (PlanBudgetExceeded), the caller's process is untouched; the planner's own errors come back as
themselves; one Problem is planned once; a failed plan is retried only after a back-off; a pass never waits longer
than `wait_s` (PlanPending)."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import plan_fakes
import pytest
from test_reconcile import topology

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.cluster.plan_worker import (
    FAILURE_BACKOFF_S,
    ChildFailed,
    PlanBudget,
    PlanBudgetExceeded,
    PlanPending,
    PlanWorker,
    blocking,
)
from servingtopology.planner.errors import Infeasible
from servingtopology.planner.problem import Problem
from servingtopology.spec import to_problem


def problem(rate: float = 40.0) -> Problem:
    obj = topology()
    obj["spec"]["workload"]["arrivalRate"] = rate
    return to_problem(parse_topology_spec(obj["spec"]))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def worker(fn: object, **kw: object) -> PlanWorker:
    return PlanWorker(fn=fn, **kw)  # type: ignore[arg-type]


def test_a_plan_over_its_wall_time_is_killed_and_named_without_waiting_for_it() -> None:
    w = worker(plan_fakes.endless, budget=PlanBudget(wall_s=2.0, memory_mib=256))
    started = time.monotonic()
    with pytest.raises(PlanBudgetExceeded) as caught:
        w.plan(problem(), wait_s=None)
    assert time.monotonic() - started < 20
    assert caught.value.kind == "time" and "planning took > 2 s wall" in str(caught.value) and "spec.search" in str(caught.value)


def test_a_stopped_plan_says_what_it_had_used_and_which_setting_raises_the_budget() -> None:
    w = worker(plan_fakes.spinning, budget=PlanBudget(wall_s=2.0, memory_mib=256))
    with pytest.raises(PlanBudgetExceeded) as caught:
        w.plan(problem(), wait_s=None)
    used = caught.value.detail
    assert used.endswith(" CPU s used") and 0.1 <= float(used.split()[0]) <= 2.5, used   # a busy child, read before the kill
    assert "operator.plan.timeoutSeconds (--plan-timeout-s)" in str(caught.value)
    memory = PlanBudgetExceeded(PlanBudget(), "memory")
    assert "> 768 MiB" in str(memory) and "operator.plan.memoryMiB (--plan-memory-mib)" in str(memory)


# Every spec field PlanBudgetExceeded advises, and another value of it: the operator's problem must change with it
# (a setting the operator ignores would leave the Problem as it was, and the advice would be false).
ADVISED = [
    ("search", "layouts", ["replicas"]),           # "narrow spec.search (layouts, tp, pp, dp, preset)"
    ("search", "tp", [1]),
    ("search", "pp", [1]),
    ("search", "dp", [2]),                         # a dense model searches dp [1] by default: read, if not lowered
    ("search", "preset", "narrow"),
    ("search", "topK", 1),                         # "lower spec.search.topK"
    ("simulation", "requests", 50),                # "spec.simulation.requests": stage 6's SimulationBudget
    ("hardware", "maxGPUs", 2),                    # "spec.hardware.maxGPUs"
]


def test_every_setting_the_budget_advice_names_changes_the_operators_plan() -> None:
    from servingtopology.operator.pass_context import problem_from_spec

    message = str(PlanBudgetExceeded(PlanBudget(), "time"))
    for section, name, value in ADVISED:
        assert f"spec.{section}" in message and name in message, (section, name)
        obj = topology()
        obj["spec"].setdefault(section, {})[name] = value
        base = problem_from_spec(parse_topology_spec(topology()["spec"]), None)
        assert problem_from_spec(parse_topology_spec(obj["spec"]), None) != base, (section, name)
    pinned = topology()
    pinned["spec"]["policy"] = {**pinned["spec"].get("policy", {}), "mode": "Pinned"}
    pinned["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    assert "policy.mode Pinned with spec.pinned" in message
    assert problem_from_spec(parse_topology_spec(pinned["spec"]), None).pinned is not None


def test_the_default_budget_plans_the_largest_gpu_budget_a_spec_allows() -> None:
    """PlanBudgetFollowsTheWork: 16,384 GPUs (the spec's limit) of the wide 70B search grew 550 MiB; 256 MiB refused it."""
    import yaml

    from servingtopology.spec import MAX_GPUS, parse_spec

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "plan-llama70b-wide.yaml").read_text())
    data["hardware"]["maxGPUs"] = MAX_GPUS
    w = PlanWorker(budget=PlanBudget(wall_s=300.0, memory_mib=PlanBudget().memory_mib), slots=1)
    try:
        decision = w.plan(to_problem(parse_spec(data)), wait_s=None)
    finally:
        w.close()
    assert decision.best.layout.gpus <= MAX_GPUS and w.last_cost is not None
    assert 0 < w.last_cost.memory_mib < PlanBudget().memory_mib, w.last_cost


def test_a_plan_over_its_memory_budget_is_stopped_and_the_operator_process_does_not_grow() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    w = worker(plan_fakes.hungry, budget=PlanBudget(wall_s=60.0, memory_mib=512))
    with pytest.raises(PlanBudgetExceeded) as caught:
        w.plan(problem(), wait_s=None)
    assert caught.value.kind == "memory" and "> 512 MiB" in str(caught.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024   # KiB: the 4 GiB was the child's


def test_the_planners_own_errors_come_back_as_themselves() -> None:
    w = worker(plan_fakes.infeasible)
    with pytest.raises(Infeasible) as caught:
        w.plan(problem(), wait_s=None)
    assert caught.value.stage == "slo" and caught.value.funnel == ("row",) and "p95 TTFT" in str(caught.value)


def test_a_child_that_dies_is_a_failure_of_the_plan_not_of_the_caller() -> None:
    with pytest.raises(ChildFailed, match="exited with 3"):
        worker(plan_fakes.crash).plan(problem(), wait_s=None)


def test_a_pass_waits_at_most_wait_s_then_finds_the_finished_plan_without_planning_again() -> None:
    w = worker(plan_fakes.slow, wait_s=0.1)
    with pytest.raises(PlanPending) as caught:
        w(problem())
    assert 0 < caught.value.retry_after_s <= 10
    assert w.plan(problem(), wait_s=None).best.layout.label == "2×TP4"
    assert w(problem()).best.layout.label == "2×TP4"
    assert w.plans_started == 1


def test_plans_of_different_problems_are_separate_and_blocking_waits() -> None:
    w = worker(plan_fakes.quick)
    assert blocking(w)(problem(10.0)).best.layout.label == "2×TP4"
    assert blocking(w)(problem(20.0)).best.layout.label == "2×TP4"
    assert w.plans_started == 2
    plain = plan_fakes.quick
    assert blocking(plain) is plain


def test_a_failed_plan_is_tried_again_only_after_an_exponential_back_off() -> None:
    clock = Clock()
    w = worker(plan_fakes.endless, budget=PlanBudget(wall_s=0.5, memory_mib=256), clock=clock)
    for _ in range(3):
        with pytest.raises(PlanBudgetExceeded):
            w.plan(problem(), wait_s=None)
    assert w.plans_started == 1                      # the same Problem within the back-off: the kept failure
    clock.now += FAILURE_BACKOFF_S
    with pytest.raises(PlanBudgetExceeded):
        w.plan(problem(), wait_s=None)
    assert w.plans_started == 2
    clock.now += FAILURE_BACKOFF_S                   # the second back-off is twice as long
    with pytest.raises(PlanBudgetExceeded):
        w.plan(problem(), wait_s=None)
    assert w.plans_started == 2
    clock.now += FAILURE_BACKOFF_S
    with pytest.raises(PlanBudgetExceeded):
        w.plan(problem(), wait_s=None)
    assert w.plans_started == 3
