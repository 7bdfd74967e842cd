"""One reconcile pass's state and the planning steps every policy mode shares, and the Outcome a pass returns.

Called by operator/reconcile.py, which drives the modes (DryRun, Auto, Pinned) over these pieces: PassState
accumulates conditions, Events and replan memory; PassContext holds the parsed spec and the seams; the steps build
the Problem, turn planner errors into status and observe live metrics. It never applies or prunes workloads and
never reads the clock (`now` comes with the pass).
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

from servingtopology.operator.api.resource import (
    ApprovalStatus,
    CalibrationSourceStatus,
    ConditionType,
    HistoryEntry,
    Mode,
    ObservedStatus,
    PlanStatus,
    PodTemplate,
    PolicySpec,
    ProposalStatus,
    TopologySpec,
    TopologyStatus,
)
from servingtopology.operator.cluster.cluster import Cluster, ObjectRef
from servingtopology.operator.cluster.plan_worker import PlanBudgetExceeded, blocking
from servingtopology.operator.live.readout import summary_status
from servingtopology.operator.live.url_policy import UrlAllowList
from servingtopology.operator.live_replan import MetricsFactory, run_live_replan
from servingtopology.operator.plan_status import condition, set_condition
from servingtopology.operator.render.manifests import Blueprint, engine_extra_args, role_nodes
from servingtopology.operator.render.network import NetworkKnobs, network_capabilities
from servingtopology.operator.render.pod_template import ENGINE_CONTAINER, ROUTER_CONTAINER
from servingtopology.operator.render.tenancy import TemplateInput
from servingtopology.operator.replan import Predictor, ReplanOutcome, ReplanPolicy, calibration_status, read_replan_status
from servingtopology.planner.engines.caps import resolve_version
from servingtopology.planner.engines.command import engine_command
from servingtopology.planner.errors import Infeasible, InsufficientData, InvalidSpec, PinRefused
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Layout, Role, RoleLayout
from servingtopology.planner.model.catalog import model_catalog
from servingtopology.planner.problem import Decision, Problem
from servingtopology.planner.search.tables import layout_rejection
from servingtopology.spec import SpecError, model_identity, to_layout, to_problem
from servingtopology.spec import engine_extra_args as spec_extra_args

__all__ = [
    "Planner", "Outcome", "PassState", "PassContext", "blueprint_for", "engine_args_of", "build_problem", "problem_from_spec", "problem_or_none",
    "invalid_outcome", "hold_unreadable", "decide_or_outcome", "slo_percentile", "observe_live", "network_knobs",
    "template_inputs",
]

Planner = Callable[[Problem], Decision]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one pass did: the status to write, and what it applied or pruned (for logs and metrics)."""

    status: dict[str, Any]
    applied: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    decided: bool = False
    requeue_after_s: float | None = None
    error: str | None = None       # the reason of a failed pass (InvalidSpec, Infeasible, ...), for metrics


