"""The reconcile: one idempotent, level-based pass over a ServingTopology (create, update, resume, timer).

Called by the kopf handlers (operator/entry/handlers.py) and by the tests with an in-memory Cluster. It reads
the CR, plans (or reuses the plan of this generation), replans from live metrics when due, drives a transition
one step, renders and applies the workloads or proposes, and returns the new status; the pass state and the
shared planning steps are operator/pass_context.py's. It never relies on a diff and never reads the clock:
`now` is an argument. Policy by mode:

- Auto: plan when the generation changed; the first plan is applied at once, a changed one through a
  transition (one step per pass, state in status.replan, target in status.proposal); replan on drift.
- Pinned: the same with `spec.pinned` as the layout; live metrics are only observed and calibrated.
- DryRun: plan, write `status.proposal` and a `PlanProposed` Event; workloads are never touched.
- Invalid spec, no feasible layout, metrics down: conditions and Events; running workloads stay as they are.

The steps of one pass, in order (`reconcile`, then `_dry_run` or `_enact`, then `_render`):

1. Read: the resource's status and the replan memory in it (`pass_context.hold_unreadable`: what of it cannot be
   read is reported, and holds the workloads where it must).
2. Admit: the resource name and the spec (`api/resource.py` models: `InvalidSpec` names the field), the pod
   templates and the metrics selector against the tenancy policy (`render/tenancy.py`).
3. Set up the pass: the running layout from status.plan, the replan policy (`replan.policy_from_spec`), the metrics
   source (`live_replan.py`).
4. DryRun: plan once per generation into status.proposal, observe the running layout, propose a replan. Stop here.
5. Auto/Pinned, a transition running: advance it one step (`replan.transition_step` over the cluster view
   `cluster/cluster_view.py` reads); finish it (the plan it ends on, `rollout.finished_plan`) or roll back.
6. A new generation: plan it (`_decide_within_capacity`: the cluster's free GPUs, `cluster/capacity.py`), then
   apply the first plan at once or start a transition to the new one (`rollout.start_for_change`), or wait while a
   blocked one cannot start; the pass that starts a transition only declares it in status.
7. Otherwise, steady: read the live metrics when the interval is due (`live_replan.run_live_replan`; the planner's
   loop decides, `planner/live/loop.py` `step`, and `replan.replan` words its effects); drift that is worth a move starts a transition (declared, as in 6).
8. Render and apply: the sets the plan or the transition wants (`render/sets.py`, `render/manifests.py`), each
   object's size checked (`render/object_size.py`), applied server-side with ownership checked and the rest pruned
   (`cluster/cluster.py`).
9. Report: readiness, Degraded, refused or failing pods, traffic shares, the summary; the new status and the requeue
   are the Outcome the kopf handler writes (`entry/handlers.py`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from servingtopology.operator.api.resource import (
    APPROVE_ANNOTATION,
    HISTORY_LIMIT,
    Approval,
    ApprovalStatus,
    ConditionType,
    HistoryEntry,
    Mode,
    PlanStatus,
    Predicted,
    ProposalStatus,
    TopologySpec,
    check_resource_name,
    parse_topology_spec,
)
from servingtopology.operator.calibration_source import admit_calibration, with_calibration
from servingtopology.operator.cluster.admission import AdmissionRefusal
from servingtopology.operator.cluster.capacity import GPU_PRODUCT_LABEL, Capacity, layout_pod_gpus, missing_by_kind, read_capacity, unplaced_gpus
from servingtopology.operator.cluster.cluster import AdmissionRefused, Cluster, ObjectRef, owned_selector, ref_of
from servingtopology.operator.cluster.cluster_view import read_cluster_view
from servingtopology.operator.cluster.plan_worker import PlanBudgetExceeded
from servingtopology.operator.live.readout import phase_text, traffic_shares
from servingtopology.operator.live.url_policy import UrlAllowList
from servingtopology.operator.live_replan import MetricsFactory
from servingtopology.operator.pass_context import (
    Outcome,
    PassContext,
    PassState,
    Planner,
    blueprint_for,
    build_problem,
    decide_or_outcome,
    engine_args_of,
    hold_unreadable,
    invalid_outcome,
    observe_live,
    problem_or_none,
    slo_percentile,
    template_inputs,
)
from servingtopology.operator.plan_status import (
    append_history,
    change_message,
    condition,
    layout_from_plan,
    plan_status,
    predicted,
    proposal_status,
    timestamp,
    with_intervals,
)
from servingtopology.operator.pool_member import capped, membership
from servingtopology.operator.render.manifests import API_VERSION, KIND, ROLE_LABEL, SET_LABEL, Blueprint, build_topology, multinode_roles
from servingtopology.operator.render.object_size import oversized
from servingtopology.operator.render.sets import Rendering, steady_rendering, transition_rendering
from servingtopology.operator.render.tenancy import STRICT, Refusal, TenancyPolicy, pod_template_refusals, selector_refusal
from servingtopology.operator.replan import (
    FloorCheck,
    Predictor,
    Verdict,
    after_transition,
    policy_from_spec,
    proposal_from_replan,
    serving_floor,
    transition_step,
)
from servingtopology.operator.rollout import Started, finished_plan, rebase_sets, running_set, start_for_change
from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Layout
from servingtopology.planner.live.transition import Phase, TransitionState
from servingtopology.planner.live.transition import set_name as layout_set_name
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.planner.search.decide import predict_layout
from servingtopology.spec import SpecError

__all__ = ["Planner", "Outcome", "reconcile", "blueprint_for", "ApprovalRefusal", "approval_refusal"]

PROGRESS_REQUEUE_S = 15.0
CAPACITY_REQUEUE_S = 15.0   # look again for freed GPUs
REFUSALS_SHOWN = 8          # refused template fields named in a condition at most (the rest are counted)
CONDITION_MESSAGE_CHARS = 1024   # a condition's message is cut there (api/resource.py Condition.message)


def reconcile(obj: Mapping[str, Any], *, cluster: Cluster, planner: Planner, now: datetime, gpus_per_node_default: int = 8,
              metrics: MetricsFactory | None = None, predict: Predictor = predict_layout,
              metrics_allow: UrlAllowList | None = None, tenancy: TenancyPolicy = STRICT) -> Outcome:
    """Bring the cluster and the status in line with one ServingTopology; safe to run any number of times.

    `metrics` builds the live metrics source (None: no live replanning, e.g. unit tests of the plan alone);
    `metrics_allow` the Prometheus URLs it may call (None: any; the operator always passes its allow-list); `tenancy`
    what a resource's pod templates and metrics selector may ask for (default: the strict policy, operator/render/tenancy.py).
    Raises ClusterError (from the Cluster) on transient API failures; everything else becomes status.
    """
    p = PassState(obj, cluster, now)
    held = hold_unreadable(p)
    if held is not None:
        return held
    try:
        check_resource_name(p.name)  # admitted before the CRD's name rule: no object could be named after it
        spec = parse_topology_spec(obj.get("spec"))
    except SpecError as exc:
        return invalid_outcome(p, "; ".join(f"{f}: {m}" for f, m in exc.errors), plan=p.status.plan, proposal=p.status.proposal)
    refused = _refused_templates(p, spec, tenancy)
    if refused is not None:
        return refused
    if spec.metrics is None:
        p.set(ConditionType.METRICS_AVAILABLE, False, "NoMetricsSource", "spec.metrics is not set; planning from the expected workload")
    elif (why := selector_refusal(spec.metrics.selector, namespace=p.namespace, policy=tenancy)) is not None:
        # The rest of the resource is served; its metrics are not read while the selector would leave the namespace.
        if p.set(ConditionType.METRICS_AVAILABLE, False, "MetricsSelectorRefused", why):
            p.event("Warning", "MetricsSelectorRefused", why)
        metrics = None
    spec = _pool_membership(p, spec)
    refused_calibration = admit_calibration(p, spec)
    if refused_calibration is not None:
        return refused_calibration
    current = layout_from_plan(p.status.plan) if p.status.plan is not None else None
    ctx = PassContext(spec=spec, planner=planner, predict=predict, metrics=metrics, policy=policy_from_spec(spec.policy),
                      gpus_per_node=spec.hardware.gpusPerNode or gpus_per_node_default, metrics_allow=metrics_allow)
    if spec.policy.mode is Mode.DRY_RUN or (spec.policy.mode is Mode.AUTO and spec.policy.approval is Approval.REQUIRED):
        return _gated(p, ctx, current)
    return _enact(p, ctx, current)


def _pool_membership(p: PassState, spec: TopologySpec) -> TopologySpec:
    """PoolMember: the ServingPool spec.pool names (operator/pool_member.py); the spec this pass plans with, its
    hardware.maxGPUs lowered to the cap an Auto pool assigned. A cap that changes is planned as a spec change is
    (`_cap_changed`): the plan records the cap it was made under (status.plan.poolGPUs)."""
    labels = dict((p.obj.get("metadata") or {}).get("labels") or {})
    member = membership(spec, cluster=p.cluster, namespace=p.namespace, labels=labels, annotations=dict(p.annotations))
    if member.status is None:
        return spec
    if p.set(ConditionType.POOL_MEMBER, member.status, member.reason, member.message) and member.status is False:
        p.event("Warning", member.reason, member.message)
    p.pool_gpus = member.cap_gpus
    return capped(spec, member)


def _cap_changed(p: PassState, plan: PlanStatus | ProposalStatus | None) -> bool:
    """Whether the pool's cap differs from the one `plan` was made under."""
    return plan is not None and plan.poolGPUs != p.pool_gpus


