"""Engine command lines: the full `vllm serve` / `sglang.launch_server` command of one role's pods,
multi-node rendezvous flags under LeaderWorkerSet, and the PD router's command.

Called by the manifest builders (operator/manifests.py). The plan's own flags come from the planner's
engine_args (one truth for the CLI and the cluster); this module adds what only a pod needs. Pure.
Flag spellings follow shared/reference/engines.md sections 1.1, 1.2, 1.3, 2.1 and 2.2.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..planner.engine_args import engine_args
from ..planner.hardware import Precision
from ..planner.layout import Engine, EngineKnobs, Parallelism, Role, RoleLayout

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


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """The container command of one engine pod; `worker_args` is set only for multi-node replicas."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    worker_args: tuple[str, ...] = ()


def _role_args(*, engine: Engine, model: str, served_name: str, role: Role, par: Parallelism, knobs: EngineKnobs,
               precision: Precision, transfer_backend: str) -> list[str]:
    """The planner's engine arguments (planner/engine_args.py) wrapped with what a pod needs: the model,
    the listening address, the served name, SGLang's metrics switch and PD bootstrap port."""
    plan_args = engine_args(engine, role, RoleLayout(1, par, knobs), precision=precision, moe=par.ep)
    if engine is Engine.VLLM:
        head = [model, "--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--served-model-name", served_name]
        return head + plan_args
    head = ["--model-path", model, "--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--served-model-name", served_name]
    if "--disaggregation-transfer-backend" in plan_args:
        plan_args[plan_args.index("--disaggregation-transfer-backend") + 1] = transfer_backend
    tail = ["--enable-metrics"]
    if role is Role.PREFILL:
        tail += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
    return head + plan_args + tail


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
    command = ("vllm", "serve") if engine is Engine.VLLM else ("python3", "-m", "sglang.launch_server")
    base = _role_args(engine=engine, model=model, served_name=served_name, role=role, par=par, knobs=knobs,
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
