"""Measured kernel times (planner.engines.kernels) against the roofline terms of the step model (planner.perf.step), per operation.

For H100, H200 and B200 and the newest measured vLLM and SGLang release, at shapes of Llama-3.1-70B (TP8),
Llama-3.1-8B (TP1) and DeepSeek-V3 (EP8 experts, TP8 MLA) steps: one layer's dense GEMMs at decode and prefill
token counts, prefill and decode attention, DeepSeek-V3's routed experts and MLA decode, and the TP all-reduce.
Prints the table time, the roofline time and their ratio (table / roofline; below 1: the roofline is slow).
The roofline terms mirror planner/perf/step.py's `step_coefficients` and `evaluate_step_s` with the shipped fitted
parameters (`perf_params()`); the all-reduce calls `perf.allreduce_s` itself.
`--moe-slicing` prints instead how the measured fused-MoE kernels price slicing experts over TP (issue #35): for every vLLM
table whose configuration was measured both as MoE TP n and as EP n (balanced routing), the time of TP n over EP n at 8–64
tokens, with the per-byte width constant it implies for a (1 + c / width) slicing penalty (the step model's dense GEMMs
pay c = 2·`narrow_width_cols` bytes).
Run: .venv/bin/python benchmarks/kernel_vs_roofline.py [--gpus h100_sxm,h200_sxm,b200_sxm] [--moe-slicing]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from servingtopology.planner.engines import kernels as K
from servingtopology.planner.hardware import Gpu, Precision, gpu_catalog
from servingtopology.planner.perf import step as perf


@dataclass(frozen=True)
class Dense:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    tp: int

    def gemms(self) -> list[tuple[str, int, int]]:
        """(name, n, k) per GPU of one layer's linear layers under TP (column- then row-parallel)."""
        t, d = self.tp, self.head_dim
        return [("qkv", (self.heads + 2 * self.kv_heads) * d // t, self.hidden), ("o", self.hidden, self.heads * d // t),
                ("gate_up", 2 * self.inter // t, self.hidden), ("down", self.hidden, self.inter // t)]


# config.json values of the public checkpoints.
LLAMA_70B = Dense("Llama-3.1-70B TP8", hidden=8192, heads=64, kv_heads=8, head_dim=128, inter=28672, tp=8)
LLAMA_8B = Dense("Llama-3.1-8B TP1", hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, tp=1)
DSV3 = {"hidden": 7168, "moe_inter": 2048, "experts": 256, "topk": 8, "heads": 128, "kv_lora": 512, "rope": 64}

DECODE_M = [1, 8, 32, 64, 128, 256]
PREFILL_M = [2048, 4096, 8192]


def _peak(gpu: Gpu, precision: Precision) -> float:
    """perf._compute_peak × perf._gemm_eff: the FLOP/s a large GEMM reaches in the step model."""
    p = perf.perf_params()
    native = float(getattr(gpu, f"{precision.value}_tflops", 0.0))
    peak = (native if native > 0 else gpu.bf16_tflops) * 1e12
    best = gpu.matmul_bf16_tflops / gpu.bf16_tflops if gpu.matmul_bf16_tflops > 0 else p.gemm_eff_max
    scale = {Precision.FP8: p.fp8_eff_scale, Precision.FP4: p.fp4_eff_scale}.get(precision, 1.0) if precision is not Precision.BF16 and native > 0 else 1.0
    return peak * best * scale


def roofline_gemm_s(gpu: Gpu, precision: Precision, *, m: np.ndarray, n: int, k: int, width: float) -> np.ndarray:
    """One GEMM as perf.step_coefficients charges the linear layers: compute 2nk(m + half)/peak and weight streaming
    nk·bytes/(HBM·mem_eff), both × the narrow-slice factor (1 + narrow cols / per-GPU width), joined by the p-norm."""
    p = perf.perf_params()
    narrow = 1.0 + p.narrow_width_cols * 2.0 / max(precision.weight_bytes, 0.5) / width
    t_c = 2.0 * n * k / _peak(gpu, precision) * narrow * (m + p.gemm_half_tokens)
    t_m = n * k * precision.weight_bytes / (gpu.hbm_gbps * 1e9 * p.mem_eff) * narrow
    s = p.roofline_sharpness
    return np.asarray((t_c**s + t_m**s) ** (1.0 / s))


def roofline_prefill_attn_s(gpu: Gpu, *, heads: int, head_dim: int, batch: int, isl: np.ndarray) -> np.ndarray:
    """perf: attn_pair_s = 2·heads·(2·head_dim)/(BF16 peak · attn_prefill_eff) per (query, key) pair; a prompt from an
    empty cache has isl·isl/2 pairs."""
    p = perf.perf_params()
    return np.asarray(2.0 * heads * 2 * head_dim / (gpu.bf16_tflops * 1e12 * p.attn_prefill_eff) * batch * isl * isl / 2.0)


def roofline_decode_attn_s(gpu: Gpu, *, kv_heads: int, head_dim: int, batch: np.ndarray, kv_len: int, kv_bytes: int = 2) -> np.ndarray:
    """perf: attn_ctx_s = KV bytes per context token / (HBM · attn_decode_mem_eff); K and V of the local KV heads."""
    p = perf.perf_params()
    return np.asarray(batch * kv_len * 2.0 * kv_heads * head_dim * kv_bytes / (gpu.hbm_gbps * 1e9 * p.attn_decode_mem_eff))


def roofline_mla_decode_s(gpu: Gpu, *, heads: int, batch: np.ndarray, kv_len: int) -> np.ndarray:
    """perf: max(latent KV read (kv_lora + rope)·2 B / (HBM · eff), absorbed compute 2·heads·(2·kv_lora + rope) /
    (BF16 peak · attn_prefill_eff)) per context token."""
    p = perf.perf_params()
    read = (DSV3["kv_lora"] + DSV3["rope"]) * 2.0 / (gpu.hbm_gbps * 1e9 * p.attn_decode_mem_eff)
    mla = 2.0 * heads * (2 * DSV3["kv_lora"] + DSV3["rope"]) / (gpu.bf16_tflops * 1e12 * p.attn_prefill_eff)
    return np.asarray(batch * kv_len * max(read, mla))


def roofline_moe_s(gpu: Gpu, *, tokens: np.ndarray, ep: int) -> np.ndarray:
    """perf under DP attention with dp = ep (the table's convention, see kernels.moe_s): routed = tokens · dp; compute
    2·k·3hI·(routed + half)/ep / (FP8 peak · moe_eff_scale) and streaming of the active local experts (E/ep · hit),
    × the narrow factor, p-norm; balanced routing (no busiest-GPU excess)."""
    p = perf.perf_params()
    h, inter, e, k = DSV3["hidden"], DSV3["moe_inter"], DSV3["experts"], DSV3["topk"]
    routed = tokens * ep
    narrow = 1.0 + p.narrow_width_cols * 2.0 / Precision.FP8.weight_bytes / inter
    t_c = 2.0 * k * 3 * h * inter / ep / (_peak(gpu, Precision.FP8) * p.moe_eff_scale) * narrow * (routed + p.gemm_half_tokens)
    active = e / ep * (1.0 - (1.0 - k / e) ** routed)
    t_m = 3 * h * inter * Precision.FP8.weight_bytes / (gpu.hbm_gbps * 1e9 * p.mem_eff) * narrow * active
    s = p.roofline_sharpness
    return np.asarray((t_c**s + t_m**s) ** (1.0 / s))


def _row(label: str, xs: list[int], table: np.ndarray, roof: np.ndarray, unit: float = 1e6) -> None:
    cells = []
    for x, t, r in zip(xs, np.atleast_1d(table), np.atleast_1d(roof), strict=True):
        cells.append(f"{x}:{'  -  ' if not np.isfinite(t) else f'{t * unit:.0f}/{r * unit:.0f}={t / r:.2f}'}")
    print(f"    {label:<34} " + "  ".join(cells))


_MOE_WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5}


def moe_slicing() -> None:
    """Print TP n / EP n of the measured fused-MoE kernels per vLLM table, and the width constant it implies."""
    tokens = np.array([8.0, 16.0, 32.0, 64.0])
    pooled_ratio: list[float] = []
    pooled_c: list[float] = []
    print("vLLM fused MoE, balanced routing, 8-64 tokens: time of MoE TP n over EP n (median [quartiles]), implied c bytes")
    for gid, engine, version, kinds in K.coverage():
        if engine != "vllm" or "moe" not in kinds:
            continue
        for dtype, wbytes in _MOE_WEIGHT_BYTES.items():
            ratios: list[float] = []
            consts: list[float] = []
            for h, inter, topk, experts, n in _sliced_and_whole(gid, version, dtype):
                kw = dict(dtype=dtype, hidden=h, inter=inter, topk=topk, experts=experts, tokens=tokens)
                tp = K.moe_s(gid, engine, version, moe_tp=n, moe_ep=1, **kw).time_s
                ep = K.moe_s(gid, engine, version, moe_tp=1, moe_ep=n, **kw).time_s
                r = tp / ep
                ok = np.isfinite(r)
                ratios += r[ok].tolist()
                consts += (inter * wbytes * (r[ok] - 1.0) / (n - r[ok])).tolist()
            if ratios:
                q = np.percentile(ratios, [25, 50, 75])
                print(f"  {gid} {version} {dtype:<10} {len(ratios):4d} points  {q[1]:.3f} [{q[0]:.3f} {q[2]:.3f}]  c {np.median(consts):6.1f} B")
                pooled_ratio += ratios
                pooled_c += consts
    print(f"  all: {len(pooled_ratio)} points, median ratio {np.median(pooled_ratio):.3f}, median c {np.median(pooled_c):.1f} B "
          f"(dense GEMM slices: {2 * perf.perf_params().narrow_width_cols:.0f} B)")


def _sliced_and_whole(gid: str, version: str, dtype: str) -> list[tuple[int, int, int, int, int]]:
    """(hidden, inter, top-k, experts, n) of the configurations measured both as MoE TP n (EP 1) and EP n (TP 1)."""
    configs = set(K.moe_configs(gid, "vllm", version, dtype=dtype))
    return sorted((h, i, k, e, tp) for h, i, k, e, tp, ep in configs if tp > 1 and ep == 1 and (h, i, k, e, 1, tp) in configs)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--gpus", default="h100_sxm,h200_sxm,b200_sxm")
    ap.add_argument("--moe-slicing", action="store_true", help="the measured cost of slicing experts over TP against EP")
    args = ap.parse_args()
    if args.moe_slicing:
        moe_slicing()
        return
    catalog = gpu_catalog()
    print("cells are  shape: table µs / roofline µs = ratio   ('-': no table covers the shape; the roofline stays)")
    for gid in args.gpus.split(","):
        gpu = catalog[gid]
        for engine in ("vllm", "sglang"):
            ref = K.resolve_release(gid, engine, None, K.KernelOp.GEMM)
            print(f"\n== {gpu.name} · {engine} {ref.version if ref else '(no GEMM table)'}")
            for model in (LLAMA_70B, LLAMA_8B):
                for precision, dtype in ((Precision.BF16, "bfloat16"), (Precision.FP8, "fp8")):
                    for label, ms in (("decode", DECODE_M), ("prefill", PREFILL_M)):
                        m = np.array(ms, dtype=float)
                        tab = np.zeros(len(ms))
                        roof = np.zeros(len(ms))
                        for _, n, k in model.gemms():
                            tab += K.gemm_time_s(gid, engine, None, dtype=dtype, m=m, n=n, k=k).time_s
                            roof += roofline_gemm_s(gpu, precision, m=m, n=n, k=k, width=model.hidden / model.tp)
                        _row(f"{model.name} {precision} GEMMs/layer {label}", ms, tab, roof)
                heads, kvh = model.heads // model.tp, max(model.kv_heads // model.tp, 1)
                isl = np.array([1024, 4096, 8192, 16384])
                ctx = K.context_attention_s(gid, engine, None, kv_dtype="bf16", head_dim=model.head_dim, kv_heads=kvh, heads=heads, batch=1,
                                            isl=isl)
                _row(f"{model.name} prefill attn b=1 isl", isl.tolist(), ctx.time_s,
                     roofline_prefill_attn_s(gpu, heads=heads, head_dim=model.head_dim, batch=1, isl=isl))
                for kv_len in (1024, 8192):
                    b = np.array([1, 16, 64, 256])
                    dec = K.generation_attention_s(gid, engine, None, kv_dtype="bf16", head_dim=model.head_dim, kv_heads=kvh, heads=heads,
                                                   batch=b, kv_len=kv_len, split_batch=True)
                    _row(f"{model.name} decode attn kv={kv_len} batch", b.tolist(), dec.time_s,
                         roofline_decode_attn_s(gpu, kv_heads=kvh, head_dim=model.head_dim, batch=b, kv_len=kv_len))
            tokens = np.array([1, 16, 64, 256, 1024, 4096, 8192])
            moe = K.moe_s(gid, engine, None, dtype="fp8_block", hidden=DSV3["hidden"], inter=DSV3["moe_inter"], topk=DSV3["topk"],
                          experts=DSV3["experts"], moe_tp=1, moe_ep=8, tokens=tokens)
            _row(f"DeepSeek-V3 MoE EP8 fp8 ({moe.source.version if moe.source else '-'}) tokens", tokens.tolist(), moe.time_s,
                 roofline_moe_s(gpu, tokens=tokens, ep=8))
            b = np.array([1, 16, 64, 256])
            mla = K.mla_generation_s(gid, engine, None, kv_dtype="bf16", heads=16, batch=b, kv_len=4096, gemm_dtype="bfloat16",
                                     split_batch=True)
            scope = "module" if "module" in mla.note else "core"
            _row(f"DeepSeek-V3 MLA decode TP8 kv=4096 ({scope}) b", b.tolist(), mla.time_s,
                 roofline_mla_decode_s(gpu, heads=16, batch=b, kv_len=4096))
            tok = np.array([1, 16, 64, 256, 2048, 8192])
            nbytes = tok * LLAMA_70B.hidden * 2.0
            ar = K.allreduce_s(gid, engine, None, gpus=8, message_bytes=nbytes, graph=True)
            _row("Llama-70B TP8 all-reduce (graph) tok", tok.tolist(), ar.time_s, perf.allreduce_s(gpu, 8, nbytes))
        nccl = K.nccl_s(gid, op="all_reduce", gpus=8, message_bytes=np.array([1, 16, 64, 256, 2048, 8192]) * 8192 * 2.0)
        print(f"  NCCL {nccl.source.version if nccl.source else '-'}")
        _row("Llama-70B TP8 all-reduce NCCL tok", [1, 16, 64, 256, 2048, 8192], nccl.time_s,
             perf.allreduce_s(gpu, 8, np.array([1, 16, 64, 256, 2048, 8192]) * 8192 * 2.0))


if __name__ == "__main__":
    main()
