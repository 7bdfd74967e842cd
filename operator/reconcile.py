"""The reconcile: one idempotent, level-based pass over a ServingTopology (create, update, resume, timer).

Called by the kopf handlers (operator/handlers.py) and by the tests with an in-memory Cluster. It reads
the CR, plans (or reuses the plan of this generation), replans from live metrics when due, renders the
workloads, applies or proposes, and returns the new status; Events go through the Cluster. It never relies
on a diff and never reads the clock: `now` is an argument. Policy by mode:

- Auto: plan when the generation changed; the first plan is applied at once, a changed one through a
  transition (one step per pass, state in status.replan, target in status.proposal); replan on drift.
- Pinned: the same with `spec.pinned` as the layout; live metrics are only observed and calibrated.
- DryRun: plan, write `status.proposal` and a `PlanProposed` Event; workloads are never touched.
- Invalid spec, no feasible layout, metrics down: conditions and Events; running workloads stay as they are.
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

from ..planner.decide import predict_layout
from ..planner.errors import Infeasible, InsufficientData, InvalidSpec
from ..planner.layout import Layout, Role, RoleLayout
from ..planner.problem import Decision, Problem
from ..planner.transition import Phase
from ..planner.transition import set_name as layout_set_name
from ..spec import SpecError, to_layout, to_problem
from .api import (
    HISTORY_LIMIT,
    ConditionType,
    HistoryEntry,
    Mode,
    ObservedStatus,
    PlanStatus,
    ProposalStatus,
    TopologySpec,
    TopologyStatus,
    parse_topology_spec,
)
from .cluster import Cluster, ref_of
from .engine_args import engine_command
from .live import MetricsFactory, run_live_replan
from .manifests import ROLE_LABEL, SET_LABEL, Blueprint, build_topology, multinode_roles, role_nodes
from .plan_status import (
    append_history,
    change_message,
    condition,
    layout_from_plan,
    plan_status,
    proposal_from_replan,
    proposal_status,
    set_condition,
    timestamp,
)
from .replan import Predictor, ReplanMemory, ReplanOutcome, ReplanPolicy, Verdict, policy_from_spec, transition_step
from .rollout import finished_plan, rebase_sets, running_set, start_for_change
from .sets import Rendering, read_cluster_view, steady_rendering, transition_rendering

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
        self.memory = ReplanMemory.from_dict(self.status.replan)
        self.observed: ObservedStatus | None = self.status.observed

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
            "history": history if history is not None else self.status.history, "observed": self.observed,
            "replan": self.memory.to_dict(),
        })
        body = status.model_dump(mode="json", exclude_none=True)
        body.setdefault("plan", None)       # explicit nulls: a merge patch then removes a stale plan or proposal
        body.setdefault("proposal", None)
        return Outcome(body, tuple(self.applied), tuple(self.pruned), decided, requeue_after_s, error)


def blueprint_for(spec: TopologySpec, layout: Layout, *, name: str, namespace: str, uid: str, gpus_per_node: int,
                  set_name: str = "") -> Blueprint:
    """The builders' input for one plan (or one set of a transition) of one ServingTopology."""
    source = spec.modelSource or spec.model or ""
    hw = spec.hardware
    return Blueprint(
        name=name, namespace=namespace, uid=uid, engine=spec.engine.name, image=spec.engine.image, model=source,
        served_model_name=spec.servedModelName or spec.model or source, layout=layout, gpus_per_node=gpus_per_node,
        router_image=spec.engine.routerImage or "", extra_args=tuple(spec.engine.extraArgs),
        node_selector=dict(hw.nodeSelector),
        tolerations=tuple(t.model_dump(exclude_none=True) for t in hw.tolerations),
        transfer_backend=spec.engine.transferBackend, set_name=set_name,
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
    workloads = [o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    several = len({o["metadata"]["labels"].get(SET_LABEL) for o in workloads}) > 1   # mid-transition: name the sets
    for obj in workloads:
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
        labels = obj["metadata"]["labels"]
        role = f"{labels[SET_LABEL]}/{labels[ROLE_LABEL]}" if several else labels[ROLE_LABEL]
        parts.append(f"{role} {min(have, want)}/{want}")
    return ready, "ready: " + ", ".join(parts)


def _apply(p: _Pass, rendering: Rendering) -> list[dict[str, Any]]:
    objects = build_topology(rendering.sets, serving=rendering.serving)
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
        p.event("Normal", "WorkloadsPruned", f"removed {', '.join(p.pruned)} (not in {' + '.join(bp.layout.label for bp in rendering.sets)})")
    return objects


def _percentile(spec: TopologySpec) -> str:
    return next(iter(spec.slo.ttftMs))


def _decide(p: _Pass, spec: TopologySpec, planner: Planner, current: Layout | None, problem: Problem | None = None) -> Decision | Outcome:
    plan, proposal = p.status.plan, p.status.proposal
    try:
        decision = planner(problem if problem is not None else _problem(p, spec, current))
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


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What every step of one pass shares once the spec has parsed."""

    spec: TopologySpec
    planner: Planner
    predict: Predictor
    metrics: MetricsFactory | None
    policy: ReplanPolicy
    gpus_per_node: int

    def bp_for(self, p: _Pass, layout: Layout, set_name: str = "") -> Blueprint:
        return blueprint_for(self.spec, layout, name=p.name, namespace=p.namespace, uid=p.uid, gpus_per_node=self.gpus_per_node,
                             set_name=set_name)


def reconcile(obj: Mapping[str, Any], *, cluster: Cluster, planner: Planner, now: datetime, gpus_per_node_default: int = 8,
              metrics: MetricsFactory | None = None, predict: Predictor = predict_layout) -> Outcome:
    """Bring the cluster and the status in line with one ServingTopology; safe to run any number of times.

    `metrics` builds the live metrics source (None: no live replanning, e.g. unit tests of the plan alone).
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
    ctx = _Ctx(spec=spec, planner=planner, predict=predict, metrics=metrics, policy=policy_from_spec(spec.policy),
               gpus_per_node=spec.hardware.gpusPerNode or gpus_per_node_default)
    if spec.policy.mode is Mode.DRY_RUN:
        return _dry_run(p, ctx, current)
    return _enact(p, ctx, current)




def _problem_or_none(p: _Pass, ctx: _Ctx, current: Layout | None) -> Problem | None:
    try:
        return _problem(p, ctx.spec, current)
    except (InvalidSpec, SpecError):
        return None   # the planning path reports it


def _live(p: _Pass, ctx: _Ctx, problem: Problem, current: Layout | None) -> ReplanOutcome | None:
    """One replan interval when due: write its conditions, Events, observed figures and memory."""
    if ctx.metrics is None:
        return None
    try:
        out = run_live_replan(spec=ctx.spec, problem=problem, current=current, memory=p.memory, policy=ctx.policy, now=p.now,
                              cluster=p.cluster, namespace=p.namespace, name=p.name, factory=ctx.metrics, planner=ctx.planner,
                              predict=ctx.predict)
    except (InvalidSpec, InsufficientData) as exc:
        p.event("Warning", "ReplanFailed", f"{exc}; keeping the running layout")
        p.memory = dataclasses.replace(p.memory, last_fetch_s=p.now.timestamp())
        return None
    if out is None:
        return None
    for c in out.conditions:
        p.set(c.type, c.status, c.reason, c.message)
    for e in out.events:
        p.event(e.type, e.reason, e.message)
    if out.observed is not None:
        p.observed = out.observed
    p.memory = out.memory
    return out


def _dry_run(p: _Pass, ctx: _Ctx, current: Layout | None) -> Outcome:
    proposal, history, decided = p.status.proposal, list(p.status.history), False
    if proposal is None or proposal.generation != p.generation:
        decision = _decide(p, ctx.spec, ctx.planner, current)
        if isinstance(decision, Outcome):
            return decision
        best, decided = decision.best, True
        proposal = proposal_status(best, current=p.status.plan, before=decision.current.prediction if decision.current else None,
                                   args_of=_args_of(ctx.bp_for(p, best.layout)), reasons=decision.reasons, now=p.now,
                                   generation=p.generation, percentile=_percentile(ctx.spec))
        p.event("Normal", "PlanProposed", proposal.message)
        p.set(ConditionType.PLANNED, True, "PlanProposed", proposal.message)
        if p.status.plan is None:
            p.set(ConditionType.READY, False, "DryRun", "policy.mode is DryRun: nothing is deployed; see status.proposal")
        history = append_history(history, HistoryEntry(at=timestamp(p.now), action="Proposed", layout=proposal.layout,
                                                       gpus=proposal.gpus, reason=proposal.reason[:256]), HISTORY_LIMIT)
    problem = _problem_or_none(p, ctx, current) if current is not None else None
    # Live replanning needs something running to observe; DryRun never starts anything itself.
    out = _live(p, ctx, problem, current) if problem is not None else None
    if out is not None and out.verdict is Verdict.PROPOSE and out.after is not None:
        proposal = proposal_from_replan(out, current=p.status.plan, args_of=_args_of(ctx.bp_for(p, out.after.layout)), now=p.now,
                                        generation=p.generation, percentile=_percentile(ctx.spec))
        p.set(ConditionType.PLANNED, True, "PlanProposed", proposal.message)
        history = append_history(history, HistoryEntry(at=timestamp(p.now), action="Proposed", layout=proposal.layout,
                                                       gpus=proposal.gpus, reason=proposal.reason[:256]), HISTORY_LIMIT)
        decided = True
    return p.outcome(plan=p.status.plan, proposal=proposal, history=history, decided=decided)


@dataclass
class _Run:
    """What the Auto/Pinned pass carries from planning to rendering."""

    plan: PlanStatus | None
    proposal: ProposalStatus | None
    history: list[HistoryEntry]
    decided: bool = False
    requeue_after_s: float | None = None


def _step(p: _Pass, ctx: _Ctx, problem: Problem, run: _Run) -> None:
    """Execute one step of the running transition; finish it when the planner says Done."""
    assert run.plan is not None and p.memory.transition is not None
    bp_for = _set_blueprints(p, ctx)
    view = read_cluster_view(p.cluster, transition_rendering(p.memory.transition, bp_for), namespace=p.namespace, name=p.name)
    memory, step, events = transition_step(p.memory, view, problem=problem, policy=ctx.policy, now_s=p.now.timestamp())
    p.memory = memory
    for e in events:
        p.event(e.type, e.reason, e.message)
    state = memory.transition
    if step is None or state is None or state.phase is not Phase.DONE:
        run.requeue_after_s = step.requeue_after_s if step is not None and step.requeue_after_s else PROGRESS_REQUEUE_S
        return
    if state.rolled_back:
        p.event("Warning", "TransitionRolledBack", f"back on {run.plan.layout}: {state.message}")
        run.plan = run.plan.model_copy(update={"set": state.to_set})
    else:
        new = finished_plan(p.memory, run.proposal, problem=problem, predict=ctx.predict, now=p.now, generation=p.generation,
                            args_of=_args_of(ctx.bp_for(p, state.target)))
        reason = new.reasons[0] if new.reasons else "a better layout for the workload"
        message = change_message(current_layout=run.plan.layout, current_gpus=run.plan.gpus, before=run.plan.predicted, after=new,
                                 reason=reason, percentile=_percentile(ctx.spec), verb="did")
        p.event("Normal", "PlanApplied", message)
        p.set(ConditionType.PLANNED, True, "Pinned" if ctx.spec.policy.mode is Mode.PINNED else "Planned", message)
        run.history = append_history(run.history, HistoryEntry(at=timestamp(p.now), action="Applied", layout=new.layout, gpus=new.gpus,
                                                               reason=reason[:256]), HISTORY_LIMIT)
        run.plan = new
    run.proposal = None
    p.memory = dataclasses.replace(memory, transition=None)


def _set_blueprints(p: _Pass, ctx: _Ctx) -> Callable[[Layout, str], Blueprint]:
    def bp_for(layout: Layout, set_name: str) -> Blueprint:
        return ctx.bp_for(p, layout, set_name)
    return bp_for


def _plan_for_generation(p: _Pass, ctx: _Ctx, problem: Problem | None, current: Layout | None, run: _Run) -> Outcome | None:
    """Plan this generation: adopt the first plan (or an unchanged layout) at once, start a transition to a changed one."""
    plan = run.plan
    decision = _decide(p, ctx.spec, ctx.planner, current, problem)
    if isinstance(decision, Outcome):
        return decision
    best, run.decided = decision.best, True
    bp = ctx.bp_for(p, best.layout)
    if multinode_roles(bp) and not p.cluster.has_leader_worker_set():
        roles = ", ".join(r.value for r in multinode_roles(bp))
        message = (f"plan {best.layout.label} needs multi-node instances ({roles}, over {bp.gpus_per_node} GPUs per node) and "
                   "the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io) is not installed; nothing was applied")
        if p.set(ConditionType.READY, False, "LeaderWorkerSetMissing", message):
            p.event("Warning", "LeaderWorkerSetMissing", message)
        p.set(ConditionType.PLANNED, False, "LeaderWorkerSetMissing", message)
        return p.outcome(plan=plan, proposal=None, error="LeaderWorkerSetMissing")
    new_plan = plan_status(best, args_of=_args_of(bp), reasons=decision.reasons, now=p.now, generation=p.generation)
    reason = decision.reasons[0] if decision.reasons else (best.why or "best ranked layout under the SLOs")
    if ctx.spec.policy.mode is Mode.PINNED:
        reason = "policy.mode is Pinned"
    before = plan.predicted if plan is not None else None
    # A new generation re-bases drift on the spec's workload; the calibration and the metric window stay.
    p.memory = dataclasses.replace(p.memory, assumed=None, drift=dataclasses.replace(p.memory.drift, streak=0, calm=0, detected=False))
    started = None
    if plan is not None and current is not None and problem is not None and current != best.layout:
        started = start_for_change(p.memory, problem=problem, current=current, target=best.layout, running=running_set(plan),
                                   policy=ctx.policy, now_s=p.now.timestamp())
        if started.warning:
            p.event("Warning", "TransitionUnsafe", started.warning)
        p.memory = started.memory
    if started is not None and started.started:
        proposal = proposal_status(best, current=plan, before=None, args_of=_args_of(bp), reasons=[reason, *decision.reasons],
                                   now=p.now, generation=p.generation, percentile=_percentile(ctx.spec))
        state = p.memory.transition
        assert state is not None
        run.proposal = proposal.model_copy(update={"set": state.to_set})
        message = f"{state.mode.value} transition: {proposal.message.replace('would change', 'changing', 1)}"
        p.event("Normal", "TransitionStarted", message)
        p.set(ConditionType.PLANNED, True, "Pinned" if ctx.spec.policy.mode is Mode.PINNED else "Planned", message)
        return None
    message = change_message(current_layout=plan.layout if plan else None, current_gpus=plan.gpus if plan else None,
                             before=before, after=new_plan, reason=reason, percentile=_percentile(ctx.spec), verb="did")
    changed = plan is None or plan.layout != new_plan.layout or plan.gpus != new_plan.gpus
    p.event("Normal", "PlanApplied" if changed else "PlanKept", message)
    p.set(ConditionType.PLANNED, True, "Pinned" if ctx.spec.policy.mode is Mode.PINNED else "Planned", message)
    if changed:
        run.history = append_history(run.history, HistoryEntry(at=timestamp(p.now), action="Applied", layout=new_plan.layout,
                                                               gpus=new_plan.gpus, reason=reason[:256]), HISTORY_LIMIT)
    keep_set = plan is not None and current == best.layout
    run.plan = new_plan.model_copy(update={"set": running_set(plan) if keep_set and plan is not None else layout_set_name(best.layout)})
    return None


def _enact(p: _Pass, ctx: _Ctx, current: Layout | None) -> Outcome:
    run = _Run(plan=p.status.plan, proposal=p.status.proposal if p.memory.transitioning else None, history=list(p.status.history))
    state = p.memory.transition
    new_generation = run.plan is None or run.plan.generation != p.generation
    if state is not None and (state.phase is Phase.DONE or (state.phase is Phase.FAILED and new_generation) or run.plan is None):
        p.memory = dataclasses.replace(p.memory, transition=None)   # a finished one, or a failed one the user has moved past
    problem = _problem_or_none(p, ctx, current)
    if p.memory.transitioning and problem is not None and run.plan is not None:
        if new_generation:
            p.set(ConditionType.PLANNED, None, "TransitionInProgress", "the spec changed; it is planned once the running transition ends")
        _step(p, ctx, problem, run)
    elif new_generation:
        failed = _plan_for_generation(p, ctx, problem, current, run)
        if failed is not None:
            return failed
        if p.memory.transitioning and problem is not None:
            _step(p, ctx, problem, run)
    elif problem is not None and run.plan is not None and p.memory.transition is None:
        out = _live(p, ctx, problem, current)
        if out is not None and out.verdict is Verdict.TRANSITION and out.after is not None:
            p.memory = rebase_sets(p.memory, running_set(run.plan))
            state = p.memory.transition
            run.proposal = proposal_from_replan(out, current=run.plan, args_of=_args_of(ctx.bp_for(p, out.after.layout)), now=p.now,
                                                generation=p.generation, percentile=_percentile(ctx.spec),
                                                set_name=state.to_set if state is not None else None)
            run.decided = True
            _step(p, ctx, problem, run)
    return _render(p, ctx, run)


def _render(p: _Pass, ctx: _Ctx, run: _Run) -> Outcome:
    """Apply what the plan or the running transition wants, prune the rest, and report readiness."""
    plan = run.plan
    assert plan is not None
    state = p.memory.transition
    bp_for = _set_blueprints(p, ctx)
    rendering = (transition_rendering(state, bp_for) if state is not None
                 else steady_rendering(layout_from_plan(plan), running_set(plan), bp_for))
    if any(multinode_roles(bp) for bp in rendering.sets) and not p.cluster.has_leader_worker_set():
        message = f"plan {plan.layout} needs LeaderWorkerSet, which is no longer installed; nothing was applied"
        if p.set(ConditionType.READY, False, "LeaderWorkerSetMissing", message):
            p.event("Warning", "LeaderWorkerSetMissing", message)
        return p.outcome(plan=plan, proposal=run.proposal, history=run.history, decided=run.decided, error="LeaderWorkerSetMissing")
    objects = _apply(p, rendering)
    ready, summary = _readiness(p, objects)
    moving = p.memory.transitioning
    failed = state is not None and state.phase is Phase.FAILED
    # Degraded: replicas were lost while nothing changed (a crash, an evicted node), as opposed to a rollout
    # or a transition that has not finished. It stays set until every replica is back.
    was = {k: condition(p.conditions, k) for k in (ConditionType.READY, ConditionType.DEGRADED)}
    degraded = failed or (not ready and not p.applied and not run.decided and not moving
                          and any(c is not None and c.status == "True" for c in was.values()))
    p.set(ConditionType.READY, ready, "WorkloadsReady" if ready else ("ReplicasUnavailable" if degraded else "WorkloadsNotReady"),
          f"{plan.layout}: {summary}")
    if moving and state is not None:
        p.set(ConditionType.PROGRESSING, True, "Transition", f"{state.source.label} → {state.target.label}: {state.message}")
    else:
        p.set(ConditionType.PROGRESSING, not ready and not degraded, "RollingOut" if not ready and not degraded else "Settled", summary)
    reason = "TransitionFailed" if failed else ("ReplicasUnavailable" if degraded else "AsPlanned")
    text = state.message if failed and state is not None else summary
    if p.set(ConditionType.DEGRADED, degraded, reason, text) and degraded:
        p.event("Warning", reason, f"{plan.layout}: {text}")
    requeue = run.requeue_after_s if moving else (None if ready else PROGRESS_REQUEUE_S)
    return p.outcome(plan=plan, proposal=run.proposal, history=run.history, decided=run.decided, requeue_after_s=requeue)
