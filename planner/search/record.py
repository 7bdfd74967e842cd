"""The topology decision record: a markdown page a person can review and file.

Called by the CLI (`plan --record`, and inside `plan --json`) and the operator (linked from status). Field by
field the one-page topology decision record: model and footprint, KV bytes per token, the longest prompt and its
KV, transfer floors per link, SLOs and which binds, the measured replica baseline (blanks until measured),
candidates evaluated by family, decision and rationale, measurements before approval, release, version, date and
sign-off. Its figures come from planner/search/record_facts.py, which `plan --json` prints too. Pure text.
"""

from __future__ import annotations

import shlex

from servingtopology.planner.arch import ModelArch
from servingtopology.planner.engines.args import layout_engine_args
from servingtopology.planner.engines.caps import load_caps, resolve_version
from servingtopology.planner.figure_text import gpus_text, ms_text, per_gpu_text, rps_text, share_text
from servingtopology.planner.hardware import GIB
from servingtopology.planner.layout import Engine, Layout, Role
from servingtopology.planner.perf.memory import state_bytes_per_seq
from servingtopology.planner.perf.step import ROOFLINE_PREFIX, measured_terms
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.planner.search.record_facts import BLANK, LINKS_GBIT, MeasuredBaseline, RecordFacts, measured_binding, record_facts

__all__ = ["render_record", "fmt_ms", "engine_label", "LINKS_GBIT"]


def fmt_ms(seconds: float) -> str:
    """Milliseconds with three significant figures (214.7 ms → '215 ms', 21.47 ms → '21.5 ms')."""
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms"


def engine_label(problem: Problem) -> str:
    """The engine release the plan is for: `vLLM 0.11.0`; a release the data does not cover says which covered one it
    was planned at: `vLLM 0.19.0 planned as 0.11.0 (the nearest covered release; the capability data does not hold 0.19.0)`."""
    label = load_caps(problem.engine.value, problem.engine_version or resolve_version(problem.engine)).label
    if not problem.engine_version_requested:
        return label
    name, _, version = label.rpartition(" ")
    return (f"{name} {problem.engine_version_requested} planned as {version} (the nearest covered release; the capability data "
            f"does not hold {problem.engine_version_requested})")


def _cand_row(c: Candidate, head: str, engine: Engine) -> str:
    p = c.prediction
    why = f"{head}: {c.why}" if head and c.why and c.why != "pinned by the spec" else (head or c.why)
    return (f"| {c.layout.label_for(engine)} | {c.layout.gpus} | {ms_text(p.ttft_ms)} | {ms_text(p.tpot_ms)} | {rps_text(p.capacity_rps)} | "
            f"{per_gpu_text(p.goodput_per_gpu)} | {p.source} | {why} |")


def _model_notes(m: ModelArch) -> list[str]:
    """What the model reader assumed and which config fields it did not understand (empty when nothing to say)."""
    facts = []
    if m.num_sliding_layers:
        facts.append(f"{m.num_sliding_layers} of {m.num_layers} layers attend to a {m.sliding_window}-token window")
    if m.num_state_layers:
        mib = float(state_bytes_per_seq(m, tp=1)) / 2**20
        facts.append(f"{m.num_state_layers} layers keep a fixed {m.state_kind.value} state per sequence ({mib:.1f} MiB at TP 1)")
    if m.has_indexer:
        facts.append(f"sparse attention over the top {m.index_topk} tokens ({m.num_indexer_layers} indexer layers)")
    if m.checkpoint is not None:
        facts.append(f"checkpoint {m.checkpoint.method}: {', '.join(sorted(g.value for g in m.checkpoint.quantized))}")
    lines = [f"- Model layout: {'; '.join(facts)}."] if facts else []
    lines += [f"- Assumed: {a}." for a in m.assumptions]
    lines += [f"- Warning: {w}." for w in m.warnings]
    return lines


