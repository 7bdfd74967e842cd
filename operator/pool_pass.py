"""One pass of a ServingPool: its members, the nodes' GPUs and the pods in; the pool planner's plan out, and in Auto
the next step of moving GPUs between members (status, Events, and the caps to write into members).

Called by operator/entry/pool_handlers.py on create, update, resume and a timer. Level-based: every pass reads the
pool, its members (ServingTopologies of its namespace whose spec.pool names it, or labelled as before spec.pool) and the
nodes, plans the pool (planner.pool.options.build_pool, planner.pool.plan.plan_pool) and returns the status to write and
the Events to post. Decisions, by name:
- MemberLoad: a member's load is its observed arrival rate (status.observed, what its own metrics read) when it has
  one, else spec.workload's; the status row says which (loadSource);
- PoolInventory: a kind's GPUs are its nodes' allocatable ones, capped by maxGPUs, less those held by pods that are
  no member's (other tenants, a deleted member's pods still terminating);
- AppliedLayoutHolds: a member holds the GPUs its pods request, and at least those of the layout it has applied
  (status.plan.gpus once status.plan.set names its workloads): a Deployment whose pods the controller has not created yet
  will hold them, so a member is never seen within a cap it is about to exceed;
- PoolMemberBound: a pool plans at most MAX_POOL_MEMBERS members; more is `Planned=False, TooManyMembers` naming the
  count and the bound, with one Warning, and nothing is planned (the plan's cost grows with every member's funnel);
- PoolPlanInTheWorker: the plan (options and allocation, planner.pool.request.plan_request) runs through `plan`, which
  the handlers make the operator's plan worker: a child process under the plan budget, off the reconcile threads. A
  plan over the budget is `Planned=False, PlanBudgetExceeded` naming the budget, one Warning; a plan still running
  raises PlanPending to the handler, which waits for it without holding a thread;
- DryRun: one `PoolProposal` Event whenever the proposal differs from the one in status (before/after per member and
  $/hour); nothing that runs is changed;
- Auto: each member is planned on the kinds of its own hardware.gpu (AutoKeepsMemberKind: its pods render for that
  kind) and keeps something serving (AutoKeepsEveryMemberServing); one `PoolRebalance` Event per changed target (before/
  after per member and $/hour); the step (planner.pool.moves.next_pool_step: grow receivers inside spec.surge, then shrink
  donors) is returned as caps to write (`allocations`), with a `PoolMoveStep` Event, or a `PoolMoveBlocked` Warning.
Pure apart from what it is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from servingtopology.operator.api.pool import Allocation, PoolMode, ServingPoolSpec, parse_pool_spec, pool_of, read_allocation
from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.cluster.capacity import read_capacity
from servingtopology.operator.cluster.plan_worker import PlanBudgetExceeded
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import gpu_for_product, resolve_gpu
from servingtopology.planner.pool.moves import MemberMove, PoolStep, PoolStepKind, next_pool_step
from servingtopology.planner.pool.options import MemberRequest
from servingtopology.planner.pool.plan import GpuKind, PoolDecision
from servingtopology.planner.pool.request import PoolRequest, plan_request
from servingtopology.spec import SpecError, to_problem

__all__ = ["PoolPass", "PoolPlanner", "pool_kinds", "pool_pass", "member_gpus", "AUTO_FLOOR_RPS", "MAX_POOL_MEMBERS"]

AUTO_FLOOR_RPS = 1e-3      # AutoKeepsEveryMemberServing: every member of an Auto pool keeps at least one option
MAX_POOL_MEMBERS = 64      # PoolMemberBound
INSTANCE_LABEL = "app.kubernetes.io/instance"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"


PoolPlanner = Callable[[PoolRequest], PoolDecision]


@dataclass(frozen=True, slots=True)
class PoolPass:
    status: dict[str, Any]
    events: list[tuple[str, str, str]]      # (type, reason, message)
    allocations: tuple[tuple[str, Allocation], ...] = ()   # Auto: (member, cap) to write into the member


def pool_kinds(spec: ServingPoolSpec, nodes: Sequence[Mapping[str, Any]],
               outside: Mapping[str, int] | None = None) -> tuple[GpuKind, ...]:
    """The pool's kinds with counts from the nodes' allocatable GPUs (product labels as capacity reads them), capped per kind,
    less `outside`: GPUs of each catalog GPU id held by pods that are no member's (PoolInventory)."""
    cap = read_capacity(nodes, [], node_selector={}, own=set())
    out = []
    for i, k in enumerate(spec.inventory):
        gpu = resolve_gpu(k.gpu, field=f"spec.inventory[{i}].gpu")
        count = cap.allocatable(gpu.id) - int((outside or {}).get(gpu.id, 0))
        if k.maxGPUs is not None:
            count = min(count, k.maxGPUs)
        out.append(GpuKind(k.kind, gpu, max(0, count), k.pricePerHour, gpu.nic_gbit if k.nicGbps is None else k.nicGbps))
    return tuple(out)


