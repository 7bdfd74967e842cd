"""The reconcile: one idempotent, level-based pass over a ServingTopology (create, update, resume, timer).

Called by the kopf handlers (operator/handlers.py) and by the tests with an in-memory Cluster. It reads
the CR, plans (or reuses the plan of this generation), renders the workloads, applies or proposes, and
returns the new status; Events go through the Cluster. It never relies on a diff and never reads the
clock: `now` is an argument. Policy by mode:

- Auto: plan when the generation changed, apply, prune what an older plan left behind.
- Pinned: the same with `spec.pinned` as the layout; the planner only predicts its figures.
- DryRun: plan, write `status.proposal` and a `PlanProposed` Event; workloads are never touched.
- Invalid spec or no feasible layout: conditions and a Warning Event; running workloads stay as they are.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..planner.errors import Infeasible, InsufficientData, InvalidSpec
from ..planner.layout import Layout, Role, RoleLayout
from ..planner.problem import Decision, Problem
from ..spec import SpecError, to_layout, to_problem
from .api import (
    HISTORY_LIMIT,
    ConditionType,
    HistoryEntry,
    Mode,
    PlanStatus,
    TopologySpec,
    TopologyStatus,
    parse_topology_spec,
)
from .cluster import Cluster, ref_of
from .engine_args import engine_command
from .manifests import Blueprint, build_workloads, multinode_roles, role_nodes
from .plan_status import (
    append_history,
    change_message,
    condition,
    layout_from_plan,
    plan_status,
    proposal_status,
    set_condition,
    timestamp,
)

__all__ = ["Planner", "Outcome", "reconcile", "blueprint_for"]

Planner = Callable[[Problem], Decision]
PROGRESS_REQUEUE_S = 15.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one pass did: the status to write, and what it applied or pruned (for logs and metrics)."""

    status: dict[str, Any]
    applied: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    decided: bool = False
    requeue_after_s: float | None = None
    error: str | None = None       # the reason of a failed pass (InvalidSpec, Infeasible, ...), for metrics