def _gated(p: PassState, ctx: PassContext, current: Layout | None) -> Outcome:
    """ApprovedProposal: DryRun, and Auto with policy.approval Required, apply nothing of their own; a proposal runs
    once the approve annotation names its id, while it is still the current proposal of this generation.

    - the annotation names the current proposal (not yet applied): this pass plans this generation again pinned to the
      proposal's layout and applies it as Auto would (at once, or through a transition within the surge budget);
      Approved=True, a ProposalApproved Event, status.approval records it;
    - the annotation names anything else: refused and disarmed (`_disarm`, ApprovalOfWhatWasShown), so it can never
      apply a proposal made after it was written;
    - after an approval, while its plan is the running one for this generation (or its transition runs), each pass
      keeps it reconciled as Auto would and reads live metrics, but drift only proposes (policy as DryRun);
    - otherwise: the DryRun pass (plan once per generation into status.proposal, nothing applied).
    """
    gated = dataclasses.replace(ctx, policy=dataclasses.replace(ctx.policy, mode=Mode.DRY_RUN))
    asked = str(p.annotations.get(APPROVE_ANNOTATION, "")).strip()
    proposal, approval = p.status.proposal, p.approval
    if asked and (approval is None or asked != approval.id):
        if proposal is not None and asked == proposal.id and proposal.generation == p.generation:
            p.approval = ApprovalStatus(id=asked, layout=proposal.layout, gpus=proposal.gpus, at=timestamp(p.now), generation=p.generation)
            message = f"applying proposal {asked}: {proposal.layout} on {_gpus(proposal.gpus)} ({proposal.message})"
            p.set(ConditionType.APPROVED, True, "ProposalApproved", message)
            applied = _enact(p, dataclasses.replace(gated, approved=layout_from_plan(proposal)), current, replan_now=True)
            # Posted once the pass got through (a plan still running in the worker raises PlanPending above and the
            # next pass approves again): one Event per approval.
            p.event("Normal", "ProposalApproved", message)
            return applied
        _disarm(p, asked, proposal)
    approval = p.approval
    plan = p.status.plan
    if approval is not None and (p.memory.transitioning or (plan is not None and plan.generation == p.generation == approval.generation)):
        return _enact(p, gated, current)
    return _dry_run(p, ctx, current)


class ApprovalRefusal(enum.StrEnum):
    """Why an approve annotation was refused (the Approved=False reason)."""

    STALE = "ProposalStale"          # it names a proposal shown earlier and since replaced (another generation, a newer id)
    NOT_SHOWN = "ProposalNotShown"   # it names no proposal shown so far: a future id (armed before the proposal existed), a typo


def approval_refusal(asked: str, *, proposals_shown: int) -> ApprovalRefusal:
    """ProposalStale for p1 … p<proposals_shown> (ids this resource has shown), ProposalNotShown for anything else."""
    number = asked[1:] if asked.startswith("p") else ""
    shown = number.isdigit() and not number.startswith("0") and 1 <= int(number) <= proposals_shown
    return ApprovalRefusal.STALE if shown else ApprovalRefusal.NOT_SHOWN


def _disarm(p: PassState, asked: str, proposal: ProposalStatus | None) -> None:
    """ApprovalOfWhatWasShown: an approve annotation counts only for the proposal current when the operator first reads
    it. Any other value is refused (Approved=False, ProposalStale or ProposalNotShown, one Warning per refusal) and
    removed from the resource in the same pass, before this pass can publish a new proposal: an id written ahead of its
    proposal (approve=p2 while p1 is current) would otherwise apply p2, which nobody reviewed, once the next edit made it.

    The removal tests the value first (a JSON patch `test` + `remove`), so an annotation rewritten since this pass read
    it is left for the next pass to judge. A failed removal fails the pass (ClusterError, retried with back-off) before
    anything is planned or applied. What it cannot tell apart: an annotation written while the pass that publishes a new
    proposal runs (after its read, before its status write) is read by the next pass as written after it was shown.
    """
    removed = p.cluster.remove_annotation(ObjectRef(API_VERSION, KIND, p.namespace, p.name), APPROVE_ANNOTATION, value=asked)
    reason = approval_refusal(asked, proposals_shown=p.proposals)
    now = (f"the current proposal is {proposal.id} ({proposal.layout}, {_gpus(proposal.gpus)})"
           if proposal is not None and proposal.id and proposal.generation == p.generation else "there is no current proposal")
    what = ("names no current proposal" if reason is ApprovalRefusal.STALE
            else "names no proposal shown so far (an approval counts only for the proposal current when it is set)")
    disarmed = ("the annotation was removed" if removed else "the annotation has changed since and is judged on the next pass")
    message = (f"{APPROVE_ANNOTATION}={asked} {what}: {now}; nothing was applied and {disarmed}. Approve the current "
               f"one once it is shown: kubectl annotate stopo {p.name} -n {p.namespace} --overwrite {APPROVE_ANNOTATION}=<id>")
    p.set(ConditionType.APPROVED, False, reason.value, message)
    p.event("Warning", reason.value, message)


