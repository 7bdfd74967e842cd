"""Engine command lines: the `vllm serve` and `sglang.launch_server` arguments of one role of a plan.

Called by the manifest builders (operator/manifests.py). Pure: turns planner values into argument
lists; never reads the cluster. Flag spellings follow shared/reference/engines.md sections 1.1, 1.2,
2.1 and 2.2 (long names only, so a reader can grep for them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..planner.hardware import Precision
from ..planner.layout import Engine, EngineKnobs, KvDtype, Parallelism, Role

__all__ = [
    "ENGINE_PORT",
    "ROUTER_PORT",
    "SGLANG_BOOTSTRAP_PORT",
    "NIXL_SIDE_CHANNEL_PORT",
    "MULTINODE_PORT",
    "EngineCommand",
    "engine_command",
    "router_command",
]

ENGINE_PORT = 8000
ROUTER_PORT = 8080
SGLANG_BOOTSTRAP_PORT = 8998      # SGLang's default --disaggregation-bootstrap-port
NIXL_SIDE_CHANNEL_PORT = 5600     # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
MULTINODE_PORT = 29500            # vLLM --master-port / SGLang --dist-init-addr port under LeaderWorkerSet

_VLLM_KV_DTYPE = {KvDtype.AUTO: "auto", KvDtype.BF16: "bfloat16", KvDtype.FP8: "fp8"}
_SGLANG_KV_DTYPE = {KvDtype.AUTO: "auto", KvDtype.BF16: "bf16", KvDtype.FP8: "fp8_e4m3"}


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """The container command of one engine pod; `worker_args` is set only for multi-node replicas."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    worker_args: tuple[str, ...] = ()


def _quantization(precision: Precision) -> tuple[str, ...]:
    """Only FP8 is quantized on the fly; FP4/INT4 checkpoints carry their own quantization_config,
    which both engines detect, so naming a method there would only risk a mismatch."""
    return ("--quantization", "fp8") if precision is Precision.FP8 else ()


