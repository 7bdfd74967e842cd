"""What a ServingTopology's author may make the operator do in their namespace: the administrator's policy.

Called by operator/reconcile.py at the start of every pass (pod templates, metrics selector) and by
operator/runtime/cluster.py when it reads a token Secret; operator/runtime/main.py builds the policy from the chart's flags.
Pure: the spec's templates and labels in, refusals (field path, what was found, what is allowed) out; it never
reads the cluster itself. Creating a ServingTopology creates pods in its namespace, so by default a template may
not ask for more than the pods the operator renders have:

- no privileged container, no privilege escalation, no unconfined seccomp/AppArmor, no SELinux user, role or type
  beyond the container types, no unmasked /proc, no unsafe sysctls (grant `Privileged`), in engine, router, sidecar
  and init containers alike;
- no hostPath volume (grant `HostPath`); no hostNetwork, hostPID, hostIPC or hostPort (grant `HostNamespaces`);
- no Linux capability beyond the IPC_LOCK spec.network adds for RDMA (grant `Capabilities`);
- no ServiceAccount and no token automount (grant `ServiceAccount`): the engines get no API credentials;
- spec.metrics.selector stays inside the resource's namespace (a `namespace` matcher naming another is refused),
  and no `__`-prefixed Prometheus label; a bearer-token Secret is read only when it carries the opt-in label.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PodGrant", "NamespaceGrant", "TenancyPolicy", "Refusal", "TemplateInput", "pod_template_refusals", "selector_refusal",
           "secret_refusal", "parse_namespace_grant", "parse_grants", "parse_label", "TOKEN_SECRET_LABEL", "SAFE_SYSCTLS", "STRICT"]

# The label a token Secret carries to let the operator read it (chart value operator.metricsTokenSecret.label).
TOKEN_SECRET_LABEL = ("servingtopology.io/metrics-token", "true")
# The sysctls the Pod Security Standards' baseline allows (kubernetes.io/docs/concepts/security/pod-security-standards).
SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                          "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                          "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                          "net.ipv4.tcp_keepalive_probes"})


class PodGrant(enum.StrEnum):
    """What an administrator may let pod templates ask for (chart value operator.podTemplatePolicy.allow)."""

    PRIVILEGED = "Privileged"           # privileged, allowPrivilegeEscalation, Unconfined profiles, procMount, sysctls
    HOST_PATH = "HostPath"              # hostPath volumes: the node's files
    HOST_NAMESPACES = "HostNamespaces"  # hostNetwork, hostPID, hostIPC, hostPort
    CAPABILITIES = "Capabilities"       # Linux capabilities beyond spec.network's IPC_LOCK
    SERVICE_ACCOUNT = "ServiceAccount"  # serviceAccountName, automountServiceAccountToken: true


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
        parts = [f"cluster-wide {sorted(self.pod_grants)}" if self.pod_grants else "none cluster-wide"]
        parts += [f"{sorted(g.grants)} in namespaces labelled {g.label_key}={g.label_value}" for g in self.namespace_grants]
        return "; ".join(parts)


STRICT = TenancyPolicy()   # the chart's default


@dataclass(frozen=True, slots=True)
class Refusal:
    """One thing a template asks for that the policy does not grant: where, what, and the grant it needs."""

    field: str
    found: str
    grant: PodGrant

    def __str__(self) -> str:
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
    rendered pods it is merged into already have (the capabilities spec.network adds; the router's own token)."""

    where: str
    template: Mapping[str, Any] | None
    network_capabilities: tuple[str, ...] = ()
    rendered_token: bool = False


@dataclass(slots=True)
class _Scan:
    where: str
    network_capabilities: frozenset[str]
    rendered_token: bool = False
    found: list[Refusal] = field(default_factory=list)

    def add(self, path: str, what: str, grant: PodGrant) -> None:
        self.found.append(Refusal(f"{self.where}.{path}", what, grant))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


# The SELinux types the Pod Security Standards' baseline allows; it allows no user or role.
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})