def _pod_gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        try:
            total += int(limits.get(GPU_RESOURCE, 0))
        except (TypeError, ValueError):
            continue
    return total


def member_gpus(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]], *, namespace: str,
                members: Mapping[str, str]) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """GPUs held by each member's pods by catalog GPU id (a pod not yet on a node counts as its member's `members[name]` id),
    and GPUs held by every other pod on a node, by id. Terminating pods count: they hold their GPUs until they are gone."""
    product = {str((n.get("metadata") or {}).get("name", "")): str(((n.get("metadata") or {}).get("labels") or {}).get(PRODUCT_LABEL, ""))
               for n in nodes}
    held: dict[str, dict[str, int]] = {m: {} for m in members}
    outside: dict[str, int] = {}
    for pod in pods:
        gpus = _pod_gpus(pod)
        if not gpus:
            continue
        meta = pod.get("metadata") or {}
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        found = gpu_for_product(product[node]) if product.get(node) else None
        owner = str((meta.get("labels") or {}).get(INSTANCE_LABEL, ""))
        if meta.get("namespace") == namespace and owner in members:
            gid = found.id if found is not None else members[owner]
            held[owner][gid] = held[owner].get(gid, 0) + gpus
        elif found is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            outside[found.id] = outside.get(found.id, 0) + gpus
    return held, outside


def _condition(status: str, reason: str, message: str, now: datetime, generation: int) -> dict[str, Any]:
    return {"type": "Planned", "status": status, "reason": reason, "message": message[:4000], "observedGeneration": generation,
            "lastTransitionTime": now.isoformat().replace("+00:00", "Z")}


def _members_status(d: PoolDecision) -> list[dict[str, Any]]:
    return [{"name": a.name, "priority": a.priority, "parts": [{"layout": p.option.label, "group": p.option.group, "gpus": dict(p.option.gpus),
                                                                "roles": dict(p.option.role_kinds), "weight": round(p.routing_weight, 4)}
                                                               for p in a.parts],
             "gpus": dict(a.gpus), "costPerHour": round(a.cost_per_hour, 4), "capacityRps": round(a.capacity_rps, 4), "loadRps": a.load_rps,
             "sloAttainment": round(a.attainment, 4), "met": a.met, "why": a.why} for a in d.members]


def _brief(members: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(m["name"]): " + ".join(str(p["layout"]) for p in m.get("parts") or []) or "none" for m in members}


@dataclass(frozen=True, slots=True)
class _Member:
    request: MemberRequest
    gpu_id: str                      # the member's own hardware.gpu, by catalog id
    spec_gpus: int                   # its hardware.maxGPUs
    load_source: str                 # MemberLoad: "observed" or "spec"
    body: Mapping[str, Any]


def _load(body: Mapping[str, Any]) -> float | None:
    """MemberLoad: the observed arrival rate in status.observed (None: the member has measured none)."""
    observed = ((body.get("status") or {}).get("observed") or {}).get("arrivalRateRps")
    if isinstance(observed, (int, float)) and not isinstance(observed, bool) and observed >= 0:
        return float(observed)
    return None


