"""The pool planner: one option set per member of a GPU pool, chosen jointly under the inventory, with named decisions.

Called by the CLI (`plan --pool`) and the benchmarks, after planner.pool.options has turned each member's funnel into
options (parts: GPUs by kind, $/hour, SLO capacity). Pure: no clock, no I/O; deterministic (HiGHS single-threaded with
a fixed seed and a node limit, ties broken by member and option order).

The model. Each member picks at most one option per group (a group is a GPU kind, or a prefill→decode kind pair) and at
most MAX_PARTS options in all, on at most `max_kinds_per_member` GPU kinds (the knob; None: no bound beyond the parts).
PlanTheRenderedSplit: the parts serve behind the one plain Service the operator renders (operator/render/sets.py
`parts_rendering`), which sends each ready entry pod an equal share, so a member's capacity is (its entry pods in all) ×
(the slowest entry pod's capacity) (planner.pool.service_split `per_pod_capacity_rps`), not the sum of its parts'
capacities. The MILP holds it linearly: y ≤ r_i · Σ_j n_j x_j wherever option i is chosen (r_i its capacity per entry
pod, n_j the entry pods of option j; a big-M releases the row when i is not chosen). The verdict, goodput, shortages and
marginal values all read this one figure. Objectives, lexicographic, one MILP per level (planner.pool.milp):
  min-cost      1. the most members meeting their load within the SLOs, a higher priority outweighing every lower one
                   together; 2. the most goodput (partial service of the members left short); 3. the lowest $/hour.
  max-goodput   1. the most goodput (req/s within the SLOs, capped at each member's load) within `budget_per_hour`;
                2. members met by priority, as above; 3. the lowest $/hour.
Every member keeps at least `min_rps` of capacity (its serving floor) whatever the objective; an inventory that cannot
hold the floors is InvalidSpec on `inventory`.

Exact where the size allows (at most EXACT_MAX_OPTIONS options, NODE_LIMIT nodes a level): the MILP, proved optimal, or stopped at its node limit
and then the better of its incumbent and the greedy, with the MILP's proved bound. Beyond: the greedy (min-cost:
members by priority, the cheapest set of ≤ 2 parts that meets each, then the largest partial sets; max-goodput:
upgrades by goodput per $ until nothing fits), with the LP relaxation's optimum as its stated bound: the answer is
within `gap` of the optimum of that level, reported in the decision.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.figure_text import rps_text
from servingtopology.planner.hardware import Gpu
from servingtopology.planner.layout import Layout, Role
from servingtopology.planner.pool.milp import MilpResult, MilpStatus, SparseRows, solve_milp
from servingtopology.planner.pool.service_split import PD_ROUTER_REPLICAS, PartLoad, per_pod_capacity_rps, service_split

__all__ = ["PoolObjective", "GpuKind", "MemberOption", "PoolMember", "PoolProblem", "Part", "MemberAllocation", "Marginal",
           "Shortage", "SolverReport", "PoolDecision", "plan_pool", "objective_values", "priority_weights", "MAX_PARTS",
           "EXACT_MAX_OPTIONS"]

MAX_PARTS = 2                 # parts (option groups) one member may span behind its Service
# Options up to which the MILP runs, and its branch-and-bound nodes per level (deterministic, unlike a time limit). Measured
# (benchmarks/pool_scale.py): 20 members on 512 GPUs give ~1,100 options, solved at the root in 0.4 CPU s; the same pool
# with 10x the load gives ~6,300 options on a short inventory, where HiGHS spends ~0.35 CPU s a node: beyond these bounds
# the greedy (1 CPU s, within 2.1 % of its LP bound there) answers instead.
EXACT_MAX_OPTIONS = 2_500
NODE_LIMIT = 200
# Member selections (≤ MAX_PARTS options each) up to which the exact solve takes one column per selection
# (`_milp_selections`): 40 members × 3 kinds hold ~68,000 and solve at the root in ~3 CPU s; past the bound (members of
# hundreds of options each) the option model `_milp` solves instead.
EXACT_MAX_SELECTIONS = 150_000
GREEDY_FLOORS_MISSED = "milp (the greedy could not place the floors)"
MIP_FEASIBILITY = 1e-6       # HiGHS's default mip_feasibility_tolerance
LEX_TOLERANCE = 1e-7          # relative slack when a level's optimum is fixed for the next level

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class PoolObjective(enum.StrEnum):
    MIN_COST = "min-cost"          # meet every member's SLO at the lowest $/hour
    MAX_GOODPUT = "max-goodput"    # the most goodput within a $/hour budget


@dataclass(frozen=True, slots=True)
class GpuKind:
    """GPUs of one kind in the pool: `name` is the pool's key, `nic_gbit` the per-GPU network between nodes (0: none)."""

    name: str
    gpu: Gpu
    count: int
    price_per_hour: float
    nic_gbit: float