def _refused_templates(p: PassState, spec: TopologySpec, tenancy: TenancyPolicy) -> Outcome | None:
    """PodTemplateRefused: the templates ask for what the administrator's policy does not grant in this namespace.

    Nothing is planned or applied (running workloads stay as they were); Ready and Planned name every refused field and
    what is allowed. The namespace's labels are read only when a namespace rule could grant what is missing."""
    dicts = template_inputs(spec)
    found = pod_template_refusals(dicts, granted=tenancy.pod_grants)
    if tenancy.namespace_grants and any(r.grant is not None for r in found):
        found = pod_template_refusals(dicts, granted=tenancy.grants_for(p.cluster.namespace_labels(p.namespace)))
    if not found:
        return None
    tail = (f". Creating a ServingTopology creates pods in namespace {p.namespace}; the operator's pod-template policy grants "
            f"{tenancy.allowed_words()} (chart values operator.podTemplatePolicy.allow and .namespaces). Nothing was applied; "
            "running workloads are left as they are")
    shown = _refusals_within(found, chars=CONDITION_MESSAGE_CHARS - len(tail))
    message = "; ".join(shown) + (f"; and {len(found) - len(shown)} more" if len(found) > len(shown) else "") + tail
    if p.set(ConditionType.READY, False, "PodTemplateRefused", message):
        p.event("Warning", "PodTemplateRefused", message)
    p.set(ConditionType.PLANNED, False, "PodTemplateRefused", message)
    return p.outcome(plan=p.status.plan, proposal=p.status.proposal, error="PodTemplateRefused")


def _refusals_within(found: list[Refusal], *, chars: int) -> list[str]:
    """The first refusals, at most REFUSALS_SHOWN, that fit in `chars` with the count of the rest (the first always)."""
    shown: list[str] = []
    for r in found[:REFUSALS_SHOWN]:
        text = str(r)
        if shown and len("; ".join([*shown, text])) + len(f"; and {len(found)} more") > chars:
            break
        shown.append(text)
    return shown


_Shown = TypeVar("_Shown", PlanStatus, ProposalStatus)


def _with_intervals(shown: _Shown, problem: Problem | None, decision: Decision, p: PassState, *,
                    before: Candidate | None = None) -> _Shown:
    """IntervalsShown: a plan or proposal made for this generation with each prediction's nominal interval (the chosen
    layout's under `predicted` and, calibrated, `uncalibrated`; the running layout's at the same load under `before`),
    widened per missed move."""
    if problem is None:
        return shown
    update: dict[str, Any] = {"predicted": with_intervals(shown.predicted, problem, decision.best, misses=p.memory.misses),
                              "uncalibrated": with_intervals(shown.uncalibrated, problem, decision.uncalibrated, misses=p.memory.misses)}
    if isinstance(shown, ProposalStatus):
        update["before"] = with_intervals(shown.before, problem, before if before is not None else decision.current,
                                          misses=p.memory.misses)
    return shown.model_copy(update=update)

def _dry_run(p: PassState, ctx: PassContext, current: Layout | None) -> Outcome:
    proposal, history, decided = p.status.proposal, list(p.status.history), False
    if proposal is None or proposal.generation != p.generation or _cap_changed(p, proposal):
        try:
            spec_problem: Problem | None = build_problem(p, ctx.spec, current)
        except (InvalidSpec, SpecError):
            spec_problem = None   # decide_or_outcome builds it again and reports the field
        decision = decide_or_outcome(p, ctx.spec, ctx.planner, current, spec_problem)
        if isinstance(decision, Outcome):
            return decision
        best, decided = decision.best, True
        proposal = proposal_status(best, engine=ctx.spec.engine.name, current=p.status.plan, before=decision.current.prediction if decision.current else None,
                                   args_of=engine_args_of(ctx.bp_for(p, best.layout)), reasons=decision.reasons, now=p.now,
                                   generation=p.generation, percentile=slo_percentile(ctx.spec))
        proposal = p.numbered(_with_intervals(with_calibration(proposal, decision, p), spec_problem, decision, p)).model_copy(
            update={"poolGPUs": p.pool_gpus})
        p.event("Normal", "PlanProposed", f"proposal {proposal.id}: {proposal.message}")
        p.set(ConditionType.PLANNED, True, "PlanProposed", proposal.message)
        if p.status.plan is None:
            p.set(ConditionType.READY, False, "AwaitingApproval", _awaiting(p, proposal))
        history = append_history(history, HistoryEntry(at=timestamp(p.now), action="Proposed", layout=proposal.layout,
                                                       gpus=proposal.gpus, reason=proposal.reason[:256]), HISTORY_LIMIT)
    problem = problem_or_none(p, ctx, current) if current is not None else None
    # Live replanning needs something running to observe; DryRun never starts anything itself.
    out = observe_live(p, ctx, problem, current) if problem is not None else None
    if out is not None and out.verdict is Verdict.PROPOSE and out.after is not None:
        proposal = p.numbered(proposal_from_replan(out, engine=ctx.spec.engine.name, current=p.status.plan,
                                                   args_of=engine_args_of(ctx.bp_for(p, out.after.layout)),
                                                   now=p.now, generation=p.generation, percentile=slo_percentile(ctx.spec)))
        p.set(ConditionType.PLANNED, True, "PlanProposed", proposal.message)
        history = append_history(history, HistoryEntry(at=timestamp(p.now), action="Proposed", layout=proposal.layout,
                                                       gpus=proposal.gpus, reason=proposal.reason[:256]), HISTORY_LIMIT)
        decided = True
    return p.outcome(plan=p.status.plan, proposal=proposal, history=history, decided=decided)


def _gpus(n: int) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


def _awaiting(p: PassState, proposal: ProposalStatus) -> str:
    """AwaitingApproval: what Ready says while nothing runs and a proposal waits, with the proposal's predicted figures."""
    figures = proposal.predicted
    predicted_text = (f"; predicted TTFT {figures.ttftMs:.0f} ms, TPOT {figures.tpotMs:.1f} ms, {figures.capacityRps:.3g} req/s "
                      "within the SLO" if figures is not None else "")
    return (f"nothing is deployed: proposal {proposal.id} ({proposal.layout}, {_gpus(proposal.gpus)}{predicted_text}) waits for "
            f"approval: kubectl annotate stopo {p.name} -n {p.namespace} {APPROVE_ANNOTATION}={proposal.id}")


@dataclass
class _Run:
    """What the Auto/Pinned pass carries from planning to rendering."""

    plan: PlanStatus | None
    proposal: ProposalStatus | None
    history: list[HistoryEntry]
    decided: bool = False
    requeue_after_s: float | None = None
    floor: FloorCheck | None = None   # ServingFloorHeld of the running transition, when read this pass
    hold: bool = False                # TransitionBlocked: apply and prune nothing, report on the objects as they are


