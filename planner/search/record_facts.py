"""The figures of the topology decision record, computed once: `plan --json` prints them and the record renders them.

Follows the one-page topology decision record (model and footprint, KV bytes per token, the longest prompt and its
KV, transfer floors per link, SLOs and which one binds, the measured replica baseline, candidates evaluated by
layout family and why each dropped out, the per-role KV pools, the measurements required before approval). Called
by planner/search/record.py and the CLI; the operator may pass its measured figures (`baseline_from_observed`). Pure: the
date and the planner's version are arguments, never read here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from servingtopology.planner.errors import PlannerError
from servingtopology.planner.figure_text import against_pinned_text, per_gpu_text, rps_text
from servingtopology.planner.layout import Layout, LayoutKind, Role
from servingtopology.planner.perf.memory import kv_bytes_per_token, kv_pool_tokens, transfer_floor_s
from servingtopology.planner.perf.predict import predict_figures
from servingtopology.planner.problem import Candidate, Decision, Problem, SearchSpace
from servingtopology.planner.search.funnel import run_funnel
from servingtopology.planner.search.limits import SloFloors, slo_floors
from servingtopology.planner.search.pd_ratio import RANK_TOLERANCE
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN

__all__ = ["Family", "FamilyRow", "Floor", "Binding", "MeasuredBaseline", "RecordFacts", "record_facts", "baseline_from_observed",
           "family_of", "facts_json", "measured_binding", "LINKS_GBIT", "BLANK"]

# Links a KV transfer may cross, in Gb/s: common Ethernet speeds; then the GPU's own NIC and scale-up link are added.
LINKS_GBIT = (10.0, 25.0, 100.0, 200.0, 400.0)
BLANK = "______"


class Family(enum.StrEnum):
    """The layout families of the decision record's 'candidates evaluated' list."""

    REPLICAS = "replicas of one GPU"
    TP = "tensor-parallel replicas"
    DP = "data-parallel-attention replicas"
    TP_PP = "TP+PP replicas"
    PD = "prefill/decode disaggregation"


def family_of(layout: Layout) -> Family:
    """Which family a layout belongs to (PD whatever its roles' shapes; a replica by its instance's shape)."""
    if layout.kind is LayoutKind.PD:
        return Family.PD
    par = layout.roles[Role.AGGREGATED].parallelism
    if par.pp > 1:
        return Family.TP_PP
    if par.dp > 1:
        return Family.DP
    return Family.TP if par.tp > 1 else Family.REPLICAS


@dataclass(frozen=True, slots=True)
class Floor:
    """The ideal time to move the longest prompt's KV over one link (no latency, no protocol overhead)."""

    link: str
    gbit: float
    floor_ms: float


@dataclass(frozen=True, slots=True)
class Binding:
    """Which limit sets the chosen layout's SLO capacity: `slo` is 'TTFT', 'TPOT' or 'load' (saturation), with the
    analytical figures just past that capacity (ms, the share of the saturation load) and at the planned load."""

    slo: str
    at_rps: float
    ttft_ms: float
    tpot_ms: float
    load_share: float
    planned_ttft_share: float     # the chosen layout's predicted figure / its SLO, at the planned load
    planned_tpot_share: float
    margin: float = 1.0           # the SLO margin its capacity was found with (the funnel's 1.1 for a planned layout)


@dataclass(frozen=True, slots=True)
class FamilyRow:
    """One layout family: how many candidates of it were evaluated, its best (None: none met the SLOs) and why it
    is or is not the decision."""

    family: Family
    searched: bool
    evaluated: int
    best: str | None
    best_gpus: int
    best_goodput_per_gpu: float
    why: str


