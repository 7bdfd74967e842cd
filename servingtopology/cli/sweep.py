"""`servingtopology sweep SPEC.yaml --concurrency 1,2,4,...`: the serving envelope of one layout.

For each concurrency, a closed-loop run (that many clients, each sending its next request when the
last one ends, lengths from the spec's workload) on the spec's layout, or the planner's best: output
throughput per GPU, tokens/s per user (1000 / mean TPOT), TTFT and inter-token p50/p99. Prints a
table, `--json`, and `--plot FILE.png` (throughput per GPU against tokens/s per user, labelled by
concurrency). Exit 0 done, 1 infeasible, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from typing import Any

from servingtopology.cli.calibration_io import add_calibration_arg, calibration_summary, prediction_intervals, read_calibration
from servingtopology.cli.output_paths import PLOT_SUFFIXES, check_output
from servingtopology.cli.progress import StageBar, wanted
from servingtopology.cli.spec_input import emit_spec_error, layout_for, read_spec
from servingtopology.cli.whatif import add_whatif_flags, flagged, whatif_overrides
from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.figure_text import gpus_text
from servingtopology.planner.layout import Layout
from servingtopology.planner.problem import Problem
from servingtopology.planner.sim import from_workload, simulate
from servingtopology.planner.workload import Slo
from servingtopology.spec import MAX_CONCURRENCY, MAX_SIM_REQUESTS, SpecError, to_problem

__all__ = ["add_parser", "run", "sweep_points", "parse_concurrency"]

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="serving envelope of a layout over client concurrency",
                       description="Closed-loop simulations at each concurrency: throughput per GPU against tokens/s per user.")
    p.add_argument("spec", nargs="?", help="planning spec (YAML); its layout, or the planner's best (omit for the embedded default "
                   "scenario)")
    p.add_argument("--layout", action="append", default=[], metavar="[NAME=]LAYOUT",
                   help="sweep this layout instead (compare's syntax: A=8xTP1, B=4xTP2, C=2P6D); repeat to overlay several "
                        "layouts' envelopes on one table and plot")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help=f"comma-separated client counts (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--requests-per-client", type=int, default=8, help="requests each client sends (default 8; at least 200 in all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (drawn on a terminal's stderr only)")
    p.add_argument("--plot", metavar="FILE.png", help="draw output tokens/s per GPU against tokens/s per user, and TTFT, with the SLOs "
                   "(the axes of plan --plot)")
    add_calibration_arg(p)
    add_whatif_flags(p)


def parse_concurrency(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every entry a positive integer up to MAX_CONCURRENCY, at most MAX_POINTS entries."""
    shown = text if len(text) <= 80 else text[:60] + f"... ({len(text):,} characters)"
    try:
        values = [int(x) for x in text[:4096].split(",") if x.strip()]
    except ValueError:
        raise InvalidSpec("--concurrency", f"expected comma-separated positive integers, got {shown!r}") from None
    if not values or min(values) < 1 or len(text) > 4096:
        raise InvalidSpec("--concurrency", f"expected comma-separated positive integers, got {shown!r}")
    if len(values) > MAX_POINTS or max(values) > MAX_CONCURRENCY:
        raise InvalidSpec("--concurrency", f"at most {MAX_POINTS} points of at most {MAX_CONCURRENCY:,} clients each (issue #17: bounded work)")
    return values


MAX_POINTS = 64


def check_requests(concurrency: list[int], per_client: int) -> None:
    """Each point simulates max(per_client x c, 200) requests: held to the spec's bound on simulation.requests."""
    if per_client * max(concurrency) > MAX_SIM_REQUESTS:
        raise InvalidSpec("--requests-per-client", f"{per_client} x {max(concurrency):,} clients: each point may simulate at most "
                                                   f"{MAX_SIM_REQUESTS:,} requests")


def _r(x: float, nd: int = 3) -> float | None:
    return round(x, nd) if math.isfinite(x) else None


