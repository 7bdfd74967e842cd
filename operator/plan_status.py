"""Plans in status: converts a planner Decision into `status.plan` / `status.proposal` and back into a
Layout, writes conditions, and words the Event messages ("would change 4×TP2 → 2P3D@TP4: …").

Called by the reconcile (operator/reconcile.py). Pure: values in, values out; time is an argument.
Must not talk to the API server.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime

from servingtopology.operator.api.resource import (
    Condition,
    ConditionType,
    HistoryEntry,
    IntervalBand,
    PlanStatus,
    Predicted,
    ProposalStatus,
    RolePlan,
)
from servingtopology.operator.live.readout import ms_text, pd_ratio
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.live.error_bars import LEVEL, Interval
from servingtopology.planner.live.error_gate import shown_intervals
from servingtopology.planner.problem import Candidate, Prediction, Problem

__all__ = [
    "queueing_note",
    "timestamp",
    "pd_ratio",
    "predicted",
    "interval_band",
    "plan_status",
    "proposal_status",
    "layout_from_plan",
    "change_message",
    "set_condition",
    "condition",
    "append_history",
]

ArgsOf = Callable[[Role, RoleLayout], tuple[int, tuple[str, ...]]]  # role -> (nodes per instance, engine args)


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with a Z, second precision (what Kubernetes writes)."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def interval_band(iv: Interval) -> IntervalBand | None:
    """A prediction's interval as status shows it (None when its class has no interval)."""
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return None
    return IntervalBand(low=round(iv.low, 3), high=round(iv.high, 3), level=LEVEL, classKey=iv.class_key[:128], calibrated=iv.calibrated)



def with_intervals(predicted_: Predicted | None, problem: Problem, candidate: Candidate | None, *, misses: int = 0) -> Predicted | None:
    """IntervalsShown for a plan made for a spec edit: `predicted_` (the candidate's figures) with the nominal intervals
    of its TTFT and TPOT (planner/live/error_bars.py `figure_intervals`, the class's width at the problem's load), widened 1.5×
    per missed move as the error gate widens them (planner/live/error_gate.py `shown_intervals`, which a live replan's
    proposal also uses, narrowed there by the deployment's own calibration)."""
    if predicted_ is None or candidate is None:
        return predicted_
    ivs = shown_intervals(problem, candidate.layout, ttft_ms=candidate.prediction.ttft_ms, tpot_ms=candidate.prediction.tpot_ms,
                          misses=misses)
    return predicted_.model_copy(update={"ttftInterval": interval_band(ivs["ttft"]), "tpotInterval": interval_band(ivs["tpot"])})


def predicted(p: Prediction) -> Predicted:
    return Predicted(ttftMs=round(p.ttft_ms, 1), tpotMs=round(p.tpot_ms, 2), throughputTokS=round(p.throughput_tok_s, 1),
                     capacityRps=round(p.capacity_rps, 3), goodputRps=round(p.goodput_rps, 3), meetsSlo=p.meets_slo,
                     source=p.source)


def _roles(layout: Layout, args_of: ArgsOf) -> list[RolePlan]:
    out = []
    for role, rl in layout.roles.items():
        par, k = rl.parallelism, rl.knobs
        nodes, args = args_of(role, rl)
        out.append(RolePlan(role=role.value, replicas=rl.count, tp=par.tp, pp=par.pp, dp=par.dp, ep=par.ep, epSize=par.ep_size or None,
                            gpusPerInstance=par.gpus, nodesPerInstance=nodes, maxNumSeqs=k.max_num_seqs,
                            maxNumBatchedTokens=k.max_num_batched_tokens, memoryFraction=k.memory_fraction,
                            kvCacheDtype=k.kv_dtype.value, blockSize=k.block_size_tokens,
                            enablePrefixCaching=k.enable_prefix_caching, engineArgs=list(args), gpu=rl.gpu or None))
    return out


def plan_status(candidate: Candidate, *, engine: Engine, args_of: ArgsOf, reasons: Sequence[str], now: datetime,
                generation: int) -> PlanStatus:
    """`status.plan` for a chosen candidate; its layout named in `engine`'s words, as the command line's record names
    it (EngineNamed: Layout.label_for)."""
    layout = candidate.layout
    return PlanStatus(layout=layout.label_for(engine), kind=layout.kind, precision=layout.precision.value, gpus=layout.gpus,
                      pd=pd_ratio(layout), roles=_roles(layout, args_of), predicted=predicted(candidate.prediction),
                      reasons=list(reasons)[:8], decidedAt=timestamp(now), generation=generation)


def proposal_status(candidate: Candidate, *, engine: Engine, current: PlanStatus | None, before: Prediction | None,
                    args_of: ArgsOf, reasons: Sequence[str], now: datetime, generation: int, percentile: str, load_rps: float | None = None) -> ProposalStatus:
    """`status.proposal`: the plan a DryRun would apply, with the figures before and after.

    SameLoadFigures: `before` must be the running layout predicted at the load `candidate` was predicted at
    (`load_rps`); without one the message quotes the new figures alone, never the running plan's figures at the
    load it was planned for.
    """
    plan = plan_status(candidate, engine=engine, args_of=args_of, reasons=reasons, now=now, generation=generation)
    before_p = predicted(before) if before is not None else None
    reason = reasons[0] if reasons else (candidate.why or "best ranked layout under the SLOs")
    message = change_message(current_layout=current.layout if current else None, current_gpus=current.gpus if current else None,
                             before=before_p, after=plan, reason=reason, percentile=percentile, verb="would", load_rps=load_rps)
    return ProposalStatus(**plan.model_dump(), fromLayout=current.layout if current else None,
                          fromGPUs=current.gpus if current else None, before=before_p,
                          loadRps=None if load_rps is None else round(load_rps, 3), reason=reason, message=message)