@dataclass(frozen=True, slots=True)
class MeasuredBaseline:
    """What was measured on the running replicas (None: not measured; the record prints a blank to fill in)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    goodput_pct: float | None = None
    load_rps: float | None = None
    layout: str | None = None
    at: str | None = None


@dataclass(frozen=True, slots=True)
class RecordFacts:
    """Every figure of the decision record (units in the names; sizes in bytes, times in ms)."""

    model: str
    precision: str
    attention: str
    layers: int
    kv_heads: int
    head_dim: int
    params: float
    active_params: float
    weight_bytes: float
    gpu_memory_bytes: float
    fits_one_gpu: bool
    kv_dtype: str
    kv_bytes_per_token: int
    kv_formula: str
    longest_prompt_tokens: int
    mean_prompt_tokens: float
    longest_prompt_kv_bytes: float
    longest_request_tokens: int
    transfer_floors: tuple[Floor, ...]
    binding: Binding | None
    floors: SloFloors
    single_gpu_layout: str | None
    single_gpu_rps: float | None
    kv_pool_tokens: Mapping[str, int]
    families: tuple[FamilyRow, ...]
    candidates_evaluated: int
    candidates_total: int
    simulated: int
    decision: str
    decision_gpus: int
    pinned: bool
    measurements: tuple[str, ...]
    engine_release: str
    planner_version: str
    date: str
    baseline: MeasuredBaseline


def baseline_from_observed(observed: Mapping[str, Any] | None, *, layout: str | None = None) -> MeasuredBaseline:
    """The measured baseline from a ServingTopology's `status.observed` (camelCase: at, arrivalRateRps, ttftMs,
    tpotMs; `goodputPct` when a benchmark measured it); a missing or non-numeric figure stays blank."""
    if not observed:
        return MeasuredBaseline(layout=layout)

    def num(key: str) -> float | None:
        v = observed.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None
    at = observed.get("at")
    return MeasuredBaseline(ttft_ms=num("ttftMs"), tpot_ms=num("tpotMs"), goodput_pct=num("goodputPct"), load_rps=num("arrivalRateRps"),
                            layout=layout, at=str(at) if at else None)


def _floors(problem: Problem, nbytes: float) -> tuple[Floor, ...]:
    g = problem.gpu
    rows = [Floor(f"{x:g} Gb/s Ethernet", x, transfer_floor_s(nbytes, link_gbit=x) * 1e3) for x in LINKS_GBIT]
    rows.append(Floor(f"{g.id} NIC ({g.nic_gbit:g} Gb/s per GPU)", g.nic_gbit, transfer_floor_s(nbytes, link_gbit=g.nic_gbit) * 1e3))
    link = "NVLink" if g.nvlink_gbps > 0 else "PCIe"
    rows.append(Floor(f"{link} inside a node ({g.scaleup_gbps:g} GB/s)", g.scaleup_gbps * 8,
                      transfer_floor_s(nbytes, link_gbit=g.scaleup_gbps * 8) * 1e3))
    return tuple(rows)


def _kv_formula(problem: Problem, kv_tok: int) -> str:
    """`2 × L × H_kv × d_head × bytes` when that is what the cache holds (plain MHA/GQA), else empty."""
    m = problem.model
    b = problem.search.kv_dtypes[0].bytes_per_value
    if m.is_mla or m.num_sliding_layers or m.num_state_layers or 2 * m.num_layers * m.num_kv_heads * m.head_dim * b != kv_tok:
        return ""
    return f"2 × {m.num_layers} × {m.num_kv_heads} × {m.head_dim} × {b}"


def _binding(problem: Problem, best: Candidate, *, pinned: bool) -> Binding | None:
    """The limit that stops the chosen layout just past its SLO capacity (the margins its capacity was found with:
    the funnel's for a planned layout, none for a pinned one)."""
    slo = problem.slo
    margin, load_margin = (1.0, 1.0) if pinned else (SLO_MARGIN, LOAD_MARGIN)
    cap = best.prediction.capacity_rps
    rate = max(cap, 1e-3) * 1.001
    f = predict_figures(problem, [best.layout], [rate])
    ttft_s, tpot_s, sat = float(f.ttft_s[0]), float(f.tpot_s[0]), float(f.capacity_rps[0])
    ratios = {"TTFT": ttft_s * 1e3 * margin / slo.ttft_ms, "TPOT": tpot_s * 1e3 * margin / slo.tpot_ms,
              "load": rate / max(load_margin * sat, 1e-12)}
    name = max(ratios, key=lambda k: ratios[k] if math.isfinite(ratios[k]) else math.inf)
    p = best.prediction
    return Binding(name, cap, ttft_s * 1e3, tpot_s * 1e3, rate / sat if sat > 0 else math.inf,
                   p.ttft_ms / slo.ttft_ms, p.tpot_ms / slo.tpot_ms, margin)


def _pools(problem: Problem, layout: Layout) -> dict[str, int]:
    return {role.value: kv_pool_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision,
                                       parallelism=r.parallelism, knobs=r.knobs) for role, r in layout.roles.items()}


def _searched(problem: Problem, family: Family) -> bool:
    s = problem.search
    if family is Family.PD:
        return LayoutKind.PD in s.layouts
    if LayoutKind.REPLICAS not in s.layouts:
        return False
    return {Family.REPLICAS: 1 in s.tp, Family.TP: any(t > 1 for t in s.tp), Family.DP: any(d > 1 for d in s.dp),
            Family.TP_PP: any(p > 1 for p in s.pp)}[family]


