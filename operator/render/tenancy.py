"""What a ServingTopology's author may make the operator do in their namespace: the administrator's policy, as grants.

Called by operator/reconcile.py at the start of every pass, before anything is planned or applied (pod templates, metrics
selector), and by operator/cluster/cluster.py when it reads a token Secret; operator/entry/main.py builds the policy from
the chart's flags. Pure: the spec's templates and labels in, refusals (field path, what was found, the grant it needs or
what is allowed) out; it never reads the cluster itself. Creating a ServingTopology creates pods in its namespace, so a
template is read against what it may set, not against a list of what it may not: a field this policy does not know is
refused, and what the plan decides comes only from the plan. By default, in engine, router, sidecar and init containers:

- resources: cpu, memory, ephemeral-storage and hugepages-<size> requests and limits (PlanOwnsResources). GPUs and every
  other extended resource are the plan's (the layout) and spec.network's (its RDMA device); resource claims, pod-level
  resources and overhead are refused with no grant: a template could otherwise hold GPUs its status never counts;
- volumes of the kinds the Pod Security Standards' `restricted` profile allows (VolumeKinds): emptyDir, configMap,
  secret, persistentVolumeClaim, downwardAPI, ephemeral, csi (a CSI driver serves inline volumes only when its CSIDriver
  opts in), and projected from configMap, secret and downwardAPI. A projected serviceAccountToken needs `ServiceAccount`,
  hostPath `HostPath`; any other kind (nfs, iscsi, gitRepo, image, ...) is refused with no grant;
- no privileged container, no privilege escalation, no Unconfined seccomp or AppArmor profile, in the fields or in the
  annotations that stand for them (`container.apparmor.security.beta.kubernetes.io/<c>`,
  `[container.]seccomp.security.alpha.kubernetes.io/...`: `unconfined`), no SELinux user, role or type beyond the
  container types, no unmasked /proc, no unsafe sysctls, no runtime annotations (`io.kubernetes.cri-o.*`, Kata's and
  containerd's: the runtime reads devices and sandbox settings from them), no NVIDIA_VISIBLE_DEVICES (the NVIDIA
  runtime hands a container the GPUs it names, whatever the device plugin allocated) (grant `Privileged`);
  a profile type or annotation value the API server does not spell so (`unconfined` in a field) is refused, naming its spellings;
- no hostNetwork, hostPID, hostIPC, hostPort, Windows host process, probe or lifecycle hook with a `host` (the kubelet
  connects from the node's network) (grant `HostNamespaces`); no Linux capability beyond the IPC_LOCK spec.network adds
  for RDMA (grant `Capabilities`); no ServiceAccount, token automount or projected token (grant `ServiceAccount`): the
  engines get no API credentials;
- no priorityClassName, priority or preemptionPolicy (grant `Priority`: priority preempts other namespaces' pods, and
  the plan's capacity accounting assumes the cluster's default order); a `system-` class never (SystemPriority:
  Kubernetes reserves the prefix for the node's and the cluster's critical pods, which preempt everything else);
- no schedulerName (grant `Scheduler`: another scheduler need not fit the plan's GPUs, taints or quotas), no
  runtimeClassName (grant `RuntimeClass`: a handler can leave a sandbox the cluster puts tenants in, or honour a device
  list over the device plugin's), no nodeName ever (it skips the scheduler and its GPU accounting; nodeSelector on
  kubernetes.io/hostname places a pod on one node through it);
- placement the scheduler still checks (nodeSelector, affinity, tolerations), imagePullSecrets and the grace period
  are free; a container named `engine` or `router` merges into the operator's container of that name where the pod has
  one, and is refused where it would be a second container of the name (an init container, a `router` in engine pods),
  as is a name given twice in the template;
- spec.metrics.selector stays inside the resource's namespace (a `namespace` matcher naming another is refused),
  and no `__`-prefixed Prometheus label; a bearer-token Secret is read only when it carries the opt-in label.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servingtopology.operator.render.pod_template import ENGINE_CONTAINER, GPU_RESOURCE, OPERATOR_CONTAINERS

__all__ = ["PodGrant", "NamespaceGrant", "TenancyPolicy", "Refusal", "TemplateInput", "pod_template_refusals", "selector_refusal",
           "secret_refusal", "parse_namespace_grant", "parse_grants", "parse_label", "TOKEN_SECRET_LABEL", "SAFE_SYSCTLS", "STRICT",
           "HOST_RESOURCES", "VOLUME_KINDS", "PROJECTED_SOURCES", "POD_FIELDS", "SYSTEM_PRIORITY_PREFIX"]

# The label a token Secret carries to let the operator read it (chart value operator.metricsTokenSecret.label).
TOKEN_SECRET_LABEL = ("servingtopology.io/metrics-token", "true")
# The sysctls the Pod Security Standards' baseline allows (kubernetes.io/docs/concepts/security/pod-security-standards).
SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                          "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                          "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                          "net.ipv4.tcp_keepalive_probes"})


class PodGrant(enum.StrEnum):
    """What an administrator may let pod templates ask for (chart value operator.podTemplatePolicy.allow)."""

    PRIVILEGED = "Privileged"           # privileged, escalation, Unconfined profiles and annotations, procMount, sysctls, runtime annotations
    HOST_PATH = "HostPath"              # hostPath volumes: the node's files
    HOST_NAMESPACES = "HostNamespaces"  # hostNetwork, hostPID, hostIPC, hostPort, Windows host processes, probe and hook hosts
    CAPABILITIES = "Capabilities"       # Linux capabilities beyond spec.network's IPC_LOCK
    SERVICE_ACCOUNT = "ServiceAccount"  # serviceAccountName, automountServiceAccountToken: true, projected serviceAccountToken
    PRIORITY = "Priority"               # priorityClassName (never system-*), priority, preemptionPolicy
    SCHEDULER = "Scheduler"             # schedulerName
    RUNTIME_CLASS = "RuntimeClass"      # runtimeClassName


@dataclass(frozen=True, slots=True)
class NamespaceGrant:
    """Grants for the namespaces whose labels include `label_key=label_value`."""

    label_key: str
    label_value: str
    grants: frozenset[PodGrant]


@dataclass(frozen=True, slots=True)
class TenancyPolicy:
    """The administrator's policy. The default is the strict one: no grants, the opt-in label, no other namespace."""

    pod_grants: frozenset[PodGrant] = frozenset()
    namespace_grants: tuple[NamespaceGrant, ...] = ()
    token_secret_label: tuple[str, str] | None = TOKEN_SECRET_LABEL   # None: any Secret of the namespace
    cross_namespace_selector: bool = False

    def grants_for(self, namespace_labels: Mapping[str, str] | None) -> frozenset[PodGrant]:
        """The grants of a namespace with these labels (None: labels unknown, the cluster-wide grants only)."""
        out = set(self.pod_grants)
        for g in self.namespace_grants:
            if namespace_labels is not None and namespace_labels.get(g.label_key) == g.label_value:
                out |= g.grants
        return frozenset(out)

    def allowed_words(self) -> str:
        """How an administrator allows more, for the refusal's message."""
        parts = [f"cluster-wide {_names(self.pod_grants)}" if self.pod_grants else "none cluster-wide"]
        parts += [f"{_names(g.grants)} in namespaces labelled {g.label_key}={g.label_value}" for g in self.namespace_grants]
        return "; ".join(parts)


