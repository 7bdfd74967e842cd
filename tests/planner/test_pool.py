"""The pool planner against a brute-force search on small pools, its named decisions and its bad-input errors."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Layout, Parallelism, RoleLayout
from servingtopology.planner.pool.plan import (
    GREEDY_FLOORS_MISSED,
    MAX_PARTS,
    GpuKind,
    MemberOption,
    PoolMember,
    PoolObjective,
    PoolProblem,
    objective_values,
    plan_pool,
)
from servingtopology.planner.pool.service_split import per_pod_capacity_rps

KINDS = ("fast", "cheap")


def _kinds(counts: tuple[int, int], prices: tuple[float, float]) -> tuple[GpuKind, ...]:
    return (GpuKind("fast", resolve_gpu("h100_sxm"), counts[0], prices[0], 400.0),
            GpuKind("cheap", resolve_gpu("a100_sxm"), counts[1], prices[1], 200.0))


def brute_force(problem: PoolProblem) -> tuple[float, float, float] | None:
    """The best lexicographic value over every selection (≤ 1 option per group, ≤ MAX_PARTS per member, on at most
    max_kinds_per_member kinds), each member's capacity what one plain Service carries (PerPodSplit)."""
    price = {k.name: k.price_per_hour for k in problem.kinds}
    per_member = []
    for m in problem.members:
        groups: dict[str, list[MemberOption]] = {}
        for o in m.options:
            groups.setdefault(o.group, []).append(o)
        sets = []
        for choice in itertools.product(*[[None, *opts] for opts in groups.values()]):
            parts = [o for o in choice if o is not None]
            if len(parts) > MAX_PARTS:
                continue
            if problem.max_kinds_per_member is not None and len({k for o in parts for k, v in o.gpus.items() if v}) > problem.max_kinds_per_member:
                continue
            cap = per_pod_capacity_rps(entry_pods=[o.entry_pods for o in parts], capacity_rps=[o.capacity_rps for o in parts]) if parts else 0.0
            if cap < m.min_rps - 1e-9:
                continue
            gpus = {k: sum(o.gpus.get(k, 0) for o in parts) for k in price}
            sets.append((cap, sum(gpus[k] * price[k] for k in price), gpus))
        per_member.append(sets)
    best = None
    for combo in itertools.product(*per_member):
        if any(sum(s[2][k.name] for s in combo) > k.count for k in problem.kinds):
            continue
        cost = sum(s[1] for s in combo)
        if problem.objective is PoolObjective.MAX_GOODPUT and cost > (problem.budget_per_hour or 0) + 1e-9:
            continue
        v = objective_values(problem, np.array([s[0] for s in combo]), cost)
        if best is None or v > best:
            best = v
    return best


@st.composite
def pools(draw: st.DrawFn) -> PoolProblem:
    counts = (draw(st.integers(0, 8)), draw(st.integers(0, 8)))
    prices = (draw(st.sampled_from([2.0, 3.0, 4.0])), draw(st.sampled_from([1.0, 1.5, 2.0])))
    members = []
    for i in range(draw(st.integers(1, 3))):
        opts = []
        for group in draw(st.lists(st.sampled_from(["fast", "cheap", "fast→cheap"]), min_size=1, max_size=3, unique=True)):
            for _ in range(draw(st.integers(1, 3))):
                if group == "fast→cheap":
                    gpus = {"fast": draw(st.integers(1, 3)), "cheap": draw(st.integers(1, 3))}
                else:
                    gpus = {group: draw(st.integers(1, 4))}
                cap = draw(st.integers(1, 16)) * 0.5
                pods = draw(st.sampled_from([0, 1, 2, 3]))   # entry pods behind the Service (0: no layout, one endpoint)
                layout = Layout.replicas(pods, Parallelism(tp=1)) if pods else None
                opts.append(MemberOption(group, f"{group}-{len(opts)}", gpus, cap, layout))
        load = draw(st.integers(1, 20)) * 0.5
        members.append(PoolMember(f"m{i}", load, tuple(opts), priority=draw(st.integers(0, 2)),
                                  min_rps=draw(st.sampled_from([0.0, 0.0, 0.5]))))
    objective = draw(st.sampled_from(list(PoolObjective)))
    budget = float(draw(st.integers(2, 40))) if objective is PoolObjective.MAX_GOODPUT else None
    return PoolProblem(_kinds(counts, prices), tuple(members), objective, budget,
                       max_kinds_per_member=draw(st.sampled_from([None, None, 1, 2])))


