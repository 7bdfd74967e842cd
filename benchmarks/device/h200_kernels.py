"""Times the step model's operations on one GPU with PyTorch and Triton (issue 35 item 6); run on the device machine.

What it times, each at the shapes planner/perf/step.py asks the kernel tables for:
  - dense GEMMs (BF16 torch.matmul; FP8 per-tensor-scaled torch._scaled_mm) over m (tokens) × (n, k) of the models'
    projections;
  - the routed experts of one MoE layer of MiniMax-M2.5 (hidden 3072, moe intermediate 1536, top-8 of 256 experts) and of
    Qwen3-235B-A22B (4096, 1536, top-8 of 128), BF16, one GPU's share under MoE TP t (every expert, 1/t of its columns) and
    under EP e (1/e of the experts, whole), with balanced routing (each expert the same tokens, as the tables were
    measured) and with top-k routing drawn uniformly at random (the statistical imbalance alone: the slowest EP rank
    sets the layer's time; every rank is timed and the maximum kept). The expert kernel is a grouped GEMM written here
    in Triton in the shape of a fused MoE kernel: the routed (token, expert) pairs sorted by expert, each expert's run
    padded to the block's rows, one program per (block of rows, block of columns) reading its expert's weights;
  - prefill attention (torch SDPA, causal, GQA) and decode attention (SDPA with one query per sequence over a
    contiguous cache) at head_dim 128;
  - a device-to-device copy (the HBM bandwidth the roofline terms assume).
Times are CUDA-event medians over replays of a CUDA graph holding `REPS` calls (no launch gaps), in microseconds.
Writes $OUT/h200_kernels.json (or ./h200_kernels.json); benchmarks/device/compare_tables.py sets them beside the tables.
Budget: about 3 minutes on an H200. Every section is independent: one that fails records its error and the rest run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import torch

REPS = 10
MOE_DTYPE = torch.bfloat16   # float16 when the BF16 check of the Triton kernel fails (same speed on Hopper)
DEV = "cuda"
RESULTS: dict[str, Any] = {"meta": {}, "gemm": [], "moe": [], "attention": [], "copy": [], "errors": []}


def bench_us(fn: Any, reps: int = REPS) -> float:
    """Median time of one call (µs): `reps` calls captured in one CUDA graph, replayed 7 times (eager when capture fails)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        run = graph.replay
        per = reps
    except Exception:
        torch.cuda.synchronize()
        def run() -> None:
            for _ in range(reps):
                fn()
        per = reps
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / per)
    times.sort()
    return times[len(times) // 2]


def section(name: str):  # type: ignore[no-untyped-def]
    def wrap(fn):  # type: ignore[no-untyped-def]
        def run() -> None:
            t0 = time.time()
            try:
                fn()
            except Exception as exc:
                RESULTS["errors"].append({"section": name, "error": repr(exc), "trace": traceback.format_exc()[-2000:]})
            print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        return run
    return wrap


# ------------------------------------------------------------------------------------------------ dense GEMMs
GEMM_M = (1, 8, 32, 128, 512, 2048, 8192)
GEMM_NK = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 3072), (3072, 6144), (1024, 8192), (7168, 7168))


