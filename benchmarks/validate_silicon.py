"""Accuracy benchmark: the performance model against the shared silicon measurements and vLLM replays.

Prints the validation table of `servingtopology validate` on shared/groundtruth/silicon_calibration.csv
(every backend; the targets are on the vLLM and SGLang rows), the time it took, the same rows without the
benchmark-harness knowledge, the leave-one-model-out figures recorded by `fit_perf.py --lomo` with the shipped
parameters (the number to improve: each model family predicted by a fit that never saw it), the trivial ranking
baseline and the pairwise ordering accuracy (also within one engine release: many groups compare a topology run on one
release with another run on a later one), and, when the simulator's replay is available (`servingtopology
simulate --replay`), the TTFT/TPOT errors of the replayed vLLM runs in shared/groundtruth/llmservingsim_vllm_refs/.

    .venv/bin/python benchmarks/validate_silicon.py [--csv PATH] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from servingtopology.cli.validate import Measurements, evaluate, load_measurements, print_summary
from servingtopology.planner.fidelity.benchmark_cases import without_harness
from servingtopology.planner.perf.step import fit_record, perf_params

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "groundtruth"
# Issue #12, on the leave-one-model-out predictions of the vLLM and SGLang rows; top-1 against the trivial baseline.
TARGETS = {"lomo_ttft_median_ape": 20.0, "lomo_tpot_median_ape": 12.0, "lomo_pairwise_ordering": 0.85, "lomo_top1_over_baseline": 0.05}


def _subset(m: Measurements, backends: tuple[str, ...]) -> Measurements:
    return m.for_backends(backends)


def _replays() -> None:
    refs = SHARED / "llmservingsim_vllm_refs"
    exe = shutil.which("servingtopology") or str(ROOT / ".venv" / "bin" / "servingtopology")
    print("\nvLLM replays (servingtopology simulate --replay):")
    for ref in sorted(p for p in refs.iterdir() if p.is_dir()):
        try:
            r = subprocess.run([exe, "simulate", "--replay", str(ref), "--json"], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"  {ref.name}: not run ({exc})")
            continue
        try:
            d = json.loads(r.stdout)
        except json.JSONDecodeError:
            print(f"  {ref.name}: simulator not available (exit {r.returncode}: {r.stderr.strip()[-160:]})")
            continue
        figs = {k: d.get(k, {}).get("mean", {}) for k in ("ttft_ms", "tpot_ms")}
        print(f"  {ref.name}: " + ", ".join(f"{k} mean recorded {v.get('recorded')} predicted {v.get('predicted')} "
                                             f"error {v.get('error_pct')} %" for k, v in figs.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=SHARED / "silicon_calibration.csv")
    ap.add_argument("--model-dir", type=Path, default=SHARED / "models")
    ap.add_argument("--no-replay", action="store_true")
    args = ap.parse_args(argv)

    print(f"parameters: {perf_params().source}")
    t0 = time.perf_counter()
    m = load_measurements(args.csv, model_dir=args.model_dir)
    _, summary = evaluate(m)
    elapsed = time.perf_counter() - t0
    print(f"\nAll {summary['rows']} rows, validated in {elapsed:.2f} s:")
    print_summary(summary)
    vm = _subset(m, ("vllm", "sglang"))
    _, vs = evaluate(vm)
    _, tr = evaluate(_subset(m, ("trtllm",)))
    _, bare = evaluate(Measurements(without_harness(vm.cases), vm.models, vm.gpus, vm.skipped_at_parse))
    record = fit_record()
    lomo = (record.get("leave_one_model_out") or {}).get("vllm_sglang") if record.get("data_file") == args.csv.name else None
    print("\nvLLM + SGLang rows:")
    for label, b in (("fitted on every row", vs), ("without the harness knowledge", bare), ("leave-one-model-out (recorded)", lomo)):
        if b is None:
            print(f"  {label:32s} not recorded for this file (run benchmarks/fit_perf.py --lomo)")
            continue
        r = b["ranking"]
        print(f"  {label:32s} TTFT {b['ttft']['median_ape']} %, TPOT {b['tpot']['median_ape']} %, top-1 {r['top1_agreement']} "
              f"(baseline {r['baseline_top1']}), pairwise {r['pairwise_ordering']}")
        same = r.get("same_release")
        if same is not None:
            print(f"  {'':32s} {r['cross_release_groups']} of {r['groups']} groups mix engine releases; within one release "
                  f"({same['groups']} groups): top-1 {same['top1_agreement']} (baseline {same['baseline_top1']}), "
                  f"pairwise {same['pairwise_ordering']}")
    if lomo is not None:
        r = lomo["ranking"]
        got = {"lomo_ttft_median_ape": lomo["ttft"]["median_ape"], "lomo_tpot_median_ape": lomo["tpot"]["median_ape"],
               "lomo_pairwise_ordering": r["pairwise_ordering"],
               "lomo_top1_over_baseline": round(r["top1_agreement"] - r["baseline_top1"], 4)}
        for k, target in TARGETS.items():
            v = got[k]
            higher = k in ("lomo_pairwise_ordering", "lomo_top1_over_baseline")
            ok = v is not None and (v >= target if higher else v <= target)
            print(f"  {k:24s} {v!s:>8s}  target {'≥' if higher else '≤'} {target}  {'met' if ok else 'NOT met'}")
    print(f"  skipped {vs['skipped']['share']} ({vs['skipped']['by_reason']})")
    print(f"TensorRT-LLM rows: TTFT median APE {tr['ttft']['median_ape']} %, TPOT median APE {tr['tpot']['median_ape']} %, "
          f"ranking {tr['ranking']}")
    if not args.no_replay:
        _replays()
    return 0


if __name__ == "__main__":
    sys.exit(main())
