"""spec.network reaches the right places: RDMA resources and IPC_LOCK on engine pods, NCCL's HCAs and socket NIC on
every engine, UCX's devices for NIXL on PD pods, SGLang's --disaggregation-ib-device for mooncake."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from cases import blueprint
from test_pod_template import _spec

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.pass_context import blueprint_for
from servingtopology.operator.render.manifests import build_workloads
from servingtopology.operator.render.network import NetworkKnobs
from servingtopology.planner.layout import Engine, Layout, Parallelism, RoleLayout
from servingtopology.spec import SpecError

PD = Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(1, Parallelism(tp=2)))
NET = NetworkKnobs(rdma_resource="rdma/rdma_shared_device_a", rdma_count=1, ipc_lock=True, ib_devices=("mlx5_0", "mlx5_1"),
                   socket_interface="eth0")


def _engines(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for o in objects:
        if o["kind"] == "Deployment" and o["spec"]["template"]["spec"]["containers"][0]["name"] == "engine":
            out[o["spec"]["template"]["metadata"]["labels"]["servingtopology.io/role"]] = o["spec"]["template"]["spec"]["containers"][0]
    return out


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_vllm_pd_pods_get_rdma_devices_ipc_lock_and_nics_for_nccl_and_nixl() -> None:
    objects = build_workloads(blueprint(Engine.VLLM, PD, network=NET))
    for role, engine in _engines(objects).items():
        env = _env(engine)
        assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"          # exact names: mlx5_1 must not pick mlx5_10
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1", role
        assert engine["resources"]["requests"]["rdma/rdma_shared_device_a"] == engine["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
        assert engine["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert "--disaggregation-ib-device" not in engine["args"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_aggregated_pods_get_nccl_nics_but_no_ucx_devices() -> None:
    (engine,) = _engines(build_workloads(blueprint(Engine.VLLM, Layout.replicas(2, Parallelism(tp=4)), network=NET))).values()
    assert "NCCL_IB_HCA" in _env(engine) and "UCX_NET_DEVICES" not in _env(engine)


@pytest.mark.parametrize(("backend", "flag", "ucx"), [("mooncake", True, False), ("nixl", False, True)])
def test_sglang_pd_names_the_nics_for_its_transfer_backend(backend: str, flag: bool, ucx: bool) -> None:
    engines = _engines(build_workloads(blueprint(Engine.SGLANG, PD, network=NET, transfer_backend=backend)))
    for engine in engines.values():
        args = engine["args"]
        assert ("--disaggregation-ib-device" in args) is flag
        if flag:
            assert args[args.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"
        assert ("UCX_NET_DEVICES" in _env(engine)) is ucx


def test_the_spec_turns_into_knobs_with_ipc_lock_on_by_default_with_rdma() -> None:
    spec = parse_topology_spec(_spec(network={"rdma": {"resource": "rdma/ib"}, "ibDevices": ["mlx5_0"]}))
    bp = blueprint_for(spec, PD, name="llama", namespace="serving", uid="u", gpus_per_node=8)
    assert bp.network == NetworkKnobs(rdma_resource="rdma/ib", rdma_count=1, ipc_lock=True, ib_devices=("mlx5_0",))
    with pytest.raises(SpecError) as caught:
        parse_topology_spec(_spec(network={"rdma": {"resource": "infiniband"}, "ibDevices": ["mlx5 0"]}))
    fields = {f for f, _ in caught.value.errors}
    assert {"spec.network.rdma.resource", "spec.network.ibDevices"} <= fields, caught.value.errors