def step_terms_line(problem: Problem, layout: Layout) -> str:
    """Which step-time terms of the layout's instances came from measured kernel tables and which from the roofline."""
    measured: dict[str, str] = {}
    for role in layout.roles.values():
        par = role.parallelism
        ep = par.moe_ep
        for term, source in measured_terms(problem.gpu, problem.engine, problem.engine_version, par.tp, problem.model.hidden_size,
                                           model=problem.model, precision=problem.precision, moe_precision=problem.precision,
                                           dp=par.dp, moe_ep=ep, kv_dtype=role.knobs.kv_dtype).items():
            measured.setdefault(term, source)
    kept = {term: source.removeprefix(ROOFLINE_PREFIX) for term, source in measured.items() if source.startswith(ROOFLINE_PREFIX)}
    measured = {term: source for term, source in measured.items() if term not in kept}
    why = "".join(f" {term} from the roofline: {reason}." for term, reason in sorted(kept.items()))
    if not measured:
        return ("Step time: every term from the roofline with the fitted efficiencies (no measured kernel table covers "
                f"this GPU, engine and group, or the shipped parameters leave them off).{why}")
    named = "; ".join(f"{term} measured ({source})" for term, source in sorted(measured.items()))
    return f"Step time: {named}; the other terms from the roofline with the fitted efficiencies.{why}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _b(x: float | None, fmt: str) -> str:
    return BLANK if x is None else format(x, fmt)


