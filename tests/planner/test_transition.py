"""The transition step planner, run to completion against a fake cluster (LeaderWorkerSet's test shape)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, LayoutKind, Parallelism, Role, RoleLayout
from servingtopology.planner.live.transition import (
    Action,
    Budget,
    CapacityDrop,
    ClusterView,
    Mode,
    Phase,
    Step,
    TransitionState,
    layout_from_state,
    layout_to_state,
    next_step,
    run_ideal,
    start_requested,
    start_transition,
)
from servingtopology.planner.live.transition import StartVerdict as V


def capacity(layout: Layout) -> float:
    """A toy capacity: an aggregated TPn instance carries 2n req/s; PD is limited by its slower role."""
    if layout.kind is LayoutKind.REPLICAS:
        r = layout.roles[Role.AGGREGATED]
        return r.count * 2.0 * r.parallelism.tp
    p, d = layout.roles[Role.PREFILL], layout.roles[Role.DECODE]
    return min(p.count * 3.0 * p.parallelism.tp, d.count * 2.0 * d.parallelism.tp)


def replicas(n: int, tp: int = 1) -> Layout:
    return Layout.replicas(n, Parallelism(tp=tp))


def pd(p: int, d: int, tp_p: int = 1, tp_d: int = 1) -> Layout:
    return Layout.pd(RoleLayout(p, Parallelism(tp=tp_p)), RoleLayout(d, Parallelism(tp=tp_d)))


class FakeCluster:
    """Sets of instances: scale-downs release GPUs one tick later; new instances get ready after a random delay."""

    def __init__(self, name: str, layout: Layout, *, seed: int = 0, never_ready: str | None = None) -> None:
        counts = {r: rl.count for r, rl in layout.roles.items()}
        self.desired: dict[str, dict[Role, int]] = {name: dict(counts)}
        self.ready: dict[str, dict[Role, int]] = {name: dict(counts)}
        self.present: dict[str, dict[Role, int]] = {name: dict(counts)}
        self.shapes: dict[str, Layout] = {name: layout}
        self.serving: tuple[str, ...] = (name,)
        self.rng = random.Random(seed)
        self.never_ready = never_ready

    def view(self) -> ClusterView:
        return ClusterView(ready={k: dict(v) for k, v in self.ready.items()}, present={k: dict(v) for k, v in self.present.items()})

    def apply(self, step: Step) -> None:
        if step.action is Action.SCALE:
            assert step.layout is not None
            name = step.set_name
            self.shapes[name] = step.layout
            want = {r: rl.count for r, rl in step.layout.roles.items()}
            self.desired[name] = want
            self.ready[name] = {r: min(self.ready.get(name, {}).get(r, 0), n) for r, n in want.items()}
            self.present[name] = {r: max(self.present.get(name, {}).get(r, 0), n) for r, n in want.items()}
        elif step.action is Action.DELETE:
            self.desired.pop(step.set_name)
            self.ready.pop(step.set_name)
        elif step.action is Action.ROUTE:
            self.serving = step.serving

    def tick(self) -> None:
        self.present = {k: dict(v) for k, v in self.desired.items()}
        for name, want in self.desired.items():
            if name == self.never_ready:
                continue
            for r, n in want.items():
                if self.ready[name][r] < n and self.rng.random() < 0.6:
                    self.ready[name][r] += 1

    def gpus(self) -> int:
        total = 0
        for name in set(self.desired) | set(self.present):
            layout = self.shapes[name]
            for r, rl in layout.roles.items():
                total += max(self.desired.get(name, {}).get(r, 0), self.present.get(name, {}).get(r, 0)) * rl.parallelism.gpus
        return total

    def serving_capacity(self) -> float:
        total = 0.0
        for name in self.serving:
            counts = self.ready.get(name, {})
            layout = self.shapes[name]
            if counts and all(counts.get(r, 0) > 0 for r in layout.roles):
                total += capacity(Layout(layout.kind, {r: RoleLayout(counts[r], rl.parallelism, rl.knobs) for r, rl in layout.roles.items()},
                                         layout.precision))
        return total


def drive(state: TransitionState, cluster: FakeCluster, budget: Budget, *, roundtrip: bool = False, max_ticks: int = 400,
          tick_s: float = 15.0, gpu_cap: int | None = None) -> list[Step]:
    """Run the planner one step per tick, checking the budget and the floor after every executed step (GPUs against
    `gpu_cap` when the running layout already holds more than the budget: a lowered maxGPUs)."""
    now, steps = state.started_s, []
    for _ in range(max_ticks):
        if roundtrip:
            restored = TransitionState.from_dict(json.loads(json.dumps(state.to_dict())))
            assert restored == state
            state = restored
        step = next_step(state, cluster.view(), budget=budget, capacity=capacity, now_s=now)
        cluster.apply(step)
        steps.append(step)
        assert cluster.gpus() <= max(budget.limit_gpus, gpu_cap or 0), step.message
        assert cluster.serving_capacity() >= budget.floor_rps - 1e-9, step.message
        assert cluster.serving_capacity() > 0 or not budget.keep_serving, step.message
        state = step.state
        if state.phase in (Phase.DONE, Phase.FAILED):
            return steps
        cluster.tick()
        now += tick_s
    raise AssertionError(f"no end after {max_ticks} ticks: {steps[-1].message}")


# (current, target, max_gpus, surge, load) — one row per kind of move
CASES = [
    (replicas(2), replicas(4), 4, 0, 3.0),               # more replicas in place
    (replicas(4), replicas(2), 4, 0, 3.0),               # fewer replicas in place, floor 3 req/s held by 2
    (pd(1, 1), pd(4, 1), 8, 0, 2.0),                      # a new prefill:decode ratio in place
    (pd(3, 1), pd(1, 3), 4, 0, 1.5),                      # ratio flips with no spare GPU: shrink first
    (replicas(2, tp=2), pd(2, 1, 1, 2), 4, 4, 3.5),       # replicas → PD beside the old (surge)
    (replicas(4), replicas(2, tp=2), 4, 0, 1.0),          # new TP degree with no surge: overlap in steps
]


@pytest.mark.parametrize(("current", "target", "max_gpus", "surge", "load"), CASES)
def test_each_kind_of_move_reaches_its_target_within_budget_and_floor(current, target, max_gpus, surge, load):
    floor = min(load, capacity(current))
    budget = Budget(max_gpus=max_gpus, surge_gpus=surge, floor_rps=floor)
    state = start_transition(current, target, budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    cluster = FakeCluster(state.from_set, current, seed=1)
    steps = drive(state, cluster, budget)
    assert steps[-1].state.phase is Phase.DONE
    assert cluster.desired == {state.to_set: {r: rl.count for r, rl in target.roles.items()}}


def test_same_shapes_scale_in_place_and_other_shapes_surge():
    budget = Budget(max_gpus=8, surge_gpus=4, floor_rps=1.0)
    assert start_transition(pd(1, 1), pd(3, 1), budget=budget, capacity=capacity, now_s=0, engine=Engine.VLLM).mode is Mode.IN_PLACE
    assert start_transition(replicas(2), pd(1, 1), budget=budget, capacity=capacity, now_s=0, engine=Engine.VLLM).mode is Mode.SURGE
    assert start_transition(replicas(2), replicas(1, tp=2), budget=budget, capacity=capacity, now_s=0, engine=Engine.VLLM).mode is Mode.SURGE
    knobs = Layout.replicas(2, Parallelism(), EngineKnobs(max_num_seqs=64))
    assert start_transition(replicas(2), knobs, budget=budget, capacity=capacity, now_s=0, engine=Engine.VLLM).mode is Mode.SURGE


def test_a_surge_brings_the_new_set_up_before_traffic_moves_and_deletes_the_old_after_draining():
    budget = Budget(max_gpus=4, surge_gpus=4, floor_rps=3.0, drain_s=60.0)
    state = start_transition(replicas(2, tp=2), pd(2, 1, 1, 2), budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    steps = run_ideal(state, budget=budget, capacity=capacity, now_s=0.0)
    assert [s.action for s in steps] == [Action.SCALE, Action.ROUTE, Action.DELETE, Action.DONE]
    assert steps[1].serving == (state.to_set,)
    assert steps[2].set_name == state.from_set


def test_a_move_that_would_break_the_floor_or_the_budget_is_refused():
    # 1×TP8 on 8 GPUs, no surge, carrying its full load: nothing can start beside it.
    with pytest.raises(Infeasible, match="blocked"):
        start_transition(replicas(1, tp=8), pd(1, 1, 4, 4), budget=Budget(8, 0, floor_rps=8.0), capacity=capacity, now_s=0, engine=Engine.VLLM)
    with pytest.raises(Infeasible, match="over the budget"):
        start_transition(replicas(2), replicas(9), budget=Budget(8, 4, floor_rps=1.0), capacity=capacity, now_s=0, engine=Engine.VLLM)
    with pytest.raises(Infeasible, match="floor"):
        start_transition(replicas(4), replicas(1), budget=Budget(8, 0, floor_rps=6.0), capacity=capacity, now_s=0, engine=Engine.VLLM)


def test_a_set_that_never_gets_ready_is_rolled_back_to_the_source():
    current, target = replicas(2, tp=2), pd(2, 1, 1, 2)
    budget = Budget(max_gpus=4, surge_gpus=4, floor_rps=3.0, ready_timeout_s=120.0)
    state = start_transition(current, target, budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    cluster = FakeCluster(state.from_set, current, never_ready=state.to_set)
    steps = drive(state, cluster, budget)
    assert Action.ROLLBACK in [s.action for s in steps]
    assert steps[-1].state.phase is Phase.DONE and steps[-1].state.rolled_back
    assert cluster.desired == {state.from_set: {Role.AGGREGATED: 2}}
    assert cluster.serving == (state.from_set,)


def test_a_rollback_that_also_stalls_stops_in_failed_and_leaves_things_as_they_are():
    current, target = replicas(2), replicas(4)
    budget = Budget(max_gpus=4, surge_gpus=0, floor_rps=2.0, ready_timeout_s=60.0)
    state = start_transition(current, target, budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    step = next_step(state, ClusterView(ready={state.to_set: {Role.AGGREGATED: 2}}), budget=budget, capacity=capacity, now_s=0.0)
    assert step.action is Action.SCALE
    stuck = ClusterView(ready={state.to_set: {Role.AGGREGATED: 2}}, present={state.to_set: {Role.AGGREGATED: 4}})
    back = next_step(step.state, stuck, budget=budget, capacity=capacity, now_s=100.0)
    assert back.action is Action.ROLLBACK
    # Rolling back means scaling down to 2, but two terminating pods never go away.
    shrink = next_step(back.state, stuck, budget=budget, capacity=capacity, now_s=100.0)
    assert shrink.action is Action.SCALE and shrink.layout is not None and shrink.layout.gpus == 2
    final = next_step(shrink.state, stuck, budget=budget, capacity=capacity, now_s=500.0)
    assert final.state.phase is Phase.FAILED and final.action is Action.WAIT


def test_the_layout_status_form_round_trips_every_field():
    lay = Layout.pd(RoleLayout(3, Parallelism(tp=2, pp=2), EngineKnobs(max_num_seqs=64, memory_fraction=0.85)),
                    RoleLayout(1, Parallelism(tp=4, dp=2, ep=True), EngineKnobs(enable_prefix_caching=False)))
    assert layout_from_state(json.loads(json.dumps(layout_to_state(lay)))) == lay


layouts = st.one_of(
    st.builds(replicas, st.integers(1, 4), st.sampled_from([1, 2, 4])),
    st.builds(pd, st.integers(1, 4), st.integers(1, 4), st.sampled_from([1, 2]), st.sampled_from([1, 2])),
)


@settings(max_examples=60, deadline=None)
@given(current=layouts, target=layouts, spare=st.integers(0, 4), surge=st.integers(0, 8), load_share=st.floats(0.1, 1.0),
       seed=st.integers(0, 1000), roundtrip=st.booleans())
def test_any_start_reaches_the_target_without_breaking_the_floor_or_the_budget(current, target, spare, surge, load_share, seed, roundtrip):
    max_gpus = max(current.gpus, target.gpus) + spare
    floor = load_share * min(capacity(current), capacity(target))
    budget = Budget(max_gpus=max_gpus, surge_gpus=surge, floor_rps=floor)
    try:
        state = start_transition(current, target, budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    except Infeasible:
        assert surge < max(current.gpus, target.gpus)  # only a tight budget may refuse a move
        return
    cluster = FakeCluster(state.from_set, current, seed=seed)
    steps = drive(state, cluster, budget, roundtrip=roundtrip)
    assert steps[-1].state.phase is Phase.DONE
    assert cluster.desired == {state.to_set: {r: rl.count for r, rl in target.roles.items()}}


@settings(max_examples=40, deadline=None)
@given(current=layouts, target=layouts, surge=st.integers(0, 8), cut=st.integers(0, 30), seed=st.integers(0, 100))
def test_a_restarted_operator_resumes_from_any_intermediate_status(current, target, surge, cut, seed):
    budget = Budget(max_gpus=max(current.gpus, target.gpus) + 2, surge_gpus=surge, floor_rps=0.5 * min(capacity(current), capacity(target)))
    try:
        state = start_transition(current, target, budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    except Infeasible:
        return
    cluster = FakeCluster(state.from_set, current, seed=seed)
    now = 0.0
    for _ in range(cut):
        step = next_step(state, cluster.view(), budget=budget, capacity=capacity, now_s=now)
        cluster.apply(step)
        state = step.state
        if state.phase is Phase.DONE:
            break
        cluster.tick()
        now += 15.0
    # The operator restarts: all it has is status (JSON) and the cluster.
    status = json.dumps({"transition": state.to_dict()})
    resumed = TransitionState.from_dict(json.loads(status)["transition"])
    assert resumed == state
    steps = drive(resumed, cluster, budget) if resumed.phase is not Phase.DONE else [Step(Action.DONE, resumed)]
    assert steps[-1].state.phase is Phase.DONE
    assert cluster.desired == {state.to_set: {r: rl.count for r, rl in target.roles.items()}}


@settings(max_examples=80, deadline=None)
@given(current=layouts, target=layouts, max_gpus=st.integers(1, 12), surge=st.integers(0, 8), load=st.floats(0.0, 40.0),
       allow=st.sampled_from(list(CapacityDrop)), seed=st.integers(0, 1000))
def test_a_requested_change_starts_only_as_the_capacity_drop_policy_allows_and_then_keeps_what_it_promised(
        current, target, max_gpus, surge, load, allow, seed):
    """start_requested's verdicts: each started move reaches its target within the GPU budget, keeping the floor it
    recorded (and capacity above zero unless it dropped to zero under Any); a floor below the full one only when the
    policy allows it; nothing started otherwise, with the GPUs a move keeping the full floor would need."""
    budget = Budget(max_gpus=max_gpus, surge_gpus=surge, floor_rps=min(load, capacity(current)))
    got = start_requested(current, target, budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM, allow=allow)
    full = min(budget.floor_rps, capacity(target))
    assert got.full_floor_rps == full and got.started == (got.state is not None)
    assert (got.verdict is V.OVER_BUDGET) == (got.holdable_rps is None)
    if target.gpus > max_gpus:
        assert got.verdict is V.OVER_BUDGET and not got.started
    if got.verdict is V.FLOOR_KEPT:
        assert got.floor_rps == full and got.message == ""
    elif got.verdict is V.FLOOR_LOWERED:
        assert allow is not CapacityDrop.NEVER and 0 < got.floor_rps < full
    elif got.verdict is V.FLOOR_DROPPED:
        assert allow is CapacityDrop.ANY and got.floor_rps == 0
    else:
        assert not got.started and got.message
    if got.gpus_needed is not None:   # the figure the blocked message quotes does keep the full floor
        wide = Budget(max_gpus=max(max_gpus, target.gpus), surge_gpus=got.gpus_needed - max(max_gpus, target.gpus), floor_rps=full)
        start_transition(current, target, budget=wide, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    if got.state is None:
        return
    kept = Budget(max_gpus=max_gpus, surge_gpus=surge, floor_rps=got.floor_rps, keep_serving=got.verdict is not V.FLOOR_DROPPED)
    cluster = FakeCluster(got.state.from_set, current, seed=seed)
    steps = drive(got.state, cluster, kept, gpu_cap=current.gpus)
    assert steps[-1].state.phase is Phase.DONE
    assert cluster.desired == {got.state.to_set: {r: rl.count for r, rl in target.roles.items()}}


def test_a_floor_of_zero_still_keeps_something_serving_unless_the_budget_lets_it_stop():
    # maxGPUs 2, no surge, 3×TP1 → 1×TP2: the TP2 fits only once every TP1 is gone.
    current, target = replicas(3), replicas(1, tp=2)
    with pytest.raises(Infeasible):
        start_transition(current, target, budget=Budget(2, 0, floor_rps=0.0), capacity=capacity, now_s=0, engine=Engine.VLLM)
    state = start_transition(current, target, budget=Budget(2, 0, floor_rps=0.0, keep_serving=False), capacity=capacity, now_s=0, engine=Engine.VLLM)
    assert run_ideal(state, budget=Budget(2, 0, floor_rps=0.0, keep_serving=False), capacity=capacity, now_s=0)[-1].state.phase is Phase.DONE
    got = start_requested(current, target, budget=Budget(2, 0, floor_rps=3.0), capacity=capacity, now_s=0, engine=Engine.VLLM)
    assert got.verdict is V.FLOOR_WOULD_DROP and got.holdable_rps == 0.0 and got.gpus_needed == 4
    assert "keeping it needs 4 GPUs during the move: raise policy.maxSurgeGPUs to 2" in got.message
    assert start_requested(current, target, budget=Budget(2, 0, floor_rps=3.0), capacity=capacity, now_s=0, engine=Engine.VLLM,
                           allow=CapacityDrop.ABOVE_ZERO).verdict is V.FLOOR_WOULD_DROP
    assert start_requested(current, target, budget=Budget(2, 0, floor_rps=3.0), capacity=capacity, now_s=0, engine=Engine.VLLM,
                           allow=CapacityDrop.ANY).verdict is V.FLOOR_DROPPED


def test_capacity_drop_above_zero_finds_a_serving_sequence_below_the_bisections_reach():
    # 8×TP1 → 1×TP8 in 8 GPUs + 1 of surge: one TP1 keeps serving while the TP8 comes up. With a capacity that grows
    # with the batch (2·n³ req/s for n TP1 instances), that one instance carries 2 req/s, under 1/256 of the 2000 req/s
    # floor, below the floor bisection's last step: old main refused AboveZero ("the most a sequence keeps: 0.00")
    # and let Any stop serving though a sequence keeps 2 req/s.
    def steep(layout: Layout) -> float:
        r = layout.roles[Role.AGGREGATED]
        return 2.0 * r.count ** 3 if r.parallelism.tp == 1 else 2000.0 * r.count

    current, target, budget = replicas(8), replicas(1, tp=8), Budget(8, 1, floor_rps=2000.0)
    for allow in (CapacityDrop.ABOVE_ZERO, CapacityDrop.ANY):
        got = start_requested(current, target, budget=budget, capacity=steep, now_s=0.0, engine=Engine.VLLM, allow=allow)
        assert got.verdict is V.FLOOR_LOWERED and got.floor_rps == 2.0 * 1 ** 3 and got.state is not None
        kept = Budget(8, 1, floor_rps=got.floor_rps)
        assert run_ideal(got.state, budget=kept, capacity=steep, now_s=0.0)[-1].state.phase is Phase.DONE
    held = start_requested(current, target, budget=budget, capacity=steep, now_s=0.0, engine=Engine.VLLM)
    assert held.verdict is V.FLOOR_WOULD_DROP and held.holdable_rps == 2.0
    assert held.message.endswith("or set policy.capacityDrop to AboveZero to move keeping at least 2.00 req/s")


def test_a_dip_under_a_hundredth_of_a_request_per_second_is_not_printed_as_zero():
    # 3×TP1 → 1×TP2 in 3 GPUs, no surge, each TP1 carrying 0.004 req/s: the move keeps one TP1 (0.004 req/s) while
    # the TP2 comes up. Old main printed that dip as "0.00 req/s", the figure its messages use for stopping serving.
    def tiny(layout: Layout) -> float:
        r = layout.roles[Role.AGGREGATED]
        return 0.004 * r.count if r.parallelism.tp == 1 else 0.006 * r.count

    current, target, budget = replicas(3), replicas(1, tp=2), Budget(3, 0, floor_rps=0.012)
    held = start_requested(current, target, budget=budget, capacity=tiny, now_s=0.0, engine=Engine.VLLM)
    assert held.verdict is V.FLOOR_WOULD_DROP and held.holdable_rps == pytest.approx(0.004)
    assert "keeps the serving floor of 0.006 req/s" in held.message and "(the most a sequence keeps: 0.004 req/s)" in held.message
    assert held.message.endswith("or set policy.capacityDrop to AboveZero to move keeping at least 0.004 req/s")
    lowered = start_requested(current, target, budget=budget, capacity=tiny, now_s=0.0, engine=Engine.VLLM, allow=CapacityDrop.ABOVE_ZERO)
    assert lowered.verdict is V.FLOOR_LOWERED and "serving capacity may dip to 0.004 req/s" in lowered.message


def test_step_messages_name_layouts_never_the_internal_set_names():
    """Step messages become Events: people read layouts there, not the sets' hashes (s + 6 hex digits)."""
    import re

    budget = Budget(max_gpus=4, surge_gpus=4, floor_rps=3.0, drain_s=60.0, ready_timeout_s=120.0)
    state = start_transition(replicas(2, tp=2), pd(2, 1, 1, 2), budget=budget, capacity=capacity, now_s=0.0, engine=Engine.VLLM)
    messages = [s.message for s in run_ideal(state, budget=budget, capacity=capacity, now_s=0.0)]
    cluster = FakeCluster(state.from_set, replicas(2, tp=2), never_ready=state.to_set)
    messages += [s.message for s in drive(state, cluster, budget)]   # a rollback too
    assert any("2×TP2" in m for m in messages), messages
    assert not [m for m in messages if re.search(r"\bs[0-9a-f]{6}\b", m) or state.to_set in m or state.from_set in m], messages
