"""`servingtopology plan [SPEC.yaml]`: search layouts, print the funnel, the best plans and a decision record.

With no spec it plans the embedded default scenario. `--json` prints one object; `--record FILE.md`
writes the record; `--plot FILE.png` draws the Pareto frontier. Exit 0 planned, 1 infeasible,
2 invalid spec (the message names the field and the allowed values).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Any

from servingtopology import __version__
from servingtopology.cli.calibration_io import (
    add_calibration_arg,
    calibration_summary,
    interval_text,
    prediction_intervals,
    read_calibration,
)
from servingtopology.cli.commands import MULTINODE_NOTE, role_commands
from servingtopology.cli.manifests import read_grants
from servingtopology.cli.output_paths import PLOT_SUFFIXES, RECORD_SUFFIXES, OutputKind, check_output, write_output
from servingtopology.cli.progress import StageBar, wanted
from servingtopology.cli.spec_input import emit_spec_error, plan_problem, read_spec, simulator_for
from servingtopology.cli.whatif import add_whatif_flags, flagged, whatif_overrides
from servingtopology.planner.engines.args import layout_engine_args
from servingtopology.planner.errors import Infeasible, InvalidSpec, PinRefused
from servingtopology.planner.figure_text import count_text, finite_json, json_number, ms_text, per_gpu_text, rps_text
from servingtopology.planner.layout import layout_to_dict
from servingtopology.planner.problem import Candidate, Decision, FunnelStage, Problem
from servingtopology.planner.search.advice import InfeasibleAdvice
from servingtopology.planner.search.decide import Simulate, decide
from servingtopology.planner.search.record import engine_label, render_record
from servingtopology.planner.search.record_facts import MeasuredBaseline, RecordFacts, baseline_from_observed, facts_json, record_facts
from servingtopology.planner.search.verdict import carries_text, ttft_parts_text, verdict_text
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN
from servingtopology.spec import PlanSpec, SpecError, read_model_identity, read_spec_data

__all__ = ["add_parser", "run", "candidate_json", "funnel_json", "advice_json"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="plan a layout for a spec (default: the embedded scenario)",
                       description="Search candidate layouts and print the funnel, the best plans and a decision record.")
    p.add_argument("spec", nargs="?", help="planning spec (YAML); omit for the embedded default scenario")
    p.add_argument("--pool", metavar="POOL.yaml", help="plan every member of a GPU pool together (cli/pool.py): the fleet table, "
                   "--record the fleet record, --plot allocation by GPU kind and $/hour against SLO attainment")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--record", metavar="FILE.md", nargs="?", const="-",
                   help="the full decision record: alone, on stdout after the summary; with FILE.md, written there")
    p.add_argument("--baseline", metavar="FILE", help="measured replica baseline for the record: a JSON or YAML mapping with ttftMs, "
                   "tpotMs, arrivalRateRps, at (a ServingTopology's status.observed, or the whole resource)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the candidates, the Pareto frontier, the chosen layout and the SLOs (output "
                   "tokens/s per GPU against tokens/s per user, and TTFT: the axes of sweep --plot)")
    p.add_argument("--manifests", metavar="DIR", help="write the objects the operator would apply for this ServingTopology (or "
                   "spec), one YAML file each, planned and built by the operator's own code; check them with "
                   "kubectl apply --dry-run=server -f DIR")
    p.add_argument("--grant", action="append", metavar="GRANT", help="with --manifests: a pod-template grant the operator's "
                   "chart gives the resource's namespace (operator.podTemplatePolicy.allow or .namespaces; repeat or comma-separate); "
                   "without it the templates are checked against the chart's strict default, as the operator checks them")
    p.add_argument("--no-simulate", action="store_true", help="skip stage 6 (step-level simulation of the top K)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_calibration_arg(p)
    add_whatif_flags(p)


def funnel_json(stages: tuple[FunnelStage, ...] | list[FunnelStage]) -> list[dict[str, Any]]:
    return [{"stage": s.stage, "admitted": s.admitted, "rejected": s.rejected, "seconds": round(s.seconds, 6), "reasons": dict(s.reasons)}
            for s in stages]


def _tok_s_per_gpu(capacity_rps: float, out_tokens: float, gpus: int) -> float:
    """Output tokens/s per GPU at the SLO capacity, rounded once (to 0.1) so the JSON and the table print one figure:
    the table's whole number comes from this value, never from the raw float (3149.46 → 3149.5 → "3150" in both)."""
    return round(capacity_rps * out_tokens / max(gpus, 1), 1)