def _family_search(problem: Problem, family: Family) -> SearchSpace:
    """The problem's search narrowed to one family (family_of's rule: PP > 1, else DP > 1, else TP > 1, else one GPU)."""
    s = problem.search
    if family is Family.PD:
        return replace(s, layouts=(LayoutKind.PD,))
    above = {Family.REPLICAS: ((1,), (1,), (1,)), Family.TP: (tuple(t for t in s.tp if t > 1), (1,), (1,)),
             Family.DP: (s.tp, (1,), tuple(d for d in s.dp if d > 1)), Family.TP_PP: (s.tp, tuple(p for p in s.pp if p > 1), s.dp)}
    tp, pp, dp = above[family]
    return replace(s, layouts=(LayoutKind.REPLICAS,), tp=tp, pp=pp, dp=dp)


def _family_miss(problem: Problem, family: Family) -> str:
    """Why no layout of `family` reached the ranking, from the funnel run on that family alone: the stage that removed
    its last candidates and the closest miss, or, where some passed stages 1–5, that none was handed on (stage 5 hands
    on the fewest-GPU candidates whose bound can tie the best of all families)."""
    try:
        result = run_funnel(replace(problem, search=_family_search(problem, family), pinned=None), keep=1)
    except (PlannerError, ValueError) as exc:
        return f"the funnel refused it ({exc})"
    if result.survivors:
        passed = result.stages[-1].admitted
        return (f"{passed:,} candidate{'s' if passed != 1 else ''} of it passed stages 1–5, but none could tie the best on its "
                "analytical bound, so stage 5 handed none on to be simulated and ranked")
    return f"no layout passed stage '{result.last_stage}'; closest miss: {result.closest_miss}"


def _families(problem: Problem, decision: Decision, *, pinned: bool) -> tuple[FamilyRow, ...]:
    best = decision.best
    b = best.prediction.goodput_per_gpu
    rows = []
    for fam in Family:
        members = [c for c in decision.evaluated if family_of(c.layout) is fam]
        meeting = [c for c in members if c.prediction.meets_slo]
        searched = _searched(problem, fam)
        top: Candidate | None = max(meeting, key=lambda c: c.prediction.goodput_per_gpu) if meeting else None
        if family_of(best.layout) is fam and (top is None or best.layout.structure == top.layout.structure
                                              or (not pinned and top.prediction.goodput_per_gpu <= b)):
            top = best
        if top is best:
            why = "pinned by the spec" if pinned else "the decision"
        elif top is not None:
            a = top.prediction.goodput_per_gpu
            if pinned and a > b * (1.0 + RANK_TOLERANCE):
                why = f"{per_gpu_text(a)} req/s per GPU within the SLOs, {against_pinned_text(a, b)}; not chosen: the spec pins the layout"
            elif a < b * (1.0 - RANK_TOLERANCE):
                why = f"{per_gpu_text(a)} req/s per GPU within the SLOs against {per_gpu_text(b)} ({1 - a / b:.0%} less)"
            else:
                alt = next((c for c in decision.alternatives if c.layout.structure == top.layout.structure), None)
                why = alt.why if alt is not None and alt.why else f"within {RANK_TOLERANCE:.0%} ({a:.2f} against {b:.2f}), lost the tie-break"
        elif not searched:
            # Hidden, not listed as an alternative: a kind the search leaves out (a resource's policy.allowedLayouts narrows
            # search.layouts) is never offered, so no alternative of it can stand beside the decision (DisallowedHidden).
            why = "not searched: search.layouts (narrowed by a resource's policy.allowedLayouts), tp, pp and dp leave it out"
        elif members:
            why = f"its {len(members)} candidates that passed the funnel missed an SLO in the step-level simulation"
        elif fam is Family.REPLICAS and not decision.weight_bytes < problem.gpu.memory_bytes:
            why = (f"one copy of the weights ({decision.weight_bytes / 1e9:,.1f} GB) does not fit one {problem.gpu.id} "
                   f"({problem.gpu.memory_gib:g} GiB)")
        else:   # the family's own funnel says which stage removed it, never a stage that rejected nothing
            why = _family_miss(problem, fam)
        # The chosen (or pinned) layout was evaluated too, though a pin is not among the search's candidates.
        count = len(members) + (top is best and not any(c.layout == best.layout for c in members))
        rows.append(FamilyRow(fam, searched, count, top.layout.label_for(problem.engine) if top else None, top.layout.gpus if top else 0,
                              top.prediction.goodput_per_gpu if top else 0.0, why))
    return tuple(rows)


