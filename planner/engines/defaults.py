"""What an engine chooses for a knob its command line leaves out: one rule per knob, read by every caller.

Read by planner/fidelity/benchmark_cases.py (the public rows ran with the engines' defaults) and by the emulator
(servingtopology/emulator/engine.py `build_simulator`, which must choose what the real engine would: never more room than
the engine gives). Pure; `gpu` is the catalog entry, every count may be a numpy array.

Sources (shared/reference/engines.md sections 1.1 and 2.1):
- vLLM V1, `vllm serve` (EngineArgs.get_batch_defaults, in 0.11 _set_default_args; OpenAI API server usage context):
  max_num_batched_tokens 16384 and max_num_seqs 1024 on a GPU of at least 160 GiB since 0.28.0, 8192 and 1024 on one of
  at least 70 GiB that is not an A100 by name (`vllm_large_gpu`), else 2048 and 256; gpu_memory_utilization 0.9.
  tests/conformance/test_engine_defaults.py runs each covered release's own code on every catalog GPU against these.
- SGLang (0.5.23 sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings): chunked_prefill_size 2048 under
  20 GiB, 4096 under 60 GiB, 8192 under 160 GiB, 16384 above, split across the DP-attention ranks (at least 1024
  each); --mem-fraction-static computed from the memory left after its reservations since 0.5.3 (sgl-project/sglang
  PR #10975, `_handle_gpu_memory_settings`), a table by TP size before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servingtopology.planner.engines.caps import release_key
from servingtopology.planner.hardware import Gpu
from servingtopology.planner.layout import Engine

__all__ = ["SGLANG_AUTO_MEM_FRACTION_SINCE", "VLLM_GRAPH_TOKENS_MAX", "cuda_graph_tokens",
           "VLLM_HUGE_GPU_GIB", "VLLM_HUGE_GPU_SINCE", "VLLM_LARGE_GPU_GIB", "max_running",
           "vllm_batch_defaults", "vllm_large_gpu", "memory_fraction", "sglang_chunked_prefill_size", "sglang_mem_fraction", "token_budget"]

VLLM_LARGE_GPU_GIB = 70.0
# vLLM's top tier (B200, B300, MI300X): "for GPUs like B200/B300 with >= 160GB memory, use the largest defaults", first
# in v0.28.0's arg_utils.py (absent in the covered 0.11.0, present in 0.32.0 and 0.33.0: the conformance test holds both).
VLLM_HUGE_GPU_GIB = 160.0
VLLM_HUGE_GPU_SINCE = (0, 28, 0)
VLLM_MEMORY_FRACTION = 0.9

# SGLang --mem-fraction-static when it is not given (first in 0.5.3): in MiB,
# reserved = 512 + 1.5·max(chunked-prefill size, 2048) + 2·cuda_graph_max_bs + 1024·tp·pp/8, plus
# 3·cuda_graph_max_bs·dp under DP attention (and 1.5·cuda_graph_max_bs·dp more when that batch size is over 300), at
# least 10 GiB on GPUs over 60 GiB; fraction = round((memory − reserved)/memory, 3). cuda_graph_max_bs is 256 below
# TP 4 and 512 from it under 160 GiB, 512 above. Releases before it used a table by TP size (0.88, 0.87 from TP 2,
# 0.85 from 4, 0.81 from 8, 0.79 from 16).
SGLANG_AUTO_MEM_FRACTION_SINCE = (0, 5, 3)


def vllm_large_gpu(gpu: Gpu) -> bool:
    """Whether vLLM's server takes its large batch defaults on `gpu` (EngineArgs.get_batch_defaults: `device_memory >=
    70 * GiB_bytes and "a100" not in device_name`, the name as the driver reports it, lower-cased): an A100-80GB is left
    out by name, since a large token budget lowered its throughput (vLLM PR #17885). `gpu.name` is the catalog's
    NVML name."""
    return gpu.memory_gib >= VLLM_LARGE_GPU_GIB and "a100" not in gpu.name.lower()


def vllm_batch_defaults(gpu: Gpu, release: str = "") -> tuple[int, int]:
    """vLLM's API-server (max_num_batched_tokens, max_num_seqs) on `gpu` for `release` ("": the newest rule), with
    chunked prefill on (V1's default for generative models). The tiers by memory (GiB as the driver reports it):
    at least 160 since 0.28.0 → (16384, 1024); at least 70 and not an A100 → (8192, 1024); else (2048, 256). 0.33.0
    also keeps a GB10 (compute capability 12.1) in the last tier; no catalog GPU is one."""
    rel = release_key(release)
    if gpu.memory_gib >= VLLM_HUGE_GPU_GIB and (not rel or rel >= VLLM_HUGE_GPU_SINCE):
        return 16384, 1024
    return (8192, 1024) if vllm_large_gpu(gpu) else (2048, 256)


def sglang_chunked_prefill_size(gpu: Gpu) -> int:
    """SGLang's server-wide --chunked-prefill-size on `gpu` when not given, by memory in MiB as the device reports it
    (0.5.23 handle_gpu_memory_settings: T4-class under 20 GiB 2048; A10, 4090, A100-40GB, L40S under 60 GiB 4096;
    H100, A100-80GB, H200 under 160 GiB 8192; B200, MI300X 16384)."""
    mib = gpu.memory_gib * 1024.0
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    return 8192 if mib < 160 * 1024 else 16384


def token_budget(engine: Engine, gpu: Gpu, dp: Any = 1, *, release: str = "") -> Any:
    """Tokens one scheduler step may hold (vLLM max_num_batched_tokens; SGLang chunked_prefill_size per DP rank)."""
    dp = np.asarray(dp, dtype=float)
    if engine is Engine.SGLANG:
        return np.maximum(sglang_chunked_prefill_size(gpu) / dp, 1024.0)
    return float(vllm_batch_defaults(gpu, release)[0]) + 0.0 * dp


# vLLM's largest CUDA-graph batch when not stated: min(2 × max_num_seqs, 512, max_num_batched_tokens) tokens
# (vllm/config/vllm.py `_set_cudagraph_sizes`: `max_cudagraph_capture_size` defaults to min(max_num_seqs × 2, 512), then
# capped by max_num_batched_tokens; `cudagraph_dispatcher` runs a step of more tokens eagerly).
VLLM_GRAPH_TOKENS_MAX = 512


def cuda_graph_tokens(engine: Engine, max_num_seqs: Any, max_num_batched_tokens: Any) -> Any:
    """The most tokens a step of one rank runs as a CUDA graph (arrays allowed): vLLM's default capture bound; SGLang 0
    (its attention-DP gather does not follow the graph: planner.perf.step.attention_dp_moe_tokens)."""
    if engine is Engine.SGLANG:
        return 0.0 * np.asarray(max_num_seqs, dtype=float)
    return np.minimum(np.minimum(2.0 * np.asarray(max_num_seqs, dtype=float), float(VLLM_GRAPH_TOKENS_MAX)),
                      np.asarray(max_num_batched_tokens, dtype=float))


def max_running(engine: Engine, gpu: Gpu, *, release: str = "") -> int:
    """Requests one instance may run at once when not stated (vLLM max_num_seqs; SGLang's own cap is the KV pool's,
    which the pool computation applies: 256 here is the emulator's ceiling below it, not SGLang's rule)."""
    if engine is Engine.VLLM:
        return vllm_batch_defaults(gpu, release)[1]
    return 256


def sglang_mem_fraction(gpu: Gpu, release: str, tp: Any, pp: Any, dp: Any) -> Any:
    """The --mem-fraction-static an SGLang server of `release` chose on `gpu` for attention TP `tp` × DP `dp` (arrays)."""
    tp, pp, dp = (np.asarray(v, dtype=float) for v in (tp, pp, dp))
    size = tp * dp  # SGLang's --tp-size counts every GPU of the instance; --dp-size splits attention
    rel = release_key(release)
    if rel and rel < SGLANG_AUTO_MEM_FRACTION_SINCE:
        return np.select([size * pp >= 16, size * pp >= 8, size * pp >= 4, size * pp >= 2], [0.79, 0.81, 0.85, 0.87], 0.88)
    mem = gpu.memory_gib * 1024.0
    if mem < 60 * 1024:
        return 0.85 + 0.0 * size
    chunk = 8192.0 if mem < 160 * 1024 else 16384.0
    graph_bs = np.where((mem < 160 * 1024) & (size < 4), 256.0, 512.0)
    reserved = 512.0 + 1.5 * max(chunk, 2048.0) + 2.0 * graph_bs + 1024.0 * size * pp / 8.0
    reserved = reserved + np.where(dp > 1, graph_bs * dp * 3.0 + np.where(graph_bs > 300, graph_bs * dp * 1.5, 0.0), 0.0)
    reserved = np.maximum(reserved, 10 * 1024.0)
    return np.round((mem - reserved) / mem, 3)


def memory_fraction(engine: Engine, gpu: Gpu, *, release: str = "", tp: int = 1, pp: int = 1, dp: int = 1) -> float:
    """The share of GPU memory the engine takes for weights, activations and KV when not stated."""
    if engine is Engine.SGLANG:
        return float(sglang_mem_fraction(gpu, release, tp, pp, dp))
    return VLLM_MEMORY_FRACTION