def candidate_json(problem: Problem, c: Candidate, spec: PlanSpec | None = None) -> dict[str, Any]:
    """One candidate in `plan --json`: keys in snake_case; `layout_spec` is the spec's `layout:` block (in the spec's
    camelCase field names) so that a plan can be pinned by pasting it; `engine_commands` (with `spec`) are the
    shell command lines the engine pods run."""
    p = c.prediction
    out_tokens = problem.workload.output_tokens.expected_tokens
    out: dict[str, Any] = {
        "label": c.layout.label_for(problem.engine),
        "gpus": c.layout.gpus,
        "layout_spec": layout_to_dict(c.layout),
        "kv_cache_dtype": next(iter(c.layout.roles.values())).knobs.kv_dtype.value,
        "prediction": {
            "ttft_ms": json_number(p.ttft_ms, 3), "tpot_ms": json_number(p.tpot_ms, 3), "throughput_tok_s": round(p.throughput_tok_s, 1),
            "slo_capacity_rps": round(p.capacity_rps, 3), "slo_capacity_tok_s_per_gpu": _tok_s_per_gpu(p.capacity_rps, out_tokens, c.layout.gpus),
            "goodput_rps": round(p.goodput_rps, 3), "goodput_per_gpu": round(p.goodput_per_gpu, 4),
            "tokens_per_s_per_user": round(p.tokens_per_s_per_user, 2),
            "kv_pool_tokens": p.kv_pool_tokens, "max_request_tokens": p.max_request_tokens, "meets_slo": p.meets_slo, "source": p.source,
        },
        "engine_args": {r.value: a for r, a in layout_engine_args(problem.engine, c.layout, moe=problem.model.is_moe,
                                                                  version=problem.engine_version, gpu=problem.gpu.id).items()},
        "why": c.why,
    }
    if spec is not None:
        out["engine_commands"] = {rc.role.value: {"count": rc.count, "nodes": rc.nodes, "command": rc.leader,
                                                  **({"worker_commands": list(rc.workers)} if rc.workers else {})}
                                  for rc in role_commands(spec, problem, c.layout)}
    return out


def advice_json(advice: InfeasibleAdvice | None) -> dict[str, Any] | None:
    """The infeasible advice in `plan --json` (snake_case; None where a lever alone does not help)."""
    if advice is None:
        return None
    c = advice.closest

    def r(x: float | None, nd: int = 3) -> float | None:
        return None if x is None else round(x, nd)
    return {
        "min_gpus": advice.min_gpus, "min_gpus_layout": advice.min_gpus_layout, "searched_gpus": advice.searched_gpus,
        "budget_gpus": advice.budget_gpus, "gpu": advice.gpu,
        "closest": None if c is None else {"label": c.label, "gpus": c.gpus, "ttft_ms": r(c.ttft_ms), "tpot_ms": r(c.tpot_ms),
                                            "capacity_rps": r(c.capacity_rps)},
        "needed_ttft_ms": r(advice.needed_ttft_ms), "needed_tpot_ms": r(advice.needed_tpot_ms),
        "slo_ttft_ms": advice.slo_ttft_ms, "slo_tpot_ms": advice.slo_tpot_ms,
        "feasible_load_rps": r(advice.feasible_load_rps), "feasible_load_layout": advice.feasible_load_layout,
        "load_rps": advice.load_rps, "floors": list(advice.floors), "lines": list(advice.lines()),
    }


def _print_funnel(stages: tuple[FunnelStage, ...] | list[FunnelStage], total: int | None = None) -> None:
    if total is not None:
        print(f"Funnel: {total:,} candidates")
    print(f"{'stage':<30} {'admitted':>12} {'rejected':>12} {'seconds':>9}  main rejection reasons")
    for s in stages:
        top = ", ".join(f"{k} ({v:,})" for k, v in sorted(s.reasons.items(), key=lambda kv: -kv[1])[:2])
        print(f"{s.stage:<30} {s.admitted:>12,} {s.rejected:>12,} {s.seconds:>9.3f}  {top}")


