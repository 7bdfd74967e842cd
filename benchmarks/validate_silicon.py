"""Accuracy benchmark: the performance model against the shared silicon measurements and vLLM replays.

Prints the validation table of `servingtopology validate` on shared/groundtruth/silicon_calibration.csv
(every backend; the issue's targets are on the vLLM and SGLang rows), the time it took, and, when the
simulator's replay is available (`servingtopology simulate --replay`), the TTFT/TPOT errors of the replayed
vLLM runs in shared/groundtruth/llmservingsim_vllm_refs/.

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
from servingtopology.planner.perf import perf_params

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "groundtruth"
TARGETS = {"ttft_median_ape": 25.0, "tpot_median_ape": 15.0, "skipped_share": 0.10, "top1_agreement": 0.80}


def _subset(m: Measurements, backends: tuple[str, ...]) -> Measurements:
    return Measurements([c for c in m.cases if c.backend in backends], m.models, m.gpus, m.skipped_at_parse)


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
    _, vs = evaluate(_subset(m, ("vllm", "sglang")))
    _, tr = evaluate(_subset(m, ("trtllm",)))
    print("\nvLLM + SGLang rows (the issue's targets):")
    got = {"ttft_median_ape": vs["ttft"]["median_ape"], "tpot_median_ape": vs["tpot"]["median_ape"],
           "skipped_share": vs["skipped"]["share"], "top1_agreement": vs["ranking"]["top1_agreement"]}
    for k, target in TARGETS.items():
        v = got[k]
        ok = v is not None and (v >= target if k == "top1_agreement" else v <= target)
        print(f"  {k:18s} {v!s:>8s}  target {'≥' if k == 'top1_agreement' else '≤'} {target}  {'met' if ok else 'NOT met'}")
    print(f"  ranking: {vs['ranking']}")
    print(f"TensorRT-LLM rows: TTFT median APE {tr['ttft']['median_ape']} %, TPOT median APE {tr['tpot']['median_ape']} %, "
          f"ranking {tr['ranking']}")
    if not args.no_replay:
        _replays()
    return 0


if __name__ == "__main__":
    sys.exit(main())
