"""Leave-one-model-out accuracy and decision quality on every shared measurement (issues #24 and #35).

Reads shared/groundtruth/silicon_calibration.csv, silicon_qwen3_32b.csv and silicon_minimax_m25.csv (vLLM and SGLang
rows) and predicts each model family's rows with parameters fitted without that family:
  - the families of silicon_calibration.csv with their own fold of `planner/data/perf_params.json`
    (`fit_perf.py --lomo --lomo-from-defaults`: each fold started from `PerfParams()` defaults);
  - Qwen3-32B (and its NVFP4 export) and MiniMax-M2.5 with the shipped parameters, which were fitted on
    silicon_calibration.csv only and never saw them.
No row's inputs are filled from measured outcomes (twins are matched on inputs only, `calibration.fill_from_twins`).

Prints TTFT, TPOT and end-to-end (TTFT + (osl − 1)·TPOT) median absolute percentage errors, and decision quality:
within each benchmark group of one engine release, the share of groups whose predicted best topology measured
within 5 % of the measured best, for tokens/s per GPU and for TPOT, beside the trivial rules (fewest GPUs; most
GPUs; ties averaged), with median and worst regrets. Broken down by engine, release, layout kind, client bucket, family and GPU.
A run exported twice (SOURCES.md: "Duplicate rows exist"; some under two model labels) counts in the judged figures as
often as it appears; the line "each run once" beside them counts it once (`run_key`), reported and not judged.
Layouts of equal GPU count within one release (issue #35: plain TP, TP·EP, DP attention, PD) are compared pair by
pair (`scores.equal_gpu_pairs`): the predicted ratio of their TPOT and of their tokens/s per GPU against the measured
ratio, and the order of the pairs whose measured figures differ by more than 5 %; by family and by the kinds compared.
Exits 1 when a target of issue #35 is missed (TARGETS; `--no-fail` prints only).

    .venv/bin/python benchmarks/lomo_decisions.py [--json] [--no-fail] [--files silicon_minimax_m25.csv]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from servingtopology.cli.validate import Measurements, load_measurements
from servingtopology.planner.fidelity.benchmark_cases import BenchmarkCase, Prediction, Skip, predict_held_out
from servingtopology.planner.fidelity.scores import layout_kind, summarize
from servingtopology.planner.perf.step import fit_record, load_params, perf_params, pinned_params

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "groundtruth"
FILES = ("silicon_calibration.csv", "silicon_qwen3_32b.csv")  # shared_lomo_predictions' rows (error bars, calibration)
SCORED_FILES = (*FILES, "silicon_minimax_m25.csv")  # this script's rows
# Issue #35's "done when" on leave-one-model-out vLLM + SGLang rows, every line a figure here can judge (the two
# replays' ±5 % is printed by replay_refs.py, not judged here):
#   - TTFT, TPOT and end-to-end median APE over every held-out row;
#   - on every one-release group the pick never below the rules (#35 replaced #24's margin of 0.03, which the shared
#     rows could not show when most groups compare TP degrees only: a margin is asked on the equal-GPU groups instead);
#   - layouts at equal GPU count: the predicted ratio of TPOT and of tokens/s per GPU within 5 % of the measured ratio
#     in the median, the order right in ≥ 95 % of the pairs differing by more than 5 %, and the pick within 5 % of the
#     best ≥ 0.10 more often than the rules (which tie there);
#   - MiniMax-M2.5 alone (no fit saw it) at or under BLIS's held-out 17.6 % TTFT and 7.1 % TPOT (where it is scored).
TARGETS = {"ttft_median_ape": 15.0, "tpot_median_ape": 7.0, "e2e_median_ape": 6.0,
           "tokens_per_gpu_margin_over_rule": 0.0, "tpot_margin_over_rule": 0.0,
           "equal_gpu_tpot_ratio_error_pct": 5.0, "equal_gpu_tokens_per_gpu_ratio_error_pct": 5.0,
           "equal_gpu_order_right": 0.95,
           "equal_gpu_tokens_per_gpu_margin_over_rule": 0.10, "equal_gpu_tpot_margin_over_rule": 0.10}
MINIMAX = "MiniMax-M2.5"
MINIMAX_TARGETS = {"minimax_ttft_median_ape": 17.6, "minimax_tpot_median_ape": 7.1}
# The targets a figure must reach or pass (the others are ceilings).
AT_LEAST = {"tokens_per_gpu_margin_over_rule", "tpot_margin_over_rule", "equal_gpu_order_right",
            "equal_gpu_tokens_per_gpu_margin_over_rule", "equal_gpu_tpot_margin_over_rule"}
# Issue #35 item 4, judged where --folds gives refitted folds (make accuracy): the CPU seconds of the slowest fold and of
# all folds together, as fit_perf.py recorded them (process time, not wall time: a fold waiting for a core is not charged).
FOLD_CPU_TARGETS = {"fold_cpu_s_max": 60.0, "folds_cpu_s_total": 900.0}


def missed_targets(got: dict[str, Any], targets: dict[str, float]) -> list[str]:
    """The targets missed: a figure under its floor (AT_LEAST), over its ceiling (the others), or not computed (None)."""
    return [k for k, t in targets.items() if got[k] is None or (got[k] < t if k in AT_LEAST else got[k] > t)]


def fitted_files(record: dict[str, Any]) -> set[str]:
    """The shared files a fit record's parameters saw (`data_file`: one name, or a list where it was fitted on several)."""
    files = record.get("data_file")
    return set(files) if isinstance(files, list) else {files} if files else set()


