"""Engine command lines: the full `vllm serve` / `sglang.launch_server` command of one role's pods,
multi-node rendezvous under LeaderWorkerSet, and the PD router's command, for one engine release.

Called by the operator's manifest builders (operator/render/manifests.py) and the CLI (cli/commands.py). The plan's own flags come from
engine_args (one truth for the CLI and the cluster); this module adds what only a pod needs. Pure.
Flag spellings follow shared/reference/engines.md sections 1.1, 1.2, 1.3, 2.1 and 2.2; how an instance
spans nodes follows the release's capability data (planner/engines/caps.py): vLLM releases with
`--nnodes` start every node with `vllm serve` (multiprocessing); older ones (0.11) have no such flags and
start through Ray, as vLLM's LeaderWorkerSet guide does (docs/deployment/frameworks/lws.md).
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass

from servingtopology.planner.engines.args import engine_args
from servingtopology.planner.engines.caps import load_caps, resolve_version
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, EngineKnobs, Parallelism, Role, RoleLayout

__all__ = [
    "ENGINE_PORT",
    "ROUTER_PORT",
    "SGLANG_BOOTSTRAP_PORT",
    "NIXL_SIDE_CHANNEL_PORT",
    "MULTINODE_PORT",
    "ROUTER_METRICS_PORT",
    "RAY_MULTINODE_SCRIPT",
    "RouterKind",
    "DEFAULT_ROUTER_IMAGES",
    "EngineCommand",
    "engine_command",
    "router_command",
    "router_kind",
]

ENGINE_PORT = 8000
ROUTER_PORT = 8080
SGLANG_BOOTSTRAP_PORT = 8998      # SGLang's default --disaggregation-bootstrap-port
NIXL_SIDE_CHANNEL_PORT = 5600     # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
MULTINODE_PORT = 29500            # vLLM --master-port / SGLang --dist-init-addr port under LeaderWorkerSet
ROUTER_METRICS_PORT = 29000       # the routers' --prometheus-port default (vllm-router, smg)
# The Ray bootstrap script the vllm/vllm-openai image ships (vLLM's LeaderWorkerSet guide runs it on every pod).
RAY_MULTINODE_SCRIPT = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"


class RouterKind(enum.StrEnum):
    """The PD router a topology runs: vLLM's vllm-router, or SGLang's gateway (smg)."""

    VLLM_ROUTER = "vllm-router"
    SMG = "smg"


ROUTER_VERSIONS = {RouterKind.VLLM_ROUTER: "0.1.17", RouterKind.SMG: "1.13.0"}
# Default router images (override with spec.engine.routerImage): the engine images do not all ship a router
# (vllm/vllm-openai has no vllm-router); these are the routers' own images at the covered versions.
DEFAULT_ROUTER_IMAGES = {RouterKind.VLLM_ROUTER: "vllm/vllm-router:v0.1.17", RouterKind.SMG: "lightseekorg/smg:1.13.0"}


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """The container command of one engine pod; `worker_args` is set only for multi-node replicas."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    worker_args: tuple[str, ...] = ()


def _role_args(*, engine: Engine, model: str, served_name: str, role: Role, par: Parallelism, knobs: EngineKnobs,
               precision: Precision, transfer_backend: str, version: str, gpu: str = "") -> list[str]:
    """The planner's engine arguments (planner/engines/args.py) wrapped with what a pod needs: the model,
    the listening address, the served name, SGLang's metrics switch and PD bootstrap port."""
    plan_args = engine_args(engine, role, RoleLayout(1, par, knobs), precision=precision, moe=par.ep, version=version, gpu=gpu)
    if engine is Engine.VLLM:
        head = [model, "--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--served-model-name", served_name]
        return head + plan_args
    head = ["--model-path", model, "--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--served-model-name", served_name]
    if "--disaggregation-transfer-backend" in plan_args:
        plan_args[plan_args.index("--disaggregation-transfer-backend") + 1] = transfer_backend
    tail = ["--enable-metrics"]
    if par.dp > 1:
        # Under attention DP only the first rank's scheduler reports gauges unless every scheduler is asked to.
        tail += ["--enable-metrics-for-all-schedulers"]
    if role is Role.PREFILL:
        tail += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
    return head + plan_args + tail


