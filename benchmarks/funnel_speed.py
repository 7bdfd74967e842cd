"""Funnel speed: `decide` on a `preset: wide` Llama-3.1-70B spec (64 GPUs), stage by stage, in CPU seconds.

Prints candidates per CPU-second per stage, the CPU and wall time of the whole call, and how much of it the
stage timers cover; exits 1 (loudly) when the timers leave more than 5 % of `decide` uncovered, since time
outside every stage is time nobody sees in the decision record.
Run: .venv/bin/python benchmarks/funnel_speed.py [--max-gpus N]
"""

from __future__ import annotations

import argparse
import sys
import time

from servingtopology.planner.search.decide import decide
from servingtopology.spec import parse_spec, to_problem

SPEC = {
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "precision": "bf16",
    "engine": "vllm",
    "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 64},
    "workload": {"arrivalRate": 40, "inputTokens": {"distribution": "lognormal", "mean": 2000, "sigma": 0.6},
                 "outputTokens": {"distribution": "lognormal", "mean": 300, "sigma": 0.5}},
    "slo": {"ttftMs": {"p95": 1500}, "tpotMs": {"p95": 50}},
    "search": {"preset": "wide", "layouts": ["replicas", "pd"]},
}
COVERAGE_MIN = 0.95


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-gpus", type=int, default=64)
    args = ap.parse_args(argv)
    spec = {**SPEC, "hardware": {**SPEC["hardware"], "maxGPUs": args.max_gpus}}  # type: ignore[dict-item]
    problem = to_problem(parse_spec(spec))
    decide(problem)  # warm caches (catalog parsing, numpy first-call costs)
    w0, c0 = time.perf_counter(), time.process_time()
    d = decide(problem, clock=time.process_time)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(f"decide on {SPEC['model']} × up to {problem.max_gpus} {problem.gpu.id}, preset wide, no simulator: {d.best.layout.label}")
    print(f"candidates enumerated: {d.candidates_total:,}")
    print(f"{'stage':<30} {'in':>16} {'admitted':>16} {'CPU s':>7} {'candidates/CPU-s':>18}")
    entering = d.candidates_total
    for s in d.funnel:
        rate = entering / s.seconds if s.seconds > 0 else float("inf")
        print(f"{s.stage:<30} {entering:>16,} {s.admitted:>16,} {s.seconds:>7.3f} {rate:>18,.0f}")
        entering = s.admitted
    covered = sum(s.seconds for s in d.funnel)
    print(f"decide: {cpu:.2f} CPU s ({wall:.2f} s wall); stage timers cover {covered / cpu:.1%} of the CPU time")
    if covered < COVERAGE_MIN * cpu:
        print(f"FAIL: the stage timers cover {covered:.3f} of {cpu:.3f} CPU s (< {COVERAGE_MIN:.0%}): time is spent outside every stage",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