def _members(pool_name: str, namespace: str, spec: ServingPoolSpec, kinds: Sequence[GpuKind],
             bodies: Sequence[Mapping[str, Any]]) -> tuple[list[_Member], list[str]]:
    auto = spec.mode is PoolMode.AUTO
    out, skipped = [], []
    for body in sorted(bodies, key=lambda b: str((b.get("metadata") or {}).get("name", ""))):
        mmeta = body.get("metadata") or {}
        name = str(mmeta.get("name", ""))
        named = pool_of(body.get("spec") if isinstance(body.get("spec"), Mapping) else None, mmeta)
        if named is None or named.pool != pool_name:
            continue
        if named.namespace is not None and named.namespace != namespace:
            skipped.append(f"{name}: spec.pool.namespace {named.namespace!r} is not the pool's namespace")
            continue
        try:
            ts = parse_topology_spec(body.get("spec"))
            if ts.modelConfigMap is not None:
                skipped.append(f"{name}: a member given by modelConfigMap is not planned in a pool yet")
                continue
            problem = to_problem(ts)
            gpu_id = resolve_gpu(ts.hardware.gpu).id
        except (SpecError, InvalidSpec, ValueError) as exc:
            skipped.append(f"{name}: invalid member ({str(exc)[:300]})")
            continue
        observed = _load(body)
        if observed is not None:
            problem = dataclasses.replace(problem, workload=dataclasses.replace(problem.workload, arrival_rate_rps=observed))
        if problem.workload.arrival_rate_rps is None:
            skipped.append(f"{name}: no workload.arrivalRate and no observed traffic")
            continue
        own = tuple(k.name for k in kinds if k.gpu.id == gpu_id) if auto else None
        if own == ():
            skipped.append(f"{name}: the pool has no kind of its hardware.gpu {gpu_id} (an Auto pool keeps a member on its own kind)")
            continue
        out.append(_Member(MemberRequest(name, problem, ts.hardware.maxGPUs, named.priority, AUTO_FLOOR_RPS if auto else 0.0, own),
                           gpu_id, ts.hardware.maxGPUs, "observed" if observed is not None else "spec", body))
    return out, skipped


def _invalid(generation: int, msg: str, now: datetime, base: Mapping[str, Any] | None = None) -> PoolPass:
    return PoolPass({**(base or {"observedGeneration": generation}), "conditions": [_condition("False", "InvalidSpec", msg, now, generation)]},
                    [("Warning", "InvalidSpec", msg)])


