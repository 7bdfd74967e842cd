"""The H200 timings of benchmarks/device/h200_kernels.py beside the measured kernel tables (planner/data/kernels).

For each op and shape: our time on the device, the table's time for the same shape (vLLM's H200 tables, the release
given), and their ratio; the medians by op. The MoE section also sets, per model and token count, the layer's time
under EP e against TP t at equal degree — balanced as the tables were measured, and under uniform random top-k
routing with the slowest rank kept — beside the tables' balanced EP/TP ratio, which is what the step model reads.

Run: .venv/bin/python benchmarks/device/compare_tables.py benchmarks/device/h200_kernels.json [--release 0.19.0]
Prints only; exits 1 when the file holds no timings or a section failed on the device.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from typing import Any

from servingtopology.planner.engines import kernels as K

GPU = "h200_sxm"


def _table_gemm(release: str, dtype: str, m: int, n: int, k: int) -> float:
    return float(K.gemm_time_s(GPU, "vllm", release, dtype=dtype, m=m, n=n, k=k).time_s) * 1e6


def _ratio_line(label: str, ratios: list[float]) -> str:
    if not ratios:
        return f"{label}: no shape covered by the table"
    return (f"{label}: {len(ratios)} shapes, ours / table median {statistics.median(ratios):.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--release", default="0.19.0", help="the vLLM release whose H200 tables to compare with")
    args = ap.parse_args(argv)
    with open(args.results) as f:
        res: dict[str, Any] = json.load(f)
    print("device:", json.dumps(res.get("meta", {})))
    for e in res.get("errors", []):
        print(f"section {e['section']} failed on the device: {e['error']}")

    for row in res.get("copy", []):
        print(f"copy {row['mib']} MiB: {row['us']:.1f} µs, {row['gb_per_s_read_plus_write']:.0f} GB/s read+write")

    by_dtype: dict[str, list[float]] = defaultdict(list)
    print("\nGEMM (m, n, k): ours µs / table µs")
    for row in res.get("gemm", []):
        for dtype, key in (("bfloat16", "bf16_us"), ("fp8", "fp8_us")):
            if key not in row:
                continue
            table = _table_gemm(args.release, dtype, row["m"], row["n"], row["k"])
            if math.isfinite(table) and table > 0:
                by_dtype[dtype].append(row[key] / table)
                print(f"  {dtype:8s} {row['m']:5d} {row['n']:6d} {row['k']:6d}  {row[key]:9.1f} / {table:9.1f}  {row[key] / table:5.2f}")
    for dtype, ratios in by_dtype.items():
        print(_ratio_line(f"GEMM {dtype}", ratios))

    print("\nAttention: ours µs (torch SDPA, contiguous cache) / table µs")
    att: dict[str, list[float]] = defaultdict(list)
    for row in res.get("attention", []):
        if row["phase"] == "context":
            t = K.context_attention_s(GPU, "vllm", args.release, kv_dtype="bfloat16", head_dim=row["head_dim"], kv_heads=row["kv_heads"],
                                      heads=row["heads"], batch=row["batch"], isl=row["isl"], split_batch=True)
            shape = f"b{row['batch']} isl {row['isl']}"
        else:
            t = K.generation_attention_s(GPU, "vllm", args.release, kv_dtype="bfloat16", head_dim=row["head_dim"], kv_heads=row["kv_heads"],
                                         heads=row["heads"], batch=row["batch"], kv_len=row["kv_len"], split_batch=True)
            shape = f"b{row['batch']} kv {row['kv_len']}"
        table = float(t.time_s) * 1e6
        ok = math.isfinite(table) and table > 0
        if ok:
            att[row["phase"]].append(row["us"] / table)
        print(f"  {row['phase']:10s} h{row['heads']}/kv{row['kv_heads']} {shape:16s} {row['us']:9.1f} / "
              f"{table if ok else float('nan'):9.1f}  {row['us'] / table if ok else float('nan'):5.2f}")
    for phase, ratios in att.items():
        print(_ratio_line(f"attention {phase}", ratios))

    moe = res.get("moe", [])
    if moe:
        print("\nMoE layer (BF16, one GPU's routed experts): EP e / TP e at equal degree, ours and the table's")
        idx = {(r["model"], r["tokens"], r["kind"], r["degree"], r["routing"]): r for r in moe}
        ours_vs_table: list[float] = []
        for r in moe:
            if r["routing"] != "balanced":
                continue
            t = K.moe_s(GPU, "vllm", args.release, dtype="bfloat16", hidden=r["hidden"], inter=r["inter"], topk=r["topk"],
                        experts=r["experts"], moe_tp=r["degree"] if r["kind"] == "tp" else 1,
                        moe_ep=r["degree"] if r["kind"] == "ep" else 1, tokens=r["tokens"])
            table = float(t.time_s) * 1e6
            if math.isfinite(table) and table > 0:
                ours_vs_table.append(r["max_us"] / table)
            if r["kind"] != "ep":
                continue
            tp = idx.get((r["model"], r["tokens"], "tp", r["degree"], "balanced"))
            rnd = idx.get((r["model"], r["tokens"], "ep", r["degree"], "random"))
            rtp = idx.get((r["model"], r["tokens"], "tp", r["degree"], "random"))
            t_tp = float(K.moe_s(GPU, "vllm", args.release, dtype="bfloat16", hidden=r["hidden"], inter=r["inter"], topk=r["topk"],
                                 experts=r["experts"], moe_tp=r["degree"], moe_ep=1, tokens=r["tokens"]).time_s) * 1e6
            table_ratio = table / t_tp if math.isfinite(table) and math.isfinite(t_tp) and t_tp > 0 else float("nan")
            if tp is None or rnd is None or rtp is None:
                continue
            print(f"  {r['model']:16s} tokens {r['tokens']:5d}  EP{r['degree']}/TP{r['degree']}: balanced {r['max_us'] / tp['max_us']:5.2f}  "
                  f"random routing {rnd['max_us'] / rtp['max_us']:5.2f} (busiest rank {rnd['pairs_max_rank']} of "
                  f"{r['tokens'] * r['topk']} pairs)  table {table_ratio:5.2f}")
        print(_ratio_line("MoE balanced, ours (Triton grouped GEMM) vs the table (the engine's fused MoE)", ours_vs_table))
    return 1 if res.get("errors") or not (res.get("gemm") or res.get("moe")) else 0


if __name__ == "__main__":
    sys.exit(main())
