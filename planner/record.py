"""The topology decision record: a markdown page a person can review and file.

Called by the CLI (`plan --record`, and inside `plan --json`) and the operator (linked from status).
Holds the model and memory facts, the KV transfer floors per link, the chosen layout and why, the
alternatives and why not, the funnel, and what must be measured before approval. Pure text.
"""

from __future__ import annotations

import math
import shlex

from .arch import ModelArch
from .engine_args import layout_engine_args
from .engine_caps import load_caps, resolve_version
from .hardware import GIB
from .layout import Layout, Role
from .memory import kv_bytes_per_token, state_bytes_per_seq, transfer_floor_s
from .perf import measured_terms
from .problem import Candidate, Decision, Problem

__all__ = ["render_record", "transfer_floors", "fmt_ms", "LINKS_GBIT"]

# Links a KV transfer may cross, in Gb/s: common Ethernet speeds, then the GPU's own NIC and scale-up link.
LINKS_GBIT = (10.0, 25.0, 100.0, 200.0, 400.0)


def fmt_ms(seconds: float) -> str:
    """Milliseconds with three significant figures (214.7 ms → '215 ms', 21.47 ms → '21.5 ms')."""
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms"


def transfer_floors(problem: Problem, prompt_tokens: float) -> list[tuple[str, float, float]]:
    """(link, Gb/s, ideal seconds) to move one prompt's KV at TP 1 over each link."""
    nbytes = prompt_tokens * float(kv_bytes_per_token(problem.model, problem.search.kv_dtypes[0], tp=1, pp=1))
    gpu = problem.gpu
    rows = [(f"{g:g} Gb/s Ethernet", g, transfer_floor_s(nbytes, link_gbit=g)) for g in LINKS_GBIT]
    rows.append((f"{gpu.id} NIC ({gpu.nic_gbit:g} Gb/s per GPU)", gpu.nic_gbit, transfer_floor_s(nbytes, link_gbit=gpu.nic_gbit)))
    link = "NVLink" if gpu.nvlink_gbps > 0 else "PCIe"
    rows.append((f"{link} inside a node ({gpu.scaleup_gbps:g} GB/s)", gpu.scaleup_gbps * 8, transfer_floor_s(nbytes, link_gbit=gpu.scaleup_gbps * 8)))
    return rows


def engine_label(problem: Problem) -> str:
    """The engine release the plan is for: `vLLM 0.11.0`."""
    return load_caps(problem.engine.value, problem.engine_version or resolve_version(problem.engine)).label


def _cand_row(c: Candidate) -> str:
    p = c.prediction
    return (f"| {c.layout.label} | {c.layout.gpus} | {p.ttft_ms:.0f} | {p.tpot_ms:.1f} | {p.capacity_rps:.1f} | "
            f"{p.goodput_per_gpu:.2f} | {p.source} | {c.why or 'chosen'} |")


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
        ep = par.tp * par.dp if par.ep else 1
        for term, source in measured_terms(problem.gpu, problem.engine, problem.engine_version, par.tp, problem.model.hidden_size,
                                           model=problem.model, moe_precision=problem.precision, dp=par.dp, moe_ep=ep).items():
            measured.setdefault(term, source)
    if not measured:
        return ("Step time: every term from the roofline with the fitted efficiencies (no measured kernel table covers "
                "this GPU, engine and group, or the shipped parameters leave them off).")
    named = "; ".join(f"{term} measured ({source})" for term, source in sorted(measured.items()))
    return f"Step time: {named}; the other terms from the roofline with the fitted efficiencies."