STRICT = TenancyPolicy()   # the chart's default


def _names(grants: Iterable[PodGrant]) -> str:
    return "[" + ", ".join(sorted(g.value for g in grants)) + "]"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One thing a template asks for that the policy does not allow: where, what, and the grant it needs (None: no grant
    allows it; `allowed` says what may stand there instead)."""

    field: str
    found: str
    grant: PodGrant | None
    allowed: str = ""

    def __str__(self) -> str:
        if self.grant is None:
            return f"{self.field}: {self.found}; allowed: {self.allowed}"
        return f"{self.field}: {self.found} needs grant {self.grant.value}"


def parse_label(text: str) -> tuple[str, str]:
    """`key=value` of a label; raises ValueError naming the shape."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} must be a label key=value, e.g. servingtopology.io/metrics-token=true")
    return key.strip(), value.strip()


def parse_namespace_grant(text: str) -> NamespaceGrant:
    """`key=value:Grant,Grant` (chart: operator.podTemplatePolicy.namespaces); raises ValueError naming the allowed grants."""
    label, sep, grants = text.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r} must look like key=value:{','.join(g.value for g in PodGrant)}")
    key, value = parse_label(label)
    return NamespaceGrant(key, value, frozenset(parse_grants(grants.split(","))))


def parse_grants(words: Iterable[str]) -> set[PodGrant]:
    """Grant names (case-insensitive; `All` is every grant); raises ValueError naming the allowed ones."""
    by_name = {g.value.lower(): g for g in PodGrant}
    out: set[PodGrant] = set()
    for word in (w.strip() for w in words):
        if not word:
            continue
        if word.lower() == "all":
            out |= set(PodGrant)
        elif word.lower() in by_name:
            out.add(by_name[word.lower()])
        else:
            raise ValueError(f"{word!r} is not a pod-template grant: use {', '.join(g.value for g in PodGrant)} or All")
    return out


