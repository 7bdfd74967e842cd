"""The examples against the real API server: examples/gated-llama-hf-cache.yaml applied as a user would (its Secret,
its claim, its ServingTopology), retargeted at the harness: the engine pods run with HF_TOKEN from the Secret and the
shared model cache mounted; and every example file applied at once, accepted by the API server (the CRD's schema and
rules) and planned by the operator. The live-replanning demo's own scenario is in e2e/test_transitions.py."""

from __future__ import annotations

from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .kubetools import REPO_ROOT
from .objects import GPU_PRODUCT, pod_ready
from .stack import Operator

EXAMPLE = REPO_ROOT / "examples" / "gated-llama-hf-cache.yaml"


def test_the_gated_model_example_runs_engine_pods_with_the_token_secret_and_the_cache_claim(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    topology = next(d for d in docs if d["kind"] == "ServingTopology")
    topology["spec"]["hardware"]["nodeSelector"] = {"nvidia.com/gpu.product": GPU_PRODUCT}
    topology["spec"]["metrics"] = {"prometheusUrl": cluster.prometheus_url, "selector": {"namespace": namespace}}
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    # The cluster's storage: a ReadWriteMany volume the claim binds to (a real cluster's RWX class provisions one).
    cluster.kubectl_apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"models-{namespace}"},
                           "spec": {"capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                                    "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
                                    "hostPath": {"path": f"/tmp/{namespace}-models"},
                                    "claimRef": {"namespace": namespace, "name": claim["metadata"]["name"]}}})
    try:
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
        name = topology["metadata"]["name"]
        kube.wait_condition(namespace, name, "Ready", "True", timeout_s=240, log=operator.log_tail)
        pods = [p for p in kube.items("pods", namespace, selector=f"app.kubernetes.io/instance={name}")]
        assert pods and all(pod_ready(p) for p in pods)
        for pod in pods:
            engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
            env = {e["name"]: e for e in engine.get("env", [])}
            assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
            assert any(m["mountPath"] == "/models" for m in engine["volumeMounts"])
            assert pod["spec"]["automountServiceAccountToken"] is False
            assert engine["resources"]["requests"]["memory"] and engine["resources"]["requests"]["cpu"]
        bound = kube.get("persistentvolumeclaims", namespace, claim["metadata"]["name"])
        assert bound["status"]["phase"] == "Bound", bound["status"]
    finally:
        cluster.kubectl("delete", "persistentvolume", f"models-{namespace}", "--wait=false", check=False)


def _example_documents(namespace: str, prometheus_url: str) -> list[dict[str, Any]]:
    """Every example file's objects, retargeted at the harness: the test's namespace, the harness' Prometheus, and
    Auto → DryRun (planned and proposed, not deployed: the examples together ask for more than the 32 fake GPUs).
    Pinned ones run as they are. Nothing else changes: the API server validates each against the CRD."""
    docs: list[dict[str, Any]] = []
    for path in sorted((REPO_ROOT / "examples").glob("*.yaml")):
        for doc in (d for d in yaml.safe_load_all(path.read_text()) if d and "apiVersion" in d):
            doc["metadata"]["namespace"] = namespace
            if doc["kind"] == "ServingTopology":
                doc["metadata"].setdefault("annotations", {})["e2e/example"] = path.name
                doc["spec"]["metrics"] = {"prometheusUrl": prometheus_url, "selector": {"namespace": namespace}}
                if doc["spec"]["policy"]["mode"] == "Auto":
                    doc["spec"]["policy"]["mode"] = "DryRun"
            docs.append(doc)
    return docs


def test_every_example_is_accepted_by_the_api_server_and_planned(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    docs = _example_documents(namespace, cluster.prometheus_url)
    topologies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServingTopology"}
    assert len(topologies) >= 7, sorted(topologies)
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))

    def planned(name: str) -> dict[str, Any] | None:
        obj = kube.topology(namespace, name)
        status = obj.get("status", {})
        key = "plan" if topologies[name]["spec"]["policy"]["mode"] == "Pinned" else "proposal"
        plan = status.get(key)
        return plan if plan and plan.get("generation") == obj["metadata"]["generation"] else None

    for name in topologies:
        kube.wait_condition(namespace, name, "Planned", "True", timeout_s=180, log=operator.log_tail)
        plan = planned(name)
        assert plan is not None, (name, kube.topology(namespace, name).get("status"))
        assert plan["gpus"] <= topologies[name]["spec"]["hardware"]["maxGPUs"], plan
        if "pinned" in topologies[name]["spec"]:
            assert plan["kind"] == topologies[name]["spec"]["pinned"]["kind"]
    proposed = {e.get("regarding", e.get("involvedObject", {})).get("name") for e in kube.events(namespace, reason="PlanProposed")}
    assert {n for n, t in topologies.items() if t["spec"]["policy"]["mode"] == "DryRun"} <= proposed
    pinned = [n for n, t in topologies.items() if t["spec"]["policy"]["mode"] == "Pinned"]
    for name in pinned:   # a Pinned example runs: its pods become Ready on the fake GPU nodes
        kube.wait_condition(namespace, name, "Ready", "True", timeout_s=180, log=operator.log_tail)
