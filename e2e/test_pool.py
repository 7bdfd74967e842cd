"""A ServingPool on a real API server: kwok nodes of two GPU kinds (the harness's H100 nodes and two A100 nodes added here),
three member ServingTopologies labelled into the pool. The pool's DryRun proposal appears in status and as an Event;
when traffic moves from one member to another the proposal moves GPUs with it; the proposal never exceeds the
inventory; deleting a member frees its GPUs. An API-server restart delays the pool's next pass by seconds (ApiUnavailable's
bounded back-off), not by kopf's 60 s back-off with a traceback."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import yaml

from .cluster import LocalCluster, NodePool
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .stack import Operator

A100_NODES = NodePool(count=2, gpus_per_node=8, gpu_product="NVIDIA-A100-SXM4-80GB", name_prefix="a100-node")


def _pool(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "servingtopology.io/v1alpha1", "kind": "ServingPool", "metadata": {"name": "fleet", "namespace": namespace},
            "spec": {"objective": "min-cost", "inventory": [{"kind": "h100", "gpu": "h100_sxm", "pricePerHour": 2.99, "maxGPUs": 16},
                                                            {"kind": "a100", "gpu": "a100_sxm", "pricePerHour": 1.6}]}}


def _member(name: str, namespace: str, *, rate: float, priority: int) -> dict[str, Any]:
    obj = topology(name, namespace, prometheus_url=None, mode="DryRun", max_gpus=16, arrival_rate=rate, input_tokens=1024, output_tokens=256)
    obj["metadata"]["labels"] = {"servingtopology.io/pool": "fleet"}
    obj["metadata"]["annotations"] = {"servingtopology.io/pool-priority": str(priority)}
    return obj


def _status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    done = cluster.kubectl("get", "servingpool", "fleet", "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(done.stdout).get("status") or {}) if done.returncode == 0 else {}


def _gpus(status: dict[str, Any]) -> dict[str, int]:
    return {m["name"]: sum(m["gpus"].values()) for m in status.get("members") or []}


def _within_inventory(status: dict[str, Any]) -> None:
    for kind, count in (status.get("inventory") or {}).items():
        used = sum(m["gpus"].get(kind, 0) for m in status.get("members") or [])
        assert used <= count and used + status["idle"][kind] == count, status


def test_a_pool_proposes_gpus_for_its_members_moves_them_with_traffic_and_frees_a_deleted_members(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    cluster.create_gpu_nodes(A100_NODES)
    try:
        for obj in (_member("chat", namespace, rate=60.0, priority=5), _member("rag", namespace, rate=3.0, priority=1),
                    _member("batch", namespace, rate=4.0, priority=0), _pool(namespace)):
            cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))

        def planned(members: int) -> bool:
            s = _status(cluster, namespace)
            conds = s.get("conditions") or [{}]
            return conds[0].get("reason") == "PoolPlanned" and len(s.get("members") or []) == members

        wait_until(lambda: planned(3), timeout_s=240, what="the pool planned its 3 members",
                   on_timeout=lambda: json.dumps(_status(cluster, namespace))[-2000:] + operator.log_tail())
        first = _status(cluster, namespace)
        assert first["inventory"] == {"h100": 16, "a100": 16}          # H100 capped at 16 of 32; the two A100 nodes' 16
        assert all(m["met"] for m in first["members"]), first["members"]
        _within_inventory(first)
        assert kube.events(namespace, reason="PoolProposal"), "a DryRun proposal is an Event"
        columns = cluster.kubectl("get", "spool", "-n", namespace).stdout
        assert "PoolPlanned" in columns and "3/3" in columns, columns

        # traffic moves from chat to rag: the proposal moves GPUs from chat to rag
        for name, rate, prio in (("chat", 6.0, 5), ("rag", 60.0, 1)):
            cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_member(name, namespace, rate=rate, priority=prio)))
        before = _gpus(first)
        wait_until(lambda: _gpus(_status(cluster, namespace)).get("rag", 0) > before["rag"]
                   and _gpus(_status(cluster, namespace)).get("chat", 0) < before["chat"], timeout_s=240,
                   what="the proposal moved GPUs from chat to rag", on_timeout=lambda: json.dumps(_status(cluster, namespace))[-2000:])
        moved_status = _status(cluster, namespace)
        _within_inventory(moved_status)
        assert all(m["met"] for m in moved_status["members"])
        assert len(kube.events(namespace, reason="PoolProposal")) >= 1

        # deleting a member frees its GPUs
        batch_cost = next(m["costPerHour"] for m in moved_status["members"] if m["name"] == "batch")
        cluster.kubectl("delete", "stopo", "batch", "-n", namespace, "--wait=true", "--timeout=60s")
        wait_until(lambda: planned(2), timeout_s=240, what="the pool planned without batch")
        after = _status(cluster, namespace)
        _within_inventory(after)
        assert "batch" not in _gpus(after)
        # the others' sets of before still fit, so the pool costs at most what it cost less batch's share
        assert after["costPerHour"] <= moved_status["costPerHour"] - batch_cost + 0.01, (after, moved_status)
        assert all(m["met"] for m in after["members"])
        assert any("left the pool" in (e.get("message") or e.get("note") or "") for e in kube.events(namespace, reason="PoolProposal"))
    finally:
        cluster.kubectl("delete", "servingpool", "fleet", "-n", namespace, "--wait=false", check=False)
        for i in range(A100_NODES.count):
            cluster.kubectl("delete", "node", f"{A100_NODES.name_prefix}-{i}", "--wait=false", check=False)


OUTAGE_S = 14.0           # the API-server restart of issue 38 (a pool move then took 90 s)
RECOVERY_S = 20.0         # the pool's next pass after the restart comes within this (kopf's own back-off was 60 s)


def _planned_at(status: dict[str, Any]) -> datetime | None:
    planned = next((c for c in status.get("conditions") or [] if c.get("type") == "Planned" and c.get("reason") == "PoolPlanned"), None)
    return datetime.fromisoformat(planned["lastTransitionTime"]) if planned else None


def test_an_api_server_restart_delays_the_pools_next_pass_by_seconds_not_by_kopfs_60_s_back_off(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    pool = _pool(namespace)
    pool["spec"]["inventory"] = pool["spec"]["inventory"][:1]        # the harness's H100 nodes only
    for obj in (_member("chat", namespace, rate=20.0, priority=5), _member("rag", namespace, rate=3.0, priority=1), pool):
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))
    try:
        wait_until(lambda: len(_status(cluster, namespace).get("members") or []) == 2 and _planned_at(_status(cluster, namespace)) is not None,
                   timeout_s=240, what="the pool planned its 2 members", on_timeout=operator.log_tail)
        log_from = len(operator.log_tail(chars=1 << 30))
        cluster.stop_apiserver()
        time.sleep(OUTAGE_S)
        cluster.start_apiserver()
        up, up_wall = time.monotonic(), datetime.now(UTC)
        wait_until(lambda: (_planned_at(_status(cluster, namespace)) or up_wall) > up_wall, timeout_s=120, interval_s=0.25,
                   what="the pool's first pass after the restart", on_timeout=operator.log_tail)
        recovered_s = time.monotonic() - up
        log = operator.log_tail(chars=1 << 30)[log_from:]
        pool_lines = [line for line in log.splitlines() if "pool-timer" in line or f"pool {namespace}/fleet" in line]
        print(f"\nAPI server down {OUTAGE_S:g} s; the pool planned again {recovered_s:.1f} s after it was back; "
              f"{sum('ApiUnavailable' in x or 'pass failed' in x for x in pool_lines)} pool failure lines")
        assert recovered_s < RECOVERY_S, f"the pool waited {recovered_s:.1f} s after the restart"
        assert not any("Traceback" in x or "failed with an exception" in x for x in pool_lines), "\n".join(pool_lines[-20:])
        assert any(f"pool {namespace}/fleet: pass failed (1 in a row): Kubernetes API" in x for x in pool_lines), "\n".join(pool_lines[-20:])
    finally:
        cluster.kubectl("delete", "servingpool", "fleet", "-n", namespace, "--wait=false", check=False)