# derandomize: the same examples on every run, so CI cannot turn on a new draw; wider random runs found the two
# regressions below (5,000 and 1,500 examples, every seed clean after their fixes).
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(pools())
def test_the_pool_planner_objective_equals_a_brute_force_search(problem: PoolProblem) -> None:
    best = brute_force(problem)
    if best is None:
        with pytest.raises(InvalidSpec) as err:
            plan_pool(problem)
        assert err.value.field == "inventory"
        return
    d = plan_pool(problem)
    caps = np.array([a.capacity_rps for a in d.members])
    got = objective_values(problem, caps, d.cost_per_hour)
    assert got == pytest.approx(best, abs=1e-6)
    assert d.solver.method == "milp"
    for k in problem.kinds:   # never over the inventory, idle is what is left
        assert d.used[k.name] + d.idle[k.name] == k.count and d.idle[k.name] >= 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(pools())
def test_the_option_model_the_exact_solve_falls_back_to_equals_the_brute_force_too(problem: PoolProblem) -> None:
    # Past exact_max_selections (members of hundreds of options) the exact solve is the option model's big-M rows.
    best = brute_force(problem)
    if best is None:
        return
    d = plan_pool(replace(problem, exact_max_selections=0))
    got = objective_values(problem, np.array([a.capacity_rps for a in d.members]), d.cost_per_hour)
    assert got == pytest.approx(best, abs=1e-6)
    assert d.solver.method == "milp"


def _option(group: str, gpus: dict[str, int], cap: float) -> MemberOption:
    return MemberOption(group, f"{group}:{gpus}", gpus, cap)


def test_a_missing_price_is_a_named_error() -> None:
    kinds = _kinds((4, 4), (3.0, 0.0))
    problem = PoolProblem(kinds, (PoolMember("a", 1.0, (_option("fast", {"fast": 1}, 2.0),)),))
    with pytest.raises(InvalidSpec) as err:
        plan_pool(problem)
    assert err.value.field == "inventory[1].pricePerHour"


def test_an_inventory_below_the_members_minimums_names_each_member() -> None:
    opts = (_option("fast", {"fast": 2}, 4.0), _option("cheap", {"cheap": 4}, 4.0))
    members = (PoolMember("alpha", 4.0, opts, min_rps=4.0), PoolMember("beta", 4.0, opts, min_rps=4.0),
               PoolMember("gamma", 4.0, opts, min_rps=4.0))
    with pytest.raises(InvalidSpec) as err:
        plan_pool(PoolProblem(_kinds((2, 4), (3.0, 1.0)), members))
    assert err.value.field == "inventory"
    assert all(name in err.value.message for name in ("alpha", "beta", "gamma"))


def test_a_short_pool_meets_the_higher_priority_first_and_names_who_is_short() -> None:
    opts = (_option("fast", {"fast": 2}, 4.0), _option("cheap", {"cheap": 4}, 2.0))
    members = (PoolMember("low", 4.0, opts, priority=1), PoolMember("high", 4.0, opts, priority=5))
    d = plan_pool(PoolProblem(_kinds((2, 4), (3.0, 1.0)), members))
    by = {a.name: a for a in d.members}
    assert by["high"].met and not by["low"].met
    assert by["low"].capacity_rps == pytest.approx(2.0)   # the rest serves it partly
    (short,) = d.shortages
    assert short.member == "low" and short.short_rps == pytest.approx(2.0) and short.needs == {"fast": 2}
    assert any(m.member == "low" and m.kind == "fast" for m in d.marginals) is False   # one GPU is not a 2-GPU option
    assert d.idle == {"fast": 0, "cheap": 0}


def test_one_more_gpu_is_valued_where_it_completes_an_option() -> None:
    opts = (_option("fast", {"fast": 1}, 2.0), _option("fast", {"fast": 2}, 4.0))
    d = plan_pool(PoolProblem(_kinds((1, 0), (3.0, 1.0)), (PoolMember("m", 4.0, opts),)))
    (marginal,) = [m for m in d.marginals if m.kind == "fast"]
    assert marginal.goodput_rps == pytest.approx(2.0) and marginal.cost_per_hour == pytest.approx(3.0)