@dataclass(frozen=True, slots=True)
class MemberOption:
    """One part a member may run: GPUs by kind name, the highest load it carries within the SLOs, how it is laid out.

    `group`: at most one option per group per member (a kind name, or `prefill→decode` for a mixed-kind PD pair).
    `role_kinds`: the kind of each role of `layout` (replicas: one; PD: prefill and decode, maybe different)."""

    group: str
    label: str
    gpus: Mapping[str, int]
    capacity_rps: float
    layout: Layout | None = None
    role_kinds: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def entry_pods(self) -> int:
        """Pods that take the part's client traffic behind the member's Service: its aggregated engines, or a PD layout's
        routers (PD_ROUTER_REPLICAS, as operator/render/manifests.py renders them); an option without a layout is one endpoint."""
        if self.layout is None:
            return 1
        agg = self.layout.roles.get(Role.AGGREGATED)
        return agg.count if agg is not None else PD_ROUTER_REPLICAS


@dataclass(frozen=True, slots=True)
class PoolMember:
    name: str
    load_rps: float
    options: tuple[MemberOption, ...]
    priority: int = 0
    min_rps: float = 0.0       # the serving floor: capacity the member keeps whatever the objective


@dataclass(frozen=True, slots=True)
class PoolProblem:
    kinds: tuple[GpuKind, ...]
    members: tuple[PoolMember, ...]
    objective: PoolObjective = PoolObjective.MIN_COST
    budget_per_hour: float | None = None
    exact_max_options: int = EXACT_MAX_OPTIONS
    node_limit: int = NODE_LIMIT
    exact_max_selections: int = EXACT_MAX_SELECTIONS   # the members' selections together up to which the exact solve has a column each
    max_kinds_per_member: int | None = None   # GPU kinds one member's parts may use together (None: no bound)


@dataclass(frozen=True, slots=True)
class Part:
    option: MemberOption
    cost_per_hour: float
    routing_weight: float      # share of the member's traffic the plain Service sends it: its entry pods over the member's


@dataclass(frozen=True, slots=True)
class MemberAllocation:
    name: str
    priority: int
    load_rps: float
    parts: tuple[Part, ...]
    capacity_rps: float
    goodput_rps: float
    cost_per_hour: float
    gpus: Mapping[str, int]
    met: bool
    why: str

    @property
    def attainment(self) -> float:
        """Share of the load served within the SLOs (1: met)."""
        return min(1.0, self.capacity_rps / self.load_rps) if self.load_rps > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Marginal:
    """What one more GPU of `kind` would give `member` (the others unchanged): goodput and $/hour, and the new set."""

    member: str
    kind: str
    goodput_rps: float
    cost_per_hour: float
    becomes: str


@dataclass(frozen=True, slots=True)
class Shortage:
    member: str
    short_rps: float
    needs: Mapping[str, int]   # GPUs by kind beyond what it holds, for the cheapest set that meets its load (empty: none does)
    needs_label: str


@dataclass(frozen=True, slots=True)
class SolverReport:
    method: str                # "milp" (proved optimal), "milp+greedy" (node limit), "greedy"
    options: int
    levels: tuple[str, ...]    # one line per lexicographic level: value, bound, status
    gap: float                 # relative gap of the last level proved (0: optimal)


@dataclass(frozen=True, slots=True)
class PoolDecision:
    objective: PoolObjective
    members: tuple[MemberAllocation, ...]
    idle: Mapping[str, int]
    used: Mapping[str, int]
    cost_per_hour: float
    goodput_rps: float
    marginals: tuple[Marginal, ...]
    shortages: tuple[Shortage, ...]
    solver: SolverReport
    reasons: tuple[str, ...]


# ---------------------------------------------------------------- the flat model
@dataclass(frozen=True, slots=True)
class _Flat:
    member: IntArray            # per option
    group: IntArray             # per option: a global (member, group) index
    gpus: IntArray              # [options, kinds]
    cost: FloatArray
    cap: FloatArray
    pods: FloatArray            # per option: its entry pods (MemberOption.entry_pods)
    load: FloatArray            # per member
    floor: FloatArray
    weight: FloatArray
    counts: IntArray            # per kind
    options: tuple[MemberOption, ...]


def priority_weights(priorities: Sequence[int]) -> FloatArray:
    """A weight per member such that meeting one member of a higher priority outweighs meeting every lower one."""
    levels = sorted(set(priorities))
    per_level: dict[int, float] = {}
    below = 0.0
    for lv in levels:
        per_level[lv] = below + 1.0
        below += per_level[lv] * sum(1 for p in priorities if p == lv)
    return np.array([per_level[p] for p in priorities], dtype=np.float64)