@section("gemm")
def gemm() -> None:
    fp8 = hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
    for n, k in GEMM_NK:
        w = torch.randn(k, n, device=DEV, dtype=torch.bfloat16) * 0.02
        w8 = w.t().contiguous().to(torch.float8_e4m3fn).t() if fp8 else None   # column-major B, as _scaled_mm wants
        one = torch.ones((), device=DEV, dtype=torch.float32)
        for m in GEMM_M:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            row = {"m": m, "n": n, "k": k, "bf16_us": bench_us(lambda x=x, w=w: torch.matmul(x, w))}
            if fp8 and m % 16 == 0:
                x8 = x.to(torch.float8_e4m3fn)
                try:
                    row["fp8_us"] = bench_us(lambda x8=x8, w8=w8, one=one: torch._scaled_mm(x8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                except Exception as exc:
                    row["fp8_error"] = repr(exc)[:200]
            RESULTS["gemm"].append(row)


# ------------------------------------------------------------------------------------------------ MoE experts
def _triton_grouped() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_gemm(a_ptr, b_ptr, c_ptr, rows_ptr, block_expert_ptr, n_pairs, N, K, topk_div,
                     stride_am, stride_be, stride_bk, stride_bn, stride_cm,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)   # expert · stride overflows int32 on large layers
        offs_m = pid_m * BM + tl.arange(0, BM)
        pair = tl.load(rows_ptr + offs_m)                      # sorted (token, expert) pair ids; n_pairs marks padding
        valid = pair < n_pairs
        token = pair // topk_div                               # the row of A this pair reads
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        a_ptrs = a_ptr + token[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptrs, mask=valid[:, None] & (offs_k[None, :] + k0 < K), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
            a_ptrs += BK
            b_ptrs += BK * stride_bk
        c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))

    return triton, grouped_gemm


def _sorted_pairs(expert_of_pair: torch.Tensor, n_local: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair ids sorted by local expert, each expert's run padded to a multiple of `bm` with the padding id; the
    expert of each block of `bm` rows."""
    n_pairs = expert_of_pair.numel()
    counts = torch.bincount(expert_of_pair, minlength=n_local).cpu().tolist()
    order = torch.argsort(expert_of_pair, stable=True).cpu().tolist()
    rows: list[int] = []
    blocks: list[int] = []
    at = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        run = order[at:at + c]
        at += c
        padded = -(-c // bm) * bm
        rows.extend(run + [n_pairs] * (padded - c))
        blocks.extend([e] * (padded // bm))
    if not rows:
        rows, blocks = [n_pairs] * bm, [0]
    return torch.tensor(rows, device=DEV, dtype=torch.int32), torch.tensor(blocks, device=DEV, dtype=torch.int32)


def _moe_layer_us(triton: Any, kernel: Any, tokens: int, hidden: int, inter: int, local_experts: int,
                  pair_expert: torch.Tensor, pair_token: torch.Tensor) -> float:
    """One GPU's routed experts: gate-up GEMM (hidden → 2·inter), SiLU·mul, down GEMM (inter → hidden)."""
    bm = 16 if pair_expert.numel() <= 8 * local_experts else 64
    bn, bk = 64, 64
    n_pairs = pair_expert.numel()
    rows, block_expert = _sorted_pairs(pair_expert, local_experts, bm)
    x = torch.randn(tokens, hidden, device=DEV, dtype=MOE_DTYPE)
    w13 = torch.randn(local_experts, hidden, 2 * inter, device=DEV, dtype=MOE_DTYPE) * 0.02
    w2 = torch.randn(local_experts, inter, hidden, device=DEV, dtype=MOE_DTYPE) * 0.02
    h = torch.empty(max(n_pairs, 1), 2 * inter, device=DEV, dtype=MOE_DTYPE)
    act = torch.empty(max(n_pairs, 1), inter, device=DEV, dtype=MOE_DTYPE)
    out = torch.empty(max(n_pairs, 1), hidden, device=DEV, dtype=MOE_DTYPE)
    # The gate-up GEMM reads the routed tokens in pair order: the gather is timed with it (a fused kernel gathers in
    # its loads; the copy of tokens·topk rows is a small share of the layer).
    tok_rows = pair_token.long() if n_pairs else torch.zeros(1, device=DEV, dtype=torch.long)
    x_pairs = torch.empty(tok_rows.numel(), hidden, device=DEV, dtype=MOE_DTYPE)
    nb = block_expert.numel()

    def call_pairs() -> None:
        torch.index_select(x, 0, tok_rows, out=x_pairs)
        kernel[(nb, triton.cdiv(2 * inter, bn))](x_pairs, w13, h, rows, block_expert, n_pairs, 2 * inter, hidden, 1,
                                                 x_pairs.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), h.stride(0),
                                                 BM=bm, BN=bn, BK=bk)
        torch.mul(torch.nn.functional.silu(h[:, :inter]), h[:, inter:], out=act)
        kernel[(nb, triton.cdiv(hidden, bn))](act, w2, out, rows, block_expert, n_pairs, hidden, inter, 1,
                                              act.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), out.stride(0),
                                              BM=bm, BN=bn, BK=bk)

    return bench_us(call_pairs)


