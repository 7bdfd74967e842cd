"""Engine command-line arguments for one role of a layout, for vLLM and SGLang.

Called by the CLI's plan output and decision record, and by the operator's manifest builders. Flag
names follow shared/reference/engines.md sections 1.1 (vLLM `vllm serve`) and 2.1 (SGLang
`sglang.launch_server`). Pure string building; it does not know about pods or ports.
"""

from __future__ import annotations

from .hardware import Precision
from .layout import Engine, KvDtype, Layout, LayoutKind, Role, RoleLayout

__all__ = ["engine_args", "layout_engine_args"]

_VLLM_KV = {KvDtype.AUTO: "auto", KvDtype.BF16: "bfloat16", KvDtype.FP8: "fp8"}
_SGLANG_KV = {KvDtype.AUTO: "auto", KvDtype.BF16: "bfloat16", KvDtype.FP8: "fp8_e4m3"}
# Weight quantisation flags when the checkpoint is not already quantised (engines auto-detect otherwise).
_VLLM_QUANT = {Precision.FP8: "fp8"}
_SGLANG_QUANT = {Precision.FP8: "fp8"}


def engine_args(engine: Engine, role: Role, layout_role: RoleLayout, *, precision: Precision, moe: bool = False) -> list[str]:
    """Arguments (without the model) that make an engine instance of this role match the plan."""
    par, k = layout_role.parallelism, layout_role.knobs
    if engine is Engine.VLLM:
        args = ["--tensor-parallel-size", str(par.tp)]
        if par.pp > 1:
            args += ["--pipeline-parallel-size", str(par.pp)]
        if par.dp > 1:
            args += ["--data-parallel-size", str(par.dp)]
        if par.ep and moe:
            args += ["--enable-expert-parallel"]
        args += ["--max-num-seqs", str(k.max_num_seqs), "--max-num-batched-tokens", str(k.max_num_batched_tokens),
                 "--enable-chunked-prefill", "--gpu-memory-utilization", f"{k.memory_fraction:g}",
                 "--kv-cache-dtype", _VLLM_KV[k.kv_dtype], "--block-size", str(k.block_size_tokens)]
        args += ["--enable-prefix-caching"] if k.enable_prefix_caching else ["--no-enable-prefix-caching"]
        if precision in _VLLM_QUANT:
            args += ["--quantization", _VLLM_QUANT[precision]]
        if role is not Role.AGGREGATED:
            args += ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
        return args
    args = ["--tp-size", str(par.tp * par.dp)]
    if par.dp > 1:
        args += ["--dp-size", str(par.dp), "--enable-dp-attention"]
    if par.ep and moe:
        args += ["--ep-size", str(par.tp * par.dp)]
    if par.pp > 1:
        args += ["--pp-size", str(par.pp)]
    args += ["--max-running-requests", str(k.max_num_seqs * par.dp), "--chunked-prefill-size", str(k.max_num_batched_tokens),
             "--mem-fraction-static", f"{k.memory_fraction:g}", "--kv-cache-dtype", _SGLANG_KV[k.kv_dtype]]
    if not k.enable_prefix_caching:
        args += ["--disable-radix-cache"]
    if precision in _SGLANG_QUANT:
        args += ["--quantization", _SGLANG_QUANT[precision]]
    if role is not Role.AGGREGATED:
        args += ["--disaggregation-mode", role.value, "--disaggregation-transfer-backend", "nixl"]
    return args


def layout_engine_args(engine: Engine, layout: Layout, *, moe: bool = False) -> dict[Role, list[str]]:
    """Arguments per role of a layout."""
    roles = (Role.AGGREGATED,) if layout.kind is LayoutKind.REPLICAS else (Role.PREFILL, Role.DECODE)
    return {r: engine_args(engine, r, layout.roles[r], precision=layout.precision, moe=moe) for r in roles}