def _check(problem: PoolProblem) -> None:
    for i, k in enumerate(problem.kinds):
        if not (math.isfinite(k.price_per_hour) and k.price_per_hour > 0):
            raise InvalidSpec(f"inventory[{i}].pricePerHour", f"kind {k.name!r} needs a price per GPU-hour > 0 (got {k.price_per_hour})")
        if k.count < 0:
            raise InvalidSpec(f"inventory[{i}].count", f"kind {k.name!r}: a count ≥ 0")
    if problem.max_kinds_per_member is not None and problem.max_kinds_per_member < 1:
        raise InvalidSpec("maxKindsPerMember", f"at least 1 GPU kind per member (got {problem.max_kinds_per_member})")
    if problem.objective is PoolObjective.MAX_GOODPUT and (problem.budget_per_hour is None or problem.budget_per_hour <= 0):
        raise InvalidSpec("budgetPerHour", "the max-goodput objective needs a $/hour budget > 0")
    names = {k.name for k in problem.kinds}
    for i, m in enumerate(problem.members):
        if not m.options:
            raise InvalidSpec(f"members[{i}]", f"member {m.name!r}: its model fits no GPU kind of the pool ({', '.join(sorted(names))})")
        for o in m.options:
            unknown = set(o.gpus) - names
            if unknown:
                raise InvalidSpec(f"members[{i}]", f"option {o.label} names kinds not in the pool: {sorted(unknown)}")


def _flatten(problem: PoolProblem) -> _Flat:
    kinds = [k.name for k in problem.kinds]
    price = np.array([k.price_per_hour for k in problem.kinds])
    member, group, gpus, cap, pods, opts = [], [], [], [], [], []
    gid = 0
    for mi, m in enumerate(problem.members):
        seen: dict[str, int] = {}
        for o in m.options:
            if o.group not in seen:
                seen[o.group] = gid
                gid += 1
            member.append(mi)
            group.append(seen[o.group])
            gpus.append([int(o.gpus.get(k, 0)) for k in kinds])
            cap.append(float(o.capacity_rps))
            pods.append(float(o.entry_pods))
            opts.append(o)
    g = np.array(gpus, dtype=np.int64).reshape(len(opts), len(kinds))
    return _Flat(member=np.array(member, dtype=np.int64), group=np.array(group, dtype=np.int64), gpus=g, cost=g @ price,
                 cap=np.array(cap), pods=np.array(pods, dtype=np.float64), load=np.array([m.load_rps for m in problem.members]),
                 floor=np.array([m.min_rps for m in problem.members]), weight=priority_weights([m.priority for m in problem.members]),
                 counts=np.array([k.count for k in problem.kinds], dtype=np.int64), options=tuple(opts))


def _member_caps(f: _Flat, x: FloatArray) -> FloatArray:
    """Each member's capacity under PerPodSplit from a selection (one 0/1 per option)."""
    out = np.zeros(len(f.load))
    for mi in range(len(f.load)):
        sel = np.flatnonzero((f.member == mi) & (x > 0.5))
        if len(sel):
            out[mi] = per_pod_capacity_rps(entry_pods=[int(f.pods[i]) for i in sel], capacity_rps=[float(f.cap[i]) for i in sel])
    return out


def objective_values(problem: PoolProblem, caps: FloatArray, costs: float) -> tuple[float, float, float]:
    """The lexicographic levels of a selection from the members' capacities and its $/hour, each to maximise:
    (met weight, goodput, −cost) for min-cost, (goodput, met weight, −cost) for max-goodput. Tests compare these."""
    load = np.array([m.load_rps for m in problem.members])
    w = priority_weights([m.priority for m in problem.members])
    met = float(np.dot(w, caps >= load - 1e-9))
    good = float(np.minimum(caps, load).sum())
    if problem.objective is PoolObjective.MIN_COST:
        return met, good, -costs
    return good, met, -costs


