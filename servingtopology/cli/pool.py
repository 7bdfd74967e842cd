"""`servingtopology plan --pool POOL.yaml`: plan every member of a GPU pool together; print the fleet table and record.

Dispatched from `plan` (cli/plan.py) when --pool is given. `--record FILE.md` writes the fleet decision record,
`--plot FILE.png` draws the allocation per member by GPU kind and $/hour against SLO attainment, `--json` prints one
object; `--record` alone prints the record after the table. Exit 0 planned, 2 invalid pool or member (the message names the field).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from servingtopology.cli.output_paths import PLOT_SUFFIXES, RECORD_SUFFIXES, check_output, write_output
from servingtopology.cli.spec_input import emit_spec_error
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.figure_text import rps_text
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import PoolDecision, PoolProblem, plan_pool
from servingtopology.planner.pool.record import fleet_table, render_pool_record
from servingtopology.pool_spec import load_pool, to_pool_inputs
from servingtopology.spec import SpecError

__all__ = ["run_pool", "decision_json", "pool_figure"]


def decision_json(problem: PoolProblem, d: PoolDecision) -> dict[str, Any]:
    return {
        "objective": d.objective.value, "cost_per_hour": round(d.cost_per_hour, 4), "goodput_rps": round(d.goodput_rps, 4),
        "used": dict(d.used), "idle": dict(d.idle),
        "members": [{"name": a.name, "priority": a.priority, "load_rps": a.load_rps, "capacity_rps": round(a.capacity_rps, 4),
                     "goodput_rps": round(a.goodput_rps, 4), "cost_per_hour": round(a.cost_per_hour, 4), "slo_attainment": round(a.attainment, 4),
                     "met": a.met, "gpus": dict(a.gpus), "why": a.why,
                     "parts": [{"label": p.option.label, "group": p.option.group, "gpus": dict(p.option.gpus), "roles": dict(p.option.role_kinds),
                                "capacity_rps": round(p.option.capacity_rps, 4), "routing_weight": round(p.routing_weight, 4),
                                "entry_pods": p.option.entry_pods,
                                "cost_per_hour": round(p.cost_per_hour, 4)} for p in a.parts]} for a in d.members],
        "shortages": [{"member": s.member, "short_rps": round(s.short_rps, 4), "needs": dict(s.needs), "needs_label": s.needs_label}
                      for s in d.shortages],
        "marginals": [{"member": m.member, "kind": m.kind, "goodput_rps": round(m.goodput_rps, 4), "cost_per_hour": round(m.cost_per_hour, 4),
                       "becomes": m.becomes} for m in d.marginals],
        "solver": {"method": d.solver.method, "options": d.solver.options, "gap": d.solver.gap, "levels": list(d.solver.levels)},
        "reasons": list(d.reasons),
    }


def pool_figure(problem: PoolProblem, d: PoolDecision) -> Any:
    """Two panels: GPUs per member stacked by kind; each member's $/hour against its SLO attainment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [a.name for a in d.members]
    bottom = [0] * len(names)
    for k in problem.kinds:
        vals = [a.gpus.get(k.name, 0) for a in d.members]
        left.bar(names, vals, bottom=bottom, label=f"{k.name} (${k.price_per_hour:g}/h)")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    left.set_ylabel("GPUs")
    left.set_title("allocation per member by GPU kind")
    left.legend()
    left.tick_params(axis="x", rotation=45)
    for a in d.members:
        right.scatter(a.cost_per_hour, a.attainment * 100, s=40)
        right.annotate(a.name, (a.cost_per_hour, a.attainment * 100), textcoords="offset points", xytext=(4, 4), fontsize=8)
    right.set_xlabel("$/hour")
    right.set_ylabel("SLO attainment, % of load within the SLOs")
    right.set_ylim(-5, 105)
    right.set_title(f"{d.objective.value}: ${d.cost_per_hour:.2f}/hour, {rps_text(d.goodput_rps)} req/s goodput")
    fig.tight_layout()
    return fig


def run_pool(args: argparse.Namespace) -> int:
    as_json = bool(getattr(args, "json", False))
    t0 = time.process_time()
    try:
        if args.record and args.record != "-":
            check_output("--record", args.record, suffixes=RECORD_SUFFIXES)
        check_output("--plot", args.plot, suffixes=PLOT_SUFFIXES)
        pool = load_pool(args.pool)
        inputs = to_pool_inputs(pool, base=Path(args.pool).parent)
        requests = [MemberRequest(m.name, m.problem, m.cap_gpus, m.priority, m.min_rps) for m in inputs.members]
        problem, found = build_pool(inputs.kinds, requests, objective=inputs.objective, budget_per_hour=inputs.budget_per_hour,
                                    mixed=inputs.mixed, max_kinds_per_member=inputs.max_kinds_per_member)
        decision = plan_pool(problem)
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(exc, as_json=as_json)
    cpu_s = time.process_time() - t0
    record = render_pool_record(problem, decision, notes={k: v.notes for k, v in found.items()},
                                refusals={k: v.refusals for k, v in found.items()})
    try:
        if args.record and args.record != "-":
            write_output("--record", args.record, lambda target: target.write_text(record))
        if args.plot:
            from servingtopology.cli.plots import save

            save(pool_figure(problem, decision), args.plot)
    except InvalidSpec as exc:
        return emit_spec_error(exc, as_json=as_json)
    if as_json:
        print(json.dumps({**decision_json(problem, decision), "cpu_s": round(cpu_s, 3), "record": record}, indent=1))
        return 0
    print(fleet_table(problem, decision))
    print()
    for line in decision.reasons:
        print(line)
    print(f"solver: {decision.solver.method} over {decision.solver.options} options, gap {decision.solver.gap:.2%}; {cpu_s:.1f} CPU s")
    if args.record == "-":
        print()
        print(record)
    elif args.record:
        print(f"pool decision record written to {args.record}")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0
