"""Planner scaling: `servingtopology plan` on the wide 70B example from 8 to 1,024 GPUs, each size in its own process.

For each `hardware.maxGPUs` it runs the CLI (stage 6 simulates the top K, as a user runs it) in a child
process and reads the child's CPU seconds and peak RSS from getrusage, so the sizes do not share a heap.
Targets (issue 15): 1,024 GPUs within 10 CPU-seconds and 1 GB peak RSS; exits 1 when a size misses them.
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
SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
CPU_LIMIT_S = 10.0
RSS_LIMIT_MB = 1024.0


def _child(spec_path: str, no_simulate: bool) -> tuple[dict[str, object], float, float, float, int]:
    """Run `plan --json` in a fresh process: (its JSON, CPU s, wall s, peak RSS MB, exit code)."""
    args = ["servingtopology", "plan", spec_path, "--json"] + (["--no-simulate"] if no_simulate else [])
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
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    wall = time.perf_counter() - t0
    line = next(x for x in proc.stderr.splitlines() if x.startswith("RUSAGE"))
    _, cpu, rss_kb, code = line.split()
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return out, float(cpu), wall, float(rss_kb) / 1024.0, int(code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--no-simulate", action="store_true")
    args = ap.parse_args(argv)
    base = yaml.safe_load(EXAMPLE.read_text())
    print(f"`servingtopology plan` on {EXAMPLE.name} ({base['model']}, preset wide){' without stage 6' if args.no_simulate else ''}")
    print(f"{'maxGPUs':>8} {'candidates':>16} {'CPU s':>7} {'wall s':>7} {'peak RSS MB':>12}  chosen")
    failed = False
    planned_at: int | None = None
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
            print(f"{size:>8} {int(total or 0):>16,} {cpu:>7.2f} {wall:>7.2f} {rss:>12.0f}  {chosen}")
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
            if size == 1024 and (cpu > CPU_LIMIT_S or rss > RSS_LIMIT_MB):
                print(f"FAIL: 1,024 GPUs took {cpu:.2f} CPU s and {rss:.0f} MB (targets {CPU_LIMIT_S:g} s, {RSS_LIMIT_MB:g} MB)", file=sys.stderr)
                failed = True
    print(f"child CPU of this run: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