# ---------------------------------------------------------------- exact: the MILP, level by level
def _milp(problem: PoolProblem, f: _Flat, *, relax: bool = False) -> tuple[FloatArray | None, list[str], float]:
    """Solve the levels in turn; the selection (one 0/1 per option), a line per level and the last level's gap."""
    n, nm, nk = len(f.cap), len(f.load), len(f.counts)
    ng = int(f.group.max()) + 1 if n else 0
    uses = f.gpus > 0                                              # [options, kinds]
    bounded = problem.max_kinds_per_member is not None
    zk = [(mi, ki) for mi in range(nm) for ki in range(nk) if bounded and uses[f.member == mi, ki].any()]
    # columns: x (n options), s (nm: member met), g (nm: member goodput), y (nm: member capacity under PerPodSplit),
    # z (one per (member, kind) it may use, only under max_kinds_per_member: the member uses the kind), p (nm: the pods of
    # the member's chosen options, Σ_j n_j x_j, so each PerPodSplit row names it once instead of every option again)
    nc = n + 3 * nm + len(zk) + nm
    ps = n + 3 * nm + len(zk)
    xs, ss, gs = slice(0, n), slice(n, n + nm), slice(n + nm, n + 2 * nm)
    rows: list[tuple[IntArray, FloatArray]] = []     # each row's non-zeros: one dense row at a time, never the matrix
    lo: list[float] = []
    hi: list[float] = []

    def row(coef: tuple[slice, FloatArray] | None = None, *, at: FloatArray | None = None, lower: float = -math.inf, upper: float = math.inf) -> None:
        r = np.zeros(nc) if at is None else at
        if coef is not None:
            r[coef[0]] = coef[1]
        nz = np.flatnonzero(r)
        rows.append((nz, r[nz]))
        lo.append(lower)
        hi.append(upper)

    for gi in range(ng):   # at most one option per (member, group)
        r = np.zeros(nc)
        r[xs] = f.group == gi
        row(at=r, upper=1.0)
    top = np.zeros(nm)     # a bound on each member's capacity: its MAX_PARTS largest options together
    for mi in range(nm):
        mine = f.member == mi
        top[mi] = float(np.sort(f.cap[mine])[::-1][:MAX_PARTS].sum())
        row((xs, mine.astype(np.float64)), upper=float(MAX_PARTS))
        y = n + 2 * nm + mi
        r = np.zeros(nc)                      # capacity ≤ the parts' capacities together (0 with no part)
        r[xs] = -f.cap * mine
        r[y] = 1.0
        row(at=r, upper=0.0)
        r = np.zeros(nc)                      # p = Σ_j n_j x_j over the member's options
        r[xs] = -f.pods * mine
        r[ps + mi] = 1.0
        row(at=r, lower=0.0, upper=0.0)
        for i in np.flatnonzero(mine):        # PerPodSplit: y ≤ r_i · p when option i is chosen
            r = np.zeros(nc)
            r[i] = top[mi]
            r[ps + mi] = -(f.cap[i] / f.pods[i])
            r[y] = 1.0
            row(at=r, upper=float(top[mi]))
        r = np.zeros(nc)                      # goodput ≤ capacity
        r[n + nm + mi] = 1.0
        r[y] = -1.0
        row(at=r, upper=0.0)
        r = np.zeros(nc)                      # met ⇒ capacity ≥ load
        r[n + mi] = f.load[mi]
        r[y] = -1.0
        row(at=r, upper=0.0)
        if f.floor[mi] > 0:
            r = np.zeros(nc)
            r[y] = 1.0
            row(at=r, lower=float(f.floor[mi]))
    for zi, (mi, ki) in enumerate(zk):        # an option on kind k needs the member's z(k)
        r = np.zeros(nc)
        r[xs] = ((f.member == mi) & uses[:, ki]).astype(np.float64)
        r[n + 3 * nm + zi] = -float(MAX_PARTS)
        row(at=r, upper=0.0)
    if bounded:
        assert problem.max_kinds_per_member is not None
        for mi in range(nm):
            r = np.zeros(nc)
            r[[n + 3 * nm + zi for zi, (m2, _) in enumerate(zk) if m2 == mi]] = 1.0
            row(at=r, upper=float(problem.max_kinds_per_member))
    for ki in range(nk):
        row((xs, f.gpus[:, ki].astype(np.float64)), upper=float(f.counts[ki]))
    if problem.objective is PoolObjective.MAX_GOODPUT:
        assert problem.budget_per_hour is not None
        row((xs, f.cost), upper=float(problem.budget_per_hour))
    col_lo = np.zeros(nc)
    pods_hi = np.array([float(np.sort(f.pods[f.member == mi])[::-1][:MAX_PARTS].sum()) for mi in range(nm)])
    col_hi = np.concatenate([np.ones(n + nm), f.load, top, np.ones(len(zk)), pods_hi])
    integer = np.concatenate([np.ones(n + nm, dtype=bool), np.zeros(2 * nm, dtype=bool), np.ones(len(zk), dtype=bool), np.zeros(nm, dtype=bool)])
    met_c = np.zeros(nc)
    met_c[ss] = f.weight
    good_c = np.zeros(nc)
    good_c[gs] = 1.0
    cost_c = np.zeros(nc)
    cost_c[xs] = f.cost
    x, lines, gap = _solve_levels(problem, rows, lo, hi, nc, col_lo, col_hi, integer, (met_c, good_c, cost_c), relax=relax)
    if x is None:
        return None, lines, gap
    return np.round(x[xs]) if not relax else x[xs], lines, gap


