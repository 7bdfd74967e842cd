"""`decide`: the planner's one entry point, from a Problem to a Decision.

Runs the funnel (stages 1–5), refines the survivors' SLO capacity, simulates the top K (stage 6) when
a simulator is given, ranks by the objective (stage 7), and predicts the pinned and current layouts.
Called by the CLI and the operator. Pure: the simulator is passed in as a function; no I/O, no clock
other than the funnel's own stage timings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from servingtopology.planner.engines.caps import pd_rule_violation, problem_caps
from servingtopology.planner.errors import Infeasible, InvalidSpec, PinRefused
from servingtopology.planner.figure_text import against_pinned_text, per_gpu_text
from servingtopology.planner.layout import Layout, LayoutKind, Role
from servingtopology.planner.perf.deployment_fit import problem_factors
from servingtopology.planner.perf.memory import kv_bytes_per_token, weight_bytes_total
from servingtopology.planner.perf.memory_fit import Longest, memory_refusal
from servingtopology.planner.perf.mixed_pd import MixedKinds, mixed_figures, mixed_kinds, mixed_refusal, mixed_slo_capacity_rps
from servingtopology.planner.perf.predict import delivery_ms, predict_figures, slo_capacity_rps, to_prediction
from servingtopology.planner.problem import Candidate, Decision, FunnelStage, PdRatio, Problem
from servingtopology.planner.search.advice import infeasible_advice
from servingtopology.planner.search.funnel import MEMORY_STAGE, Clock, Progress, Stage, Survivor, no_clock, run_funnel
from servingtopology.planner.search.pd_ratio import RANK_TOLERANCE, choose_pd_ratio
from servingtopology.planner.search.stage6_size import stage6_requests
from servingtopology.planner.search.tables import layout_rejection
from servingtopology.planner.search.verdict import carries_text, ttft_parts_text, verdict_text
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN, meets_slo_ms
from servingtopology.planner.workload import Objective

__all__ = ["SimFigures", "Simulate", "context_rejection", "decide", "envelope_point", "predict_layout", "refuse_pin"]


@dataclass(frozen=True, slots=True)
class SimFigures:
    """What stage 6 needs from a simulation run: latencies at the SLO percentiles and the mean TPOT (s)."""

    ttft_s: float
    tpot_s: float
    tpot_mean_s: float


Simulate = Callable[[Problem, Layout], SimFigures]


def _reasons_for(problem: Problem, best: Candidate, alternatives: tuple[Candidate, ...]) -> tuple[str, ...]:
    p = best.prediction
    out = [verdict_text(problem, best.layout, p), carries_text(problem, best.layout, p)]
    parts = ttft_parts_text(problem, best.layout, p)
    if parts is not None:
        out.append(parts)
    for alt in alternatives[:3]:
        out.append(f"{alt.layout.label_for(problem.engine)}: {alt.why}")
    return tuple(out)


def _why_not(problem: Problem, best: Candidate, alt: Candidate) -> str:
    a, b = alt.prediction, best.prediction
    if problem.pinned is not None and best.layout == problem.pinned and a.goodput_per_gpu > b.goodput_per_gpu * (1.0 + RANK_TOLERANCE):
        # Better than the pin by more than the tie band: say so, never "within 3 %" of a worse layout.
        return (f"{per_gpu_text(a.goodput_per_gpu)} req/s per GPU within the SLOs, {against_pinned_text(a.goodput_per_gpu, b.goodput_per_gpu)}; "
                "not chosen: the spec pins the layout")
    if problem.objective is Objective.MIN_GPUS and alt.layout.gpus > best.layout.gpus:
        return f"needs {alt.layout.gpus} GPUs against {best.layout.gpus}"
    if a.goodput_per_gpu < b.goodput_per_gpu * (1.0 - RANK_TOLERANCE):
        return f"{per_gpu_text(a.goodput_per_gpu)} req/s per GPU within the SLOs against {per_gpu_text(b.goodput_per_gpu)}"
    tie = f"within {RANK_TOLERANCE:.0%} on goodput per GPU ({per_gpu_text(a.goodput_per_gpu)} against {per_gpu_text(b.goodput_per_gpu)}) but "
    if alt.layout.gpus != best.layout.gpus:
        return tie + f"needs {alt.layout.gpus} GPUs against {best.layout.gpus}"
    if alt.layout.kind is not best.layout.kind:
        return tie + f"is the more complex kind ({alt.layout.kind.value} against {best.layout.kind.value})"
    if _pipeline_depth(alt.layout) != _pipeline_depth(best.layout):
        return tie + f"has more pipeline stages ({_pipeline_depth(alt.layout)} against {_pipeline_depth(best.layout)})"
    if a.source != b.source:
        return tie + f"its figure is {a.source}, the chosen one's {b.source}"
    return tie + f"its TTFT is higher ({a.ttft_ms:.0f} against {b.ttft_ms:.0f} ms)"


def predict_layout(problem: Problem, layout: Layout, *, simulate: Simulate | None = None, searched: bool = False) -> Candidate:
    """Predict one layout at the problem's load (used for pinned and current layouts), with the problem's factors; a PD
    layout with its roles on other GPU kinds is predicted by planner.perf.mixed_pd. `searched`: its SLO capacity with the
    search's margins (SLO_MARGIN, LOAD_MARGIN), as `decide` figures a candidate it found."""
    with problem_factors(problem.factors):
        return _predict_layout(problem, layout, simulate=simulate, searched=searched)