def sweep_points(problem: Problem, layout: Layout, concurrency: list[int], *, seed: int, per_client: int,
                 bar: StageBar | None = None, stage: str = "sweep") -> list[dict[str, Any]]:
    """One closed-loop simulation per concurrency; the first `c` requests (the ramp) are left out. `bar` counts the points."""
    points = []
    for i, c in enumerate(concurrency):
        if bar is not None:
            bar.stage(stage, len(concurrency), unit="point")
            bar.at(i, f"{c} clients")
        n = max(per_client * c, 200)
        workload = replace(problem.workload, arrival_rate_rps=None, concurrency=c)
        requests = from_workload(workload, num_requests=n, seed=seed)
        t0 = time.perf_counter()
        result = simulate(layout, model=problem.model, gpu=problem.gpu, engine=problem.engine, requests=requests,
                          precision=problem.precision)
        wall = time.perf_counter() - t0
        s = result.summary(problem.slo, warmup_requests=c)
        points.append({
            "concurrency": c,
            "requests": n,
            "throughput_tok_s": _r(s.throughput_tok_s, 1),
            "throughput_tok_s_per_gpu": _r(s.throughput_tok_s_per_gpu, 1),
            "tokens_per_s_per_user": _r(1000.0 / s.tpot_ms.mean if s.tpot_ms.mean > 0 else math.nan, 2),
            "ttft_ms": {"p50": _r(s.ttft_ms.p50), "p95": _r(s.ttft_ms.p95), "p99": _r(s.ttft_ms.p99)},
            "itl_ms": {"p50": _r(s.itl_ms.p50), "p99": _r(s.itl_ms.p99)},
            "tpot_ms": {"mean": _r(s.tpot_ms.mean), "p50": _r(s.tpot_ms.p50), "p95": _r(s.tpot_ms.p95), "p99": _r(s.tpot_ms.p99)},
            "goodput_rps": _r(s.goodput_rps),
            "preemptions": s.preemptions,
            "unfinished": s.unfinished,
            "wall_s": round(wall, 4),
        })
        if bar is not None:
            bar.at(i + 1, f"{c} clients")
    return points


def _add_intervals(problem: Problem, layout: Layout, points: list[dict[str, Any]], calibration: Any) -> None:
    """Each point's nominal 80 % intervals of its p50 TTFT and mean TPOT (planner.live.error_bars; the load bucket is its clients)."""
    for p in points:
        clients = replace(problem, workload=replace(problem.workload, arrival_rate_rps=None, concurrency=p["concurrency"]))
        ttft, tpot = p["ttft_ms"]["p50"], p["tpot_ms"]["mean"]
        iv = prediction_intervals(clients, layout, ttft if ttft is not None else math.nan, tpot if tpot is not None else math.nan, calibration)
        p["intervals"] = {"ttft_ms_p50": iv["ttft_ms"], "tpot_ms_mean": iv["tpot_ms"]}


def _print_intervals(points: list[dict[str, Any]], calibrated: list[dict[str, Any]] | None) -> None:
    from servingtopology.cli.calibration_io import interval_text

    print("nominal 80 % intervals, TTFT p50 and TPOT mean (ms)" + (": uncalibrated | calibrated" if calibrated else ""))
    for i, p in enumerate(points):
        line = f"{p['concurrency']:>7}  {interval_text(p['intervals']['ttft_ms_p50']):>24} {interval_text(p['intervals']['tpot_ms_mean']):>22}"
        if calibrated:
            c = calibrated[i]["intervals"]
            line += f"  | {interval_text(c['ttft_ms_p50']):>24} {interval_text(c['tpot_ms_mean']):>22}"
        print(line)


def _plot(path: str, label: str, layout: Layout, points: list[dict[str, Any]], slo: Slo) -> None:
    from servingtopology.cli.plots import save, sweep_figure

    save(sweep_figure(label, layout.gpus, points, slo), path)


def _print(label: str, layout: Layout, points: list[dict[str, Any]]) -> None:
    print(f"serving envelope of {label} on {gpus_text(layout.gpus)} (closed loop: each client sends its next request when the last ends)")
    _print_points(points)


def _print_points(points: list[dict[str, Any]]) -> None:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"
    print(f"{'clients':>7}{'out tok/s/GPU':>15}{'tok/s/user':>12}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}{'ITL p50 ms':>12}"
          f"{'ITL p99 ms':>12}{'goodput req/s':>15}{'preemptions':>13}")
    for p in points:
        print(f"{p['concurrency']:>7}{f(p['throughput_tok_s_per_gpu']):>15}{f(p['tokens_per_s_per_user']):>12}"
              f"{f(p['ttft_ms']['p50']):>13}{f(p['ttft_ms']['p99']):>13}{f(p['itl_ms']['p50']):>12}{f(p['itl_ms']['p99']):>12}"
              f"{f(p['goodput_rps']):>15}{p['preemptions']:>13}")
    print("out tok/s/GPU: output tokens per second per GPU; tok/s/user: 1000 / mean TPOT ms; goodput: requests meeting both SLOs "
          "per second of the run")