def _print_best(spec: PlanSpec, problem: Problem, d: Decision) -> None:
    slo = problem.slo
    out_tokens = problem.workload.output_tokens.expected_tokens
    print()
    print(f"{'#':>2} {'layout':<28} {'GPUs':>4} {f'p{slo.ttft_percentile:g} TTFT ms':>13} {f'p{slo.tpot_percentile:g} TPOT ms':>13} "
          f"{'tok/s/user':>10} {'SLO cap. req/s':>14} {'req/s/GPU':>9} {'tok/s/GPU':>9} {'source':>10}")
    for i, c in enumerate((d.best, *d.alternatives)):
        p = c.prediction
        print(f"{i + 1:>2} {c.layout.label_for(problem.engine):<28} {c.layout.gpus:>4} {ms_text(p.ttft_ms):>13} {ms_text(p.tpot_ms):>13} "
              f"{p.tokens_per_s_per_user:>10.1f} {rps_text(p.capacity_rps):>14} {per_gpu_text(p.goodput_per_gpu):>9} "
              f"{_tok_s_per_gpu(p.capacity_rps, out_tokens, c.layout.gpus):>9.0f} {p.source:>10}")
    # The searched layouts' capacity keeps the search's margins (decide's predict_layout searched=True); a pin's, as
    # compare states every layout's, does not: the same layout reads two capacities unless the footer says which.
    margins = (f"with the search's planning margins (latencies × {SLO_MARGIN:g}, the load at most {LOAD_MARGIN:.0%} of what the layout "
               "serves at all)")
    if problem.pinned is None:
        which = f"{margins}; compare and a pinned layout state it without them"
    else:
        which = "the pinned layout's without margins, as compare states it" + (f"; the searched alternatives' {margins}" if d.alternatives else "")
    print(f"   at the load of {problem.workload.arrival_rate_rps:g} req/s; tok/s/user = 1000 / mean TPOT ms; SLO cap. = the highest load "
          f"within both SLOs, {which};\n   req/s/GPU and tok/s/GPU (output tokens) at that capacity, per GPU")
    print()
    release = problem.engine_version or "newest covered release"
    if problem.engine_version_requested:   # NearestCovered: the release asked for is not in the capability data
        release = f"{release}, the nearest covered release to the {problem.engine_version_requested} asked for"
    print(f"Engine commands ({problem.engine.value} {release}, as the engine pods run them):")
    commands = role_commands(spec, problem, d.best.layout)
    for rc in commands:
        print(f"  {rc.role.value} × {rc.count}" + (f", each on {rc.nodes} nodes" if rc.nodes > 1 else "") + ":")
        print(f"    {rc.leader}")
        for node, line in enumerate(rc.workers, start=1):
            print(f"    node {node}: {line}")
    if any(rc.nodes > 1 for rc in commands):
        print(f"  {MULTINODE_NOTE}")
    print()


def _print_intervals(problem: Problem, d: Decision, uncalibrated: Decision | None, calibration: Any, with_intervals: Any) -> None:
    """Nominal 80 % intervals of the best layouts; with a calibration, calibrated beside uncalibrated."""
    slo = problem.slo
    head = f"p{slo.ttft_percentile:g} TTFT ms [80 %]", f"p{slo.tpot_percentile:g} TPOT ms [80 %]"
    if calibration is None or uncalibrated is None:
        print("80 % intervals (from the model's leave-one-model-out error on the layout's class; servingtopology calibrate narrows them):")
        print(f"  {'layout':<28} {head[0]:>26} {head[1]:>24}")
        for c in (d.best, *d.alternatives):
            iv = with_intervals(c, None)["prediction"]["intervals"]
            label = c.layout.label_for(problem.engine)
            print(f"  {label:<28} {interval_text(iv['ttft_ms']):>26} {interval_text(iv['tpot_ms']):>24}  class {iv['ttft_ms']['class']}")
        print()
        return
    dep = calibration.deployment
    print(f"Calibration {dep.model} on {dep.gpu}, {dep.engine} {dep.release}: {count_text(calibration.points_used, 'point')}; factors "
          + ", ".join(f"{k} {v:.2f}" for k, v in calibration.factors.items() if abs(v - 1.0) > 0.005))
    print(f"  {'':14}{'layout':<28} {head[0]:>26} {head[1]:>24}")
    for name, dec, cal in (("uncalibrated", uncalibrated, None), ("calibrated", d, calibration)):
        for i, c in enumerate((dec.best, *dec.alternatives)):
            iv = with_intervals(c, cal)["prediction"]["intervals"]
            label = c.layout.label_for(problem.engine)
            print(f"  {name if i == 0 else '':14}{label:<28} {interval_text(iv['ttft_ms']):>26} {interval_text(iv['tpot_ms']):>24}")
    print()


