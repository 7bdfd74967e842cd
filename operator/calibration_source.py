"""spec.calibration: the deployment calibration a ServingTopology names, read from a ConfigMap key of its own namespace,
checked against the resource's deployment and handed to the planner (Problem.factors).

Called by operator/reconcile.py once per pass, after the spec is admitted and before anything is planned; the file is
read by the reader the CLI's `--calibration` uses (servingtopology/calibration_file.py). Must not plan or apply. Policy:

- no spec.calibration: nothing is read; status.calibrationSource and the Calibrated condition go;
- accepted (CalibrationApplied): every Problem the pass builds carries its factors (the plan of a generation and the
  running layout's figures beside it; a live replan predicts with the operator's own fit of its measurements instead,
  operator/replan.py, status.calibration), status.calibrationSource shows its provenance (ConfigMap, resourceVersion, sha256 of the file, the result
  files it was fitted on) and Calibrated=True; a changed file is used from the next plan (a new generation or a live
  replan), the plan of this generation is not made again;
- refused (CalibrationRejected): the ConfigMap or key is missing (CalibrationNotFound), the file cannot be read as a
  calibration (InvalidCalibration, naming the field), it is of another model, GPU, engine or release (OtherModel,
  OtherGpu, OtherEngine, OtherRelease) or was fitted on too few points or non-finite figures (TooFewPoints,
  NonFinite): Calibrated=False and Planned=False name the reason and the field, one Warning Event per change, and the
  pass stops as for an invalid spec: nothing is planned or applied, status.plan and status.proposal stay as they are
  (bad input changes nothing running; a plan is never quietly made uncalibrated instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from servingtopology.calibration_file import calibration_sha256, check_calibration, factors_of, parse_calibration
from servingtopology.operator.api.resource import CalibrationSourceStatus, ConditionType, PlanStatus, TopologySpec
from servingtopology.operator.cluster.cluster import ObjectRef
from servingtopology.operator.pass_context import Outcome, PassState, build_problem
from servingtopology.operator.plan_status import predicted, timestamp
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.perf.deployment_fit import CalibrationRefused, DeploymentCalibration
from servingtopology.planner.problem import Decision
from servingtopology.spec import SpecError

__all__ = ["APPLIED", "REJECTED", "NOT_FOUND", "INVALID", "admit_calibration", "with_calibration"]

FIELD = "spec.calibration"
APPLIED = "CalibrationApplied"      # Calibrated=True, and the Normal Event when a new file is applied
REJECTED = "CalibrationRejected"    # Planned=False reason, and the Warning Event
NOT_FOUND = "CalibrationNotFound"   # the ConfigMap or its key does not exist
INVALID = "InvalidCalibration"      # not a calibration file (size, UTF-8 YAML, a field's type or range)


class _Refusal(Exception):
    """A refused calibration: its reason, the sentence naming the field, and what was read of it (provenance)."""

    def __init__(self, reason: str, message: str, source: CalibrationSourceStatus) -> None:
        super().__init__(message)
        self.reason, self.message, self.source = reason, message, source


def admit_calibration(p: PassState, spec: TopologySpec) -> Outcome | None:
    """Read and check spec.calibration (see the module's docstring): on success set `p.calibration_factors` and
    `p.calibration_source` and return None (the pass goes on); on a refusal return the pass's Outcome."""
    ref = spec.calibration
    if ref is None:
        p.calibration_source, p.calibration_factors = None, ()
        p.drop(ConditionType.CALIBRATED)
        return None
    source = CalibrationSourceStatus(configMap=ref.name, key=ref.key, applied=False, reason=INVALID, at=timestamp(p.now))
    try:
        cal, source = _read(p, spec, source)
    except _Refusal as refusal:
        return _refused(p, refusal.source.model_copy(update={"reason": refusal.reason, "message": refusal.message[:1024]}))
    if cal is None:   # the spec itself cannot be planned: the planning path names it; the calibration is not judged
        p.calibration_factors = ()
        return None
    points = f"{cal.points_used} points" + (f" from {', '.join(sorted({s.tool for s in cal.sources}))}" if cal.sources else "")
    moved = ", ".join(f"{t} ×{f:.2f}" for t, f in sorted(cal.factors.items()) if abs(f - 1.0) > 0.005) or "none"
    message = (f"ConfigMap {ref.name} key {ref.key} (resourceVersion {source.resourceVersion}, sha256 {(source.sha256 or '')[:12]}): "
               f"{points}, factors {moved}" + (f" (at the bound: {', '.join(cal.at_bound)})" if cal.at_bound else "")
               + "; plans are made with it, the uncalibrated figures beside them")
    p.calibration_source = source.model_copy(update={"applied": True, "reason": APPLIED, "message": message[:1024]})
    p.calibration_factors = factors_of(cal)
    if p.set(ConditionType.CALIBRATED, True, APPLIED, message):
        p.event_when_done("Normal", APPLIED, message)
    return None


def _read(p: PassState, spec: TopologySpec,
          source: CalibrationSourceStatus) -> tuple[DeploymentCalibration | None, CalibrationSourceStatus]:
    ref = spec.calibration
    assert ref is not None
    found = p.cluster.read(ObjectRef("v1", "ConfigMap", p.namespace, ref.name))   # never another namespace's
    if found is None:
        raise _Refusal(NOT_FOUND, f"{FIELD}.name: ConfigMap {p.namespace}/{ref.name} does not exist", source)
    meta: Mapping[str, Any] = found.get("metadata") or {}
    source = source.model_copy(update={"resourceVersion": str(meta.get("resourceVersion") or "")[:64] or None})
    data: Mapping[str, Any] = found.get("data") or {}
    text = data.get(ref.key)
    if not isinstance(text, str):
        keys = ", ".join(sorted(map(str, data))[:8]) or "none"
        raise _Refusal(NOT_FOUND, f"{FIELD}.key: ConfigMap {p.namespace}/{ref.name} has no key {ref.key!r} (its keys: {keys}); "
                                  f"create it with kubectl create configmap {ref.name} --from-file={ref.key}=CAL.yaml", source)
    raw = text.encode("utf-8")
    source = source.model_copy(update={"sha256": calibration_sha256(raw)})
    where = f"ConfigMap {ref.name} key {ref.key}"
    try:
        cal = parse_calibration(raw, name=where, field=FIELD)
    except CalibrationRefused as exc:
        raise _Refusal(exc.reason, str(exc), source) from None
    except InvalidSpec as exc:
        raise _Refusal(INVALID, str(exc), source) from None
    d = cal.deployment
    source = source.model_copy(update={
        "deployment": d.to_dict(), "pointsUsed": cal.points_used,
        "factors": {t: round(f, 4) for t, f in cal.factors.items()}, "atBound": list(cal.at_bound),
        "residualBefore": {k: round(v, 4) for k, v in cal.residual_before.items()},
        "residualAfter": {k: round(v, 4) for k, v in cal.residual_after.items()},
        "sources": [f"{s.tool} {s.tool_version} sha256 {s.sha256[:12]}".replace("  ", " ") for s in cal.sources[:64]]})
    try:
        problem = build_problem(p, spec, None)
    except (InvalidSpec, SpecError):
        return None, source
    aliases = [x for x in (spec.model, spec.servedModelName, spec.modelSource) if x]
    try:
        check_calibration(cal, problem, name=where, field=FIELD, model_aliases=aliases)
    except CalibrationRefused as exc:
        raise _Refusal(exc.reason, str(exc), source) from None
    return cal, source


def _refused(p: PassState, source: CalibrationSourceStatus) -> Outcome:
    """CalibrationRejected: conditions, one Warning per change, nothing planned or applied."""
    p.calibration_source, p.calibration_factors = source, ()
    message = (f"{source.message}; nothing was planned or applied (running workloads and status.plan are left as they "
               "are) until the calibration or spec.calibration is fixed")
    changed = p.set(ConditionType.CALIBRATED, False, source.reason, message)
    p.set(ConditionType.PLANNED, False, REJECTED, message)
    if p.status.plan is None:
        p.set(ConditionType.READY, False, REJECTED, "the calibration is refused; nothing deployed")
    if changed:
        p.event("Warning", REJECTED, f"{source.reason}: {message}")
    return p.outcome(plan=p.status.plan, proposal=p.status.proposal, error=REJECTED)


P = TypeVar("P", bound=PlanStatus)


def with_calibration(plan: P, decision: Decision, p: PassState) -> P:
    """A plan (or proposal) made this pass with its calibration's provenance and its uncalibrated figures beside
    `predicted` (Decision.uncalibrated); unchanged when the pass planned uncalibrated."""
    source, uncal = p.calibration_source, decision.uncalibrated
    if uncal is None or source is None or not source.applied:
        return plan
    return plan.model_copy(update={"calibrationSha256": source.sha256, "uncalibrated": predicted(uncal.prediction)})