def pool_pass(pool: Mapping[str, Any], members: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]], *, now: datetime,
              pods: Sequence[Mapping[str, Any]] = (), plan: PoolPlanner = plan_request) -> PoolPass:
    """Plan the pool; the status to write, the Events to post and, in Auto, the caps to write into members. PlanPending
    from `plan` goes to the caller."""
    meta = pool.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    pool_name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    previous = pool.get("status") or {}
    try:
        spec = parse_pool_spec(pool.get("spec"))
        kinds = pool_kinds(spec, nodes)
    except SpecError as exc:
        return _invalid(generation, "; ".join(f"{f}: {m}" for f, m in exc.errors), now)
    except InvalidSpec as exc:
        return _invalid(generation, f"{exc.field}: {exc.message}", now)
    found, skipped = _members(pool_name, namespace, spec, kinds, members)
    held, outside = member_gpus(pods, nodes, namespace=namespace, members={m.request.name: m.gpu_id for m in found})
    for m in found:
        _hold_applied(held[m.request.name], m)
    kinds = pool_kinds(spec, nodes, outside)
    inventory = {k.name: k.count for k in kinds}
    base = {"observedGeneration": generation, "inventory": inventory, "skipped": skipped, "mode": spec.mode.value}
    if not found:
        msg = f"no member: set spec.pool.name: {pool_name} on ServingTopologies in namespace {namespace}"
        return PoolPass({**base, "members": [], "summary": {"members": "0/0", "costPerHour": "0", "idle": ""},
                         "conditions": [_condition("False", "NoMembers", msg, now, generation)]}, [])
    if len(found) > MAX_POOL_MEMBERS:
        msg = (f"TooManyMembers: {len(found)} ServingTopologies of namespace {namespace} name this pool; a pool plans at most "
               f"{MAX_POOL_MEMBERS} (each member's options are a funnel per GPU kind): split them over more pools")
        return PoolPass({**base, "members": [], "conditions": [_condition("False", "TooManyMembers", msg, now, generation)]},
                        [("Warning", "TooManyMembers", msg)] if _reason(previous) != "TooManyMembers" else [])
    requests = [m.request for m in found]
    try:
        d = plan(PoolRequest(tuple(kinds), tuple(requests), spec.objective, spec.budgetPerHour, spec.mixedKinds, spec.maxKindsPerMember))
    except PlanBudgetExceeded as exc:
        what = f"took > {exc.budget.wall_s:g} s" if exc.kind == "time" else f"needed > {exc.budget.memory_mib} MiB"
        msg = (f"PlanBudgetExceeded: planning {len(found)} members on {len(kinds)} kinds {what}{f' ({exc.detail})' if exc.detail else ''}; "
               "the plan was stopped. Fewer members or kinds, spec.mixedKinds: false, or a larger --plan-timeout-s/--plan-memory-mib")
        return PoolPass({**base, "conditions": [_condition("False", "PlanBudgetExceeded", msg, now, generation)]},
                        [("Warning", "PlanBudgetExceeded", msg)] if _reason(previous) != "PlanBudgetExceeded" else [])
    except InvalidSpec as exc:
        field = exc.field
        if field.startswith("members["):
            i = int(field[len("members["):field.index("]")])
            field = f"member {requests[i].name}"
        return _invalid(generation, f"{field}: {exc.message}", now, base)
    rows = _members_status(d)
    for row, m in zip(rows, found, strict=True):
        row["loadSource"] = m.load_source
    idle = ", ".join(f"{v} {k}" for k, v in d.idle.items() if v) or "0"
    status = {**base, "members": rows, "costPerHour": round(d.cost_per_hour, 4), "goodputRps": round(d.goodput_rps, 4), "idle": dict(d.idle),
              "solver": {"method": d.solver.method, "gap": d.solver.gap, "options": d.solver.options},
              "summary": {"members": f"{sum(a.met for a in d.members)}/{len(d.members)}", "costPerHour": f"{d.cost_per_hour:.2f}", "idle": idle},
              "conditions": [_condition("True", "PoolPlanned", "; ".join(d.reasons), now, generation)]}
    events = []
    before, after = _brief(previous.get("members") or []), _brief(rows)
    if before != after:
        changes = [f"{n}: {before.get(n, 'not a member')} → {after.get(n, 'left the pool')}" for n in sorted(set(before) | set(after))
                   if before.get(n) != after.get(n)]
        old_cost = previous.get("costPerHour")
        cost = f"${float(old_cost):.2f}/h → ${d.cost_per_hour:.2f}/h" if old_cost is not None else f"${d.cost_per_hour:.2f}/h"
        reason, head = ("PoolRebalance", "Auto target") if spec.mode is PoolMode.AUTO else ("PoolProposal", "DryRun proposal")
        events.append(("Normal", reason, f"{head} ({spec.objective.value}, {cost}; idle {idle}): " + "; ".join(changes)))
    if spec.mode is not PoolMode.AUTO:
        return PoolPass(status, events)
    moves = [_move(m, a.gpus, held[m.request.name], kinds, pool=pool_name) for m, a in zip(found, d.members, strict=True)]
    step = next_pool_step(moves, inventory=inventory, surge_gpus=spec.surge)
    allocations = tuple((c.name, _allocation(c.after, c.surge, m.gpu_id, kinds, pool=pool_name, step=step))
                        for c in step.changes for m in found if m.request.name == c.name)
    # Lists, not maps keyed by member: the status is written as a merge patch, which would keep a departed member's keys.
    status["move"] = {"step": step.kind.value, "reason": step.reason[:2000], "surge": spec.surge,
                      "members": [{"name": m.name, "held": dict(m.held), "cap": dict(m.cap) if m.cap is not None else None,
                                   "surge": dict(m.surge), "target": dict(m.target), "moving": m.moving} for m in moves]}
    was = (previous.get("move") or {})
    if step.kind in (PoolStepKind.GROW, PoolStepKind.SHRINK):
        events.append(("Normal", "PoolMoveStep", f"{step.kind.value}: {step.reason}"))
    elif step.kind is PoolStepKind.BLOCKED and (was.get("step"), was.get("reason")) != (step.kind.value, step.reason[:2000]):
        events.append(("Warning", "PoolMoveBlocked", step.reason))
    return PoolPass(status, events, allocations)