def lomo_predictions(m: Measurements, fitted_models: set[str], overrides: dict[str, float] | None = None,
                     records: list[dict[str, Any]] | None = None) -> tuple[list[Prediction | Skip], list[str]]:
    """Every row predicted by parameters that never saw its family (calibration.predict_held_out); the fold each row
    used. `fitted_models`: the models of the shipped fit's data file, each of which must have its own fold.
    `overrides`: parameters set in every fold (the kernel-table switches of the ablation); `records`: fit_perf.py
    outputs whose folds replace the shipped ones for the families they hold."""
    overrides = overrides or {}
    folds = (fit_record().get("leave_one_model_out") or {}).get("folds") or []
    if records:
        given = [f for r in records for f in (r.get("leave_one_model_out") or {}).get("folds") or []]
        held = {m_ for f in given for m_ in f["models"]}
        folds = given + [f for f in folds if not held & set(f["models"])]
    folds = [dict(f, params={k: v for k, v in f["params"].items() if k not in overrides}) for f in folds]
    covered = {m_ for f in folds for m_ in f["models"]}
    leaked = sorted({c.model_path for c in m.cases if c.model_path in fitted_models and c.model_path not in covered})
    if leaked:
        raise SystemExit(f"rows of {leaked[:3]} have no fold and the shipped fit saw them")
    return predict_held_out(m.cases, m.models, m.gpus, folds, replace(perf_params(), **overrides))


def shared_lomo_predictions(shared: Path) -> tuple[Measurements, list[Prediction | Skip], list[str]]:
    """Both shared files' vLLM and SGLang rows under `shared`, each predicted leave-one-model-out by the shipped folds
    (lomo_predictions): the rows, their predictions and the fold each used. Read by interval_coverage.py and
    calibration_accuracy.py."""
    parts = [load_measurements(shared / f, model_dir=shared / "models", backends=("vllm", "sglang")) for f in FILES]
    seen = fitted_files(fit_record())
    fitted = {c.model_path for f, part in zip(FILES, parts, strict=True) if f in seen for c in part.cases}
    m = Measurements.merged(parts)
    results, used = lomo_predictions(m, fitted)
    return m, results, used


def run_key(c: BenchmarkCase) -> tuple[Any, ...]:
    """What identifies one measured run: its inputs and both its figures to the thousandth of a millisecond, not the model's
    label (silicon_calibration.csv holds runs exported twice, some under DeepSeek-R1 and DeepSeek-V3 both; SOURCES.md:
    "Duplicate rows exist"). Two separate runs never read the same TTFT and TPOT to a microsecond."""
    return (c.backend, c.mode, c.system, c.engine_release, c.precision, c.moe_precision, c.topology_label, c.isl, c.osl,
            c.concurrency, round(c.ttft_ms, 3), round(c.tpot_ms, 3))


