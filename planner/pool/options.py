"""A pool member's options: from its funnel on each GPU kind, and from prefill/decode split across two kinds.

Called by the CLI (`plan --pool`) and the benchmarks before planner.pool.plan.plan_pool. For each kind the member's funnel
(planner.search.funnel.run_funnel, unchanged) runs on a probe budget and names the structures that meet the SLOs (at the
member's load, or at a fraction of it when the probe budget cannot carry the whole load); each structure is then
scaled by whole copies (replicas, or the PD ratio's multiples) up to the kind's GPUs and the member's cap, and its
SLO capacity computed with the funnel's margins (planner.perf.predict.slo_capacity_rps). Per GPU count the most capable
layout is kept, and only counts that carry more than every smaller one, up to the first that carries the load.
Mixed-kind PD options come from planner.perf.mixed_pd. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.figure_text import gpus_text, rps_text
from servingtopology.planner.layout import EngineKnobs, Layout, LayoutKind, Parallelism, Role, RoleLayout
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.perf.mixed_pd import MixedRefusal, mixed_figures, mixed_refusal, mixed_slo_capacity_rps, with_nic
from servingtopology.planner.perf.predict import slo_capacity_rps
from servingtopology.planner.pool.plan import GpuKind, MemberOption, PoolMember, PoolObjective, PoolProblem
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.funnel import run_funnel
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN
from servingtopology.planner.workload import Workload

__all__ = ["MemberOptions", "MemberRequest", "SharedWork", "member_options", "build_pool", "PROBE_GPUS", "STRUCTURES_KEPT"]

PROBE_GPUS = 64          # the funnel's budget when probing a kind for structures
STRUCTURES_KEPT = 6      # distinct structures scaled per kind (plus the smallest one)
LOAD_HALVINGS = 10       # how far the probe's load is lowered when the probe budget cannot carry it
MIXED_SHAPES = 3         # role shapes tried per side of a mixed-kind pair


@dataclass(frozen=True, slots=True)
class MemberOptions:
    options: tuple[MemberOption, ...]
    notes: tuple[str, ...]                 # per kind / pair: why it gave no option, or what bounded it
    refusals: tuple[tuple[str, MixedRefusal], ...] = ()   # (prefill→decode group, refusal) for mixed-kind pairs


def _at_rate(problem: Problem, rate: float) -> Problem:
    w: Workload = replace(problem.workload, arrival_rate_rps=rate)
    return replace(problem, workload=w)


def _probe(problem: Problem, budget: int) -> tuple[list[Layout], str]:
    """Structures the funnel admits on `budget` GPUs, best first; lowers the load when only the budget stands in the way."""
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    for _ in range(LOAD_HALVINGS + 1):
        res = run_funnel(_at_rate(replace(problem, max_gpus=budget), rate))
        if res.survivors:
            seen: dict[str, Layout] = {}
            for s in res.survivors:
                seen.setdefault(s.layout.structure, s.layout)
            ordered = list(seen.values())
            smallest = ordered[min(range(len(ordered)), key=lambda i: (ordered[i].gpus, i))]
            kept = ordered[:STRUCTURES_KEPT]
            if smallest not in kept:
                kept.append(smallest)
            return kept, ""
        if res.last_stage[:1] in "123":
            return [], f"stage '{res.last_stage}': {res.closest_miss}"
        rate /= 2.0
    return [], f"no layout meets the SLOs even at {rps_text(rate)} req/s on {gpus_text(budget)}"


def _unit(layout: Layout) -> tuple[Layout, int]:
    """The structure's smallest copy (one replica; the reduced P:D ratio) and its GPUs."""
    if layout.kind is LayoutKind.REPLICAS:
        r = layout.roles[Role.AGGREGATED]
        one = Layout.replicas(1, r.parallelism, r.knobs, layout.precision)
        return one, one.gpus
    p, d = layout.roles[Role.PREFILL], layout.roles[Role.DECODE]
    g = math.gcd(p.count, d.count)
    one = Layout.pd(replace(p, count=p.count // g), replace(d, count=d.count // g), layout.precision)
    return one, one.gpus


def _scaled(unit: Layout, n: int) -> Layout:
    return Layout(unit.kind, {role: replace(r, count=r.count * n) for role, r in unit.roles.items()}, unit.precision)


def _pareto(points: list[tuple[int, float, Layout]], load: float) -> list[tuple[int, float, Layout]]:
    """Per GPU count the most capable, then only counts that beat every smaller one, up to the first carrying the load."""
    best: dict[int, tuple[int, float, Layout]] = {}
    for g, cap, lay in points:
        if cap > 0 and (g not in best or cap > best[g][1]):
            best[g] = (g, cap, lay)
    out: list[tuple[int, float, Layout]] = []
    top = 0.0
    for g in sorted(best):
        if best[g][1] > top:
            out.append(best[g])
            top = best[g][1]
            if top >= load:
                break
    return out


def _kind_options(problem: Problem, kind: GpuKind, budget: int) -> tuple[list[MemberOption], str]:
    gpu = with_nic(kind.gpu, kind.nic_gbit)
    p = replace(problem, gpu=gpu)
    load = float(problem.workload.arrival_rate_rps or 0.0)
    structures, why = _probe(p, min(budget, PROBE_GPUS))
    if not structures and budget > PROBE_GPUS:
        structures, why = _probe(p, budget)
    if not structures:
        return [], f"{kind.name}: {why}"
    units = [_unit(s) for s in structures]
    caps1 = slo_capacity_rps(p, [u for u, _ in units], margin=SLO_MARGIN, load_margin=LOAD_MARGIN)
    layouts: list[Layout] = []
    for (unit, g), c1 in zip(units, caps1, strict=True):
        top = budget // g
        if c1 > 0:
            top = min(top, math.ceil(load / float(c1) * 1.25) + 1)
        layouts += [_scaled(unit, n) for n in range(1, max(top, 0) + 1)]
    caps = slo_capacity_rps(p, layouts, margin=SLO_MARGIN, load_margin=LOAD_MARGIN) if layouts else np.zeros(0)
    points = _pareto([(lay.gpus, float(c), lay) for lay, c in zip(layouts, caps, strict=True)], load)
    out = [MemberOption(kind.name, f"{lay.label}@{kind.name}", {kind.name: g}, cap, lay,
                        {r.value: kind.name for r in lay.roles}) for g, cap, lay in points]
    return out, "" if out else f"{kind.name}: no scaled layout carries load within the SLOs"


def _role_shapes(problem: Problem, kind: GpuKind, role: Role) -> list[RoleLayout]:
    """Single-instance role shapes to pair across kinds: TP from the search space within one node, the search's widest knobs."""
    s = problem.search
    knobs = EngineKnobs(max_num_seqs=max(s.max_num_seqs), max_num_batched_tokens=max(s.max_num_batched_tokens),
                        memory_fraction=s.memory_fraction[0], kv_dtype=s.kv_dtypes[0])
    out = []
    for tp in sorted(s.tp):
        if tp > kind.gpu.gpus_per_node or problem.model.num_heads % tp:
            continue
        par = Parallelism(tp=tp)
        pool = kv_pool_tokens(problem.model, kind.gpu, engine=problem.engine, precision=problem.precision, parallelism=par, knobs=knobs)
        if pool > 0:
            out.append(RoleLayout(1, par, knobs))
    return out[:MIXED_SHAPES]


def _mixed_options(problem: Problem, a: GpuKind, b: GpuKind, budget: int) -> tuple[list[MemberOption], str, MixedRefusal | None]:
    """Prefill on kind `a`, decode on kind `b`: counts scaled up to the load, per (a GPUs, b GPUs) the most capable."""
    group = f"{a.name}→{b.name}"
    link = min(a.nic_gbit, b.nic_gbit)
    load = float(problem.workload.arrival_rate_rps or 0.0)
    ga, gb = a.gpu, b.gpu
    first: MixedRefusal | None = None
    by_kv: dict[object, list[Layout]] = {}
    for pr in _role_shapes(problem, a, Role.PREFILL):
        for dr in _role_shapes(problem, b, Role.DECODE):
            one = Layout.pd(pr, dr, problem.precision)
            refused = mixed_refusal(problem, one, prefill_gpu=ga, decode_gpu=gb, link_gbit=link)
            if refused is not None:
                first = first or refused
                continue
            single = mixed_figures(problem, [one], [1e-3], prefill_gpu=ga, decode_gpu=gb, link_gbit=link)
            mu_p = min(float(single.prefill_rps[0]), float(single.link_rps[0]))
            mu_d = float(single.decode_rps[0])
            if not (mu_p > 0 and mu_d > 0):
                continue
            nd_top = min(b.count // dr.parallelism.gpus, math.ceil(load * 1.3 / mu_d) + 1)
            for nd in range(1, nd_top + 1):
                ratio = nd * mu_d / mu_p   # prefill instances that keep up with nd decode instances
                for npf in sorted({max(1, math.floor(ratio)), max(1, math.ceil(ratio))}):
                    lay = Layout.pd(replace(pr, count=npf), replace(dr, count=nd), problem.precision)
                    if lay.gpus <= budget and lay.roles[Role.PREFILL].gpus <= a.count:
                        by_kv.setdefault(dr.knobs.kv_dtype, []).append(lay)
    points: dict[tuple[int, int], tuple[float, Layout]] = {}
    for layouts in by_kv.values():
        caps = mixed_slo_capacity_rps(problem, layouts, prefill_gpu=ga, decode_gpu=gb, link_gbit=link)
        for lay, c in zip(layouts, caps, strict=True):
            key = (lay.roles[Role.PREFILL].gpus, lay.roles[Role.DECODE].gpus)
            if c > 0 and (key not in points or c > points[key][0]):
                points[key] = (float(c), lay)
    if not points:
        return [], f"{group}: " + (first.reason if first else "no pair meets the SLOs"), first
    # keep (a, b) points no other point dominates (fewer or equal GPUs of both kinds and at least the capacity),
    # and among those carrying the load only the ones no smaller one already carries
    keys = sorted(points, key=lambda k: (k[0] + k[1], k))
    kept: list[tuple[int, int]] = []
    for k in keys:
        c = points[k][0]
        if any(o[0] <= k[0] and o[1] <= k[1] and points[o][0] >= c * (1 - 1e-6) for o in kept):
            continue
        if any(o[0] <= k[0] and o[1] <= k[1] and points[o][0] >= load for o in kept):
            continue
        kept.append(k)
    out = [MemberOption(group, f"{points[k][1].label}@{a.name}→{b.name}", {a.name: k[0], b.name: k[1]}, points[k][0], points[k][1],
                        {Role.PREFILL.value: a.name, Role.DECODE.value: b.name},
                        note=f"KV over {link:g} Gb/s") for k in kept]
    return out, "", first


@dataclass(frozen=True, slots=True)
class SharedWork:
    """SameWorkOnce: the options of a member problem (by its repr: every field, floats to the last bit) on one kind or
    kind pair within one budget, derived once per pool and reused by every member asking the same (a pool often holds
    several members of one model and workload, at other priorities or names). Lives for one build_pool call."""

    kinds: dict[tuple[str, str, int], tuple[list[MemberOption], str]] = field(default_factory=dict)
    pairs: dict[tuple[str, str, str, int], tuple[list[MemberOption], str, MixedRefusal | None]] = field(default_factory=dict)


def member_options(problem: Problem, kinds: Sequence[GpuKind], *, cap_gpus: int, mixed: bool = True,
                   shared: SharedWork | None = None) -> MemberOptions:
    """Every option of one member (its Problem: model, engine, workload, SLO, search; its gpu and max_gpus are replaced)
    on the pool's kinds, within `cap_gpus` GPUs in all.

    `shared` (one per pool, from build_pool): the options already derived for the same member problem on the same kind
    (or kind pair) within the same budget, reused rather than searched again (SameWorkOnce)."""
    options: list[MemberOption] = []
    notes: list[str] = []
    refusals: list[tuple[str, MixedRefusal]] = []
    work = SharedWork() if shared is None else shared
    who = repr(problem)
    for kind in kinds:
        budget = min(cap_gpus, kind.count)
        if budget <= 0:
            continue
        key = (who, repr(kind), budget)
        if key not in work.kinds:
            work.kinds[key] = _kind_options(problem, kind, budget)
        got, why = work.kinds[key]
        options += got
        if why:
            notes.append(why)
    if mixed:
        for a in kinds:
            for b in kinds:
                if a.name == b.name or a.count <= 0 or b.count <= 0 or a.gpu.id == b.gpu.id:
                    continue
                if problem.search.layouts and LayoutKind.PD not in problem.search.layouts:
                    continue
                pair = (who, repr(a), repr(b), cap_gpus)
                if pair not in work.pairs:
                    work.pairs[pair] = _mixed_options(problem, a, b, cap_gpus)
                got, why, refused = work.pairs[pair]
                options += got
                if why:
                    notes.append(why)
                if refused is not None:
                    refusals.append((f"{a.name}→{b.name}", refused))
    return MemberOptions(tuple(options), tuple(notes), tuple(refusals))


@dataclass(frozen=True, slots=True)
class MemberRequest:
    """A member as the pool planner is asked about it: its Problem (model, engine, workload, SLO, search) and its cap."""

    name: str
    problem: Problem
    cap_gpus: int
    priority: int = 0
    min_rps: float = 0.0
    kinds: tuple[str, ...] | None = None    # the pool kinds it may use (None: every kind)


def build_pool(kinds: Sequence[GpuKind], members: Sequence[MemberRequest], *, objective: PoolObjective,
               budget_per_hour: float | None = None, mixed: bool = True,
               max_kinds_per_member: int | None = None) -> tuple[PoolProblem, dict[str, MemberOptions]]:
    """Every member's options on the pool's kinds, as one PoolProblem; InvalidSpec on `members[i]` for a member whose model
    fits no kind (the notes say why for each kind). `max_kinds_per_member` bounds the GPU kinds one member's parts use."""
    out: list[PoolMember] = []
    found: dict[str, MemberOptions] = {}
    shared = SharedWork()
    for i, m in enumerate(members):
        mine = [k for k in kinds if m.kinds is None or k.name in m.kinds]
        mo = member_options(m.problem, mine, cap_gpus=m.cap_gpus, mixed=mixed, shared=shared)
        if not mo.options:
            raise InvalidSpec(f"members[{i}]", f"member {m.name!r} ({m.problem.model.name}) fits no GPU kind of the pool: " + "; ".join(mo.notes))
        found[m.name] = mo
        out.append(PoolMember(m.name, float(m.problem.workload.arrival_rate_rps or 0.0), mo.options, m.priority, m.min_rps))
    return PoolProblem(tuple(kinds), tuple(out), objective, budget_per_hour, max_kinds_per_member=max_kinds_per_member), found
