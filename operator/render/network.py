"""The KV-transfer and collective network of engine pods: RDMA devices, IPC_LOCK, and the NICs NIXL (UCX),
Mooncake and NCCL use, turned into the pod's resources, capabilities, environment and engine flags.

Called by operator/render/manifests.py for every engine pod; pure. Sources (shared/reference/engines.md §1.3, §2.1):
GPUDirect RDMA in pods needs the IPC_LOCK capability, /dev/shm in memory and NCCL_IB_HCA; vLLM's NixlConnector
and SGLang's nixl backend take their NICs from UCX_NET_DEVICES (NCCL_* do not apply to them); SGLang's mooncake
backend from `--disaggregation-ib-device`. NCCL_IB_HCA's leading `=` asks for exact names (mlx5_1 must not also
select mlx5_10); UCX names a device with its port (`mlx5_0:1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servingtopology.planner.layout import Engine, Role

__all__ = ["NetworkKnobs", "network_env", "network_args", "network_resources", "network_capabilities"]


@dataclass(frozen=True, slots=True)
class NetworkKnobs:
    """spec.network: the RDMA device-plugin resource and count per pod, IPC_LOCK, HCA names and the socket NIC."""

    rdma_resource: str = ""
    rdma_count: int = 1
    ipc_lock: bool = False
    ib_devices: tuple[str, ...] = ()
    socket_interface: str = ""
    ib_port: int = 1


def _pd(role: Role) -> bool:
    return role in (Role.PREFILL, Role.DECODE)


def network_env(knobs: NetworkKnobs, *, engine: Engine, role: Role, transfer_backend: str) -> list[dict[str, Any]]:
    """Environment variables of one engine pod: NCCL's HCAs and socket NIC (TP/PP/EP collectives, multi-node),
    Gloo's socket NIC (vLLM and torch CPU groups), and UCX's devices for NIXL KV transfer on PD pods."""
    env: list[dict[str, Any]] = []
    if knobs.ib_devices:
        env.append({"name": "NCCL_IB_HCA", "value": "=" + ",".join(knobs.ib_devices)})
    if knobs.socket_interface:
        env.append({"name": "NCCL_SOCKET_IFNAME", "value": knobs.socket_interface})
        env.append({"name": "GLOO_SOCKET_IFNAME", "value": knobs.socket_interface})
    nixl = engine is Engine.VLLM or transfer_backend == "nixl"
    if knobs.ib_devices and _pd(role) and nixl:
        env.append({"name": "UCX_NET_DEVICES", "value": ",".join(f"{d}:{knobs.ib_port}" for d in knobs.ib_devices)})
    return env


def network_args(knobs: NetworkKnobs, *, engine: Engine, role: Role, transfer_backend: str) -> tuple[str, ...]:
    """Engine flags: SGLang's `--disaggregation-ib-device` for the mooncake backend on PD pods."""
    if engine is Engine.SGLANG and _pd(role) and transfer_backend == "mooncake" and knobs.ib_devices:
        return ("--disaggregation-ib-device", ",".join(knobs.ib_devices))
    return ()


def network_resources(knobs: NetworkKnobs) -> dict[str, str]:
    """Extended resources of the RDMA device plugin, requested and limited alike."""
    return {knobs.rdma_resource: str(knobs.rdma_count)} if knobs.rdma_resource else {}


def network_capabilities(knobs: NetworkKnobs) -> list[str]:
    """Linux capabilities the engine container adds: IPC_LOCK to pin memory for RDMA registration."""
    return ["IPC_LOCK"] if knobs.ipc_lock else []