def _pairs_max_rank(route: torch.Tensor, experts: int, kind: str, degree: int) -> int:
    """Routed pairs on the busiest rank: every pair under TP, the busiest rank's share under EP."""
    if kind == "tp":
        return int(route.numel())
    rank = route.reshape(-1) // (experts // degree)
    return int(torch.bincount(rank, minlength=degree).max().item())


def _check(triton: Any, kernel: Any, dtype: torch.dtype) -> float:
    """Relative error of the grouped GEMM against a per-pair torch product on a small routed case."""
    hidden, inter, topk, experts, tokens = 256, 128, 2, 8, 40
    gen = torch.Generator(device="cpu").manual_seed(0)
    route = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)]).to(DEV)
    pe, pt = route.reshape(-1), torch.arange(tokens, device=DEV).repeat_interleave(topk)
    rows, be = _sorted_pairs(pe, experts, 16)
    x = torch.randn(tokens, hidden, device=DEV, dtype=dtype)
    w = torch.randn(experts, hidden, inter, device=DEV, dtype=dtype) * 0.05
    xp = x[pt]
    h = torch.zeros(pe.numel(), inter, device=DEV, dtype=dtype)
    kernel[(be.numel(), triton.cdiv(inter, 64))](xp, w, h, rows, be, pe.numel(), inter, hidden, 1, xp.stride(0), w.stride(0),
                                                 w.stride(1), w.stride(2), h.stride(0), BM=16, BN=64, BK=64)
    ref = torch.stack([xp[i].float() @ w[pe[i]].float() for i in range(pe.numel())])
    return float((h.float() - ref).abs().max() / ref.abs().max())


MOE_MODELS = {"MiniMax-M2.5": (3072, 1536, 8, 256), "Qwen3-235B-A22B": (4096, 1536, 8, 128)}
MOE_TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MOE_LAYOUTS = (("tp", 1), ("tp", 8), ("ep", 8), ("tp", 4), ("ep", 4), ("tp", 2), ("ep", 2))


