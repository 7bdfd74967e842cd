"""Simulator speed: simulated tokens per wall second on the issue's cases.

1. 10,000 requests of 1,000 input and 1,000 output tokens on one replica (Llama-3.1-8B, H100, vLLM and
   SGLang) with up to 256 running sequences (256 closed-loop clients); target < 5 s each on one core.
2. Replay of the 300-request RTX 4090 vLLM run (shared/groundtruth); target well under a second.
3. A 4-replica open-loop run and a PD run, for scale.
Usage: .venv/bin/python benchmarks/sim_speed.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, RoleLayout
from servingtopology.planner.model import resolve_model
from servingtopology.planner.sim import SimResult, closed_loop, simulate
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

REF = Path("/work/shared/groundtruth/llmservingsim_vllm_refs/RTX4090_Llama-3.1-8B")


def report(name: str, result: SimResult, wall_s: float) -> None:
    s = result.summary()
    tokens = int(result.prompt_tokens[result.finished].sum() + result.output_tokens[result.finished].sum())
    print(f"{name:<46} wall {wall_s:6.3f} s  simulated {result.end_s:8.1f} s  {tokens / wall_s / 1e6:6.2f} M tokens/wall-s  "
          f"({s.finished} finished, {s.unfinished} unfinished, {s.preemptions} preemptions, TPOT {s.tpot_ms.mean:.1f} ms)")


def main() -> int:
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100_sxm")
    knobs = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)
    for engine in (Engine.VLLM, Engine.SGLANG):
        requests = closed_loop(clients=256, input_tokens=1000, output_tokens=1000, num_requests=10_000)
        t0 = time.perf_counter()
        r = simulate(Layout.replicas(1, Parallelism(), knobs), model=model, gpu=gpu, engine=engine, requests=requests)
        report(f"10k × 1000/1000, 256 seqs, {engine.value}", r, time.perf_counter() - t0)

    if REF.exists():
        from servingtopology.cli.simulate import load_replay, run_replay
        rep = load_replay(REF)
        t0 = time.perf_counter()
        r = run_replay(rep)
        report("replay RTX4090 vLLM run (300 requests)", r, time.perf_counter() - t0)

    w = Workload(LengthDist(LengthKind.LOGNORMAL, 2000.0, sigma=0.7), LengthDist(LengthKind.LOGNORMAL, 300.0, sigma=0.6),
                 arrival_rate_rps=40.0)
    t0 = time.perf_counter()
    r = simulate(Layout.replicas(4, Parallelism(tp=4), knobs), model=resolve_model("llama-3.1-70b"), gpu=gpu, engine=Engine.VLLM,
                 workload=w, num_requests=5000, seed=1)
    report("5k open loop, 4×TP4 Llama-3.1-70B, vLLM", r, time.perf_counter() - t0)
    t0 = time.perf_counter()
    pd = Layout.pd(RoleLayout(2, Parallelism(tp=4), knobs), RoleLayout(2, Parallelism(tp=4), knobs))
    r = simulate(pd, model=resolve_model("llama-3.1-70b"), gpu=gpu, engine=Engine.SGLANG, workload=w, num_requests=5000, seed=1)
    report("5k open loop, 2P2D@TP4 Llama-3.1-70B, SGLang", r, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