def _predict_layout(problem: Problem, layout: Layout, *, simulate: Simulate | None, searched: bool = False) -> Candidate:
    kinds = mixed_kinds(problem, layout)
    if kinds is not None:
        return _predict_mixed(problem, layout, kinds, simulate=simulate)
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    f = predict_figures(problem, [layout], [rate])
    margins = {"margin": SLO_MARGIN, "load_margin": LOAD_MARGIN} if searched else {}
    cap = float(slo_capacity_rps(problem, [layout], **margins)[0])
    ttft, tpot, tpm, source = float(f.ttft_s[0]), float(f.tpot_s[0]), float(f.tpot_mean_s[0]), "analytical"
    if simulate is not None and np.isfinite(ttft) and rate < float(f.capacity_rps[0]):
        sim = simulate(problem, layout)
        ttft, tpot, tpm, source = sim.ttft_s, sim.tpot_s, sim.tpot_mean_s, "simulated"
    pred = to_prediction(problem, layout, ttft_s=ttft, tpot_s=tpot, tpot_mean_s=tpm, capacity_rps=float(f.capacity_rps[0]),
                         slo_capacity_rps=cap, pool_tokens=int(f.pool_tokens[0]), source=source)
    return Candidate(layout, pred, score=pred.goodput_per_gpu)


def envelope_point(problem: Problem, layout: Layout, capacity_rps: float) -> tuple[float, float]:
    """(tokens/s per user, TTFT ms at the SLO percentile) of `layout` at `capacity_rps`, its SLO capacity: the one operating
    point a serving-envelope plot draws it at, with the output tokens/s per GPU of that capacity (EnvelopeAtOneLoad;
    the prediction's own latencies are at the planned load). Analytical, with the problem's factors; a mixed-kind PD
    layout through planner.perf.mixed_pd."""
    rate = [max(float(capacity_rps), 0.0)]
    with problem_factors(problem.factors):
        kinds = mixed_kinds(problem, layout)
        if kinds is not None:
            mf = mixed_figures(problem, [layout], rate, prefill_gpu=kinds.prefill_gpu, decode_gpu=kinds.decode_gpu,
                               link_gbit=kinds.link_gbit)
            ttft, tpot_mean = float(mf.ttft_s[0]), float(mf.tpot_mean_s[0])
        else:
            f = predict_figures(problem, [layout], rate)
            ttft, tpot_mean = float(f.ttft_s[0]), float(f.tpot_mean_s[0])
    return (1.0 / tpot_mean if tpot_mean > 0 and math.isfinite(tpot_mean) else 0.0), ttft * 1e3


