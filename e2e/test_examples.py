"""examples/gated-llama-hf-cache.yaml applied as a user would (its Secret, its claim, its ServingTopology), retargeted
at the harness: the engine pods run with HF_TOKEN from the Secret and the shared model cache mounted."""

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