def _single_gpu(decision: Decision) -> tuple[str | None, float | None]:
    ones = [c for c in decision.evaluated if c.layout.kind is LayoutKind.REPLICAS and c.prediction.meets_slo
            and c.layout.roles[Role.AGGREGATED].parallelism.gpus == 1]
    if not ones:
        return None, None
    top = max(ones, key=lambda c: c.prediction.goodput_per_gpu)
    return top.layout.label, top.prediction.goodput_per_gpu


def _measurements(problem: Problem, decision: Decision, pools: Mapping[str, int], longest_kv_bytes: float) -> tuple[str, ...]:
    """What must be measured before approval, most basic first; numbered by the renderer (consecutively)."""
    best, slo, w = decision.best, problem.slo, problem.workload
    p = best.prediction
    pool_text = ", ".join(f"{role} {tokens:,}" for role, tokens in pools.items())
    out = [
        f"The KV pool the engine reports at start-up (vLLM `GPU KV cache size` or `vllm:cache_config_info` num_gpu_blocks × block size; "
        f"SGLang `max_total_num_tokens`) against the predicted tokens per rank: {pool_text}.",
        f"The replica baseline: p{slo.ttft_percentile:g} TTFT and p{slo.tpot_percentile:g} TPOT of one-GPU replicas under the production "
        f"mix, p{slo.tpot_percentile:g} TPOT under prefill bursts included (does interference breach {slo.tpot_ms:g} ms?); fill in "
        "'Measured replica baseline' above.",
        "A chunked-prefill-tuned replica baseline (does tuning alone meet the SLOs without a multi-GPU layout?).",
    ]
    tps = [r.parallelism.tp for r in best.layout.roles.values()]
    if max(tps) > 1:
        out.append(f"NCCL all-reduce p99 per decode step at TP{max(tps)} ({2 * problem.model.num_layers} all-reduces per step: two per "
                   "layer) on this node's links.")
    if best.layout.kind is LayoutKind.PD or any(a.layout.kind is LayoutKind.PD for a in decision.alternatives):
        out.append(f"The achieved KV transfer bandwidth and serialization time between prefill and decode pods for the longest prompt "
                   f"({longest_kv_bytes / 2**20:,.0f} MiB) against the floors above.")
    out.append(f"Client-observed p{slo.ttft_percentile:g} TTFT and p{slo.tpot_percentile:g} TPOT of {best.layout.label_for(problem.engine)} under an "
               f"open-loop benchmark at {w.arrival_rate_rps:g} req/s with the production prompt and output lengths (prediction error "
               "above 20 % invalidates the ranking).")
    out.append(f"The load at which the SLOs break, against the predicted {rps_text(p.capacity_rps)} req/s.")
    if any(a.layout.kind is not best.layout.kind for a in decision.alternatives):
        out.append("The best alternative of the other layout kind at the same load, since the choice between kinds rests on the model.")
    return tuple(out)


def record_facts(problem: Problem, decision: Decision, *, engine_release: str, planner_version: str = "", date: str = "",
                 baseline: MeasuredBaseline | None = None) -> RecordFacts:
    """Compute the record's figures for `decision` (a pinned layout when problem.pinned is set)."""
    m, w = problem.model, problem.workload
    best = decision.best
    pinned = problem.pinned is not None and best.layout == problem.pinned
    kv_dtype = problem.search.kv_dtypes[0]
    kv_tok = int(kv_bytes_per_token(m, kv_dtype, tp=1, pp=1))
    longest_prompt = math.ceil(w.input_tokens.p99_tokens)
    longest_kv = float(kv_tok) * longest_prompt
    pools = _pools(problem, best.layout)
    single_layout, single_rps = _single_gpu(decision)
    attention = "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_heads else "GQA")
    return RecordFacts(
        model=m.name, precision=problem.precision.value, attention=attention, layers=m.num_layers, kv_heads=m.num_kv_heads,
        head_dim=m.head_dim, params=float(m.total_params), active_params=float(m.active_params_per_token),
        weight_bytes=float(decision.weight_bytes), gpu_memory_bytes=float(problem.gpu.memory_bytes),
        fits_one_gpu=decision.weight_bytes < problem.gpu.memory_bytes, kv_dtype=kv_dtype.value, kv_bytes_per_token=kv_tok,
        kv_formula=_kv_formula(problem, kv_tok), longest_prompt_tokens=longest_prompt, mean_prompt_tokens=float(w.input_tokens.expected_tokens),
        longest_prompt_kv_bytes=longest_kv,
        longest_request_tokens=math.ceil(w.input_tokens.p99_tokens + w.output_tokens.p99_tokens),
        transfer_floors=_floors(problem, longest_kv), binding=_binding(problem, best, pinned=pinned), floors=slo_floors(problem),
        single_gpu_layout=single_layout, single_gpu_rps=single_rps, kv_pool_tokens=pools,
        families=_families(problem, decision, pinned=pinned), candidates_evaluated=len(decision.evaluated),
        candidates_total=decision.candidates_total, simulated=sum(c.prediction.source == "simulated" for c in decision.evaluated),
        decision=best.layout.label_for(problem.engine), decision_gpus=best.layout.gpus, pinned=pinned,
        measurements=_measurements(problem, decision, pools, longest_kv), engine_release=engine_release,
        planner_version=planner_version, date=date, baseline=baseline or MeasuredBaseline(),
    )