@dataclass(frozen=True, slots=True)
class TemplateInput:
    """One template as the reconcile hands it over: its field path, the template as a dict (None: absent), what the
    rendered pods it is merged into already have (the capabilities spec.network adds; the router's own token; the
    operator's container in them)."""

    where: str
    template: Mapping[str, Any] | None
    network_capabilities: tuple[str, ...] = ()
    rendered_token: bool = False
    rendered_containers: tuple[str, ...] = (ENGINE_CONTAINER,)


# ---- what a template may set (each name below is a decision the module docstring states) ----

# PlanOwnsResources: the resources a container may request or limit; every other name is an extended resource.
HOST_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
HUGEPAGES_PREFIX = "hugepages-"
# VolumeKinds: the Pod Security Standards' `restricted` volume types (hostPath is HostPath's, projected is read per source).
VOLUME_KINDS = frozenset({"emptyDir", "configMap", "secret", "persistentVolumeClaim", "downwardAPI", "ephemeral", "csi", "projected"})
PROJECTED_SOURCES = frozenset({"configMap", "secret", "downwardAPI"})
# SystemPriority: Kubernetes reserves PriorityClass names starting so for the node's and the cluster's critical pods.
SYSTEM_PRIORITY_PREFIX = "system-"
# ProfileSpellings: the API server's profile types (Unconfined needs Privileged), and the annotations' values.
PROFILE_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION_PREFIX = "container.seccomp.security.alpha.kubernetes.io/"
_APPARMOR_VALUES = ("runtime/default", "localhost/<profile>", "unconfined with grant Privileged")
_SECCOMP_VALUES = ("runtime/default", "docker/default", "localhost/<profile>", "unconfined with grant Privileged")
# RuntimeAnnotations: prefixes the container runtimes read settings from (CRI-O's allowed annotations: devices, user
# namespaces; Kata's hypervisor configuration; containerd's pod annotations passed to the runtime).
RUNTIME_ANNOTATION_PREFIXES = ("io.kubernetes.cri-o.", "io.kubernetes.cri.", "io.katacontainers.", "io.containerd.")
# DeviceEnv: the NVIDIA container runtime mounts the GPUs this variable names, beside the device plugin's allocation.
DEVICE_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES"})
# The SELinux types the Pod Security Standards' baseline allows; it allows no user or role.
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})

