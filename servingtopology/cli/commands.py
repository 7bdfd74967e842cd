"""Copy-pastable engine command lines for a planned layout: what `plan` prints and puts in its JSON.

Rendered by the renderer the operator uses (planner/engines/command.py `engine_command`, the one that writes the engine
pods' command and args), so the printed line and a pod's command cannot drift: `vllm serve MODEL …` or
`python3 -m sglang.launch_server --model-path MODEL …`, with the spec's engine.extraArgs last, shell-quoted
(shlex.join: PD's `--kv-transfer-config {…}` stays one word). Used by `servingtopology plan`; owns no flags.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from servingtopology.planner.engines.command import engine_command
from servingtopology.planner.layout import Layout, LayoutKind, Role
from servingtopology.planner.problem import Problem
from servingtopology.spec import PlanSpec, engine_extra_args, read_model_identity

__all__ = ["RoleCommand", "engine_model", "role_commands", "MULTINODE_NOTE"]

# A pod's multi-node rendezvous names LeaderWorkerSet's variables, which the kubelet expands; the printed lines
# carry the node's index and this word for the first node's address instead.
LEADER_ADDRESS = "LEADER_ADDRESS"
MULTINODE_NOTE = f"replace {LEADER_ADDRESS} with the first node's address"


@dataclass(frozen=True, slots=True)
class RoleCommand:
    """One role's shell command line (`leader`, the first node's), and for an instance spanning nodes, the line of
    each other node (`workers[i]` runs on node i + 1)."""

    role: Role
    count: int
    nodes: int
    leader: str
    workers: tuple[str, ...] = ()


def engine_model(spec: PlanSpec, problem: Problem) -> str:
    """What the engine loads (servingtopology.spec.model_identity, the operator's rule): modelSource, a Hugging Face id
    as given, a catalog id's Hugging Face id, or for a config.json alone the checkpoint folder holding it; InvalidSpec
    on modelSource when none of these names the weights."""
    return read_model_identity(spec).source


def role_commands(spec: PlanSpec, problem: Problem, layout: Layout) -> list[RoleCommand]:
    """One command line per role of `layout` (aggregated, or prefill and decode), as the engine pods run it."""
    identity = read_model_identity(spec)
    model, served = identity.source, identity.served_name
    roles = (Role.AGGREGATED,) if layout.kind is LayoutKind.REPLICAS else (Role.PREFILL, Role.DECODE)
    out = []
    for role in roles:
        rl = layout.roles[role]
        nodes = max(1, math.ceil(rl.parallelism.gpus / problem.gpu.gpus_per_node))
        cmd = engine_command(engine=problem.engine, model=model, served_name=served, role=role, par=rl.parallelism, knobs=rl.knobs,
                             precision=layout.precision, extra_args=engine_extra_args(spec), nodes=nodes,
                             version=problem.engine_version)
        workers = tuple(_on_node(shlex.join([*cmd.command, *cmd.worker_args]), index=i, nodes=nodes)
                        for i in range(1, nodes)) if cmd.worker_args else ()
        out.append(RoleCommand(role, rl.count, nodes, _on_node(shlex.join([*cmd.command, *cmd.args]), index=0, nodes=nodes), workers))
    return out


def _on_node(line: str, *, index: int, nodes: int) -> str:
    """A pod's line with LeaderWorkerSet's variables given: this node's index, the group's size, the leader's address."""
    return (line.replace("$(LWS_WORKER_INDEX)", str(index)).replace("$(LWS_GROUP_SIZE)", str(nodes))
            .replace("$(LWS_LEADER_ADDRESS)", LEADER_ADDRESS))