def _vllm_args(*, model: str, served_name: str, role: Role, par: Parallelism, knobs: EngineKnobs,
               precision: Precision) -> list[str]:
    args = [
        model,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--served-model-name", served_name,
        "--tensor-parallel-size", str(par.tp),
        "--pipeline-parallel-size", str(par.pp),
        "--data-parallel-size", str(par.dp),
    ]
    if par.ep:
        args.append("--enable-expert-parallel")
    args += [
        "--max-num-seqs", str(knobs.max_num_seqs),
        "--max-num-batched-tokens", str(knobs.max_num_batched_tokens),
        "--enable-chunked-prefill",
        "--gpu-memory-utilization", f"{knobs.memory_fraction:g}",
        "--kv-cache-dtype", _VLLM_KV_DTYPE[knobs.kv_dtype],
        "--block-size", str(knobs.block_size_tokens),
        "--enable-prefix-caching" if knobs.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    args += _quantization(precision)
    if role is not Role.AGGREGATED:
        # NixlConnector ignores kv_role (the router decides who prefills), but the producer/consumer
        # spelling of the multi-host example keeps the role visible in `kubectl describe`.
        kv_role = "kv_producer" if role is Role.PREFILL else "kv_consumer"
        config = {"kv_connector": "NixlConnector", "kv_role": kv_role}
        args += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    return args


def _sglang_args(*, model: str, served_name: str, role: Role, par: Parallelism, knobs: EngineKnobs,
                 precision: Precision, transfer_backend: str) -> list[str]:
    # SGLang counts --tp-size over every GPU of a pipeline stage; DP attention splits it into dp groups.
    args = [
        "--model-path", model,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--served-model-name", served_name,
        "--tp-size", str(par.tp * par.dp),
        "--pp-size", str(par.pp),
    ]
    if par.dp > 1:
        args += ["--dp-size", str(par.dp), "--enable-dp-attention"]
    if par.ep:
        args += ["--ep-size", str(par.tp * par.dp)]
    # The planner's knobs are per attention-DP rank; SGLang's two budgets are global across the ranks.
    args += [
        "--max-running-requests", str(knobs.max_num_seqs * par.dp),
        "--chunked-prefill-size", str(knobs.max_num_batched_tokens * par.dp),
        "--mem-fraction-static", f"{knobs.memory_fraction:g}",
        "--kv-cache-dtype", _SGLANG_KV_DTYPE[knobs.kv_dtype],
    ]
    if not knobs.enable_prefix_caching:
        args.append("--disable-radix-cache")
    args += _quantization(precision)
    args.append("--enable-metrics")
    if role is not Role.AGGREGATED:
        args += ["--disaggregation-mode", role.value, "--disaggregation-transfer-backend", transfer_backend]
        if role is Role.PREFILL:
            args += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
    return args


def _multinode(engine: Engine, *, nodes: int, leader: bool) -> list[str]:
    """Rendezvous flags under LeaderWorkerSet; $(VAR) is expanded by the kubelet from the pod's env."""
    if engine is Engine.VLLM:
        rank = "0" if leader else "$(LWS_WORKER_INDEX)"
        args = ["--nnodes", str(nodes), "--node-rank", rank, "--master-addr", "$(LWS_LEADER_ADDRESS)",
                "--master-port", str(MULTINODE_PORT)]
        return args if leader else [*args, "--headless"]
    rank = "0" if leader else "$(LWS_WORKER_INDEX)"
    return ["--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{MULTINODE_PORT}", "--nnodes", str(nodes), "--node-rank", rank]


def engine_command(*, engine: Engine, model: str, served_name: str, role: Role, par: Parallelism,
                   knobs: EngineKnobs, precision: Precision, extra_args: tuple[str, ...] = (),
                   nodes: int = 1, transfer_backend: str = "nixl") -> EngineCommand:
    """Build the engine container's command and arguments for one role.

    `nodes` > 1 adds the multi-node rendezvous flags (leader in `args`, workers in `worker_args`).
    `extra_args` come last, so a user's flag overrides the generated one (both engines use argparse,
    where the last occurrence wins).
    """
    if engine is Engine.VLLM:
        command: tuple[str, ...] = ("vllm", "serve")
        base = _vllm_args(model=model, served_name=served_name, role=role, par=par, knobs=knobs, precision=precision)
    else:
        command = ("python3", "-m", "sglang.launch_server")
        base = _sglang_args(model=model, served_name=served_name, role=role, par=par, knobs=knobs,
                            precision=precision, transfer_backend=transfer_backend)
    if nodes <= 1:
        return EngineCommand(command, (*base, *extra_args))
    leader = (*base, *_multinode(engine, nodes=nodes, leader=True), *extra_args)
    worker = (*base, *_multinode(engine, nodes=nodes, leader=False), *extra_args)
    return EngineCommand(command, leader, worker)


def router_command(*, engine: Engine, namespace: str, prefill_selector: str, decode_selector: str) -> EngineCommand:
    """Build the PD router's command: it discovers prefill and decode pods by label and pairs them.

    SGLang: `sglang_router.launch_router --pd-disaggregation` (engines.md 2.2); vLLM: `vllm-router
    --vllm-pd-disaggregation`, the same gateway with vLLM's two-stage prefill→decode protocol (1.2).
    Both watch pods through Kubernetes service discovery, so scaling a role needs no router restart.
    """
    if engine is Engine.VLLM:
        command: tuple[str, ...] = ("vllm-router",)
        mode = "--vllm-pd-disaggregation"
    else:
        command = ("python3", "-m", "sglang_router.launch_router")
        mode = "--pd-disaggregation"
    args = (
        mode,
        "--host", "0.0.0.0",
        "--port", str(ROUTER_PORT),
        "--service-discovery",
        "--service-discovery-namespace", namespace,
        "--service-discovery-port", str(ENGINE_PORT),
        "--prefill-selector", *prefill_selector.split(","),
        "--decode-selector", *decode_selector.split(","),
        "--policy", "round_robin",
    )
    return EngineCommand(command, args)