class _Pass:
    """The accumulating state of one reconcile: status, Events, what was applied."""

    def __init__(self, obj: Mapping[str, Any], cluster: Cluster, now: datetime) -> None:
        self.obj, self.cluster, self.now = obj, cluster, now
        meta = obj["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta.get("namespace", "default"), meta.get("uid", "")
        self.generation = int(meta.get("generation") or 1)
        try:
            raw = obj.get("status") or {}
            known = {k: v for k, v in raw.items() if k in TopologyStatus.model_fields}  # e.g. kopf's own keys
            self.status = TopologyStatus.model_validate(known)
        except ValidationError:
            self.status = TopologyStatus()  # a status this version cannot read is rebuilt, not trusted
        self.conditions = list(self.status.conditions)
        self.applied: list[str] = []
        self.pruned: list[str] = []

    def set(self, kind: ConditionType, status: bool | None, reason: str, message: str) -> bool:
        """Set a condition; True when it changed (status, reason or message), which is when Events are due."""
        old = condition(self.conditions, kind)
        self.conditions = set_condition(self.conditions, kind, status=status, reason=reason, message=message,
                                        now=self.now, generation=self.generation)
        new = condition(self.conditions, kind)
        return old is None or new is None or (old.status, old.reason, old.message) != (new.status, new.reason, new.message)

    def event(self, type: str, reason: str, message: str) -> None:
        self.cluster.record_event(self.obj, type=type, reason=reason, message=message, now=self.now)

    def outcome(self, *, plan: PlanStatus | None, proposal: Any, history: list[HistoryEntry] | None = None,
                decided: bool = False, requeue_after_s: float | None = None, error: str | None = None) -> Outcome:
        status = self.status.model_copy(update={
            "conditions": self.conditions, "observedGeneration": self.generation, "plan": plan, "proposal": proposal,
            "history": history if history is not None else self.status.history,
        })
        body = status.model_dump(mode="json", exclude_none=True)
        body.setdefault("plan", None)       # explicit nulls: a merge patch then removes a stale plan or proposal
        body.setdefault("proposal", None)
        return Outcome(body, tuple(self.applied), tuple(self.pruned), decided, requeue_after_s, error)


def blueprint_for(spec: TopologySpec, layout: Layout, *, name: str, namespace: str, uid: str, gpus_per_node: int) -> Blueprint:
    """The builders' input for one plan of one ServingTopology."""
    source = spec.modelSource or spec.model or ""
    hw = spec.hardware
    return Blueprint(
        name=name, namespace=namespace, uid=uid, engine=spec.engine.name, image=spec.engine.image, model=source,
        served_model_name=spec.servedModelName or spec.model or source, layout=layout, gpus_per_node=gpus_per_node,
        router_image=spec.engine.routerImage or "", extra_args=tuple(spec.engine.extraArgs),
        node_selector=dict(hw.nodeSelector),
        tolerations=tuple(t.model_dump(exclude_none=True) for t in hw.tolerations),
        transfer_backend=spec.engine.transferBackend,
    )


def _args_of(bp: Blueprint) -> Callable[[Role, RoleLayout], tuple[int, tuple[str, ...]]]:
    def args_of(role: Role, rl: RoleLayout) -> tuple[int, tuple[str, ...]]:
        nodes = role_nodes(bp, rl)
        cmd = engine_command(engine=bp.engine, model=bp.model, served_name=bp.served_model_name, role=role, par=rl.parallelism,
                             knobs=rl.knobs, precision=bp.precision, extra_args=bp.extra_args, nodes=nodes,
                             transfer_backend=bp.transfer_backend)
        return nodes, (*cmd.command, *cmd.args)
    return args_of


@contextmanager
def _planning_spec(p: _Pass, spec: TopologySpec) -> Iterator[TopologySpec]:
    """Yield the spec with a ConfigMap's config.json written to a private file, so to_problem can read it."""
    if spec.modelConfigMap is None:
        yield spec
        return
    ref = spec.modelConfigMap
    text = p.cluster.read_config_map(p.namespace, ref.name, ref.key)
    if text is None:
        raise InvalidSpec("spec.modelConfigMap", f"ConfigMap {p.namespace}/{ref.name} has no key {ref.key!r}")
    with tempfile.TemporaryDirectory(prefix="stopo-") as tmp:
        path = Path(tmp) / ref.name / "config.json"
        path.parent.mkdir()
        path.write_text(text)
        yield spec.model_copy(update={"modelConfig": str(path)})


def _problem(p: _Pass, spec: TopologySpec, current: Layout | None) -> Problem:
    pinned = to_layout(spec, spec.pinned) if spec.policy.mode is Mode.PINNED and spec.pinned is not None else None
    with _planning_spec(p, spec) as planning:
        problem = to_problem(planning, pinned=pinned, current=current)
    allowed = spec.policy.allowedLayouts
    if allowed:
        kinds = tuple(k for k in problem.search.layouts if k in allowed)
        if not kinds:
            raise InvalidSpec("spec.policy.allowedLayouts", f"no overlap with spec.search.layouts {[k.value for k in problem.search.layouts]}")
        problem = dataclasses.replace(problem, search=dataclasses.replace(problem.search, layouts=kinds))
    return problem


def _invalid(p: _Pass, message: str, *, plan: PlanStatus | None, proposal: Any) -> Outcome:
    if p.set(ConditionType.READY, False, "InvalidSpec", message):
        p.event("Warning", "InvalidSpec", message)
    p.set(ConditionType.PLANNED, False, "InvalidSpec", message)
    return p.outcome(plan=plan, proposal=proposal, error="InvalidSpec")


def _readiness(p: _Pass, objects: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether every engine and router workload reports all replicas ready, and a one-line summary."""
    parts, ready = [], True
    for obj in objects:
        if obj["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        live = p.cluster.read(ref_of(obj)) or {}
        want = int(obj["spec"]["replicas"])
        st = live.get("status") or {}
        have = int(st.get("readyReplicas") or 0)
        updated = int(st.get("updatedReplicas", have) or 0)
        # LeaderWorkerSet's status has no observedGeneration; treat it as caught up.
        seen = st.get("observedGeneration")
        current = seen is None or int((live.get("metadata") or {}).get("generation") or 0) <= int(seen)
        ok = have >= want and updated >= want and current
        ready &= ok
        parts.append(f"{obj['metadata']['labels']['servingtopology.io/role']} {min(have, want)}/{want}")
    return ready, "ready: " + ", ".join(parts)


def _apply(p: _Pass, bp: Blueprint) -> list[dict[str, Any]]:
    objects = build_workloads(bp)
    for obj in objects:
        if p.cluster.apply(obj):
            p.applied.append(str(ref_of(obj)))
    desired = {ref_of(o) for o in objects}
    for ref in p.cluster.list_owned(p.namespace, p.name):
        if ref not in desired:
            p.cluster.delete(ref)
            p.pruned.append(str(ref))
    if p.applied:
        p.event("Normal", "WorkloadsApplied", f"applied {', '.join(p.applied)}")
    if p.pruned:
        p.event("Normal", "WorkloadsPruned", f"removed {', '.join(p.pruned)} (not in plan {bp.layout.label})")
    return objects


def _percentile(spec: TopologySpec) -> str:
    return next(iter(spec.slo.ttftMs))


def _decide(p: _Pass, spec: TopologySpec, planner: Planner, current: Layout | None) -> Decision | Outcome:
    plan, proposal = p.status.plan, p.status.proposal
    try:
        decision = planner(_problem(p, spec, current))
    except InvalidSpec as exc:
        return _invalid(p, str(exc), plan=plan, proposal=proposal)
    except Infeasible as exc:
        message = f"{exc}; running workloads are left as they are"
        if p.set(ConditionType.PLANNED, False, "Infeasible", message):
            p.event("Warning", "PlanInfeasible", message)
        if plan is None:
            p.set(ConditionType.READY, False, "Infeasible", "no feasible layout, nothing deployed")
        return p.outcome(plan=plan, proposal=proposal, error="Infeasible")
    except InsufficientData as exc:
        p.set(ConditionType.PLANNED, None, "InsufficientData", str(exc))
        return p.outcome(plan=plan, proposal=proposal, requeue_after_s=60.0, error="InsufficientData")
    return decision


def reconcile(obj: Mapping[str, Any], *, cluster: Cluster, planner: Planner, now: datetime, gpus_per_node_default: int = 8) -> Outcome:
    """Bring the cluster and the status in line with one ServingTopology; safe to run any number of times.

    Raises ClusterError (from the Cluster) on transient API failures; everything else becomes status.
    """
    p = _Pass(obj, cluster, now)
    try:
        spec = parse_topology_spec(obj.get("spec"))
    except SpecError as exc:
        return _invalid(p, "; ".join(f"{f}: {m}" for f, m in exc.errors), plan=p.status.plan, proposal=p.status.proposal)
    if spec.metrics is None:
        p.set(ConditionType.METRICS_AVAILABLE, False, "NoMetricsSource", "spec.metrics is not set; planning from the expected workload")
    current = layout_from_plan(p.status.plan) if p.status.plan is not None else None
    gpn = spec.hardware.gpusPerNode or gpus_per_node_default

    def bp_for(layout: Layout) -> Blueprint:
        return blueprint_for(spec, layout, name=p.name, namespace=p.namespace, uid=p.uid, gpus_per_node=gpn)

    if spec.policy.mode is Mode.DRY_RUN:
        return _dry_run(p, spec, planner, current, bp_for)
    return _enact(p, spec, planner, current, bp_for)


def _dry_run(p: _Pass, spec: TopologySpec, planner: Planner, current: Layout | None,
             bp_for: Callable[[Layout], Blueprint]) -> Outcome:
    old = p.status.proposal
    if old is not None and old.generation == p.generation:
        return p.outcome(plan=p.status.plan, proposal=old)  # already proposed for this generation
    decided = _decide(p, spec, planner, current)
    if isinstance(decided, Outcome):
        return decided
    best = decided.best
    bp = bp_for(best.layout)
    proposal = proposal_status(best, current=p.status.plan, before=decided.current.prediction if decided.current else None,
                               args_of=_args_of(bp), reasons=decided.reasons, now=p.now, generation=p.generation,
                               percentile=_percentile(spec))
    p.event("Normal", "PlanProposed", proposal.message)
    p.set(ConditionType.PLANNED, True, "PlanProposed", proposal.message)
    if p.status.plan is None:
        p.set(ConditionType.READY, False, "DryRun", "policy.mode is DryRun: nothing is deployed; see status.proposal")
    history = append_history(p.status.history, HistoryEntry(at=timestamp(p.now), action="Proposed", layout=proposal.layout,
                                                            gpus=proposal.gpus, reason=proposal.reason[:256]), HISTORY_LIMIT)
    return p.outcome(plan=p.status.plan, proposal=proposal, history=history, decided=True)


def _enact(p: _Pass, spec: TopologySpec, planner: Planner, current: Layout | None,
           bp_for: Callable[[Layout], Blueprint]) -> Outcome:
    plan, history, decided = p.status.plan, list(p.status.history), False
    if plan is None or plan.generation != p.generation:
        decision = _decide(p, spec, planner, current)
        if isinstance(decision, Outcome):
            return decision
        best, decided = decision.best, True
        bp = bp_for(best.layout)
        if multinode_roles(bp) and not p.cluster.has_leader_worker_set():
            roles = ", ".join(r.value for r in multinode_roles(bp))
            message = (f"plan {best.layout.label} needs multi-node instances ({roles}, over {bp.gpus_per_node} GPUs per node) and "
                       "the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io) is not installed; nothing was applied")
            if p.set(ConditionType.READY, False, "LeaderWorkerSetMissing", message):
                p.event("Warning", "LeaderWorkerSetMissing", message)
            p.set(ConditionType.PLANNED, False, "LeaderWorkerSetMissing", message)
            return p.outcome(plan=plan, proposal=None, error="LeaderWorkerSetMissing")
        new_plan = plan_status(best, args_of=_args_of(bp), reasons=decision.reasons, now=p.now, generation=p.generation)
        before = plan.predicted if plan is not None else None
        reason = decision.reasons[0] if decision.reasons else (best.why or "best ranked layout under the SLOs")
        if spec.policy.mode is Mode.PINNED:
            reason = "policy.mode is Pinned"
        message = change_message(current_layout=plan.layout if plan else None, current_gpus=plan.gpus if plan else None,
                                 before=before, after=new_plan, reason=reason, percentile=_percentile(spec), verb="did")
        changed = plan is None or plan.layout != new_plan.layout or plan.gpus != new_plan.gpus
        p.event("Normal", "PlanApplied" if changed else "PlanKept", message)
        p.set(ConditionType.PLANNED, True, "Pinned" if spec.policy.mode is Mode.PINNED else "Planned", message)
        if changed:
            history = append_history(history, HistoryEntry(at=timestamp(p.now), action="Applied", layout=new_plan.layout,
                                                           gpus=new_plan.gpus, reason=reason[:256]), HISTORY_LIMIT)
        plan = new_plan
    bp = bp_for(layout_from_plan(plan))
    if multinode_roles(bp) and not p.cluster.has_leader_worker_set():
        message = f"plan {plan.layout} needs LeaderWorkerSet, which is no longer installed; nothing was applied"
        if p.set(ConditionType.READY, False, "LeaderWorkerSetMissing", message):
            p.event("Warning", "LeaderWorkerSetMissing", message)
        return p.outcome(plan=plan, proposal=None, history=history, decided=decided, error="LeaderWorkerSetMissing")
    objects = _apply(p, bp)
    ready, summary = _readiness(p, objects)
    # Degraded: replicas were lost while nothing changed (a crash, an evicted node), as opposed to a rollout
    # that has not finished. It stays set until every replica is back.
    was = {k: condition(p.conditions, k) for k in (ConditionType.READY, ConditionType.DEGRADED)}
    degraded = not ready and not p.applied and not decided and any(c is not None and c.status == "True" for c in was.values())
    p.set(ConditionType.READY, ready, "WorkloadsReady" if ready else ("ReplicasUnavailable" if degraded else "WorkloadsNotReady"),
          f"{plan.layout}: {summary}")
    p.set(ConditionType.PROGRESSING, not ready and not degraded, "RollingOut" if not ready and not degraded else "Settled", summary)
    if p.set(ConditionType.DEGRADED, degraded, "ReplicasUnavailable" if degraded else "AsPlanned", summary) and degraded:
        p.event("Warning", "ReplicasUnavailable", f"{plan.layout}: {summary}")
    return p.outcome(plan=plan, proposal=None, history=history, decided=decided,
                     requeue_after_s=None if ready else PROGRESS_REQUEUE_S)