def _step(p: PassState, ctx: PassContext, problem: Problem, run: _Run) -> None:
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
        run.requeue_after_s = step.requeue_after_s if step is not None and step.requeue_after_s is not None else PROGRESS_REQUEUE_S
        if state is not None:
            p.traffic = traffic_shares(state, view)
            run.floor = serving_floor(memory, view, problem=problem)
        return
    if state.rolled_back:
        p.event("Warning", "TransitionRolledBack", f"back on {run.plan.layout}: {state.message}")
        run.plan = run.plan.model_copy(update={"set": state.to_set})
    else:
        new = finished_plan(p.memory, run.proposal, problem=problem, predict=ctx.predict, now=p.now, generation=p.generation,
                            args_of=engine_args_of(ctx.bp_for(p, state.target)))
        reason = new.reasons[0] if new.reasons else "a better layout for the workload"
        before, load_rps = _same_load_before(ctx, problem, run.proposal, source=state.source, target=new)
        message = change_message(current_layout=run.plan.layout, current_gpus=run.plan.gpus, before=before, after=new,
                                 reason=reason, percentile=slo_percentile(ctx.spec), verb="did", load_rps=load_rps)
        p.event("Normal", "PlanApplied", message)
        p.set(ConditionType.PLANNED, True, "Pinned" if ctx.spec.policy.mode is Mode.PINNED else "Planned", message)
        run.history = append_history(run.history, HistoryEntry(at=timestamp(p.now), action="Applied", layout=new.layout, gpus=new.gpus,
                                                               reason=reason[:256]), HISTORY_LIMIT)
        run.plan = new
    run.proposal = None
    p.memory = after_transition(memory, now_s=p.now.timestamp())
    p.observed = None   # measured on the layout that no longer runs (PostTransitionWindow)


def _same_load_before(ctx: PassContext, problem: Problem, proposal: ProposalStatus | None, *, source: Layout,
                      target: PlanStatus) -> tuple[Predicted | None, float | None]:
    """SameLoadFigures for a finished transition: the old layout's figures at the load the new plan was predicted at.

    The proposal carries them when it still matches the target; otherwise (status lost) `finished_plan` predicted
    the target at the spec's problem, and the old layout is predicted there too.
    """
    if proposal is not None and proposal.layout == target.layout and proposal.before is not None:
        return proposal.before, proposal.loadRps
    return predicted(ctx.predict(problem, source).prediction), problem.workload.arrival_rate_rps


def _set_blueprints(p: PassState, ctx: PassContext) -> Callable[[Layout, str], Blueprint]:
    def bp_for(layout: Layout, set_name: str) -> Blueprint:
        return ctx.bp_for(p, layout, set_name)
    return bp_for


def _capacity(p: PassState, ctx: PassContext, *, every_kind: bool = False) -> Capacity | None:
    """GPU capacity on the nodes this topology may use, its own pods' GPUs counted as free; None when unknown.
    `every_kind`: without the selector's product label (a layout naming kinds selects each role's kind itself)."""
    nodes = p.cluster.list_nodes()
    if nodes is None:
        return None
    own = {str(pod["metadata"].get("uid")) for pod in p.cluster.list_pods(p.namespace, owned_selector(p.name))}
    template = ctx.spec.podTemplate
    selector = {**ctx.spec.hardware.nodeSelector, **(template.spec.nodeSelector if template is not None else {})}
    if every_kind:
        selector.pop(GPU_PRODUCT_LABEL, None)
    return read_capacity(nodes, p.cluster.list_all_pods(), node_selector=selector, own=own)


def _capacity_note(capacity: Capacity, gpu_id: str) -> str:
    nodes = capacity.of(gpu_id)
    note = f"{capacity.free(gpu_id)} of {capacity.allocatable(gpu_id)} {gpu_id} GPUs free on {len(nodes)} matching nodes"
    others = sorted({n.product for n in capacity.nodes if n.gpu_id and n.gpu_id != gpu_id})
    if others:
        note += f"; nodes with other GPUs ({', '.join(others)}) do not count"
    if capacity.unknown_products:
        note += f"; GPU products not in the catalog, not counted: {', '.join(capacity.unknown_products)}"
    return note


def _decide_within_capacity(p: PassState, ctx: PassContext, problem: Problem | None, current: Layout | None,
                            capacity: Capacity | None) -> Decision | Outcome:
    """Plan within the GPUs that are free; when nothing fits, say how many GPUs of which kind are missing.

    - capacity unknown, or at least the budget free: plan as the spec says;
    - fewer free than the budget: plan with the free GPUs as the budget; if no layout fits them but one fits
      the spec's budget, report that layout's shortfall;
    - a layout within the budget whose pods do not fit the free GPUs node by node: report the pods' shortfall.
    Nothing is applied when capacity is insufficient; the running workloads stay.
    """
    try:
        gpu_id = resolve_gpu(ctx.spec.hardware.gpu).id
    except InvalidSpec:
        capacity = None   # the planning path names the unknown GPU
    if capacity is None:
        return decide_or_outcome(p, ctx.spec, ctx.planner, current, problem)
    free = capacity.free(gpu_id)
    within: Decision | None = None
    if problem is not None and free is not None and 0 < free < problem.max_gpus:
        try:
            within = ctx.planner(dataclasses.replace(problem, max_gpus=free))
        except (Infeasible, InvalidSpec, PlanBudgetExceeded):   # InvalidSpec: a pin over the free GPUs (decide holds pins to the budget)
            within = None   # the spec's budget decides below whether a layout exists at all
    decision = within if within is not None else decide_or_outcome(p, ctx.spec, ctx.planner, current, problem)
    if isinstance(decision, Outcome):
        return decision
    best = decision.best
    if best.layout.kinds_named:
        return _kinds_fit(p, ctx, decision, capacity, gpu_id)
    note = _capacity_note(capacity, gpu_id)
    if within is None and best.layout.gpus > free:
        missing = best.layout.gpus - free
    else:
        free_per_node = [n.free for n in capacity.of(gpu_id)]
        missing = unplaced_gpus(layout_pod_gpus(best.layout, gpus_per_node=ctx.gpus_per_node), free_per_node)
    if missing == 0:
        p.set(ConditionType.INSUFFICIENT_CAPACITY, False, "Fits", f"{ctx.label(best.layout)} ({best.layout.gpus} GPUs) fits: {note}")
        return decision
    message = (f"plan {ctx.label(best.layout)} needs {best.layout.gpus} {gpu_id} GPUs; {missing} {gpu_id} GPUs are missing "
               f"({note}); nothing was applied")
    return _insufficient_capacity(p, message)


def _insufficient_capacity(p: PassState, message: str) -> Outcome:
    """InsufficientCapacity: the plan does not fit the free GPUs; one Warning, Planned=False, nothing applied, the pass
    comes back after CAPACITY_REQUEUE_S."""
    if p.set(ConditionType.INSUFFICIENT_CAPACITY, True, "InsufficientCapacity", message):
        p.event("Warning", "InsufficientCapacity", message)
    p.set(ConditionType.PLANNED, False, "InsufficientCapacity", message)
    if p.status.plan is None:
        p.set(ConditionType.READY, False, "InsufficientCapacity", message)
    return p.outcome(plan=p.status.plan, proposal=p.status.proposal, requeue_after_s=CAPACITY_REQUEUE_S, error="InsufficientCapacity")