def _predict_mixed(problem: Problem, layout: Layout, kinds: MixedKinds, *, simulate: Simulate | None) -> Candidate:
    """MixedKindPrediction: prefill priced on its kind, decode on its own, the KV over the slower NIC; the simulator
    (planner.sim.stage routes such a layout to its simulate_mixed) where stage 6 runs."""
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    kw = dict(prefill_gpu=kinds.prefill_gpu, decode_gpu=kinds.decode_gpu, link_gbit=kinds.link_gbit)
    f = mixed_figures(problem, [layout], [rate], **kw)   # type: ignore[arg-type]
    cap = float(mixed_slo_capacity_rps(problem, [layout], **kw)[0])   # type: ignore[arg-type]
    ttft, tpot, tpm, source = float(f.ttft_s[0]), float(f.tpot_s[0]), float(f.tpot_mean_s[0]), "analytical"
    if simulate is not None and np.isfinite(ttft) and rate < float(f.capacity_rps[0]):
        sim = simulate(problem, layout)
        ttft, tpot, tpm, source = sim.ttft_s, sim.tpot_s, sim.tpot_mean_s, "simulated"
    # The decode role's pool and longest request are on the decode kind.
    pred = to_prediction(replace(problem, gpu=kinds.decode_gpu), layout, ttft_s=ttft, tpot_s=tpot, tpot_mean_s=tpm,
                         capacity_rps=float(f.capacity_rps[0]), slo_capacity_rps=cap, pool_tokens=1, source=source)
    return Candidate(layout, pred, score=pred.goodput_per_gpu)


def _mixed_pin_refusal(problem: Problem, layout: Layout) -> tuple[str, str] | None:
    """A pinned mixed-kind PD layout planner.perf.mixed_pd refuses (no-nic, transfer-floor, memory, the release's PD rules):
    (the spec's field, the rule and its figures)."""
    kinds = mixed_kinds(problem, layout)
    if kinds is None:
        return None
    refused = mixed_refusal(problem, layout, prefill_gpu=kinds.prefill_gpu, decode_gpu=kinds.decode_gpu, link_gbit=kinds.link_gbit)
    if refused is None:
        return None
    return "layout.decode.gpu", f"prefill on {kinds.prefill_gpu.id}, decode on {kinds.decode_gpu.id} is refused ({refused.rule}): {refused.reason}"


def refuse_pin(problem: Problem, layout: Layout, *, longest: Longest | None = None) -> None:
    """Raise when a pinned layout fails a check the search applies to every candidate (PinHeldToTheSearch).

    InvalidSpec: a role's shape, the GPU budget or an engine's start-up rule on the knobs (stages 1–2,
    tables.layout_rejection), a mixed-kind layout mixed_pd refuses. PinRefused: a role's rank pool that cannot hold what
    that role must (stage 3, planner.perf.memory_fit: the prefill rank the longest prompt, the decode or aggregated rank
    the longest request; `longest`: the search's p99s unless a trace says otherwise). `decide`, `simulate` and `compare`
    call it, so a pin they print figures for is one the search would have kept.
    """
    rejected = layout_rejection(problem, layout)
    if rejected is not None:
        raise InvalidSpec(*rejected)
    kinds = mixed_kinds(problem, layout)
    gpus = {Role.PREFILL: kinds.prefill_gpu, Role.DECODE: kinds.decode_gpu} if kinds is not None else None
    short = memory_refusal(problem, layout, longest=longest, gpus=gpus)
    if short is not None:
        raise PinRefused(MEMORY_STAGE, short.field, short.reason)
    mixed = _mixed_pin_refusal(problem, layout)
    if mixed is not None:
        raise InvalidSpec(*mixed)


def _pipeline_depth(layout: Layout) -> int:
    """Pipeline stages of the deepest engine instance of a layout."""
    return max(r.parallelism.pp for r in layout.roles.values())