def _plot(d: Decision, problem: Problem, path: str) -> None:
    from servingtopology.cli.plots import plan_figure, save

    save(plan_figure(d, problem), path)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "pool", None):
        from servingtopology.cli.pool import run_pool

        return run_pool(args)
    manifests = getattr(args, "manifests", None)
    try:
        check_outputs(args)
        if manifests and getattr(args, "calibration", None):
            raise InvalidSpec("--calibration", "not with --manifests: the operator applies a resource's own spec.calibration, so "
                                               "the objects written could not be the calibrated plan printed")
        if getattr(args, "grant", None) and not manifests:
            raise InvalidSpec("--grant", "only with --manifests: it is the policy the written objects are checked against")
        granted = read_grants(getattr(args, "grant", None))
        spec = read_spec(args.spec, whatif_overrides(args), as_resource=bool(manifests))
        problem = plan_problem(spec)
        read_model_identity(spec)   # the plan renders engine commands: what they load and serve is named before planning
        calibration = read_calibration(args.calibration, problem) if getattr(args, "calibration", None) else None
        baseline = read_baseline(args.baseline)
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(flagged(exc, whatif_overrides(args, strict=False)), as_json=args.json)
    bar = StageBar(enabled=wanted(args))
    progress = None
    if wanted(args):
        def progress(stage: str, fraction: float) -> None:
            bar.stage("funnel", 5, unit="stage")
            bar.at(round(fraction * 5), stage)

    def simulator() -> Simulate | None:
        """Stage 6's simulator, each candidate it simulates counted on the bar (the funnel's stages take a second; the
        simulations of a large model take the minutes)."""
        return None if args.no_simulate else bar.simulating(simulator_for(spec))
    uncalibrated: Decision | None = None
    try:
        if manifests:
            # One decision: the objects written and everything printed below come from this one plan, made as the
            # operator makes it (its stage 6), or without stage 6 where --no-simulate says so.
            from servingtopology.cli.manifests import write_manifests
            from servingtopology.operator.api.resource import TopologySpec

            assert isinstance(spec, TopologySpec)
            # Stage 6 is the operator's own (simulator_for: planner.sim.stage.stage6_figures), counted on the bar and timed
            # like plan's, so the funnel printed beside the objects states each stage's seconds.
            offline = write_manifests(args.spec, spec, manifests, granted=granted,
                                      planner=lambda p: decide(p, simulate=simulator(), progress=progress, clock=time.perf_counter))
            problem, decision = offline.problem, offline.decision
        else:
            decision = decide(problem, simulate=simulator(), progress=progress, clock=time.perf_counter)
        if calibration is not None:
            # The same search with the deployment's correction applied; the uncalibrated decision is shown beside it.
            uncalibrated = decision
            with calibration.applied():
                decision = decide(problem, simulate=simulator(), clock=time.perf_counter)
    except Infeasible as exc:
        bar.close()
        funnel = [s for s in exc.funnel if isinstance(s, FunnelStage)]
        if manifests:
            print(f"nothing written to {manifests}", file=sys.stderr)
        if isinstance(exc, PinRefused):   # the pinned layout fails a check of the search's: no funnel ran
            if args.json:
                print(json.dumps({"error": "infeasible", "pinned": True, "stage": exc.stage, "field": exc.field, "message": exc.message}))
            else:
                print(f"The pinned layout cannot run: the search's stage '{exc.stage}' would refuse it.\n{exc.field}: {exc.message}")
        elif args.json:
            print(json.dumps({"error": "infeasible", "stage": exc.stage, "closest_miss": exc.closest_miss,
                              "advice": advice_json(exc.advice), "funnel": funnel_json(funnel)}))
        else:
            _print_funnel(funnel)
            print(f"\nNo feasible layout: stage '{exc.stage}' removed the last candidates.\nClosest miss: {exc.closest_miss}")
            if exc.advice is not None:
                print("What would make it feasible:")
                for line in exc.advice.lines():
                    print(f"  - {line}")
        return 1
    except (SpecError, InvalidSpec) as exc:
        bar.close()
        return emit_spec_error(exc, as_json=args.json)
    bar.close()
    facts = record_facts(problem, decision, engine_release=engine_label(problem), planner_version=__version__,
                         date=datetime.datetime.now(datetime.UTC).date().isoformat(), baseline=baseline)
    record = render_record(problem, decision, facts=facts)
    try:
        if args.record and args.record != "-":
            write_output("--record", args.record, lambda target: target.write_text(record))
        if args.plot:
            _plot(decision, problem, args.plot)
    except InvalidSpec as exc:
        return emit_spec_error(exc, as_json=args.json)

    def with_intervals(c: Candidate, cal: Any) -> dict[str, Any]:
        out = candidate_json(problem, c, spec)
        out["prediction"]["intervals"] = prediction_intervals(problem, c.layout, c.prediction.ttft_ms, c.prediction.tpot_ms, cal)
        return out
    extra: dict[str, Any] = {}
    if calibration is not None and uncalibrated is not None:
        extra = {"calibration": calibration_summary(calibration, args.calibration),
                 "uncalibrated": {"best": with_intervals(uncalibrated.best, None),
                                  "alternatives": [with_intervals(c, None) for c in uncalibrated.alternatives]}}
    if args.json:
        print(json.dumps(finite_json({
            **({"plot": args.plot} if args.plot else {}),
            "funnel": funnel_json(decision.funnel),
            "candidates_total": decision.candidates_total,
            "best": with_intervals(decision.best, calibration),
            "alternatives": [with_intervals(c, calibration) for c in decision.alternatives],
            **extra,
            "kv_bytes_per_token": decision.kv_bytes_per_token,
            "weight_bytes": decision.weight_bytes,
            "reasons": list(decision.reasons),
            "decision_record": facts_json(facts),
            "record": record,
        }), indent=1))
        return 0
    _print_funnel(decision.funnel, decision.candidates_total)
    _print_best(spec, problem, decision)
    _print_intervals(problem, decision, uncalibrated, calibration, with_intervals)
    _print_summary(problem, decision, facts)
    if args.record == "-":
        print()
        print(record)
    elif args.record:
        print(f"decision record written to {args.record}")
    else:
        print("the full decision record (the one-page form to file): --record, or --record FILE.md")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def check_record_path(path: str | None) -> None:
    """`--record` takes `-` (stdout) or a markdown file: a spec given after `--record` would otherwise be overwritten."""
    if path and path != "-" and not path.lower().endswith(RECORD_SUFFIXES):
        raise InvalidSpec("--record", f"expected a markdown file (FILE.md) or nothing, got {path!r}; to plan a spec and print the "
                                      "record, give the spec first: plan SPEC.yaml --record")
    if path and path != "-":
        check_output("--record", path, suffixes=RECORD_SUFFIXES)