def _solve_levels(problem: PoolProblem, rows: list[tuple[IntArray, FloatArray]], lo: list[float], hi: list[float], nc: int,
                  col_lo: FloatArray, col_hi: FloatArray, integer: npt.NDArray[np.bool_],
                  objectives: tuple[FloatArray, FloatArray, FloatArray], *, relax: bool) -> tuple[FloatArray | None, list[str], float]:
    """The lexicographic levels in turn over a model's rows (each level's optimum fixed, with the solver's slack, before
    the next): the last solution, a line per level and the last level's gap. `objectives`: the met weight, goodput and
    $/hour coefficients per column."""
    met_c, good_c, cost_c = objectives
    levels = [("members met (priority-weighted)", met_c, True), ("goodput req/s", good_c, True), ("$/hour", cost_c, False)]
    if problem.objective is PoolObjective.MAX_GOODPUT:
        levels[0], levels[1] = levels[1], levels[0]
    lines: list[str] = []
    gap = 0.0
    x: FloatArray | None = None
    for name, c, maximize in levels:
        res: MilpResult = solve_milp(c, SparseRows.of(rows, nc), np.array(lo), np.array(hi), col_lower=col_lo, col_upper=col_hi, integer=integer,
                                     maximize=maximize, node_limit=problem.node_limit, relax=relax)
        if res.status in (MilpStatus.INFEASIBLE, MilpStatus.NO_SOLUTION):
            lines.append(f"{name}: {res.status.value}")
            return None, lines, math.inf
        x = res.x
        scale = max(1.0, abs(res.objective))
        gap = abs(res.bound - res.objective) / scale if math.isfinite(res.bound) else math.inf
        lines.append(f"{name}: {res.objective:.6g} ({res.status.value}" + (f", bound {res.bound:.6g}" if gap > 1e-9 else "") + ")")
        # HiGHS accepts a continuous column up to its MIP feasibility tolerance (1e-6) past a row, so a level's reported
        # optimum can stand that much above what the integer selection really gives: fixing it without that slack per
        # term cut the true optimum off the next level (goodput 1.5000008 fixed, the selection meeting more members lost).
        tol = LEX_TOLERANCE * scale + MIP_FEASIBILITY * int(np.count_nonzero(c))
        nz = np.flatnonzero(c)
        rows.append((nz, c[nz]))
        lo.append(res.objective - tol if maximize else -math.inf)
        hi.append(math.inf if maximize else res.objective + tol)
        if res.status is MilpStatus.NODE_LIMIT or relax:
            break
    assert x is not None
    return x, lines, gap


# ---------------------------------------------------------------- exact: a member's whole selections as columns
def _milp_selections(problem: PoolProblem, f: _Flat) -> tuple[FloatArray | None, list[str], float] | None:
    """The same levels over one binary column per member selection (`_member_sets`: ≤ MAX_PARTS options of different
    groups, its PerPodSplit capacity, cost and GPUs): a multiple-choice knapsack, each member taking at most one
    selection, under one row per GPU kind. Capacity, goodput and met are each selection's constants, so no big-M row
    is needed and the LP relaxation is tight: at 40 members × 3 kinds (68,000 selections) every level closes at the root,
    where `_milp`'s big-M rows left the $/hour level at its node limit (0.27 % gap). None where the members have more than
    `problem.exact_max_selections` selections together (`_milp` then)."""
    nm, nk = len(f.load), len(f.counts)
    sets = [_member_sets(f, mi, problem.max_kinds_per_member) for mi in range(nm)]
    if sum(len(cap) - 1 for _, cap, _, _ in sets) > problem.exact_max_selections:
        return None
    pick = np.concatenate([p[1:] for p, _, _, _ in sets])   # row 0 of each member's: the empty selection
    cap = np.concatenate([c[1:] for _, c, _, _ in sets])
    cost = np.concatenate([c[1:] for _, _, c, _ in sets])
    gpus = np.concatenate([g[1:] for _, _, _, g in sets])
    start = np.r_[0, np.cumsum([len(c) - 1 for _, c, _, _ in sets])].astype(np.int64)
    owner = np.repeat(np.arange(nm), np.diff(start))
    ns = len(cap)
    nc = ns + nm                     # columns: z (one per selection), s (nm: member met)
    rows: list[tuple[IntArray, FloatArray]] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(cols: IntArray, values: FloatArray, *, lower: float = -math.inf, upper: float = math.inf) -> None:
        rows.append((cols.astype(np.int64), values.astype(np.float64)))
        lo.append(lower)
        hi.append(upper)

    for mi in range(nm):
        mine = np.arange(start[mi], start[mi + 1], dtype=np.int64)
        row(mine, np.ones(len(mine)), upper=1.0)                            # at most one selection
        meets = mine[cap[mine] >= f.load[mi] - 1e-9]                       # met ⇒ a selection carrying the load
        row(np.r_[meets, ns + mi], np.r_[-np.ones(len(meets)), 1.0], upper=0.0)
        if f.floor[mi] > 0:                                                 # the floor: a selection holding it
            holds = mine[cap[mine] >= f.floor[mi] - 1e-9]
            row(holds, np.ones(len(holds)), lower=1.0)
    for ki in range(nk):
        nz = np.flatnonzero(gpus[:, ki])
        row(nz, gpus[nz, ki].astype(np.float64), upper=float(f.counts[ki]))
    if problem.objective is PoolObjective.MAX_GOODPUT:
        assert problem.budget_per_hour is not None
        nz = np.flatnonzero(cost)
        row(nz, cost[nz], upper=float(problem.budget_per_hour))
    met_c = np.zeros(nc)
    met_c[ns:] = f.weight
    good_c = np.zeros(nc)
    good_c[:ns] = np.minimum(cap, f.load[owner])
    cost_c = np.zeros(nc)
    cost_c[:ns] = cost
    z, lines, gap = _solve_levels(problem, rows, lo, hi, nc, np.zeros(nc), np.ones(nc), np.ones(nc, dtype=bool),
                                  (met_c, good_c, cost_c), relax=False)
    if z is None:
        return None, lines, gap
    x = np.zeros(len(f.cap))
    for s in np.flatnonzero(np.round(z[:ns]) > 0.5):
        x[[i for i in pick[s] if i >= 0]] = 1.0
    return x, lines, gap