def render_record(problem: Problem, decision: Decision) -> str:
    """The decision record as markdown."""
    m, g, w, slo = problem.model, problem.gpu, problem.workload, problem.slo
    best = decision.best
    prompt = w.input_tokens.expected_tokens
    kv_tok = decision.kv_bytes_per_token
    prompt_bytes = kv_tok * prompt
    lines = [
        f"# Topology decision record: {m.name} on {g.id} ({engine_label(problem)})",
        "",
        "## Inputs",
        f"- Model: {m.name}: {m.total_params / 1e9:.2f} B parameters ({m.active_params_per_token / 1e9:.2f} B active per token)"
        f"{f' plus {m.tower_params / 1e9:.2f} B of vision/audio towers, loaded beside it' if m.tower_params else ''}, "
        f"{m.num_layers} layers, {'MLA' if m.is_mla else f'{m.num_heads} heads / {m.num_kv_heads} KV heads'}"
        f"{f', MoE {m.num_experts} experts top-{m.experts_per_token}' if m.is_moe else ''}.",
        f"- Weights at {problem.precision.value}: {decision.weight_bytes / GIB:.1f} GiB ({decision.weight_bytes / 1e9:.1f} GB) for one copy.",
        f"- KV cache ({problem.search.kv_dtypes[0].value}): {kv_tok:,} bytes per token at TP 1 ({kv_tok / 1024:.1f} KiB); "
        f"a {prompt:.0f}-token prompt holds {prompt_bytes / 2**20:.0f} MiB.",
        f"- Hardware: up to {problem.max_gpus} × {g.name} ({g.memory_gib:g} GiB, {g.hbm_gbps:g} GB/s), {g.gpus_per_node} per node.",
        f"- Workload: {w.arrival_rate_rps:g} req/s, prompts of {prompt:.0f} tokens on average, outputs of "
        f"{w.output_tokens.expected_tokens:.0f}, prefix share {w.prefix_share:.0%}; the longest request planned for is "
        f"{math.ceil(w.input_tokens.p99_tokens + w.output_tokens.p99_tokens):,} tokens (p99 prompt + p99 output) of the model's "
        f"{m.max_context_tokens:,}-token context; the chosen layout holds {best.prediction.max_request_tokens:,} per request.",
        f"- SLOs: p{slo.ttft_percentile:g} TTFT ≤ {slo.ttft_ms:g} ms, p{slo.tpot_percentile:g} TPOT ≤ {slo.tpot_ms:g} ms; "
        f"objective {problem.objective.value}.",
        *_model_notes(m),
        "",
        "## KV transfer floors for one prompt (prefill → decode)",
        "",
        "Ideal time to move the prompt's KV, before latency and protocol overhead:",
        "",
        "| link | Gb/s | floor |",
        "|---|---|---|",
    ]
    for name, gbit, secs in transfer_floors(problem, prompt):
        lines.append(f"| {name} | {gbit:g} | {fmt_ms(secs)} |")
    lines += ["", "## Chosen layout", "", f"**{best.layout.label}** on {best.layout.gpus} GPUs "
              f"({best.prediction.source} prediction: p{slo.ttft_percentile:g} TTFT {best.prediction.ttft_ms:.0f} ms, "
              f"p{slo.tpot_percentile:g} TPOT {best.prediction.tpot_ms:.1f} ms, KV pool {best.prediction.kv_pool_tokens:,} tokens per rank).", ""]
    lines += [f"- {r}" for r in decision.reasons]
    lines.append(f"- {step_terms_line(problem, best.layout)}")
    if decision.pd_ratio is not None:
        r = decision.pd_ratio
        lines += ["", f"Prefill:decode ratio {r.label} ({r.prefill_count} prefill × {r.prefill.label}, {r.decode_count} decode × "
                  f"{r.decode.label}; {r.prefill_rps_per_instance:.2f} and {r.decode_rps_per_instance:.2f} req/s per instance, "
                  f"balanced at {r.balanced:.2f} prefill per decode). The chosen layout runs "
                  f"{best.layout.roles[Role.PREFILL].count}:{best.layout.roles[Role.DECODE].count}."]
    lines += ["", "Engine arguments:", ""]
    for role, args in layout_engine_args(problem.engine, best.layout, moe=m.is_moe, version=problem.engine_version).items():
        lines.append(f"- {role.value} × {best.layout.roles[role].count}: `{shlex.join(args)}`")
    if decision.current is not None:
        c = decision.current
        lines += ["", f"Current layout {c.layout.label}: p{slo.ttft_percentile:g} TTFT {c.prediction.ttft_ms:.0f} ms, "
                  f"p{slo.tpot_percentile:g} TPOT {c.prediction.tpot_ms:.1f} ms, {c.layout.gpus} GPUs."]
    lines += ["", "## Alternatives", "", "| layout | GPUs | TTFT ms | TPOT ms | SLO capacity req/s | req/s per GPU | source | why not |",
              "|---|---|---|---|---|---|---|---|", _cand_row(best)]
    lines += [_cand_row(a) for a in decision.alternatives]
    lines += ["", "## Funnel", "", f"{decision.candidates_total:,} candidates.", "", "| stage | admitted | rejected | seconds | main reasons |",
              "|---|---|---|---|---|"]
    for st in decision.funnel:
        top = ", ".join(f"{k} ({v:,})" for k, v in sorted(st.reasons.items(), key=lambda kv: -kv[1])[:3])
        lines.append(f"| {st.stage} | {st.admitted:,} | {st.rejected:,} | {st.seconds:.3f} | {top} |")
    kv_predicted = best.prediction.kv_pool_tokens
    lines += [
        "", "## Measure before approval", "",
        f"1. The KV pool the engine reports at start-up (vLLM `GPU KV cache size` or `vllm:cache_config_info` num_gpu_blocks × block size; "
        f"SGLang `max_total_num_tokens`) against the predicted {kv_predicted:,} tokens per rank.",
        f"2. p{slo.ttft_percentile:g} TTFT and p{slo.tpot_percentile:g} TPOT of {best.layout.label} under an open-loop benchmark at "
        f"{w.arrival_rate_rps:g} req/s with the production prompt and output lengths (prediction error above 20% invalidates the ranking).",
        f"3. The load at which the SLOs break, against the predicted {best.prediction.capacity_rps:.1f} req/s.",
    ]
    if any(a.layout.kind != best.layout.kind for a in decision.alternatives):
        lines.append("4. The best alternative of the other layout kind at the same load, since the choice between kinds rests on the model.")
    if best.layout.kind.value == "pd":
        lines.append("5. The achieved KV transfer bandwidth between prefill and decode pods against the floors above.")
    return "\n".join(lines) + "\n"