QUEUEING_TTFT_MS = 1000.0


def queueing_note(p: Predicted | None, *, load_rps: float | None, layout: str) -> str | None:
    """QueueingTtft: a layout offered more than it carries within the SLO queues requests, and its predicted TTFT is
    mostly that wait (a "328s" TTFT is a queue, not a slow prefill). The sentence that says so, or None: only for a
    TTFT of a second or more (QUEUEING_TTFT_MS), where the wait is what a reader sees."""
    if p is None or load_rps is None or load_rps <= p.capacityRps or p.ttftMs < QUEUEING_TTFT_MS:
        return None
    return (f"{layout}'s TTFT of {ms_text(p.ttftMs)} is time spent queueing: it carries {p.capacityRps:.3g} req/s within the "
            f"SLO, under the {load_rps:.3g} req/s offered")


def change_message(*, current_layout: str | None, current_gpus: int | None, before: Predicted | None, after: PlanStatus,
                   reason: str, percentile: str, verb: str, load_rps: float | None = None) -> str:
    """`would change 4×TP2 → 2P3D@TP4 at 30 req/s: p95 TTFT 2.1s→180ms, TPOT 30ms→28ms, GPUs 8→10, because …`.

    `verb` is "would" for a proposal and "did" for an applied change (worded "changed"). `before` and `after` must
    be predictions at the same load (SameLoadFigures), named by `load_rps` when known.
    """
    a = after.predicted
    at = "" if load_rps is None else f" at {load_rps:.3g} req/s"
    if current_layout is None or (current_layout == after.layout and current_gpus == after.gpus):
        head = f"{'would create' if verb == 'would' else 'created'} {after.layout}{at}"
        figures = [f"{after.gpus} GPU{'' if after.gpus == 1 else 's'}"]
        if a is not None:
            figures = [f"{percentile} TTFT {ms_text(a.ttftMs)}", f"TPOT {ms_text(a.tpotMs)}", *figures]
    else:
        head = f"{'would change' if verb == 'would' else 'changed'} {current_layout} → {after.layout}{at}"
        figures = []
        if a is not None:
            if before is not None:
                figures += [f"{percentile} TTFT {ms_text(before.ttftMs)}→{ms_text(a.ttftMs)}",
                            f"TPOT {ms_text(before.tpotMs)}→{ms_text(a.tpotMs)}"]
            else:
                figures += [f"{percentile} TTFT {ms_text(a.ttftMs)}", f"TPOT {ms_text(a.tpotMs)}"]
        figures.append(f"GPUs {current_gpus}→{after.gpus}")
        note = queueing_note(before, load_rps=load_rps, layout=current_layout)
        if note is not None:
            return f"{head}: {', '.join(figures)}; {note}, because {reason}"
    return f"{head}: {', '.join(figures)}, because {reason}"


def layout_from_plan(plan: PlanStatus) -> Layout:
    """Rebuild the planner Layout a plan in status describes (the `current` layout of the next decision)."""
    roles = {}
    for r in plan.roles:
        knobs = EngineKnobs(max_num_seqs=r.maxNumSeqs, max_num_batched_tokens=r.maxNumBatchedTokens, memory_fraction=r.memoryFraction,
                            kv_dtype=KvDtype(r.kvCacheDtype), block_size_tokens=r.blockSize, enable_prefix_caching=r.enablePrefixCaching)
        roles[Role(r.role)] = RoleLayout(r.replicas, Parallelism(tp=r.tp, pp=r.pp, dp=r.dp, ep=r.ep, ep_size=r.epSize or 0), knobs, r.gpu or "")
    return Layout(plan.kind, roles, Precision(plan.precision))


def condition(conditions: Sequence[Condition], kind: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type is kind), None)


def set_condition(conditions: Sequence[Condition], kind: ConditionType, *, status: bool | None, reason: str, message: str,
                  now: datetime, generation: int) -> list[Condition]:
    """Replace one condition; lastTransitionTime moves only when the status flips."""
    text = "Unknown" if status is None else ("True" if status else "False")
    old = condition(conditions, kind)
    since = old.lastTransitionTime if old is not None and old.status == text else timestamp(now)
    new = Condition(type=kind, status=text, reason=reason, message=message[:1024], lastTransitionTime=since,
                    observedGeneration=generation)
    out = [c for c in conditions if c.type is not kind] + [new]
    return sorted(out, key=lambda c: list(ConditionType).index(c.type))


def append_history(history: Sequence[HistoryEntry], entry: HistoryEntry, limit: int) -> list[HistoryEntry]:
    """Newest last, at most `limit` entries."""
    return [*history, entry][-limit:]