def _kinds_fit(p: PassState, ctx: PassContext, decision: Decision, capacity: Capacity, gpu_id: str) -> Decision | Outcome:
    """PerKindFit: a layout whose roles name GPU kinds fits when each kind's pods fit that kind's free GPUs node by
    node (cluster/capacity.py `missing_by_kind`); otherwise InsufficientCapacity names each kind's shortfall and nothing
    is applied."""
    best = decision.best
    capacity = _capacity(p, ctx, every_kind=True) or capacity
    missing = missing_by_kind(best.layout, capacity, default_gpu=gpu_id, gpus_per_node=ctx.gpus_per_node)
    kinds = sorted(set(best.layout.role_gpus(gpu_id).values()))
    note = "; ".join(f"{capacity.free(k)} of {capacity.allocatable(k)} {k} GPUs free on {len(capacity.of(k))} matching nodes" for k in kinds)
    if not missing:
        p.set(ConditionType.INSUFFICIENT_CAPACITY, False, "Fits", f"{ctx.label(best.layout)} ({best.layout.gpus} GPUs) fits: {note}")
        return decision
    short = ", ".join(f"{n} {k}" for k, n in missing.items())
    message = f"plan {ctx.label(best.layout)} needs GPUs of {len(kinds)} kinds; {short} GPUs are missing ({note}); nothing was applied"
    return _insufficient_capacity(p, message)


def _plan_for_generation(p: PassState, ctx: PassContext, problem: Problem | None, current: Layout | None, run: _Run) -> Outcome | None:
    """Plan this generation: adopt the first plan (or an unchanged layout) at once, start a transition to a changed one."""
    plan = run.plan
    decision = _decide_within_capacity(p, ctx, problem, current, _capacity(p, ctx))
    if isinstance(decision, Outcome):
        return decision
    best, run.decided = decision.best, True
    bp = ctx.bp_for(p, best.layout)
    if multinode_roles(bp) and not p.cluster.has_leader_worker_set():
        roles = ", ".join(r.value for r in multinode_roles(bp))
        message = (f"plan {ctx.label(best.layout)} needs multi-node instances ({roles}, over {bp.gpus_per_node} GPUs per node) and "
                   "the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io) is not installed; nothing was applied")
        if p.set(ConditionType.READY, False, "LeaderWorkerSetMissing", message):
            p.event("Warning", "LeaderWorkerSetMissing", message)
        p.set(ConditionType.PLANNED, False, "LeaderWorkerSetMissing", message)
        return p.outcome(plan=plan, proposal=None, error="LeaderWorkerSetMissing")
    new_plan = _with_intervals(with_calibration(plan_status(best, engine=bp.engine, args_of=engine_args_of(bp), reasons=decision.reasons, now=p.now,
                                                            generation=p.generation), decision, p), problem, decision, p)
    reason = decision.reasons[0] if decision.reasons else (best.why or "best ranked layout under the SLOs")
    if ctx.spec.policy.mode is Mode.PINNED:
        reason = "policy.mode is Pinned"
    if ctx.approved is not None and p.approval is not None:
        reason = f"proposal {p.approval.id} was approved ({APPROVE_ANNOTATION})"
    # SameLoadFigures: the running layout at the load this plan was made for, not its figures at its own planned load.
    same_load = decision.current if decision.current is not None else (
        ctx.predict(problem, current) if problem is not None and current is not None and plan is not None else None)
    before = predicted(same_load.prediction) if same_load is not None else None
    load_rps = problem.workload.arrival_rate_rps if problem is not None else None
    # A new generation re-bases drift on the spec's workload; the calibration and the metric window stay.
    p.memory = dataclasses.replace(p.memory, assumed=None, drift=dataclasses.replace(p.memory.drift, streak=0, calm=0, detected=False))
    if plan is not None and current is not None and problem is not None and current != best.layout:
        started = start_for_change(p.memory, problem=problem, current=current, target=best.layout, running=running_set(plan),
                                   policy=ctx.policy, now_s=p.now.timestamp())
        proposal = proposal_status(best, engine=bp.engine, current=plan, before=same_load.prediction if same_load is not None else None,
                                   args_of=engine_args_of(bp), reasons=[reason, *decision.reasons], now=p.now,
                                   generation=p.generation, percentile=slo_percentile(ctx.spec), load_rps=load_rps)
        proposal = _with_intervals(with_calibration(proposal, decision, p), problem, decision, p, before=same_load)
        if started.started:
            _begin(p, ctx, run, proposal, started)
        else:
            _blocked(p, run, proposal, started, fresh=True)
        return None
    message = change_message(current_layout=plan.layout if plan else None, current_gpus=plan.gpus if plan else None,
                             before=before, after=new_plan, reason=reason, percentile=slo_percentile(ctx.spec), verb="did",
                             load_rps=load_rps)
    changed = plan is None or plan.layout != new_plan.layout or plan.gpus != new_plan.gpus
    p.event("Normal", "PlanApplied" if changed else "PlanKept", message)
    p.set(ConditionType.PLANNED, True, "Pinned" if ctx.spec.policy.mode is Mode.PINNED else "Planned", message)
    if changed:
        run.history = append_history(run.history, HistoryEntry(at=timestamp(p.now), action="Applied", layout=new_plan.layout,
                                                               gpus=new_plan.gpus, reason=reason[:256]), HISTORY_LIMIT)
    keep_set = plan is not None and current == best.layout
    run.plan = new_plan.model_copy(update={"set": running_set(plan) if keep_set and plan is not None else layout_set_name(best.layout),
                                           "poolGPUs": p.pool_gpus})
    return None


TRANSITION_BLOCKED = "TransitionBlocked"   # Planned=False reason and Warning Event: a spec edit's move waits (StartVerdict says why)


def _begin(p: PassState, ctx: PassContext, run: _Run, proposal: ProposalStatus, started: Started) -> None:
    """Record the transition a spec edit starts (the next pass takes its first step) with TransitionStarted, and a
    Warning named after the verdict when the floor is lower than the full one (policy.capacityDrop allowed it)."""
    if started.warning:
        p.event("Warning", f"Transition{started.verdict.value}", started.warning)
    p.memory = started.memory
    state = p.memory.transition
    assert state is not None
    # An approved proposal's transition keeps the approved id: status.proposal is then its target, not a new proposal.
    approved_id = p.approval.id if ctx.approved is not None and p.approval is not None else None
    run.proposal = proposal.model_copy(update={"set": state.to_set, "id": approved_id, "poolGPUs": p.pool_gpus})
    message = f"{state.mode.value} transition: {proposal.message.replace('would change', 'changing', 1)}"
    p.event("Normal", "TransitionStarted", message)
    p.set(ConditionType.PLANNED, True, "Pinned" if ctx.spec.policy.mode is Mode.PINNED else "Planned", message)


