"""The pods the operator renders against the Pod Security Standards (kubernetes.io/docs/concepts/security/
pod-security-standards): routers meet `restricted`; engines meet `baseline` and every `restricted` rule but
runAsNonRoot (their images run as root), which a pod template can add; RDMA's IPC_LOCK needs `privileged`.
The e2e suite checks the same against the API server's own admission (e2e/test_safety.py)."""

from __future__ import annotations

from typing import Any

import pytest
from cases import BLUEPRINTS, blueprint

from servingtopology.operator.render.manifests import build_workloads
from servingtopology.operator.render.network import NetworkKnobs
from servingtopology.planner.layout import Engine, Layout, Parallelism

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def violations(pod: dict[str, Any], level: str) -> list[str]:
    """The rules of `level` (baseline | restricted) a pod spec breaks, as the admission plugin words their checks."""
    spec, out = pod["spec"], []
    pod_sc = spec.get("securityContext") or {}
    containers = spec["containers"] + spec.get("initContainers", [])
    for c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f"{c['name']}: capabilities.add {sorted(added - BASELINE_CAPABILITIES)}")
        if level == "restricted":
            if sc.get("allowPrivilegeEscalation") is not False:
                out.append(f"{c['name']}: allowPrivilegeEscalation != false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                out.append(f"{c['name']}: capabilities.drop does not include ALL")
            if added - {"NET_BIND_SERVICE"}:
                out.append(f"{c['name']}: restricted capabilities.add {sorted(added - {'NET_BIND_SERVICE'})}")
            if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
                out.append(f"{c['name']}: runAsNonRoot != true")
            if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
                out.append(f"{c['name']}: runAsUser 0")
            seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                out.append(f"{c['name']}: seccompProfile {seccomp}")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(key)
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if "hostPath" in kinds or (level == "restricted" and kinds - RESTRICTED_VOLUMES):
            out.append(f"volume {v['name']}: {sorted(kinds)}")
    return out


def _pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for obj in objects:
        if obj["kind"] == "Deployment":
            out.append((obj["metadata"]["name"], obj["spec"]["template"]))
        elif obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            out += [(obj["metadata"]["name"] + "/leader", lwt["leaderTemplate"]), (obj["metadata"]["name"] + "/worker", lwt["workerTemplate"])]
    return out


@pytest.mark.parametrize("name", sorted(BLUEPRINTS))
def test_every_rendered_pod_meets_baseline_and_routers_meet_restricted(name: str) -> None:
    pods = _pods(build_workloads(BLUEPRINTS[name]))
    assert pods
    for pod_name, pod in pods:
        assert violations(pod, "baseline") == [], pod_name
        router = any(c["name"] == "router" for c in pod["spec"]["containers"])
        if router:
            assert violations(pod, "restricted") == [], pod_name
            assert pod["spec"]["automountServiceAccountToken"] is True      # it discovers the engine pods
        else:
            # Only the engines' images running as root keep them off `restricted`.
            assert violations(pod, "restricted") == ["engine: runAsNonRoot != true"], pod_name
            assert pod["spec"]["automountServiceAccountToken"] is False


def test_a_template_that_names_a_non_root_user_makes_engine_pods_restricted() -> None:
    template = {"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
                         "containers": [{"name": "engine", "env": [{"name": "HOME", "value": "/tmp"}]}]}}
    bp = blueprint(Engine.VLLM, Layout.replicas(2, Parallelism(tp=4)), pod_template=template)
    for pod_name, pod in _pods(build_workloads(bp)):
        assert violations(pod, "restricted") == [], pod_name


def test_rdma_adds_ipc_lock_and_nothing_else_and_needs_a_privileged_namespace() -> None:
    bp = blueprint(Engine.VLLM, Layout.replicas(1, Parallelism(tp=8)), network=NetworkKnobs(rdma_resource="rdma/ib", ipc_lock=True))
    (_, pod), = _pods(build_workloads(bp))
    engine = pod["spec"]["containers"][0]
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert violations(pod, "baseline") == ["engine: capabilities.add ['IPC_LOCK']"]