# ---------------------------------------------------------------- greedy
def _member_sets(f: _Flat, mi: int, max_kinds: int | None = None) -> tuple[IntArray, FloatArray, FloatArray, IntArray]:
    """Every selection of ≤ MAX_PARTS options of member `mi` from different groups on ≤ `max_kinds` GPU kinds: option
    indices ([sets, 2], −1: none), capacity under PerPodSplit, cost and GPUs by kind. Row 0 is the empty selection."""
    idx = np.flatnonzero(f.member == mi)
    none = np.full(len(idx) + 1, -1, dtype=np.int64)
    first, second = np.r_[-1, idx].astype(np.int64), none
    if MAX_PARTS >= 2:
        a, b = np.triu_indices(len(idx), k=1)
        ok = f.group[idx[a]] != f.group[idx[b]]
        first, second = np.r_[first, idx[a[ok]]], np.r_[second, idx[b[ok]]]
    pick = np.stack([first, second], axis=1)
    has = pick >= 0
    safe = np.where(has, pick, 0)
    pods = (f.pods[safe] * has).sum(axis=1)
    per_pod = np.where(has, f.cap[safe] / f.pods[safe], np.inf).min(axis=1)
    cap = pods * np.where(has.any(axis=1), per_pod, 0.0)     # PerPodSplit, as per_pod_capacity_rps
    cost = (f.cost[safe] * has).sum(axis=1)
    gpus = (f.gpus[safe] * has[:, :, None]).sum(axis=1)
    if max_kinds is not None:
        keep = (gpus > 0).sum(axis=1) <= max_kinds
        return pick[keep], cap[keep], cost[keep], gpus[keep]
    return pick, cap, cost, gpus


def _chosen(pick: IntArray) -> list[int]:
    return [int(i) for i in pick if i >= 0]


def _best_set(f: _Flat, mi: int, sets: tuple[IntArray, FloatArray, FloatArray, IntArray], avail: IntArray, money: float,
              *, need: float | None) -> int | None:
    """The index (into `sets`) of the best selection fitting `avail` GPUs and `money` $/hour: with `need`, the cheapest carrying
    it; otherwise the most goodput (capped at the load), then the cheapest. None if nothing fits (the empty set always does)."""
    _, cap, cost, gpus = sets
    fits = (gpus <= avail[None, :]).all(axis=1) & (cost <= money + 1e-9) & (cap >= f.floor[mi] - 1e-9)
    if need is not None:
        fits &= cap >= need - 1e-9
        if not fits.any():
            return None
        order = np.lexsort((np.arange(len(cap)), gpus.sum(axis=1), cost, ~fits))
        return int(order[0])
    if not fits.any():
        return None
    good = np.minimum(cap, f.load[mi])
    order = np.lexsort((np.arange(len(cap)), cost, -good, ~fits))
    return int(order[0])


def _greedy(problem: PoolProblem, f: _Flat) -> FloatArray | None:
    nm = len(f.load)
    x = np.zeros(len(f.cap))
    avail = f.counts.copy()
    money = math.inf if problem.budget_per_hour is None or problem.objective is PoolObjective.MIN_COST else float(problem.budget_per_hour)
    all_sets = [_member_sets(f, mi, problem.max_kinds_per_member) for mi in range(nm)]
    order = sorted(range(nm), key=lambda mi: (-problem.members[mi].priority, mi))
    chosen: dict[int, int] = {}
    if problem.objective is PoolObjective.MIN_COST:
        # floors first (cheapest set holding each floor), then loads by priority, then the rest as partial service
        for mi in order:
            if f.floor[mi] > 0:
                j = _best_set(f, mi, all_sets[mi], avail, money, need=float(f.floor[mi]))
                if j is None:
                    return None
                chosen[mi] = j
                avail = avail - all_sets[mi][3][j]
        for need_load in (True, False):
            for mi in order:
                cur = chosen.get(mi, 0)
                if all_sets[mi][1][cur] >= f.load[mi] - 1e-9:
                    continue
                back = avail + all_sets[mi][3][cur]
                j = _best_set(f, mi, all_sets[mi], back, money, need=float(f.load[mi]) if need_load else None)
                if j is None or (not need_load and min(all_sets[mi][1][j], f.load[mi]) <= min(all_sets[mi][1][cur], f.load[mi])):
                    continue
                chosen[mi] = j
                avail = back - all_sets[mi][3][j]
    else:
        spent = 0.0
        for mi in order:   # floors
            if f.floor[mi] > 0:
                j = _best_set(f, mi, all_sets[mi], avail, money - spent, need=float(f.floor[mi]))
                if j is None:
                    return None
                chosen[mi] = j
                avail = avail - all_sets[mi][3][j]
                spent += float(all_sets[mi][2][j])
        while True:   # upgrades by goodput per $
            best: tuple[float, float, int, int] | None = None
            for mi in order:
                sets = all_sets[mi]
                cur = chosen.get(mi, 0)
                back = avail + sets[3][cur]
                fits = (sets[3] <= back[None, :]).all(axis=1) & (sets[2] - sets[2][cur] <= money - spent + 1e-9) & (sets[1] >= f.floor[mi] - 1e-9)
                gain = np.minimum(sets[1], f.load[mi]) - min(sets[1][cur], f.load[mi])
                extra = sets[2] - sets[2][cur]
                ok = fits & (gain > 1e-9)
                if not ok.any():
                    continue
                ratio = np.where(ok, gain / np.maximum(extra, 1e-9), -np.inf)
                j = int(np.lexsort((np.arange(len(ratio)), extra, -ratio))[0])
                key = (float(ratio[j]), -float(extra[j]), -mi, j)
                if best is None or key > best:
                    best = key
            if best is None:
                break
            mi, j = -best[2], best[3]
            cur = chosen.get(mi, 0)
            avail = avail + all_sets[mi][3][cur] - all_sets[mi][3][j]
            spent += float(all_sets[mi][2][j] - all_sets[mi][2][cur])
            chosen[mi] = j
    for mi, j in chosen.items():
        for i in _chosen(all_sets[mi][0][j]):
            x[i] = 1.0
    return x