def _rank(problem: Problem, cands: list[Candidate]) -> list[Candidate]:
    """Order by the objective. Candidates within RANK_TOLERANCE of the best score tie, and a tie goes
    to fewer GPUs, then the simpler kind (replicas before PD), then fewer pipeline stages (4×TP1 before
    2×TP1·PP2: stages to balance and bubbles the model prices only on average), then a simulated
    prediction over an analytical one, then lower TTFT: a 1 % edge predicted by a model is not worth more
    GPUs or a more complex deployment."""
    meeting = [c for c in cands if c.prediction.meets_slo]
    missing = [c for c in cands if not c.prediction.meets_slo]
    if problem.objective is Objective.MIN_GPUS:
        key = lambda c: (c.layout.gpus, -c.prediction.goodput_per_gpu, c.layout.kind.value != "replicas", c.prediction.ttft_ms)  # noqa: E731
        return sorted(meeting, key=key) + sorted(missing, key=key)
    by_score = sorted(meeting, key=lambda c: -c.prediction.goodput_per_gpu)
    if not by_score:
        return sorted(missing, key=lambda c: -c.prediction.goodput_per_gpu)
    top = by_score[0].prediction.goodput_per_gpu * (1.0 - RANK_TOLERANCE)
    tied = sorted((c for c in by_score if c.prediction.goodput_per_gpu >= top),
                  key=lambda c: (c.layout.gpus, c.layout.kind.value != "replicas", _pipeline_depth(c.layout), c.prediction.source != "simulated",
                                 c.prediction.ttft_ms))
    rest = [c for c in by_score if c.prediction.goodput_per_gpu < top]
    return tied + rest + sorted(missing, key=lambda c: -c.prediction.goodput_per_gpu)


def _refine(problem: Problem, survivors: list[Survivor]) -> list[Candidate]:
    layouts = [s.layout for s in survivors]
    caps = slo_capacity_rps(problem, layouts, margin=SLO_MARGIN, load_margin=LOAD_MARGIN)
    out = []
    for s, cap in zip(survivors, caps, strict=True):
        pred = to_prediction(problem, s.layout, ttft_s=s.ttft_s, tpot_s=s.tpot_s,
                             tpot_mean_s=s.tpot_mean_s, capacity_rps=s.capacity_rps, slo_capacity_rps=float(cap), pool_tokens=s.pool_tokens)
        out.append(Candidate(s.layout, pred, score=pred.goodput_per_gpu))
    return out


def _simulate_top(problem: Problem, ranked: list[Candidate], simulate: Simulate | None, clock: Clock, *,
                  entering: int) -> tuple[list[Candidate], FunnelStage]:
    """Stage 6: simulate the top K distinct structures, or with a pin only the replica baseline (PinSimulatesThePin: the
    pin itself is simulated by predict_layout). Its row counts from what stage 5 admitted (`entering`), so the
    funnel's counts only ever fall: those stage 5 did not hand on (their bound cannot tie the best) and the simulated
    misses are its rejections; what stands after it is every handed-on candidate that did not miss (StageCountsFall)."""
    t0 = clock()
    not_handed_on = max(entering - len(ranked), 0)
    top = _pinned_baseline(ranked) if problem.pinned is not None else _top_structures(ranked, problem.search.top_k)
    k = len(top)
    handed = {"not handed on by stage 5 (only the fewest-GPU candidates whose bound can tie the best go on)": not_handed_on} if not_handed_on else {}
    if simulate is None or k == 0:
        why = PIN_MAKES_SEARCH_MOOT if simulate is not None and problem.pinned is not None else "not simulated: analytical figures kept"
        note = {why: len(ranked)} if ranked else {}
        return ranked, FunnelStage("6 simulation of the top K", len(ranked), not_handed_on, clock() - t0, {**handed, **note})
    out, rejected = [], 0
    chosen = set(top)
    for c in (ranked[i] for i in top):
        sim = simulate(problem, c.layout)
        ttft, tpot = sim.ttft_s, sim.tpot_s
        pred = replace(c.prediction, ttft_ms=ttft * 1e3, tpot_ms=tpot * 1e3, tokens_per_s_per_user=1.0 / max(sim.tpot_mean_s, 1e-9),
                       source="simulated", delivery_ms=delivery_ms(c.layout, sim.tpot_mean_s))
        meets = bool(meets_slo_ms(problem.slo, ttft_ms=pred.ttft_ms, tpot_ms=pred.tpot_ms))
        pred = replace(pred, meets_slo=meets, goodput_rps=pred.goodput_rps if meets else 0.0)
        rejected += not meets
        out.append(Candidate(c.layout, pred, c.score))
    reasons = {**handed, **({"simulated SLO miss": rejected} if rejected else {})}
    sized = stage6_requests(problem).reason
    if sized:   # Stage6SizedToTheWork: long requests, fewer of them
        reasons[sized] = k
    if len(ranked) > k:
        reasons[PIN_MAKES_SEARCH_MOOT if problem.pinned is not None else "beyond the top K, not simulated: analytical figures kept"] = len(ranked) - k
    return (out + [c for i, c in enumerate(ranked) if i not in chosen],
            FunnelStage("6 simulation of the top K", len(ranked) - rejected, not_handed_on + rejected, clock() - t0, reasons))


