"""CPU seconds and peak memory to plan pools of 20 and 40 members on 3 and 4 GPU kinds (planner/pool/options.py + plan.py).

Members cycle through five catalog models with loads from 2 to 60 req/s; kinds: 192 H100 ($2.99/h), 192 A100 ($1.60/h),
128 L40S ($0.86/h, 100 Gb/s), and for four kinds 128 H200 ($3.79/h); mixed-kind PD on. Sizes: 20 members × 3 kinds at
the loads above and at ten times them (a short pool: priorities decide, the greedy answers with its LP bound), 40 × 3
and 20 × 4. Each size runs RUNS times, each in a fresh process; prints the median CPU seconds of the options (every
member's funnels and mixed pairs) and of the solve, the solver's method and gap, the fleet's totals and the peak
resident memory. Targets (issue 39): every size's median within TARGET_CPU_S CPU seconds (the operator's default plan
budget is 30) and within TARGET_PEAK_MIB; exit 1 otherwise. CPU time, not wall time: the machine is shared.

Last printed: see benchmarks/README.md ("Pool planning").
Run: .venv/bin/python benchmarks/pool_scale.py [--runs N] [SIZE ...]    (SIZE: 20x3, 20x3-load10, 40x3, 20x4)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import GpuKind, PoolObjective, plan_pool
from servingtopology.spec import parse_spec, to_problem

TARGET_CPU_S = 15.0
TARGET_PEAK_MIB = 1024.0
RUNS = 3
KINDS = (GpuKind("h100", resolve_gpu("h100_sxm"), 192, 2.99, 400.0), GpuKind("a100", resolve_gpu("a100_sxm"), 192, 1.60, 200.0),
         GpuKind("l40s", resolve_gpu("l40s"), 128, 0.86, 100.0), GpuKind("h200", resolve_gpu("h200_sxm"), 128, 3.79, 400.0))
MODELS = (("meta-llama/Llama-3.1-8B-Instruct", 1024, 256, 800, 40), ("Qwen/Qwen3-8B", 4096, 256, 1500, 50),
          ("Qwen/Qwen3-32B", 2048, 512, 1500, 60), ("meta-llama/Llama-3.1-70B", 2048, 256, 2000, 70),
          ("mistralai/Mixtral-8x7B-v0.1", 1024, 256, 1000, 50))
LOADS = (60.0, 8.0, 6.0, 2.0, 10.0, 30.0, 12.0, 4.0, 3.0, 20.0)
SIZES = {"20x3": (20, 3, 1.0), "20x3-load10": (20, 3, 10.0), "40x3": (40, 3, 1.0), "20x4": (20, 4, 1.0)}


def kinds(n: int) -> tuple[GpuKind, ...]:
    return KINDS[:n]


def members(n: int = 20, scale: float = 1.0) -> list[MemberRequest]:
    out = []
    for i in range(n):
        model, prompt, answer, ttft, tpot = MODELS[i % len(MODELS)]
        rate = LOADS[i % len(LOADS)] * scale
        problem = to_problem(parse_spec({"model": model, "hardware": {"gpu": "h100_sxm", "maxGPUs": 128},
                                         "workload": {"arrivalRate": rate, "inputTokens": prompt, "outputTokens": answer},
                                         "slo": {"ttftMs": {"p95": ttft}, "tpotMs": {"p95": tpot}}}))
        out.append(MemberRequest(f"m{i:02d}", problem, 128, priority=i % 3))
    return out


def one(size: str) -> dict[str, object]:
    """Plan one size in this process: CPU seconds of the options and of the solve, the plan's totals, the peak RSS."""
    n, k, scale = SIZES[size]
    reqs, pool_kinds = members(n, scale), kinds(k)
    t0 = time.process_time()
    pool, _ = build_pool(pool_kinds, reqs, objective=PoolObjective.MIN_COST)
    t1 = time.process_time()
    d = plan_pool(pool)
    t2 = time.process_time()
    distinct = len({repr((m.problem, m.cap_gpus, m.kinds)) for m in reqs})
    return {"options_cpu_s": t1 - t0, "solve_cpu_s": t2 - t1, "options": sum(len(m.options) for m in pool.members), "distinct": distinct,
            "method": d.solver.method, "gap": d.solver.gap, "met": sum(a.met for a in d.members), "cost": d.cost_per_hour,
            "goodput": d.goodput_rps, "load": sum(a.load_rps for a in d.members), "used": dict(d.used), "idle": dict(d.idle),
            "levels": list(d.solver.levels), "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def measure(size: str, runs: int) -> bool:
    got = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        got.append(json.loads(done.stdout.strip().splitlines()[-1]))
    n, k, scale = SIZES[size]
    last = got[-1]
    total = [g["options_cpu_s"] + g["solve_cpu_s"] for g in got]
    cpu = statistics.median(total)
    peak = max(g["peak_mib"] for g in got)
    print(f"{n} members ({last['distinct']} distinct) × {sum(x.count for x in kinds(k))} GPUs × {k} kinds, loads ×{scale:g}: "
          f"{last['options']} options in {statistics.median(g['options_cpu_s'] for g in got):.1f} CPU s; solve "
          f"{statistics.median(g['solve_cpu_s'] for g in got):.1f} CPU s ({last['method']}, gap {last['gap']:.2%}); total {cpu:.1f} CPU s, "
          f"median of {runs} ({', '.join(f'{t:.1f}' for t in total)}; target ≤ {TARGET_CPU_S:g}); peak {peak:.0f} MiB "
          f"(target ≤ {TARGET_PEAK_MIB:g})")
    print(f"   {last['met']} of {n} met; ${last['cost']:.2f}/h; goodput {last['goodput']:.1f} of {last['load']:.0f} req/s; "
          f"used {last['used']}; idle {last['idle']}")
    for line in last["levels"]:
        print(f"   {line}")
    return cpu <= TARGET_CPU_S and peak <= TARGET_PEAK_MIB


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", help=f"any of {', '.join(SIZES)} (default: all)")
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--one", choices=list(SIZES))
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        ap.error(f"unknown size {unknown[0]!r}; allowed: {', '.join(SIZES)}")
    ok = True
    for size in args.sizes or list(SIZES):
        ok &= measure(size, args.runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
