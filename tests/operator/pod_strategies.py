"""Hypothesis strategies for pod templates (one module, shared by the tenancy property tests).

Templates are drawn from the core/v1 PodSpec fields a tenant could try, benign and hostile alike: containers, init
containers and sidecars with resources of any name (host resources, GPUs, other extended resources, claims), every
volume kind and projected source, priority, scheduling and runtime fields, and the annotations that carry security
profiles. Each draw is a plain dict, as the reconcile hands a parsed template to the policy. Each template draws a
hazard rate (0, 3, 10 or 30 %) that every choice is made from the hostile values at, so that a fair share of the
templates is admitted (and its rendered pods checked) and the rest mixes one hazard with many.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from servingtopology.operator.render.tenancy import PodGrant

# Resource names a template might set: the host resources, GPUs, and extended resources of other device plugins.
HOST_RESOURCE_NAMES = ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi"]
EXTENDED_RESOURCE_NAMES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "rdma/hca", "example.com/fpga",
                           "kubernetes.io/batch-cpu", "nvidia.com/GPU"]
QUANTITIES = ["1", "7", "500m", "2Gi"]
# Every core/v1 volume source with a body: the kinds a template may use, and the rest (hostPath needs a grant).
ALLOWED_VOLUMES: dict[str, dict[str, Any]] = {
    "emptyDir": {}, "configMap": {"name": "cfg"}, "secret": {"secretName": "s"}, "persistentVolumeClaim": {"claimName": "models"},
    "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
    "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}},
    "csi": {"driver": "secrets-store.csi.k8s.io"},
}
OTHER_VOLUMES: dict[str, dict[str, Any]] = {
    "hostPath": {"path": "/"}, "nfs": {"server": "10.0.0.1", "path": "/"}, "gitRepo": {"repository": "https://example.com/r.git"},
    "iscsi": {"targetPortal": "10.0.0.1", "iqn": "iqn.x", "lun": 0}, "image": {"reference": "busybox"}, "flexVolume": {"driver": "x/y"},
    "cephfs": {"monitors": ["10.0.0.1"]}, "fc": {"wwids": ["x"]}, "azureFile": {"secretName": "a", "shareName": "b"},
}
ALLOWED_PROJECTED: dict[str, dict[str, Any]] = {"configMap": {"name": "cfg"}, "secret": {"name": "s"}, "downwardAPI": {"items": []}}
OTHER_PROJECTED: dict[str, dict[str, Any]] = {"serviceAccountToken": {"audience": "vault", "path": "token"},
                                              "clusterTrustBundle": {"signerName": "x", "path": "b"}, "podCertificate": {"signerName": "x"}}
PROFILE_ANNOTATION_KEYS = ["container.apparmor.security.beta.kubernetes.io/engine", "container.apparmor.security.beta.kubernetes.io/side",
                           "seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/engine"]
HOSTILE_ANNOTATION_KEYS = ["io.kubernetes.cri-o.Devices", "io.katacontainers.config.hypervisor.path"]
SAFE_PROFILE_VALUES = ["runtime/default", "localhost/engine"]
HOSTILE_PROFILE_VALUES = ["unconfined", "Unconfined", "bogus"]
# Pod fields a template may leave out: (benign values, hostile values); an empty benign list means the field is hostile.
POD_FIELDS: dict[str, tuple[list[Any], list[Any]]] = {
    "priorityClassName": ([], ["llm-high", "system-node-critical", "system-cluster-critical"]),
    "priority": ([], [0, 1_000_000, 2_000_001_000]),
    "preemptionPolicy": ([], ["Never", "PreemptLowerPriority"]),
    "schedulerName": ([], ["default-scheduler", "gpu-sharing-scheduler"]),
    "runtimeClassName": ([], ["nvidia", "runc"]),
    "nodeName": ([], ["gpu-node-1"]),
    "resourceClaims": ([], [[{"name": "gpus", "resourceClaimName": "all-gpus"}]]),
    "hostIPC": ([False], [True]),
    "automountServiceAccountToken": ([False], [True]),
    "serviceAccountName": ([], ["admin"]),
    "nodeSelector": ([{"zone": "a"}], []),
    "tolerations": ([[{"key": "dedicated", "operator": "Exists"}]], []),
    "imagePullSecrets": ([[{"name": "regcred"}]], []),
    "terminationGracePeriodSeconds": ([30, 120], []),
    "securityContext": ([{"runAsNonRoot": True}, {"fsGroup": 1000}], [{"seccompProfile": {"type": "Unconfined"}},
                                                                        {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}]),
}


class _Draw:
    """One template's draws: each choice is hostile at the template's rate (percent)."""

    def __init__(self, draw: st.DrawFn, rate: int) -> None:
        self.draw, self.rate = draw, rate

    def hostile(self) -> bool:
        return self.rate > 0 and self.draw(st.integers(0, 99)) < self.rate

    def pick(self, benign: list[Any], hostile: list[Any]) -> Any:
        return self.draw(st.sampled_from(hostile if (self.hostile() or not benign) and hostile else benign))

    def maybe(self, percent: int) -> bool:
        return self.draw(st.integers(0, 99)) < percent


def _resources(d: _Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("requests", "limits"):
        if d.maybe(60):
            out[key] = {d.pick(HOST_RESOURCE_NAMES, EXTENDED_RESOURCE_NAMES): d.draw(st.sampled_from(QUANTITIES))
                        for _ in range(d.draw(st.integers(1, 3)))}
    if d.hostile() and d.maybe(30):
        out["claims"] = [{"name": "gpu-claim"}]
    return out


def _security_context(d: _Draw) -> dict[str, Any]:
    out: dict[str, Any] = {"allowPrivilegeEscalation": d.pick([False], [True])}
    if d.hostile():
        out["privileged"] = True
    if d.maybe(40):
        out[d.draw(st.sampled_from(["seccompProfile", "appArmorProfile"]))] = {"type": d.pick(["RuntimeDefault", "Localhost"],
                                                                                                ["Unconfined", "unconfined"])}
    if d.maybe(30):
        out["capabilities"] = {"drop": ["ALL"], "add": d.pick([["NET_BIND_SERVICE"], []], [["SYS_ADMIN"], "SYS_ADMIN", ["IPC_LOCK"]])}
    return out


def _container(d: _Draw, *, names: list[str], hostile_names: list[str]) -> dict[str, Any]:
    name = d.pick(names, hostile_names)
    out: dict[str, Any] = {"name": name}
    if name not in ("engine", "router"):
        out["image"] = "busybox:1.36"
    if d.maybe(70):
        out["resources"] = _resources(d)
    if d.maybe(40):
        out["securityContext"] = _security_context(d)
    if d.maybe(30):
        out["env"] = [{"name": d.pick(["HF_HOME", "NCCL_DEBUG"], ["NVIDIA_VISIBLE_DEVICES"]), "value": "all"}]
    if d.maybe(15):
        out["readinessProbe"] = {"httpGet": {"path": "/", "port": 80, **d.pick([{}], [{"host": "169.254.169.254"}])}}
    return out


def _volume(d: _Draw, index: int) -> dict[str, Any]:
    name = "dshm" if index == 0 and d.maybe(20) else f"v{index}"
    if d.maybe(25):
        sources = [d.pick(sorted(ALLOWED_PROJECTED), sorted(OTHER_PROJECTED)) for _ in range(d.draw(st.integers(1, 3)))]
        return {"name": name, "projected": {"sources": [{s: {**ALLOWED_PROJECTED, **OTHER_PROJECTED}[s]} for s in sources]}}
    kind = d.pick(sorted(ALLOWED_VOLUMES), sorted(OTHER_VOLUMES))
    return {"name": name, kind: {**ALLOWED_VOLUMES, **OTHER_VOLUMES}[kind]}


@st.composite
def pod_templates(draw: st.DrawFn) -> dict[str, Any]:
    """A spec.podTemplate as a dict: metadata.annotations and a pod spec of the fields above, each often left out."""
    d = _Draw(draw, draw(st.sampled_from([0, 3, 10, 30])))
    spec: dict[str, Any] = {}
    spec["containers"] = [_container(d, names=["engine", "side", "metrics"], hostile_names=["router"])
                          for _ in range(draw(st.integers(0, 3)))]
    inits = [_container(d, names=["fetch", "warm"], hostile_names=["engine", "router", "side"]) for _ in range(draw(st.integers(0, 2)))]
    if inits:
        spec["initContainers"] = inits
    volumes = [_volume(d, i) for i in range(draw(st.integers(0, 3)))]
    if volumes:
        spec["volumes"] = volumes
    for key, (benign, hostile) in POD_FIELDS.items():
        if (benign and d.maybe(15)) or (not benign and d.hostile()):
            spec[key] = d.pick(benign, hostile)
    annotations = {}
    for _ in range(draw(st.integers(0, 2))):
        key = d.pick([*PROFILE_ANNOTATION_KEYS, "example.com/team"], HOSTILE_ANNOTATION_KEYS + PROFILE_ANNOTATION_KEYS)
        annotations[key] = d.pick(SAFE_PROFILE_VALUES, HOSTILE_PROFILE_VALUES)
    out: dict[str, Any] = {"spec": spec}
    if annotations:
        out["metadata"] = {"annotations": annotations}
    return out


# No grant, every grant, or any set of them.
grants = st.one_of(st.just(frozenset[PodGrant]()), st.just(frozenset(PodGrant)), st.frozensets(st.sampled_from(list(PodGrant))))