# ---------------------------------------------------------------- decisions
def _selection_value(problem: PoolProblem, f: _Flat, x: FloatArray) -> tuple[float, float, float]:
    return objective_values(problem, _member_caps(f, x), float(np.dot(f.cost, x)))


def _floors_error(problem: PoolProblem, f: _Flat) -> InvalidSpec:
    parts = []
    for mi, m in enumerate(problem.members):
        if m.min_rps <= 0:
            continue
        sets = _member_sets(f, mi, problem.max_kinds_per_member)
        j = _best_set(f, mi, sets, np.full(len(f.counts), 1 << 40), math.inf, need=m.min_rps)
        if j is None:
            parts.append(f"{m.name} needs {m.min_rps:g} req/s, more than any option within the inventory carries")
        else:
            g = sets[3][j]
            least = " + ".join(f"{int(v)} {k.name}" for v, k in zip(g, problem.kinds, strict=True) if v)
            parts.append(f"{m.name} needs {m.min_rps:g} req/s: at least {least}")
    have = ", ".join(f"{k.count} {k.name}" for k in problem.kinds)
    return InvalidSpec("inventory", f"the inventory ({have}) cannot hold the members' minimums together: {'; '.join(parts)}")


def plan_pool(problem: PoolProblem) -> PoolDecision:
    """Choose each member's parts under the inventory for the objective; raise InvalidSpec on bad input (a price, a member
    that fits no kind, floors the inventory cannot hold)."""
    _check(problem)
    f = _flatten(problem)
    n = len(f.cap)
    x: FloatArray | None
    if n <= problem.exact_max_options:
        x, lines, gap = _milp_selections(problem, f) or _milp(problem, f)
        method = "milp"
        if x is None and lines and lines[0].endswith(MilpStatus.INFEASIBLE.value):
            raise _floors_error(problem, f)
        if gap > 1e-9:
            g = _greedy(problem, f)
            if x is None or (g is not None and _selection_value(problem, f, g) > _selection_value(problem, f, x)):
                x = g
            method = "milp+greedy"
        if x is None:
            raise _floors_error(problem, f)
    else:
        x = _greedy(problem, f)
        if x is None:
            # The greedy places floors one member at a time and can miss a packing that exists (a 2-GPU floor taken
            # first leaves no room for a 1-GPU one): the MILP, node-limited, decides before the pool is called short.
            x, lines, gap = _milp(problem, f)
            if x is None:
                raise _floors_error(problem, f)
            return _decision(problem, f, x, SolverReport(GREEDY_FLOORS_MISSED, n, tuple(lines), gap))
        _, lp_lines, _ = _milp(problem, f, relax=True)
        method = "greedy"
        v = _selection_value(problem, f, x)
        first = lp_lines[0].split(": ")[1].split(" ")[0] if lp_lines else "nan"
        bound = float(first) if first not in ("infeasible", "no-solution") else math.nan
        got = v[0]
        gap = abs(bound - got) / max(1.0, abs(bound)) if math.isfinite(bound) else math.inf
        lines = [f"greedy: level 1 {got:.6g}; LP relaxation bound {bound:.6g} (gap {gap:.2%})"]
    return _decision(problem, f, x, SolverReport(method, n, tuple(lines), gap))


