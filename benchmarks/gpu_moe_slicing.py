"""On a GPU: does slicing experts over TP cost a batched expert GEMM per byte, against whole experts under EP? (issue #35)

The step model charges an expert's GEMMs the width of the whole expert whatever the MoE TP (planner/perf/step.py), as the
measured fused-MoE tables say (`kernel_vs_roofline.py --moe-slicing`). This script checks the same question with PyTorch's
batched GEMM (one kernel over the active experts, BF16) at the shapes of a decode step: MoE TP n holds every active expert
sliced n ways (gate/up 2I/n columns, down I/n deep); EP n holds 1/n of the active experts whole. Both stream the same
weight bytes per GPU; the script prints each one's time and effective bandwidth and their ratio. (Dense slices one GEMM a
Python call are not measured here: at these sizes each call's dispatch, ~20 µs, hides the GEMM.)

Needs torch with CUDA; nothing else. Run: python benchmarks/gpu_moe_slicing.py [--iters 50]
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

# (name, hidden, moe intermediate, experts, top-k)
MODELS = (("MiniMax-M2.5", 3072, 1536, 256, 8), ("DeepSeek-V3", 7168, 2048, 256, 8), ("Qwen3-235B-A22B", 4096, 1536, 128, 8))


def _time_ms(torch: Any, fn: Any, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / iters


def _experts_ms(torch: Any, *, experts: int, m: int, hidden: int, cols: int, iters: int) -> float:
    """One batched gate/up GEMM ([m, hidden] × [hidden, 2·cols]) and down GEMM ([m, cols] × [cols, hidden]) over `experts`."""
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(experts, m, hidden, device=dev, dtype=dt)
    w1 = torch.randn(experts, hidden, 2 * cols, device=dev, dtype=dt)
    w2 = torch.randn(experts, cols, hidden, device=dev, dtype=dt)
    a = torch.randn(experts, m, cols, device=dev, dtype=dt)
    h = torch.empty(experts, m, 2 * cols, device=dev, dtype=dt)
    y = torch.empty(experts, m, hidden, device=dev, dtype=dt)

    def step() -> None:
        torch.bmm(x, w1, out=h)
        torch.bmm(a, w2, out=y)

    return _time_ms(torch, step, iters)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing measured")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 2
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, BF16 batched GEMMs (torch.bmm), {args.iters} iterations")
    print("expert layer at a decode step: MoE TP n (every active expert sliced) against EP n (1/n of them whole), same bytes")
    for name, hidden, inter, experts, topk in MODELS:
        for n in (4, 8):
            for tokens in (16, 64, 256):
                active = round(experts * (1.0 - (1.0 - topk / experts) ** tokens))
                m = max(1, math.ceil(tokens * topk / active))  # tokens per active expert, padded to a whole row
                tp = _experts_ms(torch, experts=active, m=m, hidden=hidden, cols=inter // n, iters=args.iters)
                ep = _experts_ms(torch, experts=max(1, round(active / n)), m=m, hidden=hidden, cols=inter, iters=args.iters)
                torch.cuda.empty_cache()
                gb = 3 * hidden * inter * 2 * active / n / 1e9
                print(f"  {name:16s} n={n} {tokens:4d} tokens ({active:3d} experts, {m} rows each): TP {tp * 1e3:7.1f} µs "
                      f"({gb / tp * 1e3:6.0f} GB/s)  EP {ep * 1e3:7.1f} µs ({gb / ep * 1e3:6.0f} GB/s)  TP/EP {tp / ep:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