_CONTAINER_SECURITY_FIELDS = frozenset({"allowPrivilegeEscalation", "appArmorProfile", "capabilities", "privileged", "procMount",
                                        "readOnlyRootFilesystem", "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxOptions",
                                        "seccompProfile", "windowsOptions"})
_POD_SECURITY_FIELDS = frozenset({"appArmorProfile", "fsGroup", "fsGroupChangePolicy", "runAsGroup", "runAsNonRoot", "runAsUser",
                                  "seLinuxChangePolicy", "seLinuxOptions", "seccompProfile", "supplementalGroups",
                                  "supplementalGroupsPolicy", "sysctls", "windowsOptions"})
# Container fields with nothing the policy reads in them (the rest are read below).
_FREE_CONTAINER_FIELDS = frozenset({"name", "image", "command", "args", "workingDir", "envFrom", "volumeMounts", "volumeDevices",
                                    "terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "stdin", "stdinOnce",
                                    "tty", "restartPolicy", "resizePolicy"})
_HANDLER_FIELDS = ("livenessProbe", "readinessProbe", "startupProbe")
# Pod fields with nothing the policy reads in them: placement the scheduler still checks, pull Secrets, the grace period.
_FREE_POD_FIELDS = frozenset({"nodeSelector", "tolerations", "affinity", "imagePullSecrets", "terminationGracePeriodSeconds"})
# Pod fields no grant allows: field -> (why, what is allowed instead).
_NEVER_POD_FIELDS: dict[str, tuple[str, str]] = {
    "nodeName": ("it skips the scheduler and its GPU accounting", "nodeSelector on kubernetes.io/hostname"),
    "resourceClaims": ("devices are the plan's", "none (GPUs come from the layout, RDMA devices from spec.network)"),
    "resources": ("pod-level resources are the plan's", "cpu, memory, ephemeral-storage, hugepages-<size> per container"),
    "overhead": ("set by the RuntimeClass admission", "none"),
    "ephemeralContainers": ("added to running pods through their own subresource, never in a pod spec", "initContainers or a sidecar"),
}


@dataclass(slots=True)
class _Scan:
    where: str
    network_capabilities: frozenset[str]
    rendered_token: bool
    rendered_containers: tuple[str, ...]
    found: list[Refusal] = field(default_factory=list)

    def add(self, path: str, what: str, grant: PodGrant) -> None:
        self.found.append(Refusal(f"{self.where}.{path}", what, grant))

    def never(self, path: str, what: str, allowed: str) -> None:
        self.found.append(Refusal(f"{self.where}.{path}", what, None, allowed))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _key(name: Any) -> str:
    """A map key in a field path, quoted: `limits["nvidia.com/gpu"]`."""
    return f"[{json.dumps(str(name))}]"


def _unknown(scan: _Scan, keys: Iterable[str], known: Iterable[str], path: str, what: str) -> None:
    allowed = sorted(known)
    for k in keys:
        if k not in allowed:
            scan.never(f"{path}.{k}" if path else k, f"not a field of {what} a pod template may set", ", ".join(allowed))


def _profile(scan: _Scan, sc: Mapping[str, Any], key: str, path: str) -> None:
    """A seccomp or AppArmor profile's type, as the API server spells it (ProfileSpellings)."""
    kind = _mapping(sc.get(key)).get("type")
    if key not in sc:
        return
    if kind == "Unconfined":
        scan.add(f"{path}.{key}.type", "Unconfined", PodGrant.PRIVILEGED)
    elif kind not in PROFILE_TYPES:
        scan.never(f"{path}.{key}.type", f"{kind!r} is not a profile type the API server takes",
                   f"{', '.join(PROFILE_TYPES)}, or Unconfined with grant Privileged (as spelled)")


