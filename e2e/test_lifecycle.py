"""A ServingTopology's life on a real API server: apply, dry-run, invalid input, deletion and garbage collection."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import engine_containers, gpus_of, pod_ready, topology
from .processes import wait_until
from .stack import Emulator, Operator
from .tables import table

INSTANCE = "app.kubernetes.io/instance"


def _engine_pods(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = kube.items("pods", namespace, selector=f"{INSTANCE}={name}")
    return [p for p in pods if any(c.get("name") == "engine" for c in p["spec"]["containers"])]


def _apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))


def _prometheus(cluster: LocalCluster, query: str) -> list[dict[str, Any]]:
    """The instant-vector answer of `query` from the cluster's Prometheus."""
    url = f"{cluster.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.load(response)["data"]["result"])


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

    # The printer columns are filled: readiness and why, what runs, and TTFT/TPOT with units (e2e/test_transitions.py
    # reads them through a transition).
    header, rows = table(cluster.kubectl("get", "stopo", "llama", "-n", namespace).stdout)
    row = rows[0]
    assert header == ["NAME", "READY", "REASON", "MODE", "LAYOUT", "P:D", "GPUS", "TTFT", "TPOT", "PHASE", "AGE"], header
    assert (row["READY"], row["REASON"], row["MODE"], row["LAYOUT"], row["GPUS"]) == (
        "True", "WorkloadsReady", "Auto", plan["layout"], str(plan["gpus"])), row
    with_units = r"^(-|[0-9.]+(ms|s)) / [0-9.]+(ms|s)$"
    assert re.match(with_units, row["TTFT"]) and re.match(with_units, row["TPOT"]), row

    # The emulator serves one engine per Ready pod, none refused for its arguments.
    def emulated() -> bool:
        status = emulator.status()
        mine = [k for k in status["instances"] if k.startswith(f"{namespace}/")]
        return len(mine) == len(pods)

    wait_until(emulated, timeout_s=30, what="the emulator serving every engine pod",
               on_timeout=lambda: json.dumps(emulator.status(), indent=1))
    assert not [k for k in emulator.status()["errors"] if k.startswith(f"{namespace}/")]

    # Prometheus found every engine pod through the API server (the chart's PodMonitor relabelings) and
    # scraped it at the pod's own IP and port, with the labels the operator's PromQL filters on.
    selector = f'{{namespace="{namespace}",servingtopology_io_topology="llama"}}'

    def scraped() -> list[dict[str, Any]]:
        return [r for r in _prometheus(cluster, f"up{selector}") if r["value"][1] == "1"]

    wait_until(lambda: len(scraped()) == len(pods), timeout_s=60, what="Prometheus scraping every engine pod",
               on_timeout=lambda: json.dumps(_prometheus(cluster, "up"), indent=1)[-3000:])
    by_pod = {p["metadata"]["name"]: p for p in pods}
    for series in scraped():
        labels = series["metric"]
        pod = by_pod[labels["pod"]]
        assert labels["instance"] == f"{pod['status']['podIP']}:8000", labels
        assert labels["servingtopology_io_role"] == pod["metadata"]["labels"]["servingtopology.io/role"], labels
        assert labels["job"].endswith("-engines"), labels
    assert _prometheus(cluster, f"vllm:num_requests_running{selector}"), "no engine series with the topology's labels"


def test_dry_run_proposes_with_an_event_and_touches_no_workloads(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    _apply(cluster, topology("dry", namespace, prometheus_url=cluster.prometheus_url, mode="DryRun"))

    def proposed() -> bool:   # the pass posts its Event before kopf writes its status: wait for both
        return bool(kube.events(namespace, reason="PlanProposed")) and bool(kube.topology(namespace, "dry").get("status", {}).get("proposal"))

    wait_until(proposed, timeout_s=120, what="a PlanProposed Event and status.proposal", on_timeout=operator.log_tail)
    event = kube.events(namespace, reason="PlanProposed")[0]
    assert event["involvedObject"]["name"] == "dry"
    assert "would" in event["message"].lower(), event["message"]
    status = kube.topology(namespace, "dry").get("status", {})
    assert not kube.items("deployments", namespace), "DryRun must not create workloads"
    _, rows = table(cluster.kubectl("get", "stopo", "dry", "-n", namespace, "-o", "wide").stdout)
    row = rows[0]
    assert (row["READY"], row["REASON"], row["MODE"], row["PROPOSAL"]) == (
        "False", "AwaitingApproval", "DryRun", f"{status['proposal']['id']}: {status['proposal']['layout']}"), row


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


def test_a_pinned_layout_with_a_flag_the_engine_refuses_shows_the_engines_message_in_the_conditions(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    # A misspelled flag in spec.engine.extraArgs on a pinned layout: vLLM 0.11.0's parser (as recorded in
    # planner/data/engine_caps) exits 2 with "unrecognized arguments"; the emulator stands in for the engine and
    # the kubelet, the operator reads the termination message and reports it.
    obj = topology("wrong", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned")
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    obj["spec"]["engine"]["extraArgs"] = ["--tensor-paralel-size", "2"]
    _apply(cluster, obj)
    message = "vllm serve: error: unrecognized arguments: --tensor-paralel-size 2"

    def refused() -> list[str]:
        return [m for k, m in emulator.status()["errors"].items() if k.startswith(f"{namespace}/")]

    def condition_message() -> str:
        ready = kube.condition(namespace, "wrong", "Ready") or {}
        return str(ready.get("message", "")) if ready.get("reason") == "EngineFailed" else ""

    wait_until(lambda: message in condition_message(), timeout_s=240, what="the engine's message in the Ready condition",
               on_timeout=lambda: json.dumps({"conditions": kube.topology(namespace, "wrong").get("status", {}).get("conditions"),
                                              "emulator": refused()}, indent=1) + operator.log_tail())
    pod = _engine_pods(kube, namespace, "wrong")[0]
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 2 and last["message"] == message
    # Prometheus discovers the pods (they are Ready) but finds no engine behind them, as with a crashed engine.
    targets = lambda: _prometheus(cluster, f'up{{namespace="{namespace}"}}')  # noqa: E731
    wait_until(lambda: bool(targets()), timeout_s=60, what="Prometheus discovering the refused engine pods")
    assert all(t["value"][1] == "0" for t in targets()), targets()


def test_kubectl_explain_describes_the_pod_template(cluster: LocalCluster, operator: Operator) -> None:
    explained = cluster.kubectl("explain", "servingtopology.spec.podTemplate.spec").stdout
    for field in ("containers", "volumes", "nodeSelector", "tolerations", "affinity", "imagePullSecrets",
                  "serviceAccountName", "securityContext", "priorityClassName"):
        assert field in explained, explained
    env = cluster.kubectl("explain", "servingtopology.spec.podTemplate.spec.containers.env").stdout
    assert "merged by name" in env and "HF_TOKEN" in env, env
    roles = cluster.kubectl("explain", "servingtopology.spec.rolePodTemplates").stdout
    assert all(role in roles for role in ("prefill", "decode", "router")), roles