def _blocked(p: PassState, run: _Run, proposal: ProposalStatus, started: Started, *, fresh: bool) -> None:
    """TransitionBlocked: a spec edit's move would drop the serving floor further than policy.capacityDrop allows
    (or no sequence fits the GPU budget at all). The running layout keeps serving untouched (nothing is applied or
    pruned this pass), status.proposal shows the target with before and after figures, Planned=False names the
    verdict, the GPUs the move needs and what to change. One Warning Event per blocked change: posted by the pass
    that planned it (`fresh`) when the Planned condition did not already say the same; the passes that look again
    (the load, and so the floor, may change) post none."""
    assert run.plan is not None
    message = f"{started.verdict.value}: keeping {run.plan.layout} serving as it is; {started.message}"
    was = condition(p.conditions, ConditionType.PLANNED)
    p.set(ConditionType.PLANNED, False, TRANSITION_BLOCKED, message)
    if fresh and (was is None or (was.reason, was.message) != (TRANSITION_BLOCKED, message)):
        p.event("Warning", TRANSITION_BLOCKED, message)
    run.proposal = proposal.model_copy(update={"poolGPUs": p.pool_gpus})
    run.hold = True


def _blocked_target(p: PassState, run: _Run) -> ProposalStatus | None:
    """The target of this generation's blocked change, when the last pass left one (Planned=False TransitionBlocked)."""
    proposal, planned = p.status.proposal, condition(p.conditions, ConditionType.PLANNED)
    if (proposal is None or proposal.generation != p.generation or planned is None or planned.reason != TRANSITION_BLOCKED
            or run.plan is None or p.memory.transition is not None or _cap_changed(p, proposal)):
        return None
    return proposal


def _look_again(p: PassState, ctx: PassContext, problem: Problem, current: Layout, run: _Run, proposal: ProposalStatus) -> None:
    """A blocked change of this generation, judged again without planning again: it starts once the floor it needs
    can be kept (the measured load fell: the pass has just read it) and stays blocked, without another Event, while it
    cannot."""
    assert run.plan is not None
    started = start_for_change(p.memory, problem=problem, current=current, target=layout_from_plan(proposal),
                               running=running_set(run.plan), policy=ctx.policy, now_s=p.now.timestamp())
    if started.started:
        _begin(p, ctx, run, proposal, started)
    else:
        _blocked(p, run, proposal, started, fresh=False)


def _enact(p: PassState, ctx: PassContext, current: Layout | None, *, replan_now: bool = False) -> Outcome:
    """Auto and Pinned (and an approved proposal: `replan_now` plans this generation again, pinned to it)."""
    proposing = ctx.policy.mode is Mode.DRY_RUN    # an approved plan running under DryRun or approval Required
    keep = p.memory.transitioning or (proposing and not replan_now)
    run = _Run(plan=p.status.plan, proposal=p.status.proposal if keep else None, history=list(p.status.history))
    state = p.memory.transition
    new_generation = run.plan is None or run.plan.generation != p.generation or replan_now or _cap_changed(p, run.plan)
    if state is not None and (state.phase is Phase.DONE or (state.phase is Phase.FAILED and new_generation) or run.plan is None):
        p.memory = dataclasses.replace(p.memory, transition=None)   # a finished one, or a failed one the user has moved past
    problem = problem_or_none(p, ctx, current)
    if p.memory.transitioning and problem is not None and run.plan is not None:
        if new_generation and (run.proposal is None or run.proposal.generation != p.generation):
            p.set(ConditionType.PLANNED, None, "TransitionInProgress", "the spec changed; it is planned once the running transition ends")
        _step(p, ctx, problem, run)
    elif new_generation:
        blocked = _blocked_target(p, run)
        if blocked is not None and problem is not None and current is not None:
            # The running layout keeps serving: its metrics are still read (status.observed, and the load the blocked
            # move's floor follows), though nothing is decided from them while the change waits.
            observe_live(p, ctx, problem, current, observe_only=f"the spec change to {blocked.layout} waits ({TRANSITION_BLOCKED})")
            _look_again(p, ctx, problem, current, run, blocked)
        else:
            failed = _plan_for_generation(p, ctx, problem, current, run)
            if failed is not None:
                return failed
        if p.memory.transitioning and problem is not None:
            _declared(p, ctx, problem, run)
    elif problem is not None and run.plan is not None and p.memory.transition is None:
        out = observe_live(p, ctx, problem, current)
        if out is not None and out.verdict is Verdict.TRANSITION and out.after is not None:
            p.memory = rebase_sets(p.memory, running_set(run.plan))
            state = p.memory.transition
            run.proposal = proposal_from_replan(out, engine=ctx.spec.engine.name, current=run.plan,
                                                args_of=engine_args_of(ctx.bp_for(p, out.after.layout)), now=p.now,
                                                generation=p.generation, percentile=slo_percentile(ctx.spec),
                                                set_name=state.to_set if state is not None else None).model_copy(
                                                    update={"poolGPUs": p.pool_gpus})
            run.decided = True
            _declared(p, ctx, problem, run)
        elif out is not None and out.verdict is Verdict.PROPOSE and out.after is not None and proposing:
            run.proposal = p.numbered(proposal_from_replan(out, engine=ctx.spec.engine.name, current=run.plan,
                                                           args_of=engine_args_of(ctx.bp_for(p, out.after.layout)),
                                                           now=p.now, generation=p.generation, percentile=slo_percentile(ctx.spec)))
            p.set(ConditionType.PLANNED, True, "PlanProposed", run.proposal.message)
            run.history = append_history(run.history, HistoryEntry(at=timestamp(p.now), action="Proposed", layout=run.proposal.layout,
                                                                   gpus=run.proposal.gpus, reason=run.proposal.reason[:256]), HISTORY_LIMIT)
            run.decided = True
    return _render(p, ctx, run)


def _declared(p: PassState, ctx: PassContext, problem: Problem, run: _Run) -> None:
    """TransitionDeclaredFirst: the pass that starts a transition only declares it (status.replan: the sets, the
    steps' target and the serving floor) and asks for the next pass at once; the first step runs in that pass, which
    reads the transition back from status. Nothing that runs changes before its transition and floor are stored, so an
    operator killed in between leaves a declared transition to carry on, never a scaled-down set no status names.
    The pass still reads the serving floor (ServingFloorHeld), as every pass of a transition does."""
    state = p.memory.transition
    assert state is not None
    view = read_cluster_view(p.cluster, transition_rendering(state, _set_blueprints(p, ctx)), namespace=p.namespace, name=p.name)
    p.traffic = traffic_shares(state, view)
    run.floor = serving_floor(p.memory, view, problem=problem)
    run.requeue_after_s = 0.0


