"""Planner scaling: `servingtopology plan` on the wide 70B example from 8 to 16,384 GPUs, each size in its own process.

For each `hardware.maxGPUs` it runs the CLI (stage 6 simulates the top K, as a user runs it) in a child
process and reads the child's CPU seconds and peak RSS from getrusage, so the sizes do not share a heap.
Targets: 1,024 GPUs within 10 CPU-seconds and 1 GB peak RSS (issue 15); 16,384 GPUs within 30 CPU-seconds and
2 GB (issue 26); stage 5 (SLO feasibility and the survivors' pick) no worse than linear in the budget from 1,024 GPUs
up (its CPU ratio against 1,024 GPUs at most the budgets' ratio); the chosen layout's goodput per GPU never lower at a
larger budget (the load is fixed). Exits 1 when a size is refused, plans nothing after a smaller one planned, or
misses a target.
Run: .venv/bin/python benchmarks/funnel_scaling.py [--sizes 8,64,1024] [--no-simulate]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plan-llama70b-wide.yaml"
SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# size: (CPU s, peak RSS MB)
LIMITS = {1024: (10.0, 1024.0), 16384: (30.0, 2048.0)}
SLO_STAGE = "5 SLO and load feasibility"


def plan_in_child(args: list[str]) -> tuple[dict[str, object], float, float, float, int]:
    """`servingtopology ARGS` (a `plan ... --json`) in a fresh process: (its JSON, CPU s, wall s, peak RSS MB, exit code).
    Also used by long_prompt.py."""
    code = "\n".join([
        "import resource, runpy, sys",
        "sys.argv = sys.argv[1:]",
        "try:",
        "    runpy.run_module('servingtopology', run_name='__main__')",
        "except SystemExit as e:",
        "    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 3)",
        "else:",
        "    code = 0",
        "r = resource.getrusage(resource.RUSAGE_SELF)",
        "print('RUSAGE', r.ru_utime + r.ru_stime, r.ru_maxrss, code, file=sys.stderr)",
    ])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, "servingtopology", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    wall = time.perf_counter() - t0
    line = next(x for x in proc.stderr.splitlines() if x.startswith("RUSAGE"))
    _, cpu, rss_kb, rc = line.split()
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return out, float(cpu), wall, float(rss_kb) / 1024.0, int(rc)


def _child(spec_path: str, no_simulate: bool) -> tuple[dict[str, object], float, float, float, int]:
    """Run `plan --json` in a fresh process: (its JSON, CPU s, wall s, peak RSS MB, exit code)."""
    return plan_in_child(["plan", spec_path, "--json"] + (["--no-simulate"] if no_simulate else []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--no-simulate", action="store_true")
    args = ap.parse_args(argv)
    base = yaml.safe_load(EXAMPLE.read_text())
    print(f"`servingtopology plan` on {EXAMPLE.name} ({base['model']}, preset wide){' without stage 6' if args.no_simulate else ''}")
    print(f"{'maxGPUs':>8} {'candidates':>16} {'CPU s':>7} {'stage 5 s':>9} {'wall s':>7} {'peak RSS MB':>12} {'req/s/GPU':>9}  chosen")
    failed = False
    planned_at: int | None = None
    best_so_far: tuple[int, float] | None = None
    slo_stage_at: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(x) for x in args.sizes.split(",")):
            spec = {**base, "hardware": {**base["hardware"], "maxGPUs": size}}
            path = Path(tmp) / f"wide-{size}.yaml"
            path.write_text(yaml.safe_dump(spec))
            out, cpu, wall, rss, code = _child(str(path), args.no_simulate)
            funnel = out.get("funnel") or [{}]
            first = funnel[0] if isinstance(funnel, list) and funnel else {}
            total = out.get("candidates_total") or (first.get("admitted", 0) + first.get("rejected", 0) if isinstance(first, dict) else 0)
            best = out.get("best")
            chosen = best.get("label", "?") if isinstance(best, dict) else str(out.get("error", "no output"))
            stage5 = next((float(st.get("seconds", 0.0)) for st in funnel if isinstance(st, dict) and st.get("stage") == SLO_STAGE), float("nan"))
            pred = best.get("prediction", {}) if isinstance(best, dict) else {}
            per_gpu = float(pred.get("goodput_per_gpu", 0.0)) if pred.get("meets_slo") else 0.0
            print(f"{size:>8} {int(total or 0):>16,} {cpu:>7.2f} {stage5:>9.2f} {wall:>7.2f} {rss:>12.0f} {per_gpu:>9.4f}  {chosen}")
            if isinstance(best, dict):
                slo_stage_at[size] = stage5
                if best_so_far is not None and per_gpu < best_so_far[1] * (1 - 1e-9):
                    print(f"FAIL: {size} GPUs chose {per_gpu:.4f} req/s per GPU where {best_so_far[0]} GPUs chose {best_so_far[1]:.4f}",
                          file=sys.stderr)
                    failed = True
                if best_so_far is None or per_gpu > best_so_far[1]:
                    best_so_far = (size, per_gpu)
            # Exit 2 (refused) or 3 (internal error) fails the benchmark; so does a budget that plans nothing after a smaller
            # one planned (exit 1 at a larger maxGPUs): more GPUs must never make the load infeasible.
            if code >= 2 or not out:
                print(f"FAIL: {size} GPUs: plan exited {code} ({chosen})", file=sys.stderr)
                failed = True
            elif isinstance(best, dict):
                planned_at = size if planned_at is None else planned_at
            elif planned_at is not None:
                print(f"FAIL: {size} GPUs planned nothing where {planned_at} GPUs planned", file=sys.stderr)
                failed = True
            if size in LIMITS and (code != 0 or cpu > LIMITS[size][0] or rss > LIMITS[size][1]):
                print(f"FAIL: {size:,} GPUs took {cpu:.2f} CPU s and {rss:.0f} MB, exit {code} (targets {LIMITS[size][0]:g} s, "
                      f"{LIMITS[size][1]:g} MB)", file=sys.stderr)
                failed = True
            ref = slo_stage_at.get(1024)
            if size > 1024 and ref and size in slo_stage_at and slo_stage_at[size] / ref > size / 1024:
                print(f"FAIL: stage 5 took {slo_stage_at[size] / ref:.1f}x its 1,024-GPU CPU at {size:,} GPUs ({size // 1024}x the budget)",
                      file=sys.stderr)
                failed = True
    print(f"child CPU of this run: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