def _profiles(scan: _Scan, sc: Mapping[str, Any], path: str) -> None:
    """What pod and container securityContexts share: seccomp, AppArmor, SELinux, Windows host processes."""
    for key in ("seccompProfile", "appArmorProfile"):
        _profile(scan, sc, key, path)
    selinux = _mapping(sc.get("seLinuxOptions"))
    if selinux.get("type", "") not in _SELINUX_TYPES:
        scan.add(f"{path}.seLinuxOptions.type", repr(selinux.get("type")), PodGrant.PRIVILEGED)
    for key in ("user", "role"):
        if selinux.get(key):
            scan.add(f"{path}.seLinuxOptions.{key}", repr(selinux.get(key)), PodGrant.PRIVILEGED)
    if _mapping(sc.get("windowsOptions")).get("hostProcess") is True:
        scan.add(f"{path}.windowsOptions.hostProcess", "true", PodGrant.HOST_NAMESPACES)


def _container_security(scan: _Scan, sc: Mapping[str, Any], spath: str) -> None:
    _unknown(scan, sc, _CONTAINER_SECURITY_FIELDS, spath, "a container's securityContext")
    if sc.get("privileged") is True:
        scan.add(f"{spath}.privileged", "true", PodGrant.PRIVILEGED)
    if sc.get("allowPrivilegeEscalation") is True:
        scan.add(f"{spath}.allowPrivilegeEscalation", "true", PodGrant.PRIVILEGED)
    if sc.get("procMount") not in (None, "Default"):
        scan.add(f"{spath}.procMount", str(sc.get("procMount")), PodGrant.PRIVILEGED)
    _profiles(scan, sc, spath)
    capabilities = _mapping(sc.get("capabilities"))
    for key in ("add", "drop"):
        if key in capabilities and not isinstance(capabilities[key], list | tuple):
            scan.never(f"{spath}.capabilities.{key}", f"{capabilities[key]!r} is not a list", "a list of capability names, e.g. [IPC_LOCK]")
    added = [str(x) for x in _items(capabilities.get("add"))]
    extra = sorted({a.upper().removeprefix("CAP_") for a in added} - scan.network_capabilities)
    if extra:
        allowed = sorted(scan.network_capabilities)
        scan.add(f"{spath}.capabilities.add", f"{extra} (spec.network adds {allowed or 'none'} here)", PodGrant.CAPABILITIES)


def _resources(scan: _Scan, resources: Mapping[str, Any], path: str) -> None:
    """PlanOwnsResources: host resources only; GPUs and every extended resource are the plan's, claims too."""
    for key, value in resources.items():
        if key in ("requests", "limits"):
            for name, quantity in _mapping(value).items():
                if name not in HOST_RESOURCES and not str(name).startswith(HUGEPAGES_PREFIX):
                    what = ("GPUs are the plan's: the layout's GPUs per pod, within hardware.maxGPUs" if name == GPU_RESOURCE
                            else "an extended resource: only the plan (GPUs) and spec.network (its RDMA device) request them")
                    scan.never(f"{path}.{key}{_key(name)}", f"{quantity}, {what}", "cpu, memory, ephemeral-storage, hugepages-<size>")
        elif key == "claims":
            scan.never(f"{path}.claims", "resource claims hand the container devices the plan does not count",
                       "none (GPUs come from the layout, RDMA devices from spec.network)")
        else:
            scan.never(f"{path}.{key}", "not a field of a container's resources", "requests, limits")


def _handler_host(scan: _Scan, handler: Mapping[str, Any], path: str) -> None:
    """A probe's or lifecycle hook's httpGet/tcpSocket `host`: the kubelet connects to it from the node's network."""
    for kind in ("httpGet", "tcpSocket"):
        host = _mapping(handler.get(kind)).get("host")
        if host:
            scan.add(f"{path}.{kind}.host", f"{host!r} (the kubelet connects there from the node's network)", PodGrant.HOST_NAMESPACES)