def _hold_applied(held: dict[str, int], m: _Member) -> None:
    """AppliedLayoutHolds: raise `held` (GPUs by catalog id) to the GPUs of the layout the member has applied, the
    shortfall on its own GPU id."""
    plan = (m.body.get("status") or {}).get("plan")
    if not isinstance(plan, Mapping) or not plan.get("set"):
        return
    applied = plan.get("gpus")
    if isinstance(applied, bool) or not isinstance(applied, int) or applied <= 0:
        return
    short = applied - sum(held.values())
    if short > 0:
        held[m.gpu_id] = held.get(m.gpu_id, 0) + short


def _reason(status: Mapping[str, Any]) -> str | None:
    """The reason of the Planned condition in `status` (the previous pass's)."""
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Planned":
            return str(c.get("reason"))
    return None


def _by_kind(by_gpu: Mapping[str, int], kinds: Sequence[GpuKind]) -> dict[str, int]:
    """GPUs by catalog id as the pool's kinds (the first kind of each GPU id)."""
    out: dict[str, int] = {}
    for gid, n in by_gpu.items():
        kind = next((k.name for k in kinds if k.gpu.id == gid), gid)
        out[kind] = out.get(kind, 0) + n
    return out


def _move(m: _Member, target: Mapping[str, int], held_by_gpu: Mapping[str, int], kinds: Sequence[GpuKind], *, pool: str) -> MemberMove:
    """A member as the sequencer sees it: its cap (this pool's allocation), GPUs held by kind, and whether it still moves:
    its own transition runs, it has not planned under its newest cap yet (unless its last plan failed: Planned=False,
    e.g. Infeasible under a cap that carries less than its load; then what it holds counts and the step names the block),
    or its pods hold more than the cap."""
    status = m.body.get("status") or {}
    got = read_allocation((m.body.get("metadata") or {}).get("annotations") or {})
    mine = isinstance(got, Allocation) and got.pool == pool
    cap = {got.kind: got.max_gpus} if isinstance(got, Allocation) and mine else None
    surge = {got.kind: got.surge_gpus} if isinstance(got, Allocation) and mine and got.surge_gpus else {}
    held = _by_kind(held_by_gpu, kinds)
    plan = status.get("plan") or status.get("proposal") or {}
    transition = bool((status.get("replan") or {}).get("transition"))
    moving = transition
    if cap is not None:
        want = min(sum(cap.values()), m.spec_gpus)
        planned = next((c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == "Planned"), {})
        failed = planned.get("status") == "False"
        moving = moving or (not failed and (plan.get("poolGPUs") != want or sum(held.values()) > sum(cap.values())))
    return MemberMove(m.request.name, m.request.priority, cap, held, moving, dict(target), surge)


def _allocation(after: Mapping[str, int], surge: Mapping[str, int], gpu_id: str, kinds: Sequence[GpuKind], *, pool: str,
                step: PoolStep) -> Allocation:
    """The cap written into a member: its own kind's GPUs (an Auto pool plans a member on the kinds of its GPU only), and the
    surge granted for its own move."""
    own = [k for k in kinds if k.gpu.id == gpu_id]
    kind = next((k for k in own if after.get(k.name)), own[0])
    return Allocation(pool, kind.name, gpu_id, int(sum(after.get(k.name, 0) for k in own)), step.kind.value,
                      int(sum(surge.get(k.name, 0) for k in own)))