def test_a_member_spans_two_kinds_where_each_entry_pod_carries_its_equal_share() -> None:
    # 3 fast pods at 1 req/s each and 1 cheap pod at 1 req/s: the per-pod split (75 %:25 %) is the capacity split, so
    # the parts add up
    fast = MemberOption("fast", "3×TP1@fast", {"fast": 3}, 3.0, Layout.replicas(3, Parallelism(tp=1)))
    cheap = MemberOption("cheap", "1×TP1@cheap", {"cheap": 1}, 1.0, Layout.replicas(1, Parallelism(tp=1)))
    d = plan_pool(PoolProblem(_kinds((3, 1), (3.0, 1.0)), (PoolMember("m", 4.0, (fast, cheap)),)))
    (a,) = d.members
    assert a.met and a.capacity_rps == pytest.approx(4.0)
    assert sorted(p.routing_weight for p in a.parts) == pytest.approx([0.25, 0.75])


def test_parts_whose_pods_differ_are_planned_at_what_one_plain_service_carries_not_their_sum() -> None:
    # PlanTheRenderedSplit, the shape of examples/pool.yaml's summarise: 1 cheap pod at 1.1 req/s beside a PD part
    # (2 routers) at 7.3 req/s adds up to 8.4 ≥ 8, but the Service sends the cheap pod a third: 3 × 1.1 = 3.3 req/s.
    # The planner takes the dearer single part that really carries the load.
    pd = Layout.pd(RoleLayout(1, Parallelism(tp=1)), RoleLayout(1, Parallelism(tp=1)))
    opts = (MemberOption("cheap", "1×TP1@cheap", {"cheap": 1}, 1.1, Layout.replicas(1, Parallelism(tp=1))),
            MemberOption("fast→cheap", "1P1D@fast→cheap", {"fast": 1, "cheap": 1}, 7.3, pd),
            MemberOption("fast", "2×TP1@fast", {"fast": 2}, 11.5, Layout.replicas(2, Parallelism(tp=1))))
    d = plan_pool(PoolProblem(_kinds((4, 4), (3.0, 1.6)), (PoolMember("m", 8.0, opts),)))
    (a,) = d.members
    assert a.met and [p.option.label for p in a.parts] == ["2×TP1@fast"] and a.capacity_rps == pytest.approx(11.5)
    # with one fast GPU the member is short: the PD part alone (7.3) carries more than both parts behind one Service (3.3),
    # the shortage and the marginal value say so, and one more fast GPU is worth the 0.7 req/s the split leaves
    d = plan_pool(PoolProblem(_kinds((1, 2), (3.0, 1.6)), (PoolMember("m", 8.0, opts),)))
    (a,) = d.members
    assert not a.met and [p.option.label for p in a.parts] == ["1P1D@fast→cheap"] and a.capacity_rps == pytest.approx(7.3)
    (short,) = d.shortages
    assert short.short_rps == pytest.approx(0.7) and short.needs == {"fast": 1}
    (more,) = [m for m in d.marginals if m.kind == "fast"]
    assert more.goodput_rps == pytest.approx(0.7) and more.becomes == "2×TP1@fast"
    assert not [m for m in d.marginals if m.kind == "cheap"]   # a cheap pod beside the PD part lowers what it carries


def test_a_bound_on_kinds_per_member_keeps_each_member_on_that_many_kinds() -> None:
    opts = (_option("fast", {"fast": 1}, 2.0), _option("cheap", {"cheap": 1}, 2.0), _option("fast", {"fast": 2}, 4.0))
    free = plan_pool(PoolProblem(_kinds((2, 1), (3.0, 1.0)), (PoolMember("m", 4.0, opts),)))
    assert set(free.members[0].gpus) == {"fast", "cheap"} and free.members[0].met   # 1 fast + 1 cheap: $4/hour
    one = plan_pool(PoolProblem(_kinds((2, 1), (3.0, 1.0)), (PoolMember("m", 4.0, opts),), max_kinds_per_member=1))
    assert one.members[0].gpus == {"fast": 2} and one.members[0].met and one.cost_per_hour == pytest.approx(6.0)
    with pytest.raises(InvalidSpec) as err:
        plan_pool(PoolProblem(_kinds((2, 1), (3.0, 1.0)), (PoolMember("m", 4.0, opts),), max_kinds_per_member=0))
    assert err.value.field == "maxKindsPerMember"