def _multinode(engine: Engine, *, nodes: int, leader: bool) -> list[str]:
    """Rendezvous flags under LeaderWorkerSet (vLLM's multiprocessing form, SGLang's dist-init form); $(VAR) is
    expanded by the kubelet from the pod's env."""
    if engine is Engine.VLLM:
        rank = "0" if leader else "$(LWS_WORKER_INDEX)"
        args = ["--nnodes", str(nodes), "--node-rank", rank, "--master-addr", "$(LWS_LEADER_ADDRESS)",
                "--master-port", str(MULTINODE_PORT)]
        return args if leader else [*args, "--headless"]
    rank = "0" if leader else "$(LWS_WORKER_INDEX)"
    return ["--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{MULTINODE_PORT}", "--nnodes", str(nodes), "--node-rank", rank]


def _ray_command(base: list[str], extra_args: tuple[str, ...]) -> EngineCommand:
    """vLLM without multi-node flags: the leader starts the Ray head, waits for the group, then serves with the
    Ray executor; workers only join the Ray cluster (vLLM's LeaderWorkerSet guide)."""
    serve = shlex.join(["vllm", "serve", *base, "--distributed-executor-backend", "ray", *extra_args])
    leader = f"bash {RAY_MULTINODE_SCRIPT} leader --ray_cluster_size=$(LWS_GROUP_SIZE); exec {serve}"
    worker = f"bash {RAY_MULTINODE_SCRIPT} worker --ray_address=$(LWS_LEADER_ADDRESS)"
    return EngineCommand(("/bin/sh", "-c"), (leader,), (worker,))


def engine_command(*, engine: Engine, model: str, served_name: str, role: Role, par: Parallelism,
                   knobs: EngineKnobs, precision: Precision, extra_args: tuple[str, ...] = (),
                   nodes: int = 1, transfer_backend: str = "nixl", version: str = "", gpu: str = "") -> EngineCommand:
    """Build the engine container's command and arguments for one role of one release (empty `version`: the
    newest covered).

    `gpu`: the catalog id of the role's GPU kind (planner.engines.args.engine_args).
    `nodes` > 1 adds the multi-node rendezvous (leader in `args`, workers in `worker_args`), in the form the
    release supports. `extra_args` come last, so a user's flag overrides the generated one (both engines use
    argparse, where the last occurrence wins).
    """
    version = version or resolve_version(engine)
    command = ("vllm", "serve") if engine is Engine.VLLM else ("python3", "-m", "sglang.launch_server")
    base = _role_args(engine=engine, model=model, served_name=served_name, role=role, par=par, knobs=knobs,
                      precision=precision, transfer_backend=transfer_backend, version=version, gpu=gpu)
    if nodes <= 1:
        return EngineCommand(command, (*base, *extra_args))
    if engine is Engine.VLLM and load_caps(engine.value, version).multinode_style == "ray":
        # Data-parallel ranks over Ray's nodes need Ray's DP backend too (the executor flag places TP and PP only).
        dp_backend = ["--data-parallel-backend", "ray"] if par.dp > 1 else []
        return _ray_command([*base, *dp_backend], extra_args)
    leader = (*base, *_multinode(engine, nodes=nodes, leader=True), *extra_args)
    worker = (*base, *_multinode(engine, nodes=nodes, leader=False), *extra_args)
    return EngineCommand(command, leader, worker)


def router_kind(engine: Engine) -> RouterKind:
    """The router a PD layout of this engine runs."""
    return RouterKind.VLLM_ROUTER if engine is Engine.VLLM else RouterKind.SMG


def router_command(*, engine: Engine, namespace: str, prefill_selector: str, decode_selector: str) -> EngineCommand:
    """Build the PD router's command: it discovers prefill and decode pods by label and pairs them.

    SGLang: `smg launch --pd-disaggregation`, SGLang's model gateway as its own package (engines.md 2.2);
    vLLM: `vllm-router --vllm-pd-disaggregation`, the same gateway with vLLM's two-stage prefill→decode
    protocol (1.2). Both watch pods through Kubernetes service discovery, so scaling a role needs no router
    restart, and export Prometheus metrics on ROUTER_METRICS_PORT.
    """
    if router_kind(engine) is RouterKind.VLLM_ROUTER:
        command: tuple[str, ...] = ("vllm-router",)
        mode = "--vllm-pd-disaggregation"
    else:
        command = ("smg", "launch")
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
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(ROUTER_METRICS_PORT),
    )
    return EngineCommand(command, args)