def _render(p: PassState, ctx: PassContext, run: _Run) -> Outcome:
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
    rendered = [] if run.hold else build_topology(rendering.sets, serving=rendering.serving)
    too_large = [why for obj in rendered for why in oversized(obj)]
    if too_large:
        message = (f"{'; '.join(too_large)}. The pod templates' fields (spec.podTemplate, spec.rolePodTemplates: annotations, env, "
                   "args) are copied into every rendered pod template; shorten them. Nothing was applied")
        if p.set(ConditionType.READY, False, "ObjectTooLarge", message):
            p.event("Warning", "ObjectTooLarge", message)
        return p.outcome(plan=plan, proposal=run.proposal, history=run.history, decided=run.decided, error="ObjectTooLarge")
    objects = _unchanged(p, rendering) if run.hold else _apply(p, rendering, rendered)
    if objects is NothingApplied.ADMISSION_REFUSED:
        return p.outcome(plan=plan, proposal=run.proposal, history=run.history, decided=run.decided, error=objects.value)
    if isinstance(objects, NothingApplied):
        conflict = condition(p.conditions, ConditionType.CONFLICT)
        if p.status.plan is None or condition(p.conditions, ConditionType.READY) is None:
            p.set(ConditionType.READY, False, "ObjectNotOwned", conflict.message if conflict else "objects not owned")
        return p.outcome(plan=plan, proposal=run.proposal, history=run.history, decided=run.decided, error="ObjectNotOwned",
                         requeue_after_s=PROGRESS_REQUEUE_S)
    ready, summary, refused = _readiness(p, objects)
    moving = p.memory.transitioning
    failed = state is not None and state.phase is Phase.FAILED
    # Degraded: replicas were lost while nothing changed (a crash, an evicted node), as opposed to a rollout
    # or a transition that has not finished. It stays set until every replica is back.
    was = {k: condition(p.conditions, k) for k in (ConditionType.READY, ConditionType.DEGRADED)}
    degraded = failed or (not ready and not p.applied and not run.decided and not moving
                          and any(c is not None and c.status == "True" for c in was.values()))
    failures = [] if ready else engine_failures(p.cluster.list_pods(p.namespace, f"app.kubernetes.io/instance={p.name}"))
    floor = run.floor if moving and state is not None else None
    if floor is not None and floor.held and state is not None:
        # ServingFloorHeld: the old set (or both) still carries the load while the new one comes up; a surge is not
        # an outage, and `kubectl wait --for=condition=Ready` must not fail in the middle of one.
        p.set(ConditionType.READY, True, "ServingFloorHeld",
              f"{_serving_label(state)} serves {floor.capacity_rps:.2f} req/s ready (floor {floor.floor_rps:.2f}) while "
              f"{state.name(state.source)} → {state.name(state.target)} runs; {summary}")
    elif failures:
        # An engine that refused to start: its own message, as the kubelet kept it, is the reason to show.
        if p.set(ConditionType.READY, False, "EngineFailed", f"{plan.layout}: {'; '.join(failures)}"):
            p.event("Warning", "EngineFailed", failures[0])
    elif refused:
        # The pods were never created (Pod Security admission, a quota): the controller's own message says why.
        if p.set(ConditionType.READY, False, "PodsRefused", f"{plan.layout}: {'; '.join(refused)}; {summary}"):
            p.event("Warning", "PodsRefused", refused[0])
    elif floor is not None and state is not None:
        p.set(ConditionType.READY, False, "BelowServingFloor",
              f"{_serving_label(state)} serves {floor.capacity_rps:.2f} req/s ready, under the floor of {floor.floor_rps:.2f}; {summary}")
    else:
        p.set(ConditionType.READY, ready, "WorkloadsReady" if ready else ("ReplicasUnavailable" if degraded else "WorkloadsNotReady"),
              f"{plan.layout}: {summary}")
    if moving and state is not None:
        p.set(ConditionType.PROGRESSING, True, progressing_reason(state),
              f"{state.name(state.source)} → {state.name(state.target)}, {phase_text(state, p.traffic)}; {state.message}"
              + (f"; engine failures: {'; '.join(failures)}" if failures else ""))
    elif failed and state is not None:
        p.set(ConditionType.PROGRESSING, False, "TransitionFailed", f"{state.name(state.source)} → {state.name(state.target)}: {state.message}")
    elif refused:
        p.set(ConditionType.PROGRESSING, False, "PodsRefused", f"{'; '.join(refused)}; {summary}")
    else:
        p.set(ConditionType.PROGRESSING, not ready and not degraded, "RollingOut" if not ready and not degraded else "Settled", summary)
    reason = "TransitionFailed" if failed else ("ReplicasUnavailable" if degraded else "AsPlanned")
    text = state.message if failed and state is not None else summary
    if p.set(ConditionType.DEGRADED, degraded, reason, text) and degraded:
        p.event("Warning", reason, f"{plan.layout}: {text}")
    requeue = run.requeue_after_s if moving else (None if ready else PROGRESS_REQUEUE_S)
    return p.outcome(plan=plan, proposal=run.proposal, history=run.history, decided=run.decided, requeue_after_s=requeue)


def progressing_reason(state: TransitionState) -> str:
    """The Progressing reason of a running transition: `SurgeProgressing`, `InPlaceProgressing`, `SurgeDraining`,
    or `RollingBack` once it heads back to where it started."""
    return "RollingBack" if state.rolled_back else f"{state.mode.value}{state.phase.value}"


def _serving_label(state: TransitionState) -> str:
    labels = {state.from_set: state.name(state.source), state.to_set: state.name(state.target)}
    return " + ".join(labels.get(s, s) for s in state.serving)


ENGINE_CONTAINERS = ("engine", "router")
FAILURE_MESSAGE_CHARS = 600


def engine_failures(pods: list[Mapping[str, Any]]) -> list[str]:
    """`<pod> (<role>): exit N: <message>` for each engine or router container that exited in error (now or last
    time), with the termination message the kubelet kept (terminationMessagePolicy FallbackToLogsOnError: the
    engine's last log lines). Distinct messages only, in pod order."""
    out: list[str] = []
    seen: set[str] = set()
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") not in ENGINE_CONTAINERS:
                continue
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            code = int(term.get("exitCode") or 0)
            if not code:
                continue
            message = " ".join(str(term.get("message") or term.get("reason") or "").split())[:FAILURE_MESSAGE_CHARS]
            if message in seen:
                continue
            seen.add(message)
            role = ((meta.get("labels") or {}).get(ROLE_LABEL)) or cs.get("name")
            out.append(f"{meta.get('name')} ({role}): exit {code}: {message}")
    return out


