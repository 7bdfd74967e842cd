"""The fleet decision record and table of a pool plan: per member $/hour, goodput and SLO attainment; idle GPUs by kind.

Called by the CLI (`plan --pool`, `--record`) and the benchmarks. Text only (Markdown); pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from servingtopology.planner.figure_text import rps_text
from servingtopology.planner.perf.mixed_pd import MixedRefusal
from servingtopology.planner.pool.plan import PoolDecision, PoolProblem

__all__ = ["fleet_table", "render_pool_record"]


def fleet_table(problem: PoolProblem, d: PoolDecision) -> str:
    """One row per member: parts, GPUs by kind, $/hour, capacity, load, goodput, attainment; then the fleet's totals."""
    kinds = [k.name for k in problem.kinds]
    head = f"{'member':<16} {'prio':>4} {'layout':<44} " + " ".join(f"{k:>6}" for k in kinds) + \
        f" {'$/hour':>8} {'cap rps':>8} {'load':>7} {'goodput':>8} {'SLO att.':>8}"
    lines = [head]
    for a in d.members:
        label = " + ".join(p.option.label for p in a.parts) or "(none)"
        lines.append(f"{a.name:<16} {a.priority:>4} {label[:44]:<44} " + " ".join(f"{a.gpus.get(k, 0):>6}" for k in kinds) +
                     f" {a.cost_per_hour:>8.2f} {rps_text(a.capacity_rps):>8} {rps_text(a.load_rps):>7} {rps_text(a.goodput_rps):>8} "
                     f"{a.attainment:>8.0%}")
    lines.append(f"{'fleet':<16} {'':>4} {'':<44} " + " ".join(f"{d.used[k]:>6}" for k in kinds) +
                 f" {d.cost_per_hour:>8.2f} {'':>8} {rps_text(sum(a.load_rps for a in d.members)):>7} {rps_text(d.goodput_rps):>8}")
    lines.append(f"{'idle':<16} {'':>4} {'':<44} " + " ".join(f"{d.idle[k]:>6}" for k in kinds))
    return "\n".join(lines)


def render_pool_record(problem: PoolProblem, d: PoolDecision, *, notes: Mapping[str, tuple[str, ...]] | None = None,
                       refusals: Mapping[str, tuple[tuple[str, MixedRefusal], ...]] | None = None) -> str:
    """The pool's decision record (Markdown)."""
    out = ["# Pool decision record", ""]
    out.append(f"Objective: **{problem.objective.value}**" + (f" within ${problem.budget_per_hour:g}/hour" if problem.budget_per_hour else ""))
    out.append("")
    out.append("| kind | GPU | count | $/GPU-hour | NIC Gb/s | used | idle |")
    out.append("|---|---|---|---|---|---|---|")
    for k in problem.kinds:
        out.append(f"| {k.name} | {k.gpu.id} | {k.count} | {k.price_per_hour:g} | {k.nic_gbit:g} | {d.used[k.name]} | {d.idle[k.name]} |")
    out += ["", "## Fleet", ""]
    good_per_dollar = d.goodput_rps * 3600.0 / d.cost_per_hour if d.cost_per_hour > 0 else 0.0
    out.append(f"- $/hour: **{d.cost_per_hour:.2f}**; goodput **{rps_text(d.goodput_rps)} req/s**; "
               f"{good_per_dollar:,.0f} requests within the SLOs per $")
    out += [f"- {r}" for r in d.reasons]
    out += ["", "## Members", "",
            "| member | priority | parts (traffic share: entry pods) | GPUs | $/hour | SLO capacity req/s | load req/s | goodput req/s | SLO attainment |",
            "|---|---|---|---|---|---|---|---|---|"]
    for a in d.members:
        parts = "; ".join(f"{p.option.label} ({p.routing_weight:.0%}: {p.option.entry_pods} pods)" for p in a.parts) or "none"
        gpus = ", ".join(f"{v} {k}" for k, v in a.gpus.items()) or "0"
        out.append(f"| {a.name} | {a.priority} | {parts} | {gpus} | {a.cost_per_hour:.2f} | {rps_text(a.capacity_rps)} | {a.load_rps:g} | "
                   f"{rps_text(a.goodput_rps)} | {a.attainment:.0%} |")
    out += ["", "### Why", ""]
    out += [f"- **{a.name}**: {a.why}" for a in d.members]
    out += ["", "## Short", ""]
    if d.shortages:
        for s in d.shortages:
            need = ", ".join(f"{v} more {k}" for k, v in s.needs.items())
            out.append(f"- {s.member}: short by {rps_text(s.short_rps)} req/s; " + (f"needs {need} ({s.needs_label})" if s.needs else s.needs_label))
    else:
        out.append("- nobody: every member's load is met within its SLOs")
    out += ["", "## Marginal value of one more GPU", ""]
    if d.marginals:
        out += ["| member | kind | Δ goodput req/s | Δ $/hour | would run |", "|---|---|---|---|---|"]
        out += [f"| {m.member} | {m.kind} | {m.goodput_rps:+.2f} | {m.cost_per_hour:+.2f} | {m.becomes} |" for m in d.marginals]
    else:
        out.append("- none: one more GPU of any kind changes no member's goodput or lowers its $/hour")
    if refusals and any(refusals.values()):
        out += ["", "## Mixed-kind prefill/decode refused", ""]
        for member, rows in refusals.items():
            out += [f"- {member} {group}: {r.rule}: {r.reason}" for group, r in rows]
    if notes and any(notes.values()):
        out += ["", "## Options not offered", ""]
        for member, lines in notes.items():
            out += [f"- {member}: {n}" for n in lines]
    out += ["", "## Solver", "", f"- {d.solver.method} over {d.solver.options} options; gap {d.solver.gap:.2%}"]
    out += [f"- {line}" for line in d.solver.levels]
    return "\n".join(out) + "\n"