def _top_structures(ranked: list[Candidate], k: int) -> list[int]:
    """The top K distinct structures (knob variants of one structure would say the same thing)."""
    top: list[int] = []
    seen: set[str] = set()
    for i, c in enumerate(ranked):
        if c.layout.structure not in seen:
            seen.add(c.layout.structure)
            top.append(i)
            if len(top) >= k:
                break
    return top


# PinSimulatesThePin: with the layout pinned, stage 6 simulates what the decision and its record use: the pin itself
# (predict_layout) and the replica baseline (the best-ranked one-GPU replica, the record's "single-GPU rate"); the other
# searched candidates cannot be chosen, so they keep their analytical figures as the alternatives beside the pin.
PIN_MAKES_SEARCH_MOOT = "not simulated: the spec pins the layout, so only the one-GPU replica baseline is (analytical figures kept)"


def _pinned_baseline(ranked: list[Candidate]) -> list[int]:
    """The best-ranked one-GPU replica (PinSimulatesThePin), or nothing when the search kept none."""
    for i, c in enumerate(ranked):
        if c.layout.kind is LayoutKind.REPLICAS and c.layout.roles[Role.AGGREGATED].parallelism.gpus == 1:
            return [i]
    return []


def context_rejection(problem: Problem) -> None:
    """Raise InvalidSpec when the workload's longest request is longer than the model's context.

    Called by the spec conversion (servingtopology.spec.to_problem), so `plan`, `simulate` and the operator refuse such
    a spec before anything is planned; not by `decide`, whose workload may be observed live: the engines refuse longer
    requests, so a fitted distribution's tail past the context is the fit's, not traffic to refuse. The longest request
    is the one the funnel's memory stage holds: the p99 prompt plus the p99 output (analytic.load_shape). The context is
    the model's (`ModelArch.max_context_tokens`: the config's max_position_embeddings with its RoPE scaling, as
    planner.model.hf_config reads them), which is what vLLM's --max-model-len and SGLang's --context-length default to: both refuse a prompt plus
    max_tokens beyond it, so no layout of any size serves it.
    """
    w, m = problem.workload, problem.model
    prompt, output = w.input_tokens.p99_tokens, w.output_tokens.p99_tokens
    longest = math.ceil(prompt + output)
    if longest <= m.max_context_tokens:
        return
    field = "workload.inputTokens" if prompt > m.max_context_tokens or prompt >= output else "workload.outputTokens"
    raise InvalidSpec(field, f"the longest request needs {longest:,} tokens (p99 prompt {math.ceil(prompt):,} + p99 output "
                             f"{math.ceil(output):,}); the model's context is {m.max_context_tokens:,} tokens ({m.name}: its "
                             "max_position_embeddings with any RoPE scaling): shorten workload.inputTokens or workload.outputTokens to at most "
                             f"{m.max_context_tokens:,} together, or choose a model with a longer context")


def decide(problem: Problem, *, simulate: Simulate | None = None, progress: Progress | None = None, clock: Clock = no_clock,
           ladder: Sequence[tuple[str, Stage]] | None = None) -> Decision:
    """Plan a layout for the problem; raise Infeasible (with the funnel) when nothing meets it. `ladder`: the
    funnel's stages (default: the engine release's, funnel.engine_ladder). Every figure is predicted with the problem's
    factors (a deployment calibration) applied; `Decision.uncalibrated` is then the chosen layout predicted without them."""
    with problem_factors(problem.factors):
        decision = _decide(problem, simulate=simulate, progress=progress, clock=clock, ladder=ladder)
    if not problem.factors:
        return decision
    # Calibrated beside uncalibrated: the chosen layout without the factors, figured as the search figured it (its SLO
    # capacity with the search's margins), or as a pin.
    plain = replace(problem, factors=())
    return replace(decision, uncalibrated=predict_layout(plain, decision.best.layout, simulate=simulate, searched=problem.pinned is None))