def _readiness(p: PassState, objects: list[dict[str, Any]]) -> tuple[bool, str, list[str]]:
    """Whether every engine and router workload reports all replicas ready, a one-line summary, and the pods the
    cluster refused to create (`refused_pods`)."""
    parts, ready, refused = [], True, []
    workloads = [o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    several = len({o["metadata"]["labels"].get(SET_LABEL) for o in workloads}) > 1   # mid-transition: name the sets
    for obj in workloads:
        ref = ref_of(obj)
        live = p.listed[ref] if ref in p.listed else (p.cluster.read(ref) or {})   # read again only what this pass changed
        want = int(obj["spec"]["replicas"])
        st = live.get("status") or {}
        have = int(st.get("readyReplicas") or 0)
        updated = int(st.get("updatedReplicas", have) or 0)
        # LeaderWorkerSet's status has no observedGeneration; treat it as caught up.
        seen = st.get("observedGeneration")
        current = seen is None or int((live.get("metadata") or {}).get("generation") or 0) <= int(seen)
        ok = have >= want and updated >= want and current
        ready &= ok
        if not ok:
            refused += refused_pods(live)
        labels = obj["metadata"]["labels"]
        role = f"{labels[SET_LABEL]}/{labels[ROLE_LABEL]}" if several else labels[ROLE_LABEL]
        parts.append(f"{role} {min(have, want)}/{want}")
    return ready, "ready: " + ", ".join(parts), refused


def refused_pods(workload: Mapping[str, Any]) -> list[str]:
    """`<Kind>/<name>: <message>` when the workload's controller cannot create its pods: a Deployment's
    ReplicaFailure=True condition (reason FailedCreate, copied from its ReplicaSet), e.g. Pod Security admission or a
    ResourceQuota refusing them. Otherwise the rollout would read "0/1" for ever with no reason."""
    out = []
    meta = workload.get("metadata") or {}
    for c in (workload.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            message = " ".join(str(c.get("message") or c.get("reason") or "").split())[:FAILURE_MESSAGE_CHARS]
            out.append(f"{workload.get('kind')}/{meta.get('name')}: {c.get('reason') or 'FailedCreate'}: {message}")
    return out


def owned_by(obj: Mapping[str, Any] | None, uid: str) -> bool:
    """Whether an object carries an owner reference to the ServingTopology with this uid."""
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == KIND and r.get("uid") == uid for r in refs)


def _owner_words(obj: Mapping[str, Any]) -> str:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return ", ".join(f"{r.get('kind')}/{r.get('name')}" for r in refs) or "no owner"


def _not_owned(p: PassState, objects: list[dict[str, Any]], listed: Mapping[ObjectRef, Mapping[str, Any]]) -> list[str]:
    """`Kind/name (owned by …)` for each object to apply that exists and is not this resource's.

    `listed` is the pass's one LIST of the objects with this resource's labels: an object found there is judged from
    it; only the others (not yet created, or someone else's without the labels) are read, each once."""
    out = []
    for obj in objects:
        ref = ref_of(obj)
        live = listed[ref] if ref in listed else p.cluster.read(ref)
        if live is not None and not owned_by(live, p.uid):
            out.append(f"{ref} ({_owner_words(live)})")
    return out


def _unchanged(p: PassState, rendering: Rendering) -> list[dict[str, Any]]:
    """TransitionBlocked: apply and prune nothing (a spec edit's other changes wait with the move); the objects the
    running plan renders, for readiness, which reads them from the pass's one LIST."""
    p.listed = p.cluster.owned_objects(p.namespace, p.name)
    return build_topology(rendering.sets, serving=rendering.serving)


class NothingApplied(enum.StrEnum):
    """Why a pass applied and pruned nothing (the reason of its Ready condition and Outcome.error)."""

    OBJECT_NOT_OWNED = "ObjectNotOwned"        # an object to apply exists and is someone else's (Conflict=True)
    ADMISSION_REFUSED = "AdmissionRefused"     # the API server's dry-run refused a rendered object


def _admission_refused(p: PassState, rendering: Rendering, refusals: list[AdmissionRefusal]) -> None:
    """AdmissionRefused: the API server's own validation or an admission plugin (Pod Security, a quota, a webhook, a
    policy) refused a rendered object in the server-side dry-run that precedes every apply. Nothing of the pass is
    applied or pruned, running workloads stay as they are, and Ready=False names each object with the server's reason
    and message (one Warning when it changes). The pass completes, so it is not retried as a failure: the verdict is
    remembered per rendered object (cluster/admission.py) and checked again when the spec changes what is rendered, or
    with back-off in case the cluster's admission changed."""
    tail = (f". The API server refused what {' + '.join(bp.label for bp in rendering.sets)} renders (a server-side "
            "dry-run before anything is applied): nothing was applied; running workloads are left as they are. Checked "
            "again when the spec changes, and with back-off (1 to 15 min) in case the cluster's admission changed")
    shown = "; ".join(str(r) for r in refusals)
    if len(shown) > CONDITION_MESSAGE_CHARS - len(tail):
        shown = shown[:CONDITION_MESSAGE_CHARS - len(tail) - 1] + "…"
    message = shown + tail
    if p.set(ConditionType.READY, False, NothingApplied.ADMISSION_REFUSED.value, message):
        p.event("Warning", NothingApplied.ADMISSION_REFUSED.value, message)


def _apply(p: PassState, rendering: Rendering, objects: list[dict[str, Any]]) -> list[dict[str, Any]] | NothingApplied:
    """Apply the rendering's objects and prune what no set needs; NothingApplied when the pass applied or pruned nothing:

    - OBJECT_NOT_OWNED: an object to apply exists and is not this resource's; Conflict=True names the objects;
    - ADMISSION_REFUSED: the API server refused an object in the server-side dry-run every object goes through before
      the first apply (`Cluster.admit`, once per change of the object), or in the apply itself.

    Server-side apply with force would take such an object over (its selector overwritten, an owner reference added,
    and garbage collection deleting it with this resource); the check is before the first apply, so a pass is all
    or nothing. Pruning deletes only objects with this resource's owner reference, whatever their labels say.
    """
    listed = p.cluster.owned_objects(p.namespace, p.name)
    foreign = _not_owned(p, objects, listed)
    if foreign:
        message = (f"{'; '.join(foreign)} already exist{'s' if len(foreign) == 1 else ''} and {'is' if len(foreign) == 1 else 'are'} "
                   f"not owned by ServingTopology {p.name}: nothing was applied; delete or rename "
                   f"{'it' if len(foreign) == 1 else 'them'}, or rename this resource")
        if p.set(ConditionType.CONFLICT, True, "ObjectNotOwned", message):
            p.event("Warning", "ObjectNotOwned", message)
        return NothingApplied.OBJECT_NOT_OWNED
    if condition(p.conditions, ConditionType.CONFLICT) is not None:
        p.set(ConditionType.CONFLICT, False, "AllOwned", "every object this resource renders is its own")
    refusals = [r for obj in objects if (r := p.cluster.admit(obj)) is not None]
    try:
        for obj in objects if not refusals else ():
            if p.cluster.apply(obj):
                p.applied.append(str(ref_of(obj)))
    except AdmissionRefused as exc:
        refusals = [exc.refusal]
    if refusals:
        _admission_refused(p, rendering, refusals)
        return NothingApplied.ADMISSION_REFUSED
    desired = {ref_of(o) for o in objects}
    for ref, live in listed.items():
        if ref not in desired and owned_by(live, p.uid):
            p.cluster.delete(ref)
            p.pruned.append(str(ref))
    p.listed = {ref: live for ref, live in listed.items() if str(ref) not in p.applied}   # unchanged by this pass
    if p.applied:
        p.event("Normal", "WorkloadsApplied", f"applied {', '.join(p.applied)}")
    if p.pruned:
        p.event("Normal", "WorkloadsPruned", f"removed {', '.join(p.pruned)} (not in {' + '.join(bp.label for bp in rendering.sets)})")
    return objects
