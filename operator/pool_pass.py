"""One pass of a ServingPool: its members and the nodes' GPUs in, the pool planner's proposal out (status and Events).

Called by operator/runtime/pool_handlers.py on create, update, resume and a timer. Level-based: every pass reads the
pool, its members (ServingTopologies labelled servingtopology.io/pool=<name> in its namespace) and the nodes, plans the
pool (planner.pool_options.build_pool, planner.pool.plan_pool) and returns the status to write and the Events to post:
one `PoolProposal` Event whenever the proposal differs from the one in status (before/after per member and $/hour).
DryRun only: nothing that runs is changed; each member keeps planning inside its own maxGPUs. Pure apart from what it
is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from servingtopology.operator.api.pool import PRIORITY_ANNOTATION, ServingPoolSpec, parse_pool_spec
from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.runtime.capacity import read_capacity
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.pool import GpuKind, PoolDecision, plan_pool
from servingtopology.planner.pool_options import MemberRequest, build_pool
from servingtopology.spec import SpecError, to_problem

__all__ = ["PoolPass", "pool_kinds", "pool_pass"]


@dataclass(frozen=True, slots=True)
class PoolPass:
    status: dict[str, Any]
    events: list[tuple[str, str, str]]      # (type, reason, message)


def pool_kinds(spec: ServingPoolSpec, nodes: Sequence[Mapping[str, Any]]) -> tuple[GpuKind, ...]:
    """The pool's kinds with counts from the nodes' allocatable GPUs (product labels as capacity reads them), capped per kind."""
    cap = read_capacity(nodes, [], node_selector={}, own=set())
    out = []
    for i, k in enumerate(spec.inventory):
        gpu = resolve_gpu(k.gpu, field=f"spec.inventory[{i}].gpu")
        count = cap.allocatable(gpu.id)
        if k.maxGPUs is not None:
            count = min(count, k.maxGPUs)
        out.append(GpuKind(k.kind, gpu, count, k.pricePerHour, gpu.nic_gbit if k.nicGbps is None else k.nicGbps))
    return tuple(out)


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


def pool_pass(pool: Mapping[str, Any], members: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]], *, now: datetime) -> PoolPass:
    """Plan the pool; the status to write and the Events to post."""
    meta = pool.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    previous = pool.get("status") or {}
    try:
        spec = parse_pool_spec(pool.get("spec"))
        kinds = pool_kinds(spec, nodes)
    except SpecError as exc:
        msg = "; ".join(f"{f}: {m}" for f, m in exc.errors)
        return PoolPass({"observedGeneration": generation, "conditions": [_condition("False", "InvalidSpec", msg, now, generation)]},
                        [("Warning", "InvalidSpec", msg)])
    except InvalidSpec as exc:
        msg = f"{exc.field}: {exc.message}"
        return PoolPass({"observedGeneration": generation, "conditions": [_condition("False", "InvalidSpec", msg, now, generation)]},
                        [("Warning", "InvalidSpec", msg)])
    inventory = {k.name: k.count for k in kinds}
    requests, skipped = [], []
    for body in sorted(members, key=lambda b: str((b.get("metadata") or {}).get("name", ""))):
        mmeta = body.get("metadata") or {}
        name = str(mmeta.get("name", ""))
        try:
            ts = parse_topology_spec(body.get("spec"))
            if ts.modelConfigMap is not None:
                skipped.append(f"{name}: a member given by modelConfigMap is not planned in a pool yet")
                continue
            problem = to_problem(ts)
            priority = int((mmeta.get("annotations") or {}).get(PRIORITY_ANNOTATION, 0))
        except (SpecError, InvalidSpec, ValueError) as exc:
            skipped.append(f"{name}: invalid member ({str(exc)[:300]})")
            continue
        if problem.workload.arrival_rate_rps is None:
            skipped.append(f"{name}: no workload.arrivalRate")
            continue
        requests.append(MemberRequest(name, problem, ts.hardware.maxGPUs, priority))
    base = {"observedGeneration": generation, "inventory": inventory, "skipped": skipped}
    if not requests:
        msg = "no member: label ServingTopologies in this namespace servingtopology.io/pool=" + str(meta.get("name", ""))
        return PoolPass({**base, "members": [], "summary": {"members": "0/0", "costPerHour": "0", "idle": ""},
                         "conditions": [_condition("False", "NoMembers", msg, now, generation)]}, [])
    try:
        pool_problem, _ = build_pool(kinds, requests, objective=spec.objective, budget_per_hour=spec.budgetPerHour, mixed=spec.mixedKinds)
        d = plan_pool(pool_problem)
    except InvalidSpec as exc:
        field = exc.field
        if field.startswith("members["):
            i = int(field[len("members["):field.index("]")])
            field = f"member {requests[i].name}"
        msg = f"{field}: {exc.message}"
        return PoolPass({**base, "conditions": [_condition("False", "InvalidSpec", msg, now, generation)]}, [("Warning", "InvalidSpec", msg)])
    rows = _members_status(d)
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
        events.append(("Normal", "PoolProposal", f"DryRun proposal ({spec.objective.value}, {cost}; idle {idle}): " + "; ".join(changes)))
    return PoolPass(status, events)
