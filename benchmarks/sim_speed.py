"""Simulator speed: simulated tokens per CPU-second (and per wall second) on the issue's cases.

1. 10,000 requests of 1,000 input and 1,000 output tokens on one replica (Llama-3.1-8B, H100, vLLM and
   SGLang) with up to 256 running sequences (256 closed-loop clients); target < 5 s each on one core.
2. The same on Llama-2-7B (vLLM): a 512 KiB/token KV cache leaves room for a third of the batch, so
   about 7,300 preemptions; the case where per-step costs show.
3. Replay of the 300-request RTX 4090 vLLM run (shared/groundtruth); target well under a second.
4. A 4-replica open-loop run and a PD run, for scale.
Target (issue #39, raised from issue 15's 10 M): at least 25 M simulated tokens per CPU-second in every case, each case's
median run; every case's rate is printed, and how many cases are under the target. CPU time is the figure
to compare: these machines are shared, and wall time counts the neighbours.

Each case runs at least --repeats times (default 5) and until it has used --min-cpu-s CPU seconds (default 1.0; the
replay's single run is ~40 ms, one scheduler hiccup away from a miss), at most 200 runs; the rate printed and judged
is the median's, with the slowest and fastest run beside it, so the script fails only on a real miss.
Usage: .venv/bin/python benchmarks/sim_speed.py [--repeats N] [--min-cpu-s S]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import SimResult, closed_loop, simulate
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

REF = Path("/work/shared/groundtruth/llmservingsim_vllm_refs/RTX4090_Llama-3.1-8B")


MAX_RUNS = 200


def measure(name: str, run: Callable[[], SimResult], *, repeats: int, min_cpu_s: float) -> float:
    """Run one case `repeats` times and until `min_cpu_s` CPU s are spent (at most MAX_RUNS); print the median run's
    figures and the spread; return the median rate (M simulated tokens per CPU s)."""
    cpu_s: list[float] = []
    wall_s: list[float] = []
    result = None
    while len(cpu_s) < MAX_RUNS and (len(cpu_s) < repeats or sum(cpu_s) < min_cpu_s):
        w0, c0 = time.perf_counter(), time.process_time()
        result = run()
        cpu_s.append(time.process_time() - c0)
        wall_s.append(time.perf_counter() - w0)
    assert result is not None
    s = result.summary()
    tokens = int(result.prompt_tokens[result.finished].sum() + result.output_tokens[result.finished].sum())
    med_cpu, med_wall = statistics.median(cpu_s), statistics.median(wall_s)
    rate = tokens / med_cpu / 1e6
    print(f"{name:<46} CPU {med_cpu:6.3f} s  wall {med_wall:6.3f} s (medians of {len(cpu_s)})  simulated {result.end_s:8.1f} s  "
          f"{rate:6.2f} M tokens/CPU-s [{tokens / max(cpu_s) / 1e6:.2f}–{tokens / min(cpu_s) / 1e6:.2f}]  "
          f"({s.finished} finished, {s.unfinished} unfinished, {s.preemptions} preemptions, TPOT {s.tpot_ms.mean:.1f} ms)")
    return rate


TARGET_M_TOKENS_PER_CPU_S = 25.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs of each case at least (the median is judged)")
    ap.add_argument("--min-cpu-s", type=float, default=1.0, help="CPU seconds each case runs for at least")
    args = ap.parse_args(argv)
    each = {"repeats": max(1, args.repeats), "min_cpu_s": args.min_cpu_s}
    gpu = resolve_gpu("h100_sxm")
    knobs = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)
    rates = []
    for name, engine in (("llama-3.1-8b", Engine.VLLM), ("llama-3.1-8b", Engine.SGLANG), ("llama-2-7b", Engine.VLLM)):
        requests = closed_loop(clients=256, input_tokens=1000, output_tokens=1000, num_requests=10_000)
        model = resolve_model(name)
        rates.append(measure(f"10k × 1000/1000, 256 seqs, {name}, {engine.value}",
                             functools.partial(simulate, Layout.replicas(1, Parallelism(), knobs), model=model, gpu=gpu, engine=engine,
                                               requests=requests), **each))

    if REF.exists():
        from servingtopology.cli.simulate import load_replay, run_replay
        rep = load_replay(REF)
        rates.append(measure("replay RTX4090 vLLM run (300 requests)", lambda: run_replay(rep), **each))

    w = Workload(LengthDist(LengthKind.LOGNORMAL, 2000.0, sigma=0.7), LengthDist(LengthKind.LOGNORMAL, 300.0, sigma=0.6),
                 arrival_rate_rps=40.0)
    llama70b = resolve_model("llama-3.1-70b")
    rates.append(measure("5k open loop, 4×TP4 Llama-3.1-70B, vLLM",
                         lambda: simulate(Layout.replicas(4, Parallelism(tp=4), knobs), model=llama70b, gpu=gpu, engine=Engine.VLLM,
                                          workload=w, num_requests=5000, seed=1), **each))
    pd = Layout.pd(RoleLayout(2, Parallelism(tp=4), knobs), RoleLayout(2, Parallelism(tp=4), knobs))
    rates.append(measure("5k open loop, 2P2D@TP4 Llama-3.1-70B, SGLang",
                         lambda: simulate(pd, model=llama70b, gpu=gpu, engine=Engine.SGLANG, workload=w, num_requests=5000, seed=1), **each))
    print(f"slowest case: {min(rates):.2f} M simulated tokens per CPU-second, the median run's (target {TARGET_M_TOKENS_PER_CPU_S:g}); "
          f"{sum(r < TARGET_M_TOKENS_PER_CPU_S for r in rates)} of {len(rates)} cases under it")
    if min(rates) < TARGET_M_TOKENS_PER_CPU_S:
        print(f"FAIL: the slowest case is under {TARGET_M_TOKENS_PER_CPU_S:g} M simulated tokens per CPU-second "
              "(CPU seconds differ up to 4x between machines of this kind: compare runs on one machine)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
