"""The real node (e2e/node.py): containerd and runc from Debian and the kubelet built with the control plane, joined
beside the kwok GPU nodes. A pod of the image `make image` builds runs on it under the chart's own pod and container
securityContext, enforced by the real runtime: as uid 65532, its root file system read-only (a write is refused)
and /tmp an emptyDir; it reads its in-cluster configuration from its ServiceAccount token and lists its namespace's
pods through the kubernetes Service. The harness's API server runs without the ServiceAccount admission plugin, so
the pod names its token volume itself, as that plugin would add it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .kubetools import REPO_ROOT
from .node import NODE_SUBNET, REAL_NODE_TAINT, RealNode, wait_for_pod_phase

# The real node's network namespace, containerd and kubelet, and the project's podman store: one worker runs these
# modules, one after another (e2e/conftest.py).
pytestmark = pytest.mark.xdist_group("real-node")

VALUES = yaml.safe_load((REPO_ROOT / "charts" / "servingtopology" / "values.yaml").read_text())
PROBE = """
import ipaddress, os, kubernetes
kubernetes.config.load_incluster_config()
pods = kubernetes.client.CoreV1Api().list_namespaced_pod(os.environ["NAMESPACE"]).items
print("uid", os.getuid(), "gid", os.getgid())
print("pods", sorted(p.metadata.name for p in pods))
open("/tmp/written", "w").write("ok")
print("tmp writable")
try:
    open("/written", "w")
except OSError as error:
    print("root refused", error.errno)
"""


@pytest.fixture(scope="module")
def real_node(cluster: LocalCluster) -> Iterator[RealNode]:
    built = subprocess.run(["bash", str(REPO_ROOT / "tools" / "image" / "build.sh")], capture_output=True, text=True,
                           timeout=1800, cwd=REPO_ROOT)
    assert built.returncode == 0, built.stderr[-3000:]
    node = RealNode(cluster)
    node.start()
    try:
        node.load_image("localhost/servingtopology/operator:0.1.0")  # build.sh tags the version too
        yield node
    finally:
        node.stop()
    # Pods still running at the end (the server below) leave no process, mount or namespace behind.
    assert not node.shims() and not node.netns_path.exists()
    assert not node.pod_netns_left()


def _probe_pod(namespace: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never", "serviceAccountName": "probe", "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists"}],
            "securityContext": VALUES["podSecurityContext"],
            "containers": [{
                "name": "probe", "image": "localhost/servingtopology/operator:0.1.0", "imagePullPolicy": "Never",
                "command": ["python", "-c", PROBE], "env": [{"name": "NAMESPACE", "value": namespace}],
                "securityContext": VALUES["securityContext"],
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                 {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                                  "readOnly": True}]}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        {"name": "token", "projected": {"sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {"downwardAPI": {"items": [{"path": "namespace",
                                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]}}


@pytest.mark.e2e_seconds(45)
def test_the_image_runs_on_the_real_node_under_the_charts_security_context_with_in_cluster_config(
        cluster: LocalCluster, real_node: RealNode, namespace: str) -> None:
    cluster.kubectl_apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "probe", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "probe", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "probe", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "probe"},
         "subjects": [{"kind": "ServiceAccount", "name": "probe", "namespace": namespace}]},
        _probe_pod(namespace, real_node.name))
    pod = wait_for_pod_phase(cluster, namespace, "probe", {"Succeeded", "Failed"}, timeout_s=120)
    log = real_node.pod_log(namespace, "probe", "probe")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["podIP"].startswith(NODE_SUBNET.rsplit(".", 1)[0] + "."), pod["status"]
    assert "uid 65532 gid 65532" in log
    assert "pods ['probe']" in log
    assert "tmp writable" in log
    assert "root refused 30" in log  # EROFS: readOnlyRootFilesystem, enforced by runc


@pytest.mark.e2e_seconds(7)
def test_a_pod_on_the_real_node_passes_an_http_readiness_probe_from_the_kubelet(
        cluster: LocalCluster, real_node: RealNode, namespace: str) -> None:
    # The chart's probes are HTTP GETs from the kubelet to the pod's address: both live in the node's namespace.
    pod = _probe_pod(namespace, real_node.name)
    pod["metadata"]["name"] = "server"
    container = pod["spec"]["containers"][0]
    container.update(name="server", command=["python", "-m", "http.server", "8080", "--directory", "/tmp"],
                     readinessProbe={"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1})
    pod["spec"]["serviceAccountName"] = "default"
    pod["spec"]["volumes"] = pod["spec"]["volumes"][:1]
    container["volumeMounts"] = container["volumeMounts"][:1]
    cluster.kubectl_apply(pod)
    running = wait_for_pod_phase(cluster, namespace, "server", {"Running", "Failed", "Succeeded"}, timeout_s=120)
    assert running["status"]["phase"] == "Running", real_node.pod_log(namespace, "server", "server")[-3000:]
    cluster.kubectl("wait", "--for=condition=Ready", "pod/server", "-n", namespace, "--timeout=60s")
    assert '"GET / HTTP/1.1" 200' in real_node.pod_log(namespace, "server", "server")
