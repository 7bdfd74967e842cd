"""CPU seconds to plan a pool of 20 members on 512 GPUs of 3 kinds (planner/pool/options.py + planner/pool/plan.py).

Members cycle through five catalog models with loads from 2 to 60 req/s; kinds: 192 H100 ($2.99/h), 192 A100 ($1.60/h),
128 L40S ($0.86/h, 100 Gb/s); mixed-kind PD on. Prints the CPU seconds of the options (every member's funnels and
mixed pairs) and of the solve, the solver's method and gap, and the fleet's totals. Target: both together within
30 CPU seconds (issue 28), at the loads above and at ten times them (a short pool: priorities decide, the greedy
answers with its LP bound); exit 1 otherwise. CPU time, not wall time: the machine is shared.

Last printed: see benchmarks/README.md ("Pool planning").
Run: .venv/bin/python benchmarks/pool_scale.py
"""

from __future__ import annotations

import sys
import time

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import GpuKind, PoolObjective, plan_pool
from servingtopology.spec import parse_spec, to_problem

TARGET_CPU_S = 30.0
KINDS = (GpuKind("h100", resolve_gpu("h100_sxm"), 192, 2.99, 400.0), GpuKind("a100", resolve_gpu("a100_sxm"), 192, 1.60, 200.0),
         GpuKind("l40s", resolve_gpu("l40s"), 128, 0.86, 100.0))
MODELS = (("meta-llama/Llama-3.1-8B-Instruct", 1024, 256, 800, 40), ("Qwen/Qwen3-8B", 4096, 256, 1500, 50),
          ("Qwen/Qwen3-32B", 2048, 512, 1500, 60), ("meta-llama/Llama-3.1-70B", 2048, 256, 2000, 70),
          ("mistralai/Mixtral-8x7B-v0.1", 1024, 256, 1000, 50))
LOADS = (60.0, 8.0, 6.0, 2.0, 10.0, 30.0, 12.0, 4.0, 3.0, 20.0)


def members(scale: float = 1.0) -> list[MemberRequest]:
    out = []
    for i in range(20):
        model, prompt, answer, ttft, tpot = MODELS[i % len(MODELS)]
        rate = LOADS[i % len(LOADS)] * scale
        problem = to_problem(parse_spec({"model": model, "hardware": {"gpu": "h100_sxm", "maxGPUs": 128},
                                         "workload": {"arrivalRate": rate, "inputTokens": prompt, "outputTokens": answer},
                                         "slo": {"ttftMs": {"p95": ttft}, "tpotMs": {"p95": tpot}}}))
        out.append(MemberRequest(f"m{i:02d}", problem, 128, priority=i % 3))
    return out


def run(scale: float) -> bool:
    reqs = members(scale)
    t0 = time.process_time()
    pool, _ = build_pool(KINDS, reqs, objective=PoolObjective.MIN_COST)
    t1 = time.process_time()
    d = plan_pool(pool)
    t2 = time.process_time()
    options = sum(len(m.options) for m in pool.members)
    print(f"20 members × 512 GPUs × 3 kinds, loads ×{scale:g}: {options} options in {t1 - t0:.1f} CPU s; solve {t2 - t1:.1f} CPU s "
          f"({d.solver.method}, gap {d.solver.gap:.2%}); total {t2 - t0:.1f} CPU s (target ≤ {TARGET_CPU_S:g})")
    print(f"   {sum(a.met for a in d.members)} of 20 met; ${d.cost_per_hour:.2f}/h; goodput {d.goodput_rps:.1f} of "
          f"{sum(a.load_rps for a in d.members):.0f} req/s; used {d.used}; idle {d.idle}")
    for line in d.solver.levels:
        print(f"   {line}")
    return t2 - t0 <= TARGET_CPU_S


def main() -> int:
    ok = run(1.0)     # the pool holds every member: the MILP, proved optimal
    ok &= run(10.0)   # ten times the load: the pool is short, priorities decide, the greedy with its LP bound answers
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