def _decide(problem: Problem, *, simulate: Simulate | None, progress: Progress | None, clock: Clock,
            ladder: Sequence[tuple[str, Stage]] | None) -> Decision:
    if problem.workload.arrival_rate_rps is None:
        raise InvalidSpec("workload.arrivalRate", "planning needs an arrival rate in requests/s (concurrency is for simulate/sweep)")
    if problem.pinned is not None:
        refuse_pin(problem, problem.pinned)
    kv_dtype = problem.search.kv_dtypes[0]
    kv_tok = int(kv_bytes_per_token(problem.model, kv_dtype, tp=1, pp=1))
    weights = weight_bytes_total(problem.model, problem.precision)
    result = run_funnel(problem, progress=progress, clock=clock, ladder=ladder)
    stages = list(result.stages)
    t0 = clock()  # stage 7's timer covers everything after the funnel but the simulation
    current = predict_layout(problem, problem.current, simulate=simulate) if problem.current is not None else None
    if not result.survivors and problem.pinned is None:
        raise Infeasible(result.last_stage, result.closest_miss, funnel=tuple(stages), advice=infeasible_advice(problem, result, ladder=ladder))
    ranked = _rank(problem, _refine(problem, result.survivors))
    ranked, stage6 = _simulate_top(problem, ranked, simulate, clock, entering=stages[-1].admitted if stages else len(ranked))
    stages.append(stage6)
    ranked = _rank(problem, ranked)
    if problem.pinned is not None:
        best = predict_layout(problem, problem.pinned, simulate=simulate)
        refused = pd_rule_violation(problem_caps(problem), problem.pinned)
        why = "pinned by the spec" + (f"; {problem_caps(problem).label} refuses it: {refused.reason} ({refused.source})" if refused else "")
        best = replace(best, why=why)
    else:
        best = ranked[0]
    alternatives: list[Candidate] = []
    labels = {best.layout.structure}
    for c in ranked:
        if c.layout.structure in labels:
            continue
        labels.add(c.layout.structure)
        alternatives.append(replace(c, why=_why_not(problem, best, c)))
        if len(alternatives) >= max(problem.search.top_k - 1, 3):
            break
    # A mixed-kind layout's counts come from its pin: choose_pd_ratio prices both roles on one kind.
    ratio = _pd_ratio(problem, best.layout) if mixed_kinds(problem, best.layout) is None else None
    reasons = _reasons_for(problem, best, tuple(alternatives))
    if ratio is not None:
        reasons = (*reasons[:2], f"P:D {ratio.label}: {ratio.reason}", *reasons[2:])
    sized = stage6_requests(problem).reason if simulate is not None else ""
    if sized:
        reasons = (*reasons, f"Simulation: {sized}")
    # Ranking rejects nothing: it orders what stage 6 left standing (a simulated miss stays ranked last, not admitted).
    stages.append(FunnelStage("7 ranking by objective", stage6.admitted, 0, clock() - t0 - stage6.seconds, {}))
    return Decision(
        best=best, alternatives=tuple(alternatives), funnel=tuple(stages), candidates_total=result.candidates_total,
        kv_bytes_per_token=kv_tok, weight_bytes=weights, reasons=reasons, current=current, evaluated=tuple(ranked), pd_ratio=ratio,
    )


def _pd_ratio(problem: Problem, layout: Layout) -> PdRatio | None:
    """The prefill:decode decision for a PD layout's roles at the problem's load (None for replicas)."""
    if layout.kind is not LayoutKind.PD or not problem.workload.arrival_rate_rps:
        return None
    return choose_pd_ratio(problem, prefill=layout.roles[Role.PREFILL], decode=layout.roles[Role.DECODE],
                           max_gpus=max(problem.max_gpus, layout.gpus))