def check_outputs(args: argparse.Namespace) -> None:
    """Every path `plan` (and `plan --pool`) writes, checked before any planning (cli/output_paths.py, CheckedUpFront)."""
    check_record_path(args.record)
    check_output("--plot", args.plot, suffixes=PLOT_SUFFIXES)
    check_output("--manifests", getattr(args, "manifests", None), kind=OutputKind.DIRECTORY)


def read_baseline(path: str | None) -> MeasuredBaseline | None:
    """The measured replica baseline from a JSON or YAML file: status.observed's fields, or a resource holding them."""
    if path is None:
        return None
    data = read_spec_data(path)   # bounded, UTF-8, duplicate keys refused
    if isinstance(data, dict) and isinstance(data.get("status"), dict):
        data = data["status"].get("observed") or {}
    if not isinstance(data, dict):
        raise InvalidSpec("--baseline", f"{path}: expected a mapping with ttftMs, tpotMs, arrivalRateRps, at (a status.observed)")
    layout = (data.get("layout") if isinstance(data.get("layout"), str) else None)
    return baseline_from_observed(data, layout=layout)


def _print_summary(problem: Problem, d: Decision, facts: RecordFacts) -> None:
    """The decision in a few lines: the layout, which SLO binds, why the other kinds lost, what to measure first."""
    best = d.best
    p = best.prediction
    word = "Pinned" if facts.pinned else "Decision"
    # The verdict and what the layout carries, in the record's own sentences (planner.search.verdict): a pin that misses
    # says so, and where the simulated run and the analytical SLO capacity disagree, which one the verdict rests on.
    print(f"{word}: {verdict_text(problem, best.layout, p)}\n  {carries_text(problem, best.layout, p)}")
    parts = ttft_parts_text(problem, best.layout, p)
    if parts is not None:
        print(f"  {parts}")
    b = facts.binding
    if b is not None:
        print(f"Binding SLO: {b.slo} " + (f"(what stops it just past {rps_text(b.at_rps)} req/s)" if b.at_rps > 0
                                          else "(missed even at the lightest load)"))
    for row in facts.families:
        if row.best != facts.decision and row.searched:
            print(f"  {row.family.value}: {row.why}")
