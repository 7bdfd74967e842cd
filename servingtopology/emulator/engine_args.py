"""Reads a vLLM or SGLang command line, as written into an engine pod, into an `EngineConfig`.

Called by the emulator for each engine pod (and by `servingtopology emulate --args`). It parses the flags the
operator generates (shared/reference/engines.md §1.1, §2.1) with their types and choices, so a wrong argument
makes the emulated engine fail to start, as the real one would. Flags it does not know are kept, not rejected.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from servingtopology.planner.layout import Engine, Role

__all__ = ["EngineArgsError", "EngineConfig", "is_engine_command", "parse_engine_command"]


class EngineArgsError(ValueError):
    """The command line would make the real engine refuse to start; the message says which flag and why."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the emulator needs from an engine's arguments."""

    engine: Engine
    model: str
    served_model_name: str
    role: Role
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    max_running: int | None = None
    token_budget: int | None = None
    memory_fraction: float | None = None
    kv_cache_dtype: str = "auto"
    port: int | None = None
    nodes: int = 1
    unknown_flags: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> int:
        """GPUs one instance spans: vLLM tp×pp×dp; SGLang's --tp already counts the DP-attention ranks."""
        if self.engine is Engine.SGLANG:
            return self.tp * self.pp * (1 if self.dp_attention else self.dp)
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_node(self) -> int:
        """GPUs one pod of the instance holds (a multi-node instance spreads evenly over `nodes` pods)."""
        return max(self.gpus // self.nodes, 1)


_VLLM_INT = {
    "--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp",
    "--data-parallel-size": "dp", "-dp": "dp", "--max-num-seqs": "max_running",
    "--max-num-batched-tokens": "token_budget", "--port": "port",
    "--nnodes": "nodes", "--max-model-len": None, "--block-size": None, "--data-parallel-size-local": None, "--data-parallel-rank": None,
    "--data-parallel-start-rank": None, "--data-parallel-rpc-port": None, "--node-rank": None,
    "--master-port": None, "--api-server-count": None, "--seed": None, "--max-num-partial-prefills": None,
}
_VLLM_FLOAT = {"--gpu-memory-utilization": "memory_fraction"}
_VLLM_STR = {
    "--served-model-name": "served_model_name", "--model": "model", "--kv-cache-dtype": "kv_cache_dtype",
    "--kv-transfer-config": "kv_transfer_config", "--quantization": None, "-q": None, "--host": None,
    "--dtype": None, "--data-parallel-address": None, "--data-parallel-backend": None, "--master-addr": None,
    "--distributed-executor-backend": None, "--tokenizer": None, "--trust-remote-code": None,
    "--prefix-caching-hash-algo": None, "--all2all-backend": None, "--kv-cache-memory-bytes": None,
}
_VLLM_BOOL = {
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--enable-expert-parallel", "-ep", "--headless", "--trust-remote-code", "--disable-log-requests",
    "--disable-log-stats", "--enforce-eager", "--enable-eplb", "--data-parallel-hybrid-lb", "--data-parallel-external-lb",
}
_VLLM_KV_DTYPES = {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "int8", "nvfp4"}

_SGL_INT = {
    "--tp-size": "tp", "--tensor-parallel-size": "tp", "--tp": "tp", "--dp-size": "dp", "--data-parallel-size": "dp",
    "--dp": "dp", "--pp-size": "pp", "--pipeline-parallel-size": "pp", "--max-running-requests": "max_running",
    "--chunked-prefill-size": "token_budget", "--port": "port", "--max-prefill-tokens": None,
    "--max-total-tokens": None, "--context-length": None, "--page-size": None, "--disaggregation-bootstrap-port": None,
    "--nnodes": "nodes", "--node-rank": None, "--base-gpu-id": None, "--ep-size": None, "--random-seed": None,
    "--num-reserved-decode-tokens": None,
}
_SGL_FLOAT = {"--mem-fraction-static": "memory_fraction"}
_SGL_STR = {
    "--model-path": "model", "--model": "model", "--served-model-name": "served_model_name",
    "--kv-cache-dtype": "kv_cache_dtype", "--disaggregation-mode": "disaggregation_mode",
    "--disaggregation-transfer-backend": "transfer_backend", "--quantization": None, "--host": None,
    "--dist-init-addr": None, "--schedule-policy": None, "--disaggregation-ib-device": None, "--load-balance-method": None,
    "--moe-a2a-backend": None, "--tokenizer-path": None, "--dtype": None,
}
_SGL_BOOL = {
    "--enable-dp-attention", "--enable-metrics", "--enable-metrics-for-all-schedulers", "--disable-radix-cache",
    "--trust-remote-code", "--enable-dp-lm-head", "--skip-server-warmup", "--enable-mixed-chunk",
}
_SGL_KV_DTYPES = {"auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"}


def is_engine_command(argv: Sequence[str]) -> Engine | None:
    """Which engine `argv` launches, or None (a router, a sidecar)."""
    joined = " ".join(argv)
    if "sglang.launch_server" in joined or "sglang serve" in joined:
        return Engine.SGLANG
    if "vllm.entrypoints.openai.api_server" in joined or any(
        a == "serve" and i > 0 and argv[i - 1].endswith("vllm") for i, a in enumerate(argv)
    ):
        return Engine.VLLM
    return None


def _split(argv: Sequence[str]) -> list[str]:
    """Flattens `sh -c "…"` style commands into tokens, and `--flag=value` into two tokens."""
    tokens: list[str] = []
    for arg in argv:
        parts = shlex.split(arg) if (" " in arg and not arg.lstrip().startswith("{")) else [arg]
        for part in parts:
            if part.startswith("--") and "=" in part:
                flag, value = part.split("=", 1)
                tokens.extend([flag, value])
            else:
                tokens.append(part)
    return tokens


# Sizes must be positive; ranks, ports and seeds may be zero. SGLang's --chunked-prefill-size -1 disables chunking.
_SIZE_KEYS = {"tp", "pp", "dp", "max_running", "token_budget", "nodes"}


def _int_flag(flag: str, value: str, *, key: str | None) -> int:
    try:
        number = int(value)
    except ValueError:
        raise EngineArgsError(f"{flag}: invalid int value {value!r}") from None
    if key in _SIZE_KEYS and number < 1 and not (flag == "--chunked-prefill-size" and number == -1):
        raise EngineArgsError(f"{flag}: must be at least 1, got {number}")
    if number < 0 and flag != "--chunked-prefill-size":
        raise EngineArgsError(f"{flag}: must not be negative, got {number}")
    return number


def parse_engine_command(argv: Sequence[str], *, role_hint: Role | None = None) -> EngineConfig:
    """Parses an engine's full command line (command plus args); raises EngineArgsError where the engine would."""
    engine = is_engine_command(argv)
    if engine is None:
        raise EngineArgsError(f"not a vLLM or SGLang command: {' '.join(argv)[:200]!r}")
    tokens = _split(argv)
    ints, floats, strs, bools = (
        (_VLLM_INT, _VLLM_FLOAT, _VLLM_STR, _VLLM_BOOL) if engine is Engine.VLLM else (_SGL_INT, _SGL_FLOAT, _SGL_STR, _SGL_BOOL)
    )
    values: dict[str, object] = {}
    flags_seen: set[str] = set()
    unknown: list[str] = []
    positional: list[str] = []
    i = next((k + 1 for k, t in enumerate(tokens) if t == "serve" or t.endswith("launch_server")), 0)
    while i < len(tokens):
        token = tokens[i]
        needs_value = token in ints or token in floats or (token in strs and token not in bools)
        if needs_value:
            if i + 1 >= len(tokens):
                raise EngineArgsError(f"{token}: expected one argument")
            value = tokens[i + 1]
            key = ints.get(token) or floats.get(token) or strs.get(token)
            if token in ints:
                parsed: object = _int_flag(token, value, key=key)
            elif token in floats:
                try:
                    parsed = float(value)
                except ValueError:
                    raise EngineArgsError(f"{token}: invalid float value {value!r}") from None
                if not 0.0 < float(parsed) <= 1.0:  # type: ignore[arg-type]
                    raise EngineArgsError(f"{token}: must be in (0, 1], got {value}")
            else:
                parsed = value
            if key:
                values[key] = parsed
            flags_seen.add(token)
            i += 2
        elif token in bools:
            flags_seen.add(token)
            i += 1
        elif token.startswith("-"):
            unknown.append(token)
            i += 2 if i + 1 < len(tokens) and not tokens[i + 1].startswith("-") else 1
        else:
            positional.append(token)
            i += 1
    model = str(values.get("model") or (positional[0] if positional else ""))
    if not model:
        raise EngineArgsError("no model given (positional MODEL or --model/--model-path)")
    kv_dtype = str(values.get("kv_cache_dtype", "auto"))
    allowed_kv = _VLLM_KV_DTYPES if engine is Engine.VLLM else _SGL_KV_DTYPES
    if kv_dtype not in allowed_kv:
        raise EngineArgsError(f"--kv-cache-dtype: invalid choice {kv_dtype!r} (choose from {', '.join(sorted(allowed_kv))})")
    role = _role(engine, values, role_hint)
    dp_attention = "--enable-dp-attention" in flags_seen
    tp = int(values.get("tp", 1))  # type: ignore[call-overload]
    dp = int(values.get("dp", 1))  # type: ignore[call-overload]
    if engine is Engine.SGLANG and dp_attention and tp % dp:
        raise EngineArgsError(f"--enable-dp-attention: --tp-size {tp} must be a multiple of --dp-size {dp}")
    budget = values.get("token_budget")
    return EngineConfig(
        engine=engine, model=model, served_model_name=str(values.get("served_model_name") or model), role=role,
        tp=tp, pp=int(values.get("pp", 1)), dp=dp, dp_attention=dp_attention,  # type: ignore[call-overload]
        max_running=values.get("max_running"),  # type: ignore[arg-type]
        token_budget=None if budget == -1 else budget,  # type: ignore[arg-type]
        memory_fraction=values.get("memory_fraction"),  # type: ignore[arg-type]
        kv_cache_dtype=kv_dtype, port=values.get("port"),  # type: ignore[arg-type]
        nodes=int(values.get("nodes", 1)),  # type: ignore[call-overload]
        unknown_flags=tuple(unknown),
    )


def _role(engine: Engine, values: dict[str, object], hint: Role | None) -> Role:
    """The engine's PD role from its own flags; a label hint only breaks ties (vLLM's kv_both)."""
    if engine is Engine.SGLANG:
        mode = values.get("disaggregation_mode")
        if mode is None or mode == "null":
            return hint or Role.AGGREGATED
        if mode not in ("prefill", "decode"):
            raise EngineArgsError(f"--disaggregation-mode: invalid choice {mode!r} (choose from null, prefill, decode)")
        return Role(str(mode))
    raw = values.get("kv_transfer_config")
    if raw is None:
        return hint or Role.AGGREGATED
    try:
        config = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise EngineArgsError(f"--kv-transfer-config: not valid JSON ({exc.msg})") from None
    if not isinstance(config, dict) or "kv_connector" not in config:
        raise EngineArgsError("--kv-transfer-config: needs a JSON object with kv_connector")
    kv_role = config.get("kv_role", "kv_both")
    if kv_role == "kv_producer":
        return Role.PREFILL
    if kv_role == "kv_consumer":
        return Role.DECODE
    if kv_role != "kv_both":
        raise EngineArgsError(f"--kv-transfer-config: kv_role {kv_role!r} is not kv_producer, kv_consumer or kv_both")
    return hint if hint in (Role.PREFILL, Role.DECODE) else Role.AGGREGATED