def distinct_runs(cases: list[BenchmarkCase]) -> list[int]:
    """The position of each run's first row (`run_key`)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for i, c in enumerate(cases):
        k = run_key(c)
        if k not in seen:
            seen.add(k)
            out.append(i)
    return out


def client_bucket(c: BenchmarkCase) -> str:
    n = c.concurrency
    return "1-16" if n <= 16 else "17-64" if n <= 64 else "65-256" if n <= 256 else ">256"


BREAKDOWNS: dict[str, Callable[[BenchmarkCase], str]] = {
    "engine": lambda c: c.backend,
    "release": lambda c: f"{c.backend} {c.engine_release or '?'}",
    "layout": layout_kind,
    "clients": client_bucket,
    "family": lambda c: c.model_path.split("/")[-1].replace("-NVFP4", "").replace("-FP8", "").replace("-Instruct", ""),
    "gpu": lambda c: c.system,
}


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    dq = summary["ranking"]["decision_quality"]
    return {"rows": summary["predicted"], "ttft": summary["ttft"]["median_ape"], "tpot": summary["tpot"]["median_ape"],
            "e2e": summary["e2e"]["median_ape"], "groups": dq["groups"],
            "tput_pick": dq["tokens_per_gpu"]["within_5pct"], "tput_rule": dq["tokens_per_gpu"]["rule_within_5pct"],
            "tpot_pick": dq["tpot"]["within_5pct"], "tpot_rule": dq["tpot"]["rule_within_5pct"]}


def _pairs_line(name: str, e: dict[str, Any]) -> str:
    def v(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)
    return (f"  {name:34s} {e['pairs']:5d}  {v(e['tpot_ratio_error_pct'], '6.1f')} {v(e['tokens_per_gpu_ratio_error_pct'], '6.1f')}"
            f"  {e['ordered_pairs']:5d} {v(e['order_right'], '6.2f')}")


def _line(name: str, f: dict[str, Any]) -> str:
    def v(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)
    return (f"  {name:34s} {f['rows']:5d} {v(f['ttft'], '6.1f')} {v(f['tpot'], '6.1f')} {v(f['e2e'], '6.1f')}  {f['groups']:4d}"
            f"  {v(f['tput_pick'], '5.2f')} {v(f['tput_rule'], '5.2f')}  {v(f['tpot_pick'], '5.2f')} {v(f['tpot_rule'], '5.2f')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-fail", action="store_true", help="print the figures; exit 0 even when a target is missed")
    ap.add_argument("--folds", type=Path, nargs="+", default=None, metavar="FILE",
                    help="fit_perf.py --lomo outputs whose folds replace the shipped ones for the families they hold")
    ap.add_argument("--params", type=Path, default=None, metavar="FILE",
                    help="a fit_perf.py output whose all-row parameters predict the rows no fold holds (Qwen3-32B, MiniMax-M2.5) "
                         "in place of the shipped fit (make accuracy: that fit refitted from defaults too)")
    ap.add_argument("--files", nargs="+", default=list(SCORED_FILES), metavar="CSV",
                    help=f"shared files to predict (default: {' '.join(SCORED_FILES)})")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a parameter in every fold, e.g. measured_allreduce=0 (the roofline all-reduce)")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    files = tuple(args.files)
    parts = [load_measurements(SHARED / f, model_dir=SHARED / "models", backends=("vllm", "sglang")) for f in files]
    seen = fitted_files(fit_record())
    fitted = {c.model_path for f, part in zip(files, parts, strict=True) if f in seen for c in part.cases}
    m = Measurements.merged(parts)
    overrides = {k: float(v) for k, v in (a.split("=", 1) for a in args.set)}
    records = [json.loads(f.read_text()) for f in args.folds] if args.folds else None
    if args.params is not None:
        with pinned_params(load_params(json.loads(args.params.read_text()))):
            results, _ = lomo_predictions(m, fitted, overrides, records)
    else:
        results, _ = lomo_predictions(m, fitted, overrides, records)
    overall = summarize(m.cases, results, skipped_at_parse=m.skipped_at_parse)
    out: dict[str, Any] = {"overall": overall, "breakdowns": {}}
    for name, key in BREAKDOWNS.items():
        keys = sorted({key(c) for c in m.cases})
        out["breakdowns"][name] = {}
        for k in keys:
            idx = [i for i, c in enumerate(m.cases) if key(c) == k]
            block = summarize([m.cases[i] for i in idx], [results[i] for i in idx])
            out["breakdowns"][name][k] = figures(block) | {"equal_gpu": block["ranking"]["equal_gpu"]}
    first = distinct_runs(m.cases)
    out["distinct_runs"] = figures(summarize([m.cases[i] for i in first], [results[i] for i in first]))  # reported, not judged
    cpu = time.process_time() - t0
    dq = overall["ranking"]["decision_quality"]
    got = {"ttft_median_ape": overall["ttft"]["median_ape"], "tpot_median_ape": overall["tpot"]["median_ape"],
           "e2e_median_ape": overall["e2e"]["median_ape"],
           "tokens_per_gpu_margin_over_rule": dq["tokens_per_gpu"]["margin_over_rule"],
           "tpot_margin_over_rule": dq["tpot"]["margin_over_rule"]}
    eq = overall["ranking"]["equal_gpu"]
    got |= {"equal_gpu_tpot_ratio_error_pct": eq["tpot_ratio_error_pct"],
            "equal_gpu_tokens_per_gpu_ratio_error_pct": eq["tokens_per_gpu_ratio_error_pct"],
            "equal_gpu_order_right": eq["order_right"],
            "equal_gpu_tokens_per_gpu_margin_over_rule": eq["decision_quality"]["tokens_per_gpu"]["margin_over_rule"],
            "equal_gpu_tpot_margin_over_rule": eq["decision_quality"]["tpot"]["margin_over_rule"]}
    targets = dict(TARGETS)
    minimax = out["breakdowns"]["family"].get(MINIMAX)
    if minimax and minimax["rows"]:
        got |= {"minimax_ttft_median_ape": minimax["ttft"], "minimax_tpot_median_ape": minimax["tpot"]}
        targets |= MINIMAX_TARGETS
    if records:
        fold_cpu = [float(f["cpu_s"]) for r in records for f in (r.get("leave_one_model_out") or {}).get("folds") or []]
        if fold_cpu:
            got |= {"fold_cpu_s_max": max(fold_cpu), "folds_cpu_s_total": round(sum(fold_cpu), 1)}
            targets |= FOLD_CPU_TARGETS
    missed = missed_targets(got, targets)
    if args.json:
        print(json.dumps(out | {"targets": targets, "got": got, "missed": missed, "cpu_s": round(cpu, 2)}))
    else:
        print(f"vLLM + SGLang rows of {', '.join(files)}, leave-one-model-out ({cpu:.1f} CPU s)")
        print(f"  predicted {overall['predicted']} of {overall['rows']}; skipped {overall['skipped']['by_reason']}")
        print(f"  {'':34s} {'rows':>5s} {'TTFT%':>6s} {'TPOT%':>6s} {'e2e%':>6s}  {'grps':>4s}  tok/GPU pick/rule  TPOT pick/rule")
        print(_line("overall (within one release)", figures(overall)))
        print(_line("each run once (not judged)", out["distinct_runs"]))
        for name, block in out["breakdowns"].items():
            print(f"  by {name}:")
            for k, f in block.items():
                print(_line("  " + k, f))
        for obj in ("tokens_per_gpu", "tpot"):
            d = dq[obj]
            print(f"  {obj}: pick within 5 % in {d['within_5pct']} of {dq['groups']} groups, rule {d['rule_within_5pct']} "
                  f"(margin {d['margin_over_rule']:+.4f}); regret median {d['median_regret_pct']} % worst {d['worst_regret_pct']} % "
                  f"(rule {d['rule_median_regret_pct']} % / {d['rule_worst_regret_pct']} %)")
        mixed = overall["ranking"]["decision_quality_mixed_releases"]
        print(f"  groups that mix releases, reported not targeted: {overall['ranking']['cross_release_groups']}; over all "
              f"{mixed['groups']} groups: tok/GPU {mixed['tokens_per_gpu']['within_5pct']} (rule {mixed['tokens_per_gpu']['rule_within_5pct']}), "
              f"TPOT {mixed['tpot']['within_5pct']} (rule {mixed['tpot']['rule_within_5pct']})")
        print(f"  equal-GPU layouts within one release: {eq['groups']} groups, {eq['pairs']} pairs; median |predicted ratio / "
              f"measured ratio − 1| (%), order right on pairs differing > 5 % (TPOT {eq['order_right_tpot']}, tok/GPU "
              f"{eq['order_right_tokens_per_gpu']})")
        print(f"  {'':34s} {'pairs':>5s}  {'TPOT%':>6s} {'tok/G%':>6s}  {'>5%':>5s} {'order':>6s}")
        print(_pairs_line("all", eq))
        for k, e in eq["by_kinds"].items():
            print(_pairs_line("  " + k, e))
        for k, f in out["breakdowns"]["family"].items():
            if f["equal_gpu"]["pairs"]:
                print(_pairs_line("  " + k, f["equal_gpu"]))
        edq = eq["decision_quality"]
        print(f"  equal-GPU picks within 5 % of the best: tok/GPU {edq['tokens_per_gpu']['within_5pct']} (rule, ties averaged, "
              f"{edq['tokens_per_gpu']['rule_within_5pct']}), TPOT {edq['tpot']['within_5pct']} (rule {edq['tpot']['rule_within_5pct']})")
        for k, t in targets.items():
            ok = k not in missed
            print(f"  {k:41s} {got[k]!s:>8s}  target {'≥' if k in AT_LEAST else '≤'} {t}  {'met' if ok else 'NOT met'}")
    return 1 if missed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
