"""Replay the recorded vLLM runs in shared/groundtruth/llmservingsim_vllm_refs and print predicted vs recorded.

For each run: TTFT/TPOT/latency mean, p50, p90, p99 (predicted, recorded, error %), the wall time of the
replay, and a step-time check from timeseries.csv: on 1 s ticks without prompt tokens, the decode step
the engine ran (running / generated tokens per second) against the performance model's step at that
batch and KV occupancy; on ticks with prompt tokens, the mixed step with its average prefill chunk. Usage: .venv/bin/python benchmarks/replay_refs.py [REFS_DIR]
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path

import numpy as np

from servingtopology.cli.simulate import Replay, compare, load_replay, run_replay
from servingtopology.planner.layout import Role
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.perf.step import InstancePerf

REFS = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/shared/groundtruth/llmservingsim_vllm_refs")


def decode_ticks(folder: Path, *, measured_kv_only: bool = False) -> tuple[Replay, list[tuple[float, float, float]], list[tuple[float, float, float, float]]]:
    """The replay and its 1 s ticks: pure decode as (running, context tokens, measured step s), and mixed
    prefill+decode as (running, prompt tokens in the tick, context tokens, measured mean step s).

    A tick's step is running / generated tokens (every running sequence decodes once per step). Its context
    is the KV in use (kv_cache_pct × pool) when recorded; else running × the mean context (skipped when
    `measured_kv_only`).
    """
    rep = load_replay(folder)
    rl = rep.layout.roles[Role.AGGREGATED]
    pool = rep.pool_tokens or kv_pool_tokens(rep.model, rep.gpu, engine=rep.engine, precision=rep.layout.precision,
                                             parallelism=rl.parallelism, knobs=rl.knobs)
    path = folder / "timeseries.csv"
    rows = list(csv.DictReader(path.read_text().splitlines())) if path.exists() else []
    mean_ctx = float(np.mean(rep.requests.prompt_tokens) + np.mean(rep.requests.output_tokens) / 2)
    decode: list[tuple[float, float, float]] = []
    mixed: list[tuple[float, float, float, float]] = []
    for r in rows:
        running, gen, prompt = float(r["running"]), float(r["gen_throughput"]), float(r["prompt_throughput"])
        kv = float(r["kv_cache_pct"]) / 100.0
        if running < 1 or gen < running or (measured_kv_only and kv <= 0):
            continue
        ctx = kv * pool if kv > 0 else running * mean_ctx
        if prompt <= 0:
            decode.append((running, ctx, running / gen))
        elif running >= 4:
            steps = gen / running
            mixed.append((running, prompt, ctx, 1.0 / steps))
    return rep, decode, mixed


def step_check(folder: Path) -> str:
    """Measured vs modelled step time on the ticks of timeseries.csv (pure decode, and mixed with prefill)."""
    if not (folder / "timeseries.csv").exists():
        return "  (no timeseries.csv)"
    rep, decode, mixed_ticks = decode_ticks(folder)
    rl = rep.layout.roles[Role.AGGREGATED]
    perf = InstancePerf(rep.model, rep.gpu, rep.layout.precision, rl.knobs.kv_dtype, rep.engine, rl.parallelism)
    mean_ctx = float(np.mean(rep.requests.prompt_tokens) + np.mean(rep.requests.output_tokens) / 2)
    budget = float(rl.knobs.max_num_batched_tokens)

    def mixed_tick(running: float, prompt: float, ctx: float, measured: float) -> tuple[float, float, float, float]:
        # The tick's prompt tokens ride in as few steps as the token budget allows (vLLM fills each step's
        # budget after the decodes); its other steps are pure decode. Compared: the tick's mean step time.
        steps = 1.0 / measured
        m = min(steps, math.ceil(prompt / max(budget - running, 1.0)))
        chunk = prompt / m
        t_mix = perf.step_time_s(prefill_tokens=chunk, prefill_pairs=chunk * (mean_ctx / 2 + chunk / 2), decode_tokens=running,
                                 decode_context_tokens=ctx)
        t_dec = perf.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=running, decode_context_tokens=ctx)
        return running, chunk, measured, (m * t_mix + (steps - m) * t_dec) / steps

    mixed = [mixed_tick(*t) for t in mixed_ticks]
    pairs = [(running, ctx, measured, perf.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=running,
                                                       decode_context_tokens=ctx))
             for running, ctx, measured in decode]
    if not pairs:
        return "  (no pure-decode ticks)"
    a = np.array(pairs)
    lines = [f"  pure-decode ticks: {len(a)}; modelled/measured step time: median {np.median(a[:, 3] / a[:, 2]):.2f}, "
             f"mean {np.mean(a[:, 3] / a[:, 2]):.2f}"]
    for lo, hi in ((1, 16), (16, 48), (48, 96), (96, 1024)):
        m = (a[:, 0] >= lo) & (a[:, 0] < hi)
        if m.any():
            lines.append(f"    batch {lo:>3}-{hi - 1:<4} n={int(m.sum()):>3}  measured {1e3 * np.median(a[m, 2]):6.1f} ms  "
                         f"modelled {1e3 * np.median(a[m, 3]):6.1f} ms  (context ≈ {np.median(a[m, 1]):,.0f} tokens)")
    if mixed:
        m = np.array(mixed)
        lines.append(f"  ticks with prompt tokens: {len(m)}; median chunk {np.median(m[:, 1]):.0f} tokens beside {np.median(m[:, 0]):.0f} "
                     f"decodes; mean step measured {1e3 * np.median(m[:, 2]):.1f} ms, modelled {1e3 * np.median(m[:, 3]):.1f} ms "
                     f"(modelled/measured median {np.median(m[:, 3] / m[:, 2]):.2f})")
    return "\n".join(lines)


def main() -> int:
    for folder in sorted(p for p in REFS.iterdir() if (p / "requests.jsonl").exists()):
        rep = load_replay(folder)
        t0 = time.perf_counter()
        result = run_replay(rep)
        wall = time.perf_counter() - t0
        table = compare(result, rep.recorded)
        s = result.summary()
        print(f"== {folder.name}: {rep.layout.label} on {rep.gpu.id}, {len(rep.requests)} requests, pool "
              f"{rep.pool_tokens or 'model'} tokens; replay {wall:.3f} s wall, {s.preemptions} preemptions, "
              f"KV in use {s.kv_utilisation_mean:.0%}")
        print(f"  {'metric':<14}{'predicted':>12}{'recorded':>12}{'error %':>9}")
        for metric, stats in table.items():
            for stat, v in stats.items():
                print(f"  {metric.removesuffix('_ms') + ' ' + stat:<14}{v['predicted']:>12.1f}{v['recorded']:>12.1f}{v['error_pct']:>+9.1f}")
        print(step_check(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