def _decision(problem: PoolProblem, f: _Flat, x: FloatArray, solver: SolverReport) -> PoolDecision:
    kinds = [k.name for k in problem.kinds]
    used_v = (f.gpus * x[:, None]).sum(axis=0).astype(np.int64)
    idle_v = f.counts - used_v
    allocs = []
    total_cost = float(np.dot(f.cost, x))
    caps = _member_caps(f, x)
    for mi, m in enumerate(problem.members):
        sel = [i for i in np.flatnonzero((f.member == mi) & (x > 0.5))]
        cap = float(caps[mi])
        cost = float(sum(f.cost[i] for i in sel))
        gpus = {k: int(sum(f.gpus[i, ki] for i in sel)) for ki, k in enumerate(kinds)}
        pods = float(sum(f.pods[i] for i in sel))
        parts = tuple(Part(f.options[i], float(f.cost[i]), float(f.pods[i]) / pods) for i in sel)
        met = cap >= m.load_rps - 1e-9
        allocs.append(MemberAllocation(m.name, m.priority, m.load_rps, parts, cap, min(cap, m.load_rps), cost,
                                       {k: v for k, v in gpus.items() if v}, met, _why(problem, m, parts, cap, cost, met)))
    idle = {k: int(v) for k, v in zip(kinds, idle_v, strict=True)}
    marg = _marginals(problem, f, x, caps, idle_v, total_cost)
    short = _shortages(problem, f, x, caps)
    good = sum(a.goodput_rps for a in allocs)
    reasons = [f"{problem.objective.value}: {sum(a.met for a in allocs)} of {len(allocs)} members meet their load within the SLOs; "
               f"${total_cost:.2f}/hour for {rps_text(good)} req/s of goodput"]
    if any(idle.values()):
        reasons.append("idle: " + ", ".join(f"{v} {k}" for k, v in idle.items() if v)
                       + (" (every member is met; more GPUs would only add cost)" if all(a.met for a in allocs) else
                          " (no option of a short member fits what is left)"))
    return PoolDecision(problem.objective, tuple(allocs), idle, {k: int(v) for k, v in zip(kinds, used_v, strict=True)}, total_cost, good,
                        marg, short, solver, tuple(reasons))


def _why(problem: PoolProblem, m: PoolMember, parts: tuple[Part, ...], cap: float, cost: float, met: bool) -> str:
    if not parts:
        return (f"none: priority {m.priority}; no option fits what higher-priority members and the objective leave"
                if m.load_rps > 0 else "none: no load")
    what = " + ".join(f"{p.option.label} [{p.option.group}]" for p in parts)
    if met:
        head = (f"met: {what} carries {cap:.1f} ≥ {m.load_rps:g} req/s within the SLOs for ${cost:.2f}/hour"
                + (" — the cheapest such set the inventory allows" if problem.objective is PoolObjective.MIN_COST else ""))
    else:
        head = (f"short: {what} carries {rps_text(cap)} of {m.load_rps:g} req/s (priority {m.priority}): a set that meets the load does not fit "
                + ("the inventory left" if problem.objective is PoolObjective.MIN_COST else "the inventory and budget left"))
    if len(parts) > 1:   # PlanTheRenderedSplit: the capacity above is already the per-pod split's
        split = service_split([PartLoad(p.option.group, p.option.entry_pods, p.option.capacity_rps) for p in parts])
        head += f"; {split.reason}"
    return head


def _marginals(problem: PoolProblem, f: _Flat, x: FloatArray, caps: FloatArray, idle: IntArray, total_cost: float) -> tuple[Marginal, ...]:
    out = []
    for mi, m in enumerate(problem.members):
        mine = (f.member == mi) & (x > 0.5)
        own = f.gpus[mine].sum(axis=0)
        cap = float(caps[mi])
        cost = float(f.cost[mine].sum())
        money = math.inf if problem.objective is PoolObjective.MIN_COST or problem.budget_per_hour is None else \
            float(problem.budget_per_hour) - total_cost + cost
        sets = _member_sets(f, mi, problem.max_kinds_per_member)
        for ki, k in enumerate(problem.kinds):
            avail = own + idle
            avail[ki] += 1
            j = _best_set(f, mi, sets, avail, money, need=None)
            if j is None:
                continue
            dg = min(float(sets[1][j]), m.load_rps) - min(cap, m.load_rps)
            dc = float(sets[2][j]) - cost
            if dg > 1e-9 or (dg > -1e-9 and dc < -1e-9):
                label = " + ".join(f.options[i].label for i in _chosen(sets[0][j])) or "nothing"
                out.append(Marginal(m.name, k.name, dg, dc, label))
    return tuple(out)


def _shortages(problem: PoolProblem, f: _Flat, x: FloatArray, caps: FloatArray) -> tuple[Shortage, ...]:
    out = []
    for mi, m in enumerate(problem.members):
        mine = (f.member == mi) & (x > 0.5)
        cap = float(caps[mi])
        if cap >= m.load_rps - 1e-9:
            continue
        own = f.gpus[mine].sum(axis=0)
        sets = _member_sets(f, mi, problem.max_kinds_per_member)
        j = _best_set(f, mi, sets, np.full(len(f.counts), 1 << 40), math.inf, need=m.load_rps)
        if j is None:
            out.append(Shortage(m.name, m.load_rps - cap, {}, "no option within the inventory carries the load"))
            continue
        need = {k.name: int(max(0, sets[3][j][ki] - own[ki])) for ki, k in enumerate(problem.kinds)}
        out.append(Shortage(m.name, m.load_rps - cap, {k: v for k, v in need.items() if v},
                            " + ".join(f.options[i].label for i in _chosen(sets[0][j]))))
    return tuple(out)
