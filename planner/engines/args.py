"""Engine command-line arguments for one role of a layout, for vLLM and SGLang, in the spelling of one release.

Called by the CLI's plan output and decision record, and by the operator's manifest builders. Flag
names follow shared/reference/engines.md sections 1.1 (vLLM `vllm serve`) and 2.1 (SGLang
`sglang.launch_server`); where releases differ (SGLang's attention DP, NixlConnector's kv_role) the
release's capability data (engine_caps.py) decides. Every line it renders is parsed by the engines' own
parsers in the conformance tests. Pure string building; it does not know about pods or ports.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from servingtopology.planner.engines import kernels
from servingtopology.planner.engines.caps import EngineCaps, load_caps, resolve_version, running_requests_flag
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, KvDtype, Layout, LayoutKind, Role, RoleLayout

__all__ = ["deepep_measured", "engine_args", "kv_transfer_config", "layout_engine_args", "sglang_deepep"]

_VLLM_KV = {KvDtype.AUTO: "auto", KvDtype.BF16: "bfloat16", KvDtype.FP8: "fp8"}
_SGLANG_KV = {KvDtype.AUTO: "auto", KvDtype.BF16: "bfloat16", KvDtype.FP8: "fp8_e4m3"}
# Weight quantisation flags when the checkpoint is not already quantised (engines auto-detect otherwise).
_VLLM_QUANT = {Precision.FP8: "fp8"}
_SGLANG_QUANT = {Precision.FP8: "fp8"}


@functools.cache
def deepep_measured(gpu: str) -> bool:
    """Whether DeepEP's kernels were measured running on this GPU kind (`kernels.deepep_s`' tables: H100, H200, B200,
    B300, GB200, GB300). Elsewhere it is not known to run (DeepEP targets NVLink-connected Hopper and Blackwell GPUs), so
    SGLang keeps its default exchange there."""
    return any(g == gpu and e == "sglang" and "deepep_ll" in kinds for g, e, _, kinds in kernels.coverage())


def sglang_deepep(tp: Any, dp: Any, ep: Any, gpu: str) -> Any:
    """Where SGLang exchanges an expert-parallel MoE layer's tokens through DeepEP (`--moe-a2a-backend deepep`, the
    all-to-all of its PD and large-scale EP recipes, shared/reference/engines.md section 2.2): attention DP with the
    experts spread over every GPU of the stage (DeepEP takes the EP size from the TP size, so a partial `--ep-size`
    keeps the default exchange), on a GPU kind DeepEP was measured on (`deepep_measured`). One rule for the arguments
    `engine_args` renders and the exchange the step model prices (planner.perf.step.measured_exchange); elementwise
    over arrays of candidates."""
    tp, dp, ep = (np.asarray(x, dtype=float) for x in (tp, dp, ep))
    out = (dp > 1) & (ep > 1) & (ep >= tp * dp) & deepep_measured(gpu)
    return bool(out) if out.ndim == 0 else out


def kv_transfer_config(caps: EngineCaps, role: Role) -> str:
    """vLLM's --kv-transfer-config for a PD role: NixlConnector, kv_producer on prefill and kv_consumer on decode
    where the release's KVTransferConfig knows them (kv_both is the old placeholder)."""
    arg = caps.argument("--kv-transfer-config")
    ktype = (arg.type or {}) if arg else {}
    fields = (ktype.get("inner") or ktype).get("fields", {})
    roles = set(fields.get("kv_role", {}).get("choices", ()))
    kv_role = "kv_both"
    if {"kv_producer", "kv_consumer"} <= roles:
        kv_role = "kv_producer" if role is Role.PREFILL else "kv_consumer"
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role}, separators=(",", ":"))


def engine_args(engine: Engine, role: Role, layout_role: RoleLayout, *, precision: Precision, moe: bool = False,
                version: str = "", gpu: str = "") -> list[str]:
    """Arguments (without the model) that make an engine instance of this role match the plan, spelled for
    `version` (empty: the newest covered release). `gpu`: the catalog id of the GPU kind the role runs on (the role's
    own where it names one; empty: not known, so nothing that depends on it, such as SGLang's DeepEP, is rendered)."""
    caps = load_caps(engine.value, version or resolve_version(engine))
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
            args += ["--kv-transfer-config", kv_transfer_config(caps, role)]
        return args
    args = ["--tp-size", str(par.tp * par.dp)]
    if par.dp > 1:
        # SGLang: attention DP inside one TP group; newer releases spell it --attn-dp-size (the old pair is deprecated).
        args += ["--attn-dp-size", str(par.dp)] if caps.has("--attn-dp-size") else ["--dp-size", str(par.dp), "--enable-dp-attention"]
    if par.ep and moe:
        args += ["--ep-size", str(par.moe_ep)]
        if sglang_deepep(par.tp, par.dp, par.moe_ep, layout_role.gpu or gpu) and "deepep" in caps.choices("--moe-a2a-backend"):
            args += ["--moe-a2a-backend", "deepep"]
    if par.pp > 1:
        args += ["--pp-size", str(par.pp)]
    # Both are server-wide: SGLang divides them by --attn-dp-size per rank. --max-running-requests gives each rank the
    # planned max_num_seqs; the chunk is the planned token budget, of which each rank takes its share (the simulator
    # and the analytic model use the same per-rank chunk, engine_caps.chunk_tokens_per_rank).
    args += ["--max-running-requests", str(running_requests_flag(par, k.max_num_seqs)), "--chunked-prefill-size", str(k.max_num_batched_tokens),
             "--mem-fraction-static", f"{k.memory_fraction:g}", "--kv-cache-dtype", _SGLANG_KV[k.kv_dtype]]
    if not k.enable_prefix_caching:
        args += ["--disable-radix-cache"]
    if precision in _SGLANG_QUANT:
        args += ["--quantization", _SGLANG_QUANT[precision]]
    if role is not Role.AGGREGATED:
        args += ["--disaggregation-mode", role.value, "--disaggregation-transfer-backend", "nixl"]
    return args


def layout_engine_args(engine: Engine, layout: Layout, *, moe: bool = False, version: str = "", gpu: str = "") -> dict[Role, list[str]]:
    """Arguments per role of a layout (`gpu`: the problem's GPU kind, for roles that name none)."""
    roles = (Role.AGGREGATED,) if layout.kind is LayoutKind.REPLICAS else (Role.PREFILL, Role.DECODE)
    return {r: engine_args(engine, r, layout.roles[r], precision=layout.precision, moe=moe, version=version, gpu=gpu) for r in roles}