def _profiles(scan: _Scan, sc: Mapping[str, Any], path: str) -> None:
    """What pod and container securityContexts share: seccomp, AppArmor, SELinux, Windows host processes."""
    for key in ("seccompProfile", "appArmorProfile"):
        if _mapping(sc.get(key)).get("type") == "Unconfined":
            scan.add(f"{path}.{key}.type", "Unconfined", PodGrant.PRIVILEGED)
    selinux = _mapping(sc.get("seLinuxOptions"))
    if selinux.get("type", "") not in _SELINUX_TYPES:
        scan.add(f"{path}.seLinuxOptions.type", repr(selinux.get("type")), PodGrant.PRIVILEGED)
    for key in ("user", "role"):
        if selinux.get(key):
            scan.add(f"{path}.seLinuxOptions.{key}", repr(selinux.get(key)), PodGrant.PRIVILEGED)
    if _mapping(sc.get("windowsOptions")).get("hostProcess") is True:
        scan.add(f"{path}.windowsOptions.hostProcess", "true", PodGrant.HOST_NAMESPACES)


def _container(scan: _Scan, c: Mapping[str, Any], path: str) -> None:
    sc = _mapping(c.get("securityContext"))
    spath = f"{path}.securityContext"
    if sc.get("privileged") is True:
        scan.add(f"{spath}.privileged", "true", PodGrant.PRIVILEGED)
    if sc.get("allowPrivilegeEscalation") is True:
        scan.add(f"{spath}.allowPrivilegeEscalation", "true", PodGrant.PRIVILEGED)
    if sc.get("procMount") not in (None, "Default"):
        scan.add(f"{spath}.procMount", str(sc.get("procMount")), PodGrant.PRIVILEGED)
    _profiles(scan, sc, spath)
    added = [str(x) for x in _items(_mapping(sc.get("capabilities")).get("add"))]
    extra = sorted({a.upper().removeprefix("CAP_") for a in added} - scan.network_capabilities)
    if extra:
        allowed = sorted(scan.network_capabilities)
        scan.add(f"{spath}.capabilities.add", f"{extra} (spec.network adds {allowed or 'none'} here)", PodGrant.CAPABILITIES)
    for i, port in enumerate(_items(c.get("ports"))):
        if _mapping(port).get("hostPort"):
            scan.add(f"{path}.ports[{i}].hostPort", str(_mapping(port).get("hostPort")), PodGrant.HOST_NAMESPACES)


def _pod_spec(scan: _Scan, spec: Mapping[str, Any]) -> None:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for i, c in enumerate(_items(spec.get(key))):
            _container(scan, _mapping(c), f"spec.{key}[{i}]")
    for i, v in enumerate(_items(spec.get("volumes"))):
        if "hostPath" in _mapping(v):
            path = _mapping(_mapping(v).get("hostPath")).get("path")
            scan.add(f"spec.volumes[{i}].hostPath", f"the node's path {path!r}", PodGrant.HOST_PATH)
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key) is True:
            scan.add(f"spec.{key}", "true", PodGrant.HOST_NAMESPACES)
    if spec.get("serviceAccountName"):
        scan.add("spec.serviceAccountName", repr(spec.get("serviceAccountName")), PodGrant.SERVICE_ACCOUNT)
    if spec.get("serviceAccount"):
        scan.add("spec.serviceAccount", repr(spec.get("serviceAccount")), PodGrant.SERVICE_ACCOUNT)
    if spec.get("automountServiceAccountToken") is True and not scan.rendered_token:
        scan.add("spec.automountServiceAccountToken", "true", PodGrant.SERVICE_ACCOUNT)
    psc = _mapping(spec.get("securityContext"))
    _profiles(scan, psc, "spec.securityContext")
    unsafe = sorted(str(_mapping(s).get("name")) for s in _items(psc.get("sysctls")) if _mapping(s).get("name") not in SAFE_SYSCTLS)
    if unsafe:
        scan.add("spec.securityContext.sysctls", f"{unsafe} (baseline allows {sorted(SAFE_SYSCTLS)})", PodGrant.PRIVILEGED)


def pod_template_refusals(templates: Sequence[TemplateInput], *, granted: frozenset[PodGrant]) -> list[Refusal]:
    """Every field of the templates that asks for more than `granted` and than the rendered pods have, in order."""
    out: list[Refusal] = []
    for t in templates:
        if not t.template:
            continue
        scan = _Scan(t.where, frozenset(c.upper() for c in t.network_capabilities), t.rendered_token)
        _pod_spec(scan, _mapping(t.template.get("spec")))
        out += [r for r in scan.found if r.grant not in granted]
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