def render_record(problem: Problem, decision: Decision, *, planner_version: str = "", date: str = "",
                  baseline: MeasuredBaseline | None = None, facts: RecordFacts | None = None) -> str:
    """The decision record as markdown, field by field as the one-page topology decision record asks; `facts` when
    the caller computed them already (record_facts with the same arguments), so that its JSON and this page agree."""
    f = facts or record_facts(problem, decision, engine_release=engine_label(problem), planner_version=planner_version, date=date,
                              baseline=baseline)
    m, g, w, slo = problem.model, problem.gpu, problem.workload, problem.slo
    best = decision.best
    tt, tp = f"p{slo.ttft_percentile:g} TTFT", f"p{slo.tpot_percentile:g} TPOT"
    chosen_word = "Pinned" if f.pinned else "Chosen"
    shape = "MLA" if m.is_mla else f"{f.attention}, {f.layers} layers, H_kv={f.kv_heads}, d_head={f.head_dim}"
    formula = f" [{f.kv_formula}]" if f.kv_formula else " (the model reader's sum over its cached layers)"
    lines = [
        f"# Topology decision record: {m.name} on {g.id} ({f.engine_release})",
        "",
        "## Inputs",
        "",
        f"- **Model:** {m.name} {f.precision.upper()} ({shape}): {f.params / 1e9:.2f} B parameters ({f.active_params / 1e9:.2f} B active "
        f"per token){f' plus {m.tower_params / 1e9:.2f} B of vision/audio towers, loaded beside it' if m.tower_params else ''}"
        f"{f', MoE {m.num_experts} experts top-{m.experts_per_token}' if m.is_moe else ''}.",
        f"- **Weight footprint:** {f.weight_bytes / 1e9:.1f} GB ({f.weight_bytes / GIB:.1f} GiB) for one copy; fits one {g.id} "
        f"({g.memory_gib:g} GiB): {'YES' if f.fits_one_gpu else 'NO'}.",
        f"- **KV bytes/token:** {f.kv_bytes_per_token:,} bytes ({f.kv_bytes_per_token / 1024:.1f} KiB){formula}, KV cache "
        f"{f.kv_dtype}, TP 1.",
        f"- **Max prompt P:** {f.longest_prompt_tokens:,} tokens (the workload's p99 prompt; mean {f.mean_prompt_tokens:,.0f}) → "
        f"{f.longest_prompt_kv_bytes / 2**20:,.0f} MiB KV.",
        f"- **Longest request:** {f.longest_request_tokens:,} tokens (p99 prompt + p99 output) of the model's {m.max_context_tokens:,}-token "
        f"context; the {chosen_word.lower()} layout holds {_holds(best, f, m.max_context_tokens)}.",
        f"- **Workload:** {w.arrival_rate_rps:g} req/s, prompts of {f.mean_prompt_tokens:,.0f} tokens on average, outputs of "
        f"{w.output_tokens.expected_tokens:,.0f}, prefix share {w.prefix_share:.0%}.",
        f"- **Hardware:** up to {problem.max_gpus} × {g.name} ({g.memory_gib:g} GiB, {g.hbm_gbps:g} GB/s), {g.gpus_per_node} per node.",
        "- **Single-GPU rate:** " + (f"{per_gpu_text(f.single_gpu_rps)} req/s within the SLOs (predicted for {f.single_gpu_layout}, per GPU); "
                                    if f.single_gpu_rps is not None else "no one-GPU replica meets the SLOs (predicted); ")
        + f"measured: {_b(f.baseline.load_rps if f.baseline.ttft_ms is not None else None, 'g')} req/s (baseline date: {f.baseline.at or BLANK}).",
        f"- **SLOs (client-observed):** {tt} ≤ {slo.ttft_ms:g} ms, {tp} ≤ {slo.tpot_ms:g} ms; objective {problem.objective.value}.",
        f"- **Physical floors:** TPOT {f.floors.tpot_floor_ms:,.2f} ms ({f.floors.tpot_reason()}); TTFT {f.floors.ttft_floor_ms:,.1f} ms "
        f"at the p{slo.ttft_percentile:g} prompt ({f.floors.ttft_reason()}). Necessary, not sufficient: queueing, overheads and "
        "interference come on top.",
    ]
    b = f.binding
    if b is not None:
        with_margin = "" if b.margin == 1.0 else f" (× {b.margin:g} planning margin)"
        limit = {"TTFT": f"{tt} reaches {ms_text(b.ttft_ms)} ms{with_margin} against the {slo.ttft_ms:g} ms SLO",
                 "TPOT": f"{tp} reaches {ms_text(b.tpot_ms)} ms{with_margin} against the {slo.tpot_ms:g} ms SLO",
                 "load": f"the load reaches {share_text(b.load_share, 'what the layout can serve at all')}"}[b.slo]
        nearer = "TTFT" if b.planned_ttft_share >= b.planned_tpot_share else "TPOT"
        where = (f"just past the SLO capacity of {rps_text(b.at_rps)} req/s" if b.at_rps > 0
                 else "it carries nothing within the SLOs: even at the lightest load")
        lines.append(f"- **Binding SLO (predicted):** {b.slo}: {where}, {limit}; at the planned {w.arrival_rate_rps:g} req/s {nearer} is "
                     f"{'the nearer' if max(b.planned_ttft_share, b.planned_tpot_share) <= 1 else 'over its SLO'} ({tt} at "
                     f"{share_text(b.planned_ttft_share, 'its SLO')}, {tp} at {share_text(b.planned_tpot_share, 'its SLO')}).")
    lines += [
        f"- **Interconnect:** {'NVLink' if g.nvlink_gbps > 0 else 'PCIe'} {g.scaleup_gbps:g} GB/s per GPU inside a node; NIC "
        f"{g.nic_gbit:g} Gb/s per GPU.",
        f"- **KV transfer floor @ P={f.longest_prompt_tokens:,}:** "
        + "; ".join(f"{fl.link}: {fmt_ms(fl.floor_ms / 1e3)}" for fl in f.transfer_floors) + ".",
        *_model_notes(m),
        "",
        "Ideal time to move the longest prompt's KV (prefill → decode), before latency and protocol overhead:",
        "",
        "| link | Gb/s | floor |",
        "|---|---|---|",
    ]
    for fl in f.transfer_floors:
        lines.append(f"| {fl.link} | {fl.gbit:g} | {fmt_ms(fl.floor_ms / 1e3)} |")
    base = f.baseline
    measured = measured_binding(slo.ttft_ms, slo.tpot_ms, base)
    lines += [
        "", "## Measured replica baseline", "",
        f"- **{tt}:** {_b(base.ttft_ms, ',.0f')} ms",
        f"- **{tp}:** {_b(base.tpot_ms, ',.1f')} ms",
        f"- **Goodput:** {_b(base.goodput_pct, '.0f')} %",
        f"- **Load:** {_b(base.load_rps, 'g')} req/s on {base.layout or BLANK}, measured {base.at or BLANK}",
        f"- **Binding SLO (measured):** {measured or 'TTFT / TPOT / neither'}",
        "", "## Candidates evaluated", "",
        f"{f.candidates_total:,} candidates enumerated; {f.candidates_evaluated:,} passed the funnel and were evaluated at the load, "
        f"{f.simulated} of them step by step.",
        "",
    ]
    for row in f.families:
        mark = "x" if row.evaluated or row.best else " "
        head = (f"best {row.best} on {gpus_text(row.best_gpus)} ({per_gpu_text(row.best_goodput_per_gpu)} req/s per GPU)" if row.best
                else "none meets the SLOs" if row.evaluated else "none reached the ranking" if row.searched else "not searched")
        if not row.searched:
            lines.append(f"- [ ] {_cap(row.family.value)}: {row.why}.")
            continue
        lines.append(f"- [{mark}] {_cap(row.family.value)} ({row.evaluated:,} evaluated): {head}: {row.why}.")
    lines += ["", "## Decision", "",
              f"- **Decision:** {'pinned by the spec: ' if f.pinned else ''}**{f.decision}** on {gpus_text(f.decision_gpus)} "
              f"({best.prediction.source} prediction: {tt} {ms_text(best.prediction.ttft_ms)} ms, {tp} {ms_text(best.prediction.tpot_ms)} ms, "
              f"{rps_text(best.prediction.capacity_rps)} req/s within the SLOs, {per_gpu_text(best.prediction.goodput_per_gpu)} per GPU).",
              "- **KV pool per rank:** " + ", ".join(f"{role} {tokens:,} tokens" for role, tokens in f.kv_pool_tokens.items()) + ".",
              "- **Rationale:**"]
    lines += [f"  - {r}" for r in decision.reasons]
    lines += [f"  - {_cap(row.family.value)}: {row.why}." for row in f.families if row.best != f.decision]
    lines.append(f"  - {step_terms_line(problem, best.layout)}")
    if decision.pd_ratio is not None:
        r = decision.pd_ratio
        lines += ["", f"Prefill:decode ratio {r.label} ({r.prefill_count} prefill × {r.prefill.label_for(problem.engine)}, {r.decode_count} decode × "
                  f"{r.decode.label_for(problem.engine)}; {r.prefill_rps_per_instance:.2f} and {r.decode_rps_per_instance:.2f} req/s per instance, "
                  f"balanced at {r.balanced:.2f} prefill per decode). The {chosen_word.lower()} layout runs "
                  f"{best.layout.roles[Role.PREFILL].count}:{best.layout.roles[Role.DECODE].count}."]
    lines += ["", "Engine arguments:", ""]
    for role, args in layout_engine_args(problem.engine, best.layout, moe=m.is_moe, version=problem.engine_version,
                                          gpu=problem.gpu.id).items():
        lines.append(f"- {role.value} × {best.layout.roles[role].count}: `{shlex.join(args)}`")
    if decision.current is not None:
        c = decision.current
        lines += ["", f"Current layout {c.layout.label_for(problem.engine)}: {tt} {ms_text(c.prediction.ttft_ms)} ms, {tp} {ms_text(c.prediction.tpot_ms)} ms, "
                  f"{gpus_text(c.layout.gpus)}."]
    lines += ["", "## Alternatives", "", "| layout | GPUs | TTFT ms | TPOT ms | SLO capacity req/s | req/s per GPU | source | why not |",
              "|---|---|---|---|---|---|---|---|", _cand_row(best, "pinned" if f.pinned else "chosen", problem.engine)]
    lines += [_cand_row(a, "", problem.engine) for a in decision.alternatives]
    lines += ["", "## Funnel", "", f"{decision.candidates_total:,} candidates.", "", "| stage | admitted | rejected | seconds | main reasons |",
              "|---|---|---|---|---|"]
    for st in decision.funnel:
        top = ", ".join(f"{k} ({v:,})" for k, v in sorted(st.reasons.items(), key=lambda kv: -kv[1])[:3])
        lines.append(f"| {st.stage} | {st.admitted:,} | {st.rejected:,} | {st.seconds:.3f} | {top} |")
    lines += ["", "## Must measure before approval", ""]
    lines += [f"{i}. {text}" for i, text in enumerate(f.measurements, start=1)]
    lines += [
        "", "## Sign-off", "",
        f"- **Engine release:** {f.engine_release}",
        f"- **Planner version:** servingtopology {f.planner_version or BLANK}",
        f"- **Date:** {f.date or BLANK}",
        f"- **Approval sign-off:** {BLANK * 3}  **Date:** {BLANK * 2}",
    ]
    return "\n".join(lines) + "\n"


def _holds(best: Candidate, f: RecordFacts, context_tokens: int) -> str:
    """What one request may take on the layout: per request on a decode or aggregated rank and, for PD, the prompt a
    prefill rank holds (its pool, at most the context), so neither role's limit is left out (the stage-3 test)."""
    held = f"{best.prediction.max_request_tokens:,} per request"
    prefill = f.kv_pool_tokens.get(Role.PREFILL.value)
    if prefill is None:
        return held
    return f"{held} on a decode rank and prompts of up to {min(prefill, context_tokens):,} on a prefill rank"