@section("moe")
def moe() -> None:
    triton, kernel = _triton_grouped()
    # Correctness of the kernel against torch on one small case before any timing is kept.
    global MOE_DTYPE
    errors = {}
    for dtype in (torch.bfloat16, torch.float16):
        errors[str(dtype)] = _check(triton, kernel, dtype)
        if errors[str(dtype)] <= 2e-2:
            MOE_DTYPE = dtype
            break
    RESULTS["meta"]["moe_kernel_check_rel_err"] = errors
    RESULTS["meta"]["moe_dtype"] = str(MOE_DTYPE)
    if min(errors.values()) > 2e-2:
        raise RuntimeError(f"grouped GEMM disagrees with torch: relative errors {errors}")
    for name, (hidden, inter, topk, experts) in MOE_MODELS.items():
        for tokens in MOE_TOKENS:
            gen = torch.Generator(device="cpu").manual_seed(tokens)
            scores = torch.rand(tokens, experts, generator=gen)
            random_route = torch.topk(scores, topk, dim=1).indices               # uniform top-k: imbalance by chance alone
            # Balanced: the pairs spread evenly over the experts (and so over the EP ranks): pair i goes to expert
            # ⌊i·E / pairs⌋ while there are fewer pairs than experts, to i mod E beyond; every rank the same count ±1.
            pairs = torch.arange(tokens * topk)
            spread = (pairs * experts) // (tokens * topk) if tokens * topk < experts else pairs % experts
            balanced_route = spread.reshape(tokens, topk)
            for kind, degree in MOE_LAYOUTS:
                for routing, route in (("balanced", balanced_route), ("random", random_route)):
                    if kind == "tp":
                        pe = route.reshape(-1).to(DEV)
                        pt = torch.arange(tokens, device=DEV).repeat_interleave(topk)
                        us = _moe_layer_us(triton, kernel, tokens, hidden, inter // degree, experts, pe, pt)
                        per_rank = [us]
                    else:
                        per_rank = []
                        local = experts // degree
                        flat = route.reshape(-1)
                        tok = torch.arange(tokens).repeat_interleave(topk)
                        for r in range(degree):
                            mine = (flat // local) == r
                            pe = (flat[mine] - r * local).to(DEV)
                            pt = tok[mine].to(DEV)
                            per_rank.append(_moe_layer_us(triton, kernel, tokens, hidden, inter, local, pe, pt)
                                            if pe.numel() else 0.0)
                            if routing == "balanced":
                                break            # every rank the same load ±1 pair
                    RESULTS["moe"].append({"model": name, "hidden": hidden, "inter": inter, "topk": topk, "experts": experts,
                                           "tokens": tokens, "kind": kind, "degree": degree, "routing": routing,
                                           "max_us": max(per_rank), "mean_us": sum(per_rank) / len(per_rank),
                                           "pairs_max_rank": _pairs_max_rank(route, experts, kind, degree)})
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ attention
@section("attention")
def attention() -> None:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for heads, kv_heads in ((32, 8), (8, 2), (48, 8), (6, 1)):
        for batch, isl in ((1, 1024), (1, 4096), (4, 2048), (16, 1024), (1, 16384)):
            q = torch.randn(batch, heads, isl, 128, device=DEV, dtype=torch.bfloat16)
            k = torch.randn(batch, kv_heads, isl, 128, device=DEV, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            us = bench_us(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True, enable_gqa=True), reps=3)
            RESULTS["attention"].append({"phase": "context", "heads": heads, "kv_heads": kv_heads, "head_dim": 128,
                                         "batch": batch, "isl": isl, "us": us})
        for batch, kv_len in ((1, 1024), (16, 1024), (64, 2048), (256, 1024), (32, 8192), (128, 4096)):
            q = torch.randn(batch, heads, 1, 128, device=DEV, dtype=torch.bfloat16)
            k = torch.randn(batch, kv_heads, kv_len, 128, device=DEV, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            us = bench_us(lambda q=q, k=k, v=v: sdpa(q, k, v, enable_gqa=True))
            RESULTS["attention"].append({"phase": "generation", "heads": heads, "kv_heads": kv_heads, "head_dim": 128,
                                         "batch": batch, "kv_len": kv_len, "us": us})
            del q, k, v
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ copy bandwidth
@section("copy")
def copy() -> None:
    for mib in (64, 1024, 4096):
        a = torch.empty(mib * 2**20, device=DEV, dtype=torch.uint8)
        b = torch.empty_like(a)
        us = bench_us(lambda a=a, b=b: b.copy_(a), reps=5)
        RESULTS["copy"].append({"mib": mib, "us": us, "gb_per_s_read_plus_write": 2 * mib * 2**20 / (us * 1e-6) / 1e9})


def main() -> None:
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    p = torch.cuda.get_device_properties(0)
    RESULTS["meta"].update({"device": p.name, "sms": p.multi_processor_count, "memory_gib": p.total_memory / 2**30,
                            "torch": torch.__version__, "cuda": torch.version.cuda, "reps_per_graph": REPS})
    try:
        import triton
        RESULTS["meta"]["triton"] = triton.__version__
    except Exception as exc:
        RESULTS["meta"]["triton"] = repr(exc)
    only = set(sys.argv[1:])
    t0 = time.time()
    for name, fn in (("copy", copy), ("gemm", gemm), ("attention", attention), ("moe", moe)):
        if not only or name in only:
            fn()
    RESULTS["meta"]["wall_s"] = time.time() - t0
    out = os.path.join(os.environ.get("OUT", "."), "h200_kernels.json")
    with open(out, "w") as f:
        json.dump(RESULTS, f, indent=1)
    print(f"wrote {out}; errors: {len(RESULTS['errors'])}")
    for e in RESULTS["errors"]:
        print(e["section"], e["error"], e["trace"][-600:])


if __name__ == "__main__":
    main()