class PassState:
    """The accumulating state of one reconcile: status, Events, what was applied."""

    def __init__(self, obj: Mapping[str, Any], cluster: Cluster, now: datetime) -> None:
        self.obj, self.cluster, self.now = obj, cluster, now
        meta = obj["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta.get("namespace", "default"), meta.get("uid", "")
        self.generation = int(meta.get("generation") or 1)
        raw = obj.get("status") or {}
        known = {k: v for k, v in raw.items() if k in TopologyStatus.model_fields}  # e.g. kopf's own keys
        self.status, unreadable = _read_status(known)
        self.conditions = list(self.status.conditions)
        self.applied: list[str] = []
        self.pruned: list[str] = []
        # The pass's one LIST of this resource's objects, less those it changed since (read those again when needed).
        self.listed: dict[ObjectRef, Mapping[str, Any]] = {}
        self.memory, replan_unreadable = read_replan_status(self.status.replan)
        self.observed: ObservedStatus | None = self.status.observed
        # What of the status could not be read (named), and whether that holds the workloads: a running transition
        # (or the plan it leads from) that cannot be read is never dropped; its raw status is written back as it was.
        self.unreadable = [*unreadable, *(replan_unreadable.problems if replan_unreadable else ())]
        self.unreadable_sections = (*(f"status.{k}" for k in _sections(unreadable)),
                                    *(f"status.replan.{k}" for k in (replan_unreadable.sections if replan_unreadable else ())))
        self.holding = bool(replan_unreadable and replan_unreadable.transition) or (
            "status.plan" in self.unreadable_sections and self.memory.transition is not None)
        self._raw_status = dict(known)
        self.traffic: dict[str, float] | None = None   # a running transition's traffic split, when read this pass
        self.annotations: Mapping[str, str] = meta.get("annotations") or {}
        self.approval: ApprovalStatus | None = self.status.approval
        self.proposals = self.status.proposals or 0     # the number in the latest proposal's id
        self.pool_gpus: int | None = None                # the GPU cap an Auto ServingPool assigned, honoured this pass
        # spec.calibration as this pass read it (operator/calibration_source.py): every Problem of the pass carries
        # the factors (build_problem); the status shows the source.
        self.calibration_source: CalibrationSourceStatus | None = self.status.calibrationSource
        self.calibration_factors: tuple[tuple[str, float], ...] = ()
        self._deferred: list[tuple[str, str, str]] = []   # Events posted when the pass gets through (`outcome`)

    def numbered(self, proposal: ProposalStatus) -> ProposalStatus:
        """ProposalIds: a new proposal gets the next id (p1, p2, ...; never reused), a carried-over one keeps its own."""
        if proposal.id is not None:
            return proposal
        self.proposals += 1
        return proposal.model_copy(update={"id": f"p{self.proposals}"})

    @property
    def mode(self) -> str:
        """policy.mode as written (the API's default when absent), for the MODE column even when the spec is invalid."""
        spec = self.obj.get("spec")
        policy = spec.get("policy") if isinstance(spec, Mapping) else None
        mode = policy.get("mode") if isinstance(policy, Mapping) else None
        return str(mode or PolicySpec.model_fields["mode"].default)

    def ready_since(self) -> datetime | None:
        """When the Ready condition last turned True (None while it is not True)."""
        ready = condition(self.conditions, ConditionType.READY)
        if ready is None or ready.status != "True":
            return None
        try:
            return datetime.fromisoformat(ready.lastTransitionTime.replace("Z", "+00:00"))
        except ValueError:
            return None

    def set(self, kind: ConditionType, status: bool | None, reason: str, message: str) -> bool:
        """Set a condition; True when it changed (status, reason or message), which is when Events are due."""
        old = condition(self.conditions, kind)
        self.conditions = set_condition(self.conditions, kind, status=status, reason=reason, message=message,
                                        now=self.now, generation=self.generation)
        new = condition(self.conditions, kind)
        return old is None or new is None or (old.status, old.reason, old.message) != (new.status, new.reason, new.message)

    def event_when_done(self, type: str, reason: str, message: str) -> None:
        """An Event posted only by a pass that gets through to its Outcome: a pass stopped by a plan still running in
        the worker (PlanPending) writes no status and is run again, and must not post it twice."""
        self._deferred.append((type, reason, message))

    def drop(self, kind: ConditionType) -> None:
        """Remove a condition that no longer applies (e.g. Calibrated once spec.calibration is gone)."""
        self.conditions = [c for c in self.conditions if c.type is not kind]

    def event(self, type: str, reason: str, message: str) -> None:
        self.cluster.record_event(self.obj, type=type, reason=reason, message=message, now=self.now)

    def outcome(self, *, plan: PlanStatus | None, proposal: Any, history: list[HistoryEntry] | None = None,
                decided: bool = False, requeue_after_s: float | None = None, error: str | None = None) -> Outcome:
        for type_, reason, message in self._deferred:
            self.event(type_, reason, message)
        self._deferred.clear()
        summary = summary_status(mode=self.mode, plan=plan, proposal=proposal, observed=self.observed,
                                 transition=self.memory.transition, shares=self.traffic)
        status = self.status.model_copy(update={
            "approval": self.approval, "proposals": self.proposals or None,
            "conditions": self.conditions, "observedGeneration": self.generation, "plan": plan, "proposal": proposal,
            "history": history if history is not None else self.status.history, "observed": self.observed,
            "replan": self.memory.to_dict(), "summary": summary, "calibration": calibration_status(self.memory.calibration, misses=self.memory.misses),
            "calibrationSource": self.calibration_source,
        })
        body = status.model_dump(mode="json", exclude_none=True)
        for key in ("plan", "proposal", "calibrationSource"):   # a merge patch keeps what it does not name
            if key in body or key in self._raw_status:
                body[key] = _with_removals(self._raw_status.get(key), body.get(key))
        if self.holding:   # what could not be read goes back as it was, never a reset
            body |= {k: self._raw_status[k] for k in ("plan", "replan") if k in self._raw_status}
        body.setdefault("plan", None)       # explicit nulls: a merge patch then removes a stale plan, proposal or observation
        body.setdefault("proposal", None)
        body.setdefault("observed", None)
        return Outcome(body, tuple(self.applied), tuple(self.pruned), decided, requeue_after_s, error)


def _with_removals(old: Any, new: Any) -> Any:
    """`new` with an explicit null for every key `old` has and `new` lacks, nested maps too: the status is written as a
    merge patch, which keeps a key it does not name (a replaced plan's `uncalibrated`, a refused calibration's factors)."""
    if not isinstance(old, Mapping) or not isinstance(new, dict):
        return new
    out = dict(new)
    for k, v in old.items():
        if k not in new:
            out[k] = None
        elif isinstance(v, Mapping):
            out[k] = _with_removals(v, new[k])
    return out


def _read_status(known: Mapping[str, Any]) -> tuple[TopologyStatus, list[str]]:
    """The status this version can read, field by field; each field it cannot read is left out and named."""
    try:
        return TopologyStatus.model_validate(known), []
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    problems = [f"status.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors]
    bad = {str(e["loc"][0]) for e in errors if e["loc"]}
    try:
        return TopologyStatus.model_validate({k: v for k, v in known.items() if k not in bad}), problems
    except ValidationError:
        return TopologyStatus(), problems


def _sections(problems: list[str]) -> list[str]:
    return sorted({p.split(":", 1)[0].removeprefix("status.").split(".", 1)[0].split("[", 1)[0] for p in problems})


def hold_unreadable(p: PassState) -> Outcome | None:
    """Report what of the status could not be read; when that holds the workloads, the pass's Outcome (nothing
    applied, pruned or planned), else None (the unreadable advisory parts started afresh; the pass goes on)."""
    if not p.unreadable:
        return None
    what = ", ".join(p.unreadable_sections)
    detail = "; ".join(p.unreadable)[:600]
    if not p.holding:
        p.event("Warning", "StatusUnreadable", f"{what} could not be read ({detail}); those parts start afresh")
        p.set(ConditionType.DRIFT_DETECTED, None, "StatusUnreadable", f"{what} could not be read; replanning memory starts afresh")
        return None
    message = (f"the running transition in status.replan cannot be read ({detail}); workloads are left as they are. Fix "
               "status.replan, or clear it to drop the transition: kubectl patch stopo "
               f"{p.name} -n {p.namespace} --subresource=status --type=merge -p '{{\"status\":{{\"replan\":null}}}}'")
    if p.set(ConditionType.DEGRADED, True, "StatusUnreadable", message):
        p.event("Warning", "StatusUnreadable", message)
    p.set(ConditionType.PROGRESSING, None, "StatusUnreadable", "the running transition cannot be read; nothing is changed")
    return p.outcome(plan=p.status.plan, proposal=p.status.proposal, error="StatusUnreadable")


def blueprint_for(spec: TopologySpec, layout: Layout, *, name: str, namespace: str, uid: str, gpus_per_node: int,
                  set_name: str = "") -> Blueprint:
    """The builders' input for one plan (or one set of a transition) of one ServingTopology."""
    identity = model_identity(spec)   # the CLI's rule: spec.py model_identity
    hw = spec.hardware
    gpu_id = resolve_gpu(hw.gpu, field="spec.hardware.gpu").id
    return Blueprint(
        name=name, namespace=namespace, uid=uid, engine=spec.engine.name, image=spec.engine.image, model=identity.source,
        served_model_name=identity.served_name, layout=layout, gpus_per_node=gpus_per_node,
        router_image=spec.engine.routerImage or "", extra_args=spec_extra_args(spec),
        node_selector=dict(hw.nodeSelector),
        tolerations=tuple(t.model_dump(exclude_none=True) for t in hw.tolerations),
        transfer_backend=spec.engine.transferBackend, set_name=set_name,
        engine_version=resolve_version(spec.engine.name, version=spec.engine.version, image=spec.engine.image),
        pod_template=_template_dict(spec.podTemplate),
        network=network_knobs(spec), gpu_id=gpu_id, nic_gbit={gpu_id: hw.nicGbps} if hw.nicGbps is not None else {},
        role_templates={role: _template_dict(t) for role in ("prefill", "decode", "router")
                        if spec.rolePodTemplates is not None and (t := getattr(spec.rolePodTemplates, role)) is not None},
    )


def network_knobs(spec: TopologySpec) -> NetworkKnobs:
    """spec.network as the builders read it (IPC_LOCK on by default with RDMA)."""
    net = spec.network
    if net is None:
        return NetworkKnobs()
    rdma = net.rdma
    return NetworkKnobs(rdma_resource=rdma.resource if rdma else "", rdma_count=rdma.count if rdma else 1,
                        ipc_lock=net.ipcLock if net.ipcLock is not None else rdma is not None,
                        ib_devices=tuple(net.ibDevices), socket_interface=net.socketInterface or "", ib_port=net.ibPort)


def template_inputs(spec: TopologySpec) -> list[TemplateInput]:
    """The spec's pod templates as the tenancy policy reads them (render/tenancy.py `pod_template_refusals`): the same
    for a pass (reconcile.py) and for `plan --manifests` (offline.py). Routers get no spec.network, keep their own
    ServiceAccount token (they discover the engine pods), and their container is `router`, not `engine`."""
    caps = tuple(network_capabilities(network_knobs(spec)))
    roles = spec.rolePodTemplates

    def given(t: Any) -> dict[str, Any] | None:
        return t.model_dump(mode="json", exclude_none=True) if t is not None else None

    return [TemplateInput("spec.podTemplate", given(spec.podTemplate), caps),
            *(TemplateInput(f"spec.rolePodTemplates.{r}", given(getattr(roles, r) if roles is not None else None),
                            caps if r != "router" else (), rendered_token=r == "router",
                            rendered_containers=(ROUTER_CONTAINER,) if r == "router" else (ENGINE_CONTAINER,))
              for r in ("prefill", "decode", "router"))]


def _template_dict(template: PodTemplate | None) -> dict[str, Any]:
    """A pod template as the merge reads it: only the fields the user set (empty lists and maps dropped)."""
    if template is None:
        return {}
    return dict(template.model_dump(mode="json", exclude_unset=True, exclude_none=True))


def engine_args_of(bp: Blueprint) -> Callable[[Role, RoleLayout], tuple[int, tuple[str, ...]]]:
    def args_of(role: Role, rl: RoleLayout) -> tuple[int, tuple[str, ...]]:
        nodes = role_nodes(bp, rl)
        cmd = engine_command(engine=bp.engine, model=bp.model, served_name=bp.served_model_name, role=role, par=rl.parallelism,
                             knobs=rl.knobs, precision=bp.precision, extra_args=engine_extra_args(bp, role), nodes=nodes,
                             transfer_backend=bp.transfer_backend, version=bp.engine_version, gpu=rl.gpu or bp.gpu_id)
        return nodes, (*cmd.command, *cmd.args)
    return args_of


@contextmanager
def _planning_spec(p: PassState, spec: TopologySpec) -> Iterator[TopologySpec]:
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


def build_problem(p: PassState, spec: TopologySpec, current: Layout | None, *, approved: Layout | None = None) -> Problem:
    """The pass's Problem: the spec's (`problem_from_spec`) with the pass's calibration factors (spec.calibration)."""
    with _planning_spec(p, spec) as planning:
        problem = problem_from_spec(spec, current, planning=planning, approved=approved)
    return dataclasses.replace(problem, factors=p.calibration_factors) if p.calibration_factors else problem


def problem_from_spec(spec: TopologySpec, current: Layout | None, *, planning: TopologySpec | None = None,
                      approved: Layout | None = None) -> Problem:
    """The planner's Problem for a resource's spec, as every pass builds it: the pin (policy.mode Pinned, or the
    `approved` proposal's layout on the pass that applies it), the planning
    spec's model (`planning`: the spec with a ConfigMap's config.json written to a file; default `spec`), and
    policy.allowedLayouts narrowing spec.search. Also `servingtopology plan --manifests` (operator/offline.py).
    Raises InvalidSpec naming the resource's field."""
    try:
        pinned = approved or (to_layout(spec, spec.pinned) if spec.policy.mode is Mode.PINNED and spec.pinned is not None else None)
    except InvalidSpec as exc:   # the spec's `layout` is the resource's `spec.pinned`
        raise InvalidSpec(exc.field.replace("layout", "spec.pinned", 1), exc.message) from None
    try:
        problem = to_problem(planning or spec, pinned=pinned, current=current)
    except InvalidSpec as exc:
        if exc.field != "model":
            raise
        # The planner's message names the CLI's `modelConfig`; a resource gives a config.json another way.
        catalog = ", ".join(sorted(model_catalog()))
        raise InvalidSpec("spec.model", f"unknown model {spec.model!r}: use a catalog id ({catalog}), or give "
                          "spec.modelConfigMap (a ConfigMap holding its config.json) with spec.modelSource "
                          "(what the engine loads)") from None
    rejected = layout_rejection(problem, problem.pinned) if problem.pinned is not None else None
    if rejected is not None:   # the planner's own rules for a pin, in the resource's field names
        where, why = rejected
        raise InvalidSpec(where.replace("layout", "spec.pinned", 1), why.replace("(hardware.maxGPUs)", "(spec.hardware.maxGPUs)"))
    allowed = spec.policy.allowedLayouts
    if allowed:
        kinds = tuple(k for k in problem.search.layouts if k in allowed)
        if not kinds:
            raise InvalidSpec("spec.policy.allowedLayouts", f"no overlap with spec.search.layouts {[k.value for k in problem.search.layouts]}")
        problem = dataclasses.replace(problem, search=dataclasses.replace(problem.search, layouts=kinds))
    return problem

def invalid_outcome(p: PassState, message: str, *, plan: PlanStatus | None, proposal: Any) -> Outcome:
    if p.set(ConditionType.READY, False, "InvalidSpec", message):
        p.event("Warning", "InvalidSpec", message)
    p.set(ConditionType.PLANNED, False, "InvalidSpec", message)
    return p.outcome(plan=plan, proposal=proposal, error="InvalidSpec")

def pin_refused(p: PassState, exc: PinRefused, *, plan: PlanStatus | None, proposal: Any) -> Outcome:
    """PinRefused: spec.pinned fails a check the search applies to every candidate (a role's rank pool shorter than the
    request it must hold: planner/search/decide.py `refuse_pin`). Valid input that cannot run: Planned=False and, with
    nothing running, Ready=False, both reason PinRefused naming the resource's field (`spec.pinned.prefill`), one Warning;
    nothing is applied and running workloads stay. Not retried hot: the spec must change."""
    field = exc.field.replace("layout", "spec.pinned", 1)
    message = (f"the pinned layout cannot run (the search's stage '{exc.stage}' refuses it): {field}: {exc.message}; "
               + ("running workloads are left as they are" if plan is not None else "nothing was applied"))
    if p.set(ConditionType.PLANNED, False, "PinRefused", message):
        p.event("Warning", "PinRefused", message)
    if plan is None:
        p.set(ConditionType.READY, False, "PinRefused", message)
    return p.outcome(plan=plan, proposal=proposal, error="PinRefused")


def slo_percentile(spec: TopologySpec) -> str:
    return next(iter(spec.slo.ttftMs))


def decide_or_outcome(p: PassState, spec: TopologySpec, planner: Planner, current: Layout | None, problem: Problem | None = None) -> Decision | Outcome:
    plan, proposal = p.status.plan, p.status.proposal
    try:
        decision = planner(problem if problem is not None else build_problem(p, spec, current))
    except InvalidSpec as exc:
        return invalid_outcome(p, str(exc), plan=plan, proposal=proposal)
    except PinRefused as exc:
        return pin_refused(p, exc, plan=plan, proposal=proposal)
    except (Infeasible, PlanBudgetExceeded) as exc:
        # Infeasible: no layout meets the spec. PlanBudgetExceeded: the worker stopped the plan; it is tried again
        # after a back-off (operator/cluster/plan_worker.py), not every pass. Either way the running workloads stay.
        reason, event, nothing = (("Infeasible", "PlanInfeasible", "no feasible layout") if isinstance(exc, Infeasible)
                                  else ("PlanBudgetExceeded", "PlanBudgetExceeded", "no plan within the planning budget"))
        message = f"{exc}; running workloads are left as they are"
        if p.set(ConditionType.PLANNED, False, reason, message):
            p.event("Warning", event, message)
        if plan is None:
            p.set(ConditionType.READY, False, reason, f"{nothing}, nothing deployed")
        return p.outcome(plan=plan, proposal=proposal, error=reason)
    except InsufficientData as exc:
        p.set(ConditionType.PLANNED, None, "InsufficientData", str(exc))
        return p.outcome(plan=plan, proposal=proposal, requeue_after_s=60.0, error="InsufficientData")
    return decision


@dataclass(frozen=True, slots=True)
class PassContext:
    """What every step of one pass shares once the spec has parsed."""

    spec: TopologySpec
    planner: Planner
    predict: Predictor
    metrics: MetricsFactory | None
    policy: ReplanPolicy
    gpus_per_node: int
    metrics_allow: UrlAllowList | None = None    # the Prometheus URLs the operator may call (None: any)
    approved: Layout | None = None               # the approved proposal's layout, on the pass that applies it

    def label(self, layout: Layout) -> str:
        """`layout` as status, conditions and Events name it: in the spec's engine's words (EngineNamed: Layout.label_for),
        as the command line's record names it."""
        return layout.label_for(self.spec.engine.name)

    def bp_for(self, p: PassState, layout: Layout, set_name: str = "") -> Blueprint:
        return blueprint_for(self.spec, layout, name=p.name, namespace=p.namespace, uid=p.uid, gpus_per_node=self.gpus_per_node,
                             set_name=set_name)

def problem_or_none(p: PassState, ctx: PassContext, current: Layout | None) -> Problem | None:
    try:
        return build_problem(p, ctx.spec, current, approved=ctx.approved)
    except (InvalidSpec, SpecError):
        return None   # the planning path reports it


def observe_live(p: PassState, ctx: PassContext, problem: Problem, current: Layout | None, *,
                 observe_only: str | None = None) -> ReplanOutcome | None:
    """One replan interval when due: write its conditions, Events, observed figures and memory (`observe_only`: why
    this interval may read and record but not decide, see planner/live/loop.py `step`)."""
    if ctx.metrics is None:
        return None
    try:
        out = run_live_replan(spec=ctx.spec, problem=problem, current=current, memory=p.memory, policy=ctx.policy, now=p.now,
                              cluster=p.cluster, namespace=p.namespace, name=p.name, factory=ctx.metrics,
                              # The replan's Problem follows the measured load, new every fetch: wait for its plan.
                              planner=blocking(ctx.planner), predict=ctx.predict, ready_since=p.ready_since(),
                              allow=ctx.metrics_allow, observe_only=observe_only)
    except (InvalidSpec, InsufficientData, PlanBudgetExceeded) as exc:
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
