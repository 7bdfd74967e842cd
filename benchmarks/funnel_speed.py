"""Funnel speed: enumerate a `preset: wide` search on a 64-GPU budget and time stages 1–5.

Target (issue 2): at least 1,000,000 candidates through stages 1–5 in under 10 s on a 2-core machine.
Run: .venv/bin/python benchmarks/funnel_speed.py   (prints candidates per second per stage)
"""

from __future__ import annotations

import time

from servingtopology.planner.funnel import run_funnel
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


def main() -> None:
    problem = to_problem(parse_spec(SPEC))
    run_funnel(problem)  # warm caches (catalog parsing, numpy first-call costs)
    t0 = time.perf_counter()
    result = run_funnel(problem, clock=time.perf_counter)
    wall = time.perf_counter() - t0
    print(f"funnel on {SPEC['model']} × up to {problem.max_gpus} {problem.gpu.id}, preset wide")
    print(f"candidates enumerated: {result.candidates_total:,}")
    print(f"{'stage':<30} {'in':>14} {'admitted':>12} {'seconds':>8} {'candidates/s':>14}")
    entering = result.candidates_total
    for s in result.stages:
        rate = entering / s.seconds if s.seconds > 0 else float("inf")
        print(f"{s.stage:<30} {entering:>14,} {s.admitted:>12,} {s.seconds:>8.3f} {rate:>14,.0f}")
        entering = s.admitted
    print(f"stages 1-5 wall time: {wall:.2f} s ({result.candidates_total / wall:,.0f} candidates/s); survivors kept: {len(result.survivors)}")


if __name__ == "__main__":
    main()
