"""A ServingTopology's life on a real API server: apply, dry-run, invalid input, deletion and garbage collection."""

from __future__ import annotations

import json
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import engine_containers, gpus_of, pod_ready, topology
from .processes import wait_until
from .stack import Emulator, Operator

INSTANCE = "app.kubernetes.io/instance"


def _engine_pods(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = kube.items("pods", namespace, selector=f"{INSTANCE}={name}")
    return [p for p in pods if any(c.get("name") == "engine" for c in p["spec"]["containers"])]


def _apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))


def test_an_applied_topology_runs_engines_on_fake_gpus_and_reports_ready(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    obj = topology("llama", namespace, prometheus_url=cluster.prometheus_url)
    _apply(cluster, obj)
    kube.wait_condition(namespace, "llama", "Ready", "True", timeout_s=180, log=operator.log_tail)

    status = kube.topology(namespace, "llama")["status"]
    plan = status["plan"]
    assert 0 < plan["gpus"] <= 8
    deployments = kube.items("deployments", namespace, selector=f"{INSTANCE}=llama")
    engine_deployments = [d for d in deployments if engine_containers(d)]
    assert engine_deployments, "no engine Deployment"
    for deployment in engine_deployments:
        owners = deployment["metadata"].get("ownerReferences", [])
        assert any(o["kind"] == "ServingTopology" and o["name"] == "llama" for o in owners)
        args = " ".join(engine_containers(deployment)[0].get("args", []))
        role = deployment["spec"]["template"]["metadata"]["labels"].get("servingtopology.io/role", "aggregated")
        role_plan = next(r for r in plan["roles"] if r["role"] == role) if isinstance(plan.get("roles"), list) else None
        if role_plan is not None:
            assert f"--tensor-parallel-size {role_plan['tp']}" in args or f"-tp {role_plan['tp']}" in args, args
            assert deployment["spec"]["replicas"] == role_plan["replicas"]
    assert kube.items("services", namespace, selector=f"{INSTANCE}=llama"), "no Service"

    pods = _engine_pods(kube, namespace, "llama")
    assert pods and all(pod_ready(p) for p in pods)
    assert all(p["spec"]["nodeName"].startswith("gpu-node-") for p in pods)
    assert sum(gpus_of(p) for p in pods) == plan["gpus"]

    # The printer columns are filled (LAYOUT, GPUS, P:D, TTFT, TPOT, READY).
    table = cluster.kubectl("get", "stopo", "llama", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    for column in ("LAYOUT", "GPUS", "READY"):
        assert column in header, table
    assert row[header.index("GPUS")] == str(plan["gpus"]), table
    assert row[header.index("READY")] == "True", table

    # The emulator serves one engine per Ready pod, none refused for its arguments.
    def emulated() -> bool:
        status = emulator.status()
        mine = [k for k in status["instances"] if k.startswith(f"{namespace}/")]
        return len(mine) == len(pods)

    wait_until(emulated, timeout_s=30, what="the emulator serving every engine pod",
               on_timeout=lambda: json.dumps(emulator.status(), indent=1))
    assert not [k for k in emulator.status()["errors"] if k.startswith(f"{namespace}/")]


def test_dry_run_proposes_with_an_event_and_touches_no_workloads(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    _apply(cluster, topology("dry", namespace, prometheus_url=cluster.prometheus_url, mode="DryRun"))

    def proposed() -> bool:
        return bool(kube.events(namespace, reason="PlanProposed"))

    wait_until(proposed, timeout_s=120, what="a PlanProposed Event", on_timeout=operator.log_tail)
    event = kube.events(namespace, reason="PlanProposed")[0]
    assert event["involvedObject"]["name"] == "dry"
    assert "would" in event["message"].lower(), event["message"]
    status = kube.topology(namespace, "dry").get("status", {})
    assert status.get("proposal"), status
    assert not kube.items("deployments", namespace), "DryRun must not create workloads"


def test_an_invalid_topology_is_rejected_by_the_api_server_with_a_readable_message(
        cluster: LocalCluster, operator: Operator, namespace: str) -> None:
    obj = topology("bad", namespace, prometheus_url=cluster.prometheus_url)
    obj["spec"]["policy"]["mode"] = "Sometimes"
    obj["spec"]["hardware"]["maxGPUs"] = -3
    done = cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj), check=False)
    assert done.returncode != 0
    message = done.stderr
    assert "spec.policy.mode" in message and "Sometimes" in message, message
    assert "spec.hardware.maxGPUs" in message, message
    assert cluster.kubectl("get", "stopo", "bad", "-n", namespace, check=False).returncode != 0


def test_deleting_a_topology_garbage_collects_everything_it_owned(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    _apply(cluster, topology("gone", namespace, prometheus_url=cluster.prometheus_url))
    wait_until(lambda: bool(_engine_pods(kube, namespace, "gone")), timeout_s=180, what="engine pods",
               on_timeout=operator.log_tail)
    cluster.kubectl("delete", "stopo", "gone", "-n", namespace, "--wait=true", "--timeout=60s")

    def nothing_left() -> bool:
        kinds = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings"
        left = [i for i in kube.items(kinds, namespace, selector=f"{INSTANCE}=gone")]
        return not left

    wait_until(nothing_left, timeout_s=120, what="garbage collection of every owned object",
               on_timeout=lambda: cluster.kubectl("get", "all", "-n", namespace, "-o", "wide", check=False).stdout)


def test_engine_arguments_a_real_engine_would_refuse_show_up_in_the_emulator(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    obj = topology("wrong", namespace, prometheus_url=cluster.prometheus_url)
    obj["spec"]["engine"]["extraArgs"] = ["--max-num-seqs", "0"]
    _apply(cluster, obj)
    wait_until(lambda: bool(_engine_pods(kube, namespace, "wrong")) and all(pod_ready(p) for p in _engine_pods(kube, namespace, "wrong")),
               timeout_s=180, what="engine pods Ready (kwok does not run them)", on_timeout=operator.log_tail)

    def refused() -> list[str]:
        return [m for k, m in emulator.status()["errors"].items() if k.startswith(f"{namespace}/")]

    wait_until(lambda: bool(refused()), timeout_s=30, what="the emulator refusing the engine",
               on_timeout=lambda: json.dumps(emulator.status(), indent=1))
    assert all("--max-num-seqs" in m for m in refused()), refused()
    targets = json.loads(cluster.file_sd_path.read_text())
    assert not [t for t in targets if t["labels"].get("namespace") == namespace]