def _container(scan: _Scan, c: Mapping[str, Any], path: str) -> None:
    _unknown(scan, c, _FREE_CONTAINER_FIELDS | {"env", "ports", "resources", "securityContext", "lifecycle", *_HANDLER_FIELDS}, path, "a container")
    _container_security(scan, _mapping(c.get("securityContext")), f"{path}.securityContext")
    _resources(scan, _mapping(c.get("resources")), f"{path}.resources")
    for i, port in enumerate(_items(c.get("ports"))):
        if _mapping(port).get("hostPort"):
            scan.add(f"{path}.ports[{i}].hostPort", str(_mapping(port).get("hostPort")), PodGrant.HOST_NAMESPACES)
    for i, var in enumerate(_items(c.get("env"))):
        if _mapping(var).get("name") in DEVICE_ENV:
            scan.add(f"{path}.env[{i}]", f"{_mapping(var).get('name')} (the NVIDIA runtime mounts the GPUs it names, beside the "
                     "device plugin's)", PodGrant.PRIVILEGED)
    for key in _HANDLER_FIELDS:
        _handler_host(scan, _mapping(c.get(key)), f"{path}.{key}")
    for hook, handler in _mapping(c.get("lifecycle")).items():
        _handler_host(scan, _mapping(handler), f"{path}.lifecycle.{hook}")


def _container_names(scan: _Scan, spec: Mapping[str, Any]) -> None:
    """OperatorContainerNames: `engine` or `router` where the pod has no such container (a second one beside the
    operator's) or as an init container, one name in both lists, and one name twice in a list: the API server would
    refuse the pod (names are unique across containers and initContainers) with an error no condition names, and the
    merge by name would fold the second entry into the first (a sidecar's command then reads as the plan's)."""
    first: dict[str, str] = {}
    rendered = " or ".join(repr(n) for n in scan.rendered_containers)
    for key in ("containers", "initContainers"):
        seen: set[str] = set()
        for i, c in enumerate(_items(spec.get(key))):
            name, path = _mapping(c).get("name"), f"spec.{key}[{i}].name"
            if isinstance(name, str) and name in seen:
                scan.never(path, f"{name!r} is given twice in spec.{key}: container names are unique in a pod", "another name")
                continue
            if isinstance(name, str):
                seen.add(name)
            if name in OPERATOR_CONTAINERS and key == "initContainers":
                scan.never(path, f"{name!r} is the name of the operator's container", "another name")
            elif name in OPERATOR_CONTAINERS and name not in scan.rendered_containers:
                scan.never(path, f"{name!r} is the operator's container of other pods; here it would be a second container",
                           f"{rendered} (merged into the operator's container) or another name (a sidecar)")
            elif isinstance(name, str) and first.setdefault(name, key) != key:
                scan.never(path, f"{name!r} is also in spec.{first[name]}: container names are unique in a pod", "another name")


def _volume(scan: _Scan, volume: Mapping[str, Any], path: str) -> None:
    """VolumeKinds: one source per volume, of the allowed kinds; hostPath with HostPath; projected per source."""
    kinds = [k for k in volume if k != "name"]
    if len(kinds) > 1:
        scan.never(path, f"{sorted(kinds)}: one source per volume", "one of " + ", ".join(sorted(VOLUME_KINDS)))
    for kind in kinds:
        if kind == "hostPath":
            scan.add(f"{path}.hostPath", f"the node's path {_mapping(volume.get(kind)).get('path')!r}", PodGrant.HOST_PATH)
        elif kind not in VOLUME_KINDS:
            scan.never(f"{path}.{kind}", f"a {kind} volume", ", ".join(sorted(VOLUME_KINDS)) + " (hostPath with grant HostPath)")
    for i, source in enumerate(_items(_mapping(volume.get("projected")).get("sources"))):
        for kind in _mapping(source):
            spath = f"{path}.projected.sources[{i}].{kind}"
            if kind == "serviceAccountToken":
                audience = _mapping(_mapping(source).get(kind)).get("audience")
                scan.add(spath, f"a ServiceAccount token (audience {audience!r})", PodGrant.SERVICE_ACCOUNT)
            elif kind not in PROJECTED_SOURCES:
                scan.never(spath, f"a projected {kind}", ", ".join(sorted(PROJECTED_SOURCES)) + " (serviceAccountToken with grant ServiceAccount)")