def _series(args: argparse.Namespace, concurrency: list[int], per_client: int, bar: StageBar) -> tuple[Slo, list[dict[str, Any]]]:
    """One sweep per --layout, each on the spec's work with that layout (compare's parsing and validation)."""
    from servingtopology.cli.compare import MAX_LAYOUTS, parse_layout
    from servingtopology.planner.search.record_facts import family_of

    if len(args.layout) > MAX_LAYOUTS:
        raise InvalidSpec("--layout", f"at most {MAX_LAYOUTS} layouts")
    out: list[dict[str, Any]] = []
    slo: Slo | None = None
    for i, text in enumerate(args.layout):
        field = f"--layout[{i}]"
        name, mapping = parse_layout(text, field=field)
        try:
            spec = read_spec(args.spec, {**whatif_overrides(args), "layout": mapping})
        except SpecError as exc:
            raise SpecError([(f"{field} ({f})" if f.startswith("layout") else f, m) for f, m in exc.errors]) from None
        problem = to_problem(spec)
        layout = layout_for(spec, problem)
        slo = problem.slo
        named = layout.label_for(problem.engine)
        out.append({"name": name or named, "layout": named, "gpus": layout.gpus, "kind": layout.kind.value,
                    "family": family_of(layout).name,
                    "points": sweep_points(problem, layout, concurrency, seed=spec.simulation.seed, per_client=per_client, bar=bar,
                                           stage=f"sweep {named}")})
    assert slo is not None
    return slo, out


def _print_series(series: list[dict[str, Any]]) -> None:
    for s in series:
        print(f"[{s['name']}]")
        _print_points(s["points"])
        print()
    print("every GPU of each layout is in its per-GPU figures (prefill and decode alike)")


def run(args: argparse.Namespace) -> int:
    per_client = max(1, args.requests_per_client)
    bar = StageBar(enabled=wanted(args))
    try:
        check_output("--plot", args.plot, suffixes=PLOT_SUFFIXES)
        concurrency = parse_concurrency(args.concurrency)
        check_requests(concurrency, per_client)
        calibration = calibrated = None
        if args.layout:
            if getattr(args, "calibration", None):   # refused by name, never dropped: the series are figured uncalibrated
                raise InvalidSpec("--calibration", "not with --layout: sweep one layout (the spec's, or the planner's best) to see "
                                                   "it calibrated beside uncalibrated")
            slo, series = _series(args, concurrency, per_client, bar)
        else:
            spec = read_spec(args.spec, whatif_overrides(args))
            problem = to_problem(spec)
            layout = layout_for(spec, problem)
            calibration = read_calibration(args.calibration, problem) if getattr(args, "calibration", None) else None
            points = sweep_points(problem, layout, concurrency, seed=spec.simulation.seed, per_client=per_client, bar=bar)
            _add_intervals(problem, layout, points, None)
            if calibration is not None:
                with calibration.applied():
                    calibrated = sweep_points(problem, layout, concurrency, seed=spec.simulation.seed, per_client=per_client, bar=bar,
                                              stage="sweep, calibrated")
                _add_intervals(problem, layout, calibrated, calibration)
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(flagged(exc, whatif_overrides(args, strict=False)), as_json=args.json)
    except Infeasible as exc:
        if args.json:
            print(json.dumps({"error": "infeasible", "message": str(exc)}))
        else:
            print(f"infeasible: {exc}")
        return 1
    finally:
        bar.close()
    if args.layout:
        if args.plot:
            from servingtopology.cli.plots import Series, save, sweep_figure
            from servingtopology.planner.search.record_facts import Family

            many = [Series(s["name"], s["layout"], s["gpus"], Family[s["family"]], s["points"]) for s in series]
            try:
                save(sweep_figure(series[0]["layout"], series[0]["gpus"], series[0]["points"], slo, series=many), args.plot)
            except InvalidSpec as exc:
                return emit_spec_error(exc, as_json=args.json)
        if args.json:
            print(json.dumps({"series": series, **({"plot": args.plot} if args.plot else {})}))
        else:
            _print_series(series)
            if args.plot:
                print(f"plot written to {args.plot}")
        return 0
    if args.plot:
        try:
            _plot(args.plot, layout.label_for(problem.engine), layout, points, problem.slo)
        except InvalidSpec as exc:
            return emit_spec_error(exc, as_json=args.json)
    extra: dict[str, Any] = {}
    if calibration is not None and calibrated is not None:
        extra = {"calibrated_points": calibrated, "calibration": calibration_summary(calibration, args.calibration)}
    if args.json:
        plot = {"plot": args.plot} if args.plot else {}
        print(json.dumps({"layout": layout.label_for(problem.engine), "gpus": layout.gpus, "points": points, **extra, **plot}))
    else:
        _print(layout.label_for(problem.engine), layout, points)
        if calibrated is not None:
            print(f"\ncalibrated ({args.calibration}):")
            _print(layout.label_for(problem.engine), layout, calibrated)
        _print_intervals(points, calibrated)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
