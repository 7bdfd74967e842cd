"""What `kubectl get stopo` shows: the figures of status written as text a person reads, with units.

Called by the reconcile's pass state (operator/pass_context.py) to fill `status.summary`, which the CRD's printer
columns read (kubectl's JSONPath cannot format a number or join two fields), and by operator/plan_status.py for
the figures in Event messages. Pure: values in, strings out; never talks to the API server or reads the clock.

Rules it names:
- MeasuredOverPredicted: TTFT and TPOT read "measured / predicted" at the SLO percentile; the prediction is the
  running layout's at the observed load when there is an observation (what the ERROR column compares with), else
  the plan's at the load it was made for; "-" stands for a figure nobody has.
- TrafficShare: during a surge the entry Service spreads connections evenly over its ready endpoints (aggregated
  engines, or one PD router per set), so a set's share is its ready entry endpoints over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from servingtopology.operator.api.resource import ObservedStatus, PlanStatus, ProposalStatus, SummaryStatus
from servingtopology.planner.layout import Layout, LayoutKind, Role
from servingtopology.planner.live.transition import ClusterView, Mode, Phase, TransitionState

__all__ = ["NONE", "ms_text", "pd_ratio", "pair_text", "error_text", "traffic_shares", "phase_text", "summary_status"]

NONE = "-"   # a figure nobody has (no measurement yet, no plan)


def ms_text(ms: float | None) -> str:
    """A duration with its unit: `8.1ms`, `40ms`, `4.6s`, `208s`; `-` for None."""
    if ms is None:
        return NONE
    if ms < 10:
        return f"{ms:.1f}ms"
    if ms < 1000:
        return f"{ms:.0f}ms"
    if ms < 100_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms / 1000:.0f}s"


def pair_text(measured_ms: float | None, predicted_ms: float | None) -> str:
    """`measured / predicted`, e.g. `4.6s / 40ms`, `- / 40ms` (MeasuredOverPredicted)."""
    return f"{ms_text(measured_ms)} / {ms_text(predicted_ms)}"


def pd_ratio(layout: Layout) -> str:
    """`P:D` instance counts of a PD layout, `-` for replicas (the P:D column)."""
    if layout.kind is LayoutKind.REPLICAS:
        return NONE
    return f"{layout.roles[Role.PREFILL].count}:{layout.roles[Role.DECODE].count}"


def _percent(error: float) -> str:
    return f"{error * 100:+.0f}%"


def error_text(observed: ObservedStatus | None) -> str:
    """`TTFT +735%, TPOT -3%`: measured / predicted − 1 at the same load; `-` without a measurement."""
    if observed is None:
        return NONE
    parts = [f"{name} {_percent(err)}" for name, err in (("TTFT", observed.ttftError), ("TPOT", observed.tpotError)) if err is not None]
    return ", ".join(parts) or NONE


def _entry_endpoints(layout: Layout, ready: Mapping[Role, int]) -> int:
    """Ready endpoints of one set behind the entry Service (TrafficShare): its aggregated engines, or its PD router
    once every role has a ready instance."""
    if layout.kind is LayoutKind.REPLICAS:
        return sum(ready.get(r, 0) for r in layout.roles)
    return 1 if all(ready.get(r, 0) > 0 for r in layout.roles) else 0


def traffic_shares(state: TransitionState, view: ClusterView) -> dict[str, float]:
    """Each serving set's share of client traffic (0..1; TrafficShare), in serving order; empty when none is ready."""
    shapes = {state.from_set: state.source, state.to_set: state.target}
    endpoints = {}
    for s in state.serving:
        if s in shapes:
            desired = state.desired.get(s, {})
            got = view.ready.get(s, {})
            endpoints[s] = _entry_endpoints(shapes[s], {r: min(got.get(r, 0), n) for r, n in desired.items()})
    total = sum(endpoints.values())
    return {s: n / total for s, n in endpoints.items()} if total else {}


def phase_text(state: TransitionState | None, shares: Mapping[str, float] | None) -> str:
    """The PHASE column: `Steady`, or the transition's phase, its mode and the traffic split when known, e.g.
    `Progressing (Surge): 3×TP1 75%, 3×TP2 25%`, `Draining (Surge): 3×TP2 100%`, `RollingBack (InPlace)`, `Failed (Surge)`
    (a failed transition stays shown until the spec changes: both sets are left as they are)."""
    if state is None or state.phase is Phase.DONE:
        return "Steady"
    phase = "RollingBack" if state.rolled_back and state.phase is not Phase.FAILED else state.phase.value
    head = f"{phase} ({state.mode.value})"
    if not shares or state.phase is Phase.FAILED or state.mode is Mode.IN_PLACE:   # in place: one set takes it all
        return head
    labels = {state.from_set: state.name(state.source), state.to_set: state.name(state.target)}
    return head + ": " + ", ".join(f"{labels.get(s, s)} {share * 100:.0f}%" for s, share in shares.items())


def summary_status(*, mode: str, plan: PlanStatus | None, proposal: ProposalStatus | None, observed: ObservedStatus | None,
                   transition: TransitionState | None, shares: Mapping[str, float] | None) -> SummaryStatus:
    """`status.summary`: one pass's printer-column texts.

    During a transition LAYOUT and GPUS read `from → to` (never the old layout alone, as if nothing moved).
    """
    moving = transition is not None and transition.phase is not Phase.DONE
    if plan is None and proposal is not None:   # DryRun or awaiting approval: what the proposal would run, marked proposed
        layout, gpus, pd = f"{proposal.layout} (proposed)", f"{proposal.gpus} (proposed)", proposal.pd
    elif plan is None:
        layout, gpus, pd = NONE, NONE, NONE
    elif moving and transition is not None:
        layout, gpus = f"{transition.name(transition.source)} → {transition.name(transition.target)}", f"{transition.source.gpus} → {transition.target.gpus}"
        before, after = pd_ratio(transition.source), pd_ratio(transition.target)
        pd = before if before == after else f"{before} → {after}"
    else:
        layout, gpus, pd = plan.layout, str(plan.gpus), plan.pd
    measured_ttft = observed.ttftMs if observed is not None else None
    measured_tpot = observed.tpotMs if observed is not None else None
    predicted = plan.predicted if plan is not None else (proposal.predicted if proposal is not None else None)
    predicted_ttft = observed.predictedTtftMs if observed is not None and observed.predictedTtftMs is not None else (
        predicted.ttftMs if predicted is not None else None)
    predicted_tpot = observed.predictedTpotMs if observed is not None and observed.predictedTpotMs is not None else (
        predicted.tpotMs if predicted is not None else None)
    return SummaryStatus(mode=mode, layout=layout, pd=pd, gpus=gpus, ttft=pair_text(measured_ttft, predicted_ttft),
                         tpot=pair_text(measured_tpot, predicted_tpot), phase=phase_text(transition if moving else None, shares),
                         proposal=(f"{proposal.id}: {proposal.layout}" if proposal is not None and proposal.id else
                                   proposal.layout if proposal is not None else NONE), error=error_text(observed))