def _annotations(scan: _Scan, annotations: Mapping[str, Any]) -> None:
    """ProfileSpellings and RuntimeAnnotations: the annotations the API server or the runtime reads as security settings."""
    for key, raw in annotations.items():
        path, value = f"metadata.annotations{_key(key)}", str(raw)
        if key.startswith(APPARMOR_ANNOTATION_PREFIX):
            spellings: tuple[str, ...] = _APPARMOR_VALUES
        elif key == SECCOMP_POD_ANNOTATION or key.startswith(SECCOMP_CONTAINER_ANNOTATION_PREFIX):
            spellings = _SECCOMP_VALUES
        else:
            if key.startswith(RUNTIME_ANNOTATION_PREFIXES):
                scan.add(path, f"{value!r} (read by the container runtime)", PodGrant.PRIVILEGED)
            continue
        if value == "unconfined":
            scan.add(path, "unconfined (the field's Unconfined)", PodGrant.PRIVILEGED)
        elif value.lower() == "unconfined" or not (value in spellings or value.startswith("localhost/")):
            scan.never(path, f"{value!r} is not a profile the API server takes", ", ".join(spellings))


def _pod_security(scan: _Scan, psc: Mapping[str, Any]) -> None:
    _unknown(scan, psc, _POD_SECURITY_FIELDS, "spec.securityContext", "a pod's securityContext")
    _profiles(scan, psc, "spec.securityContext")
    unsafe = sorted(str(_mapping(s).get("name")) for s in _items(psc.get("sysctls")) if _mapping(s).get("name") not in SAFE_SYSCTLS)
    if unsafe:
        scan.add("spec.securityContext.sysctls", f"{unsafe} (baseline allows {sorted(SAFE_SYSCTLS)})", PodGrant.PRIVILEGED)


def _priority_class(scan: _Scan, name: Any) -> None:
    if not name:
        return
    if str(name).startswith(SYSTEM_PRIORITY_PREFIX):
        scan.never("spec.priorityClassName", f"{name!r} is a system priority (the node's and the cluster's critical pods, "
                   "which preempt every other)", "with grant Priority, a PriorityClass not named system-*")
    else:
        scan.add("spec.priorityClassName", f"{name!r} (preempts other namespaces' pods)", PodGrant.PRIORITY)


# Pod fields that need a grant when set: field -> (whether this value asks for it, the grant, why).
_GRANTED_POD_FIELDS: dict[str, tuple[Callable[[Any], bool], PodGrant, str]] = {
    "hostNetwork": (lambda v: v is True, PodGrant.HOST_NAMESPACES, "the node's network"),
    "hostPID": (lambda v: v is True, PodGrant.HOST_NAMESPACES, "the node's processes"),
    "hostIPC": (lambda v: v is True, PodGrant.HOST_NAMESPACES, "the node's IPC"),
    "serviceAccountName": (bool, PodGrant.SERVICE_ACCOUNT, "API credentials the engines do not have"),
    "serviceAccount": (bool, PodGrant.SERVICE_ACCOUNT, "API credentials the engines do not have"),
    "priority": (lambda v: v is not None, PodGrant.PRIORITY, "preempts other namespaces' pods"),
    "preemptionPolicy": (bool, PodGrant.PRIORITY, "preempts other namespaces' pods"),
    "schedulerName": (bool, PodGrant.SCHEDULER, "another scheduler need not fit the plan's GPUs, taints or quotas"),
    "runtimeClassName": (bool, PodGrant.RUNTIME_CLASS, "a runtime handler can leave the cluster's sandbox or read its own device list"),
}
_READ_POD_FIELDS = frozenset({"containers", "initContainers", "volumes", "securityContext", "automountServiceAccountToken", "priorityClassName"})
POD_FIELDS = _FREE_POD_FIELDS | _READ_POD_FIELDS | set(_GRANTED_POD_FIELDS)