def test_a_two_kind_member_says_what_one_plain_service_carries_when_its_parts_have_layouts() -> None:
    fast = MemberOption("fast", "1×TP1@fast", {"fast": 1}, 1.5, Layout.replicas(1, Parallelism(tp=1)))
    cheap = MemberOption("cheap", "1×TP1@cheap", {"cheap": 1}, 1.0, Layout.replicas(1, Parallelism(tp=1)))
    d = plan_pool(PoolProblem(_kinds((1, 1), (3.0, 1.0)), (PoolMember("m", 4.0, (fast, cheap)),)))
    (a,) = d.members
    # one pod each: 50 %:50 % per pod against 60 %:40 % by capacity; the cheap part binds at 1.0 / 0.5, still more than
    # the fast part alone (1.5), and the verdict is that figure
    assert a.capacity_rps == pytest.approx(2.0) and "short: 1×TP1@fast [fast] + 1×TP1@cheap [cheap] carries 2.0 of 4 req/s" in a.why
    assert "PerPodSplit" in a.why and "carries 2 req/s within the SLOs under this split, 2.5 req/s were it split by capacity" in a.why, a.why


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(pools())
def test_the_greedy_stays_within_the_inventory_and_its_stated_bound(problem: PoolProblem) -> None:
    if brute_force(problem) is None:
        return
    exact = plan_pool(problem)
    greedy = plan_pool(PoolProblem(problem.kinds, problem.members, problem.objective, problem.budget_per_hour, exact_max_options=0,
                                   max_kinds_per_member=problem.max_kinds_per_member))
    assert greedy.solver.method in ("greedy", GREEDY_FLOORS_MISSED)
    for k in problem.kinds:
        assert greedy.used[k.name] <= k.count
    if problem.objective is PoolObjective.MAX_GOODPUT:
        assert greedy.cost_per_hour <= (problem.budget_per_hour or 0) + 1e-9
    first = objective_values(problem, np.array([a.capacity_rps for a in exact.members]), exact.cost_per_hour)[0]
    got = objective_values(problem, np.array([a.capacity_rps for a in greedy.members]), greedy.cost_per_hour)[0]
    assert got <= first + 1e-6
    assert first - got <= greedy.solver.gap * max(1.0, first) + 1e-6   # the LP bound covers the greedy's loss


def test_a_level_fixed_with_the_solvers_slack_keeps_the_true_optimum() -> None:
    """HiGHS reported goodput 1.5000008 for a 1.5 selection; fixed without slack, the next level lost the selection that
    meets the higher-priority member (met weight 1 instead of 2)."""
    m0 = PoolMember("m0", 1.5, (_option("fast", {"fast": 1}, 1.0), _option("fast→cheap", {"fast": 1, "cheap": 1}, 1.5),
                                _option("cheap", {"cheap": 1}, 1.0)), priority=1)
    m1 = PoolMember("m1", 0.5, (_option("fast", {"fast": 1}, 0.5),), priority=0)
    problem = PoolProblem(_kinds((1, 1), (2.0, 1.0)), (m0, m1), PoolObjective.MAX_GOODPUT, 3.0)
    d = plan_pool(problem)
    got = objective_values(problem, np.array([a.capacity_rps for a in d.members]), d.cost_per_hour)
    assert brute_force(problem) == pytest.approx((1.5, 2.0, -3.0))
    assert got == pytest.approx((1.5, 2.0, -3.0))


def test_floors_the_greedy_cannot_pack_go_to_the_milp_not_to_a_shortage() -> None:
    """The greedy gave the first floor two cheap GPUs and had none left for the second; a packing exists (1 cheap, and
    1 fast + 1 cheap)."""
    members = (PoolMember("m0", 0.5, (_option("fast", {"fast": 1}, 0.5),)),
               PoolMember("m1", 0.5, (_option("cheap", {"cheap": 1}, 0.5),), min_rps=0.5),
               PoolMember("m2", 0.5, (_option("cheap", {"cheap": 2}, 0.5), _option("fast→cheap", {"fast": 1, "cheap": 1}, 0.5)),
                          priority=1, min_rps=0.5))
    problem = PoolProblem(_kinds((1, 2), (2.0, 1.0)), members, PoolObjective.MIN_COST, None, exact_max_options=0)
    d = plan_pool(problem)
    assert d.solver.method == GREEDY_FLOORS_MISSED
    by = {a.name: a for a in d.members}
    assert by["m1"].capacity_rps >= 0.5 and by["m2"].capacity_rps >= 0.5
    assert d.used == {"fast": 1, "cheap": 2}