def facts_json(facts: RecordFacts) -> dict[str, Any]:
    """The facts as `plan --json` prints them (snake_case; the figures the record renders, unrounded where the
    record rounds them for print)."""
    def r(x: float | None, nd: int = 3) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, nd)
    b = facts.binding
    base = facts.baseline
    return {
        "model": facts.model, "precision": facts.precision, "attention": facts.attention, "layers": facts.layers,
        "kv_heads": facts.kv_heads, "head_dim": facts.head_dim, "params": facts.params, "active_params": facts.active_params,
        "weight_bytes": facts.weight_bytes, "gpu_memory_bytes": facts.gpu_memory_bytes, "fits_one_gpu": facts.fits_one_gpu,
        "kv_dtype": facts.kv_dtype, "kv_bytes_per_token": facts.kv_bytes_per_token, "kv_formula": facts.kv_formula,
        "longest_prompt_tokens": facts.longest_prompt_tokens, "mean_prompt_tokens": facts.mean_prompt_tokens,
        "longest_prompt_kv_bytes": facts.longest_prompt_kv_bytes, "longest_request_tokens": facts.longest_request_tokens,
        "transfer_floors": [{"link": f.link, "gbit": f.gbit, "floor_ms": r(f.floor_ms, 4)} for f in facts.transfer_floors],
        "binding_slo": None if b is None else {
            "slo": b.slo, "at_rps": r(b.at_rps), "ttft_ms": r(b.ttft_ms), "tpot_ms": r(b.tpot_ms), "load_share": r(b.load_share),
            "planned_ttft_share": r(b.planned_ttft_share), "planned_tpot_share": r(b.planned_tpot_share), "margin": b.margin},
        "slo_floors": {"tpot_ms": r(facts.floors.tpot_floor_ms, 4), "ttft_ms": r(facts.floors.ttft_floor_ms, 4), "gpus": facts.floors.gpus,
                       "prompt_tokens": r(facts.floors.prompt_tokens, 1)},
        "single_gpu": {"layout": facts.single_gpu_layout, "rps": r(facts.single_gpu_rps)},
        "kv_pool_tokens": dict(facts.kv_pool_tokens),
        "families": [{"family": f.family.value, "searched": f.searched, "evaluated": f.evaluated, "best": f.best, "best_gpus": f.best_gpus,
                      "best_goodput_per_gpu": r(f.best_goodput_per_gpu, 4), "why": f.why} for f in facts.families],
        "candidates_evaluated": facts.candidates_evaluated, "candidates_total": facts.candidates_total, "simulated": facts.simulated,
        "decision": facts.decision, "decision_gpus": facts.decision_gpus, "pinned": facts.pinned,
        "measurements": list(facts.measurements), "engine_release": facts.engine_release, "planner_version": facts.planner_version,
        "date": facts.date,
        "baseline": {"ttft_ms": base.ttft_ms, "tpot_ms": base.tpot_ms, "goodput_pct": base.goodput_pct, "load_rps": base.load_rps,
                     "layout": base.layout, "at": base.at},
    }


def measured_binding(slo_ttft_ms: float, slo_tpot_ms: float, base: MeasuredBaseline) -> str | None:
    """Which SLO the measured baseline breaks: 'TTFT', 'TPOT', 'TTFT and TPOT', 'neither', or None if not measured."""
    if base.ttft_ms is None or base.tpot_ms is None:
        return None
    over = [name for name, v, s in (("TTFT", base.ttft_ms, slo_ttft_ms), ("TPOT", base.tpot_ms, slo_tpot_ms)) if v > s]
    return " and ".join(over) if over else "neither"