def _pod_spec(scan: _Scan, spec: Mapping[str, Any]) -> None:
    for key, value in spec.items():
        if key in _NEVER_POD_FIELDS:
            scan.never(f"spec.{key}", *_NEVER_POD_FIELDS[key])
        elif key not in POD_FIELDS:
            scan.never(f"spec.{key}", "not a field of a pod spec a pod template may set", ", ".join(sorted(POD_FIELDS)))
        elif key in _GRANTED_POD_FIELDS and _GRANTED_POD_FIELDS[key][0](value):
            _, grant, why = _GRANTED_POD_FIELDS[key]
            scan.add(f"spec.{key}", f"{json.dumps(value) if isinstance(value, bool) else repr(value)} ({why})", grant)
    _container_names(scan, spec)
    for key in ("containers", "initContainers"):
        for i, c in enumerate(_items(spec.get(key))):
            _container(scan, _mapping(c), f"spec.{key}[{i}]")
    for i, v in enumerate(_items(spec.get("volumes"))):
        _volume(scan, _mapping(v), f"spec.volumes[{i}]")
    if spec.get("automountServiceAccountToken") is True and not scan.rendered_token:
        scan.add("spec.automountServiceAccountToken", "true", PodGrant.SERVICE_ACCOUNT)
    _priority_class(scan, spec.get("priorityClassName"))
    _pod_security(scan, _mapping(spec.get("securityContext")))


def pod_template_refusals(templates: Sequence[TemplateInput], *, granted: frozenset[PodGrant]) -> list[Refusal]:
    """Every field of the templates that asks for more than `granted` and than the rendered pods have, in order; a
    refusal with no grant (Refusal.grant None) stands whatever is granted."""
    out: list[Refusal] = []
    for t in templates:
        if not t.template:
            continue
        scan = _Scan(t.where, frozenset(c.upper() for c in t.network_capabilities), t.rendered_token, t.rendered_containers)
        _unknown(scan, t.template, ("metadata", "spec"), "", "a pod template")
        meta = _mapping(t.template.get("metadata"))
        _unknown(scan, meta, ("labels", "annotations"), "metadata", "a pod template's metadata")
        _annotations(scan, _mapping(meta.get("annotations")))
        _pod_spec(scan, _mapping(t.template.get("spec")))
        out += [r for r in scan.found if r.grant is None or r.grant not in granted]
    return out


def selector_refusal(selector: Mapping[str, str], *, namespace: str, policy: TenancyPolicy) -> str | None:
    """Why spec.metrics.selector may not be used (None: it may): a `namespace` matcher naming another namespace
    (unless the policy allows it), or a Prometheus-internal `__` label."""
    internal = sorted(k for k in selector if k.startswith("__"))
    if internal:
        return (f"spec.metrics.selector: {internal} are Prometheus-internal labels (the metric name is the operator's); "
                "allowed: ordinary label names")
    other = selector.get("namespace")
    if other is not None and other != namespace and not policy.cross_namespace_selector:
        return (f"spec.metrics.selector.namespace: {other!r} reads another namespace's series; allowed: {namespace!r} "
                "(this resource's namespace) or no namespace matcher, unless the operator is installed with "
                "metricsSelector.allowOtherNamespaces")
    return None


def secret_refusal(labels: Mapping[str, str] | None, *, namespace: str, name: str, policy: TenancyPolicy) -> str | None:
    """Why the operator may not read this token Secret (None: it may): it lacks the opt-in label."""
    if policy.token_secret_label is None:
        return None
    key, value = policy.token_secret_label
    if (labels or {}).get(key) == value:
        return None
    return (f"Secret {namespace}/{name} does not carry the label {key}={value}: the operator reads a token Secret only when "
            f"it opts in (kubectl label secret {name} -n {namespace} {key}={value})")
