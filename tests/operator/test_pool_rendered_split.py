"""The pool's verdict is what the objects the operator renders carry: a member's parts rendered as one set each behind the
one entry Service (operator/render/sets.py `parts_rendering`), its entry pods counted from the rendered workloads that
Service selects, and the per-pod split of those pods (planner/pool/service_split.py) equal to the capacity, the traffic
shares and the met/short verdict the pool planner reports (planner/pool/plan.py, PlanTheRenderedSplit)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from cases import blueprint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servingtopology.operator.render.manifests import SET_LABEL, build_topology
from servingtopology.operator.render.sets import on_kind, parts_rendering
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.pool.plan import GpuKind, MemberAllocation, MemberOption, PoolMember, PoolProblem, plan_pool
from servingtopology.planner.pool.service_split import PartLoad, service_split

KINDS = (GpuKind("fast", resolve_gpu("h100_sxm"), 8, 3.0, 400.0), GpuKind("cheap", resolve_gpu("a100_sxm"), 8, 1.6, 200.0))
GPU_OF = {k.name: k.gpu.id for k in KINDS}


def _rendered(option: MemberOption) -> Layout:
    """The part's layout with each role on the GPU kind the option names, as the operator renders it."""
    assert option.layout is not None
    if option.layout.kind.value == "replicas":
        return on_kind(option.layout, GPU_OF[option.group])
    kinds = {Role(r): k for r, k in option.role_kinds.items()}
    return Layout(option.layout.kind, {r: replace(rl, gpu=GPU_OF[kinds[r]]) for r, rl in option.layout.roles.items()},
                  option.layout.precision)


def _entry_pods_by_set(objects: list[dict[str, Any]]) -> dict[str, int]:
    """Ready entry pods per set: replicas of the workloads whose pods the one entry Service selects."""
    (service,) = [o for o in objects if o["kind"] == "Service" and o["spec"].get("selector")
                  and o["spec"].get("clusterIP") != "None"]
    selector = service["spec"]["selector"]
    out: dict[str, int] = {}
    for o in objects:
        if o["kind"] not in ("Deployment", "StatefulSet", "LeaderWorkerSet"):
            continue
        labels = o["spec"]["template"]["metadata"]["labels"] if "template" in o["spec"] else {}
        if all(labels.get(k) == v for k, v in selector.items()):
            s = o["metadata"]["labels"][SET_LABEL]
            out[s] = out.get(s, 0) + int(o["spec"]["replicas"])
    return out


def _rendered_capacity(a: MemberAllocation) -> tuple[float, list[float]]:
    """What the member's rendered objects carry under the Service's per-pod split, and each part's traffic share."""
    rendering = parts_rendering([_rendered(p.option) for p in a.parts], lambda lay, s: blueprint(Engine.VLLM, lay, set_name=s))
    pods = _entry_pods_by_set(build_topology(rendering.sets, serving=rendering.serving))
    split = service_split([PartLoad(bp.set, pods[bp.set], p.option.capacity_rps) for bp, p in zip(rendering.sets, a.parts, strict=True)])
    return split.capacity_rps, [s.pod_share for s in split.shares]


def _replicas(group: str, n: int, cap: float) -> MemberOption:
    return MemberOption(group, f"{n}×TP1@{group}", {group: n}, cap, Layout.replicas(n, Parallelism(tp=1)))


def _pd(p: int, d: int, cap: float) -> MemberOption:
    lay = Layout.pd(RoleLayout(p, Parallelism(tp=1)), RoleLayout(d, Parallelism(tp=1)))
    return MemberOption("fast→cheap", f"{p}P{d}D@fast→cheap", {"fast": p, "cheap": d}, cap, lay,
                        {Role.PREFILL.value: "fast", Role.DECODE.value: "cheap"})


def test_the_example_pools_summarise_shape_is_planned_at_what_its_rendered_objects_carry() -> None:
    # a cheap pod at 1.1 req/s beside a PD part at 7.3: 8.4 by capacity, 3.3 behind the one Service; the planner now
    # takes a set whose rendered objects carry the 8 req/s it says they do
    member = PoolMember("summarise", 8.0, (_replicas("cheap", 1, 1.1), _pd(1, 1, 7.3), _replicas("fast", 2, 11.5)))
    (a,) = plan_pool(PoolProblem(KINDS, (member,))).members
    cap, _ = _rendered_capacity(a)
    assert a.met and cap == pytest.approx(a.capacity_rps) and cap >= 8.0


@st.composite
def _members(draw: st.DrawFn) -> PoolProblem:
    members = []
    for i in range(draw(st.integers(1, 2))):
        opts = [_replicas(g, n, draw(st.integers(1, 12)) * 0.5) for g in ("fast", "cheap") for n in
                draw(st.lists(st.integers(1, 4), min_size=0, max_size=2, unique=True))]
        opts += [_pd(p, d, draw(st.integers(2, 16)) * 0.5) for p, d in draw(st.lists(st.sampled_from([(1, 1), (1, 2)]), max_size=2, unique=True))]
        if not opts:
            opts = [_replicas("cheap", 1, 1.0)]
        members.append(PoolMember(f"m{i}", draw(st.integers(1, 24)) * 0.5, tuple(opts), priority=i))
    counts = (draw(st.integers(1, 8)), draw(st.integers(1, 8)))
    return PoolProblem(tuple(replace(k, count=c) for k, c in zip(KINDS, counts, strict=True)), tuple(members))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_members())
def test_the_pools_verdict_equals_the_capacity_of_the_objects_it_renders(problem: PoolProblem) -> None:
    d = plan_pool(problem)
    for a in d.members:
        if not a.parts:
            assert a.capacity_rps == 0.0 and (a.met is (a.load_rps == 0))
            continue
        cap, shares = _rendered_capacity(a)
        assert a.capacity_rps == pytest.approx(cap)
        assert [p.routing_weight for p in a.parts] == pytest.approx(shares)
        assert a.met is (cap >= a.load_rps - 1e-9)
        assert a.goodput_rps == pytest.approx(min(cap, a.load_rps))
    assert sum(s.short_rps for s in d.shortages) == pytest.approx(sum(a.load_rps - a.goodput_rps for a in d.members))
