"""Manifest builders: the Kubernetes objects that run one plan (Deployments or LeaderWorkerSets per role,
the PD router and its RBAC, Services), as plain JSON-ready dicts.

Called by the reconcile (operator/reconcile.py) and the golden tests. Pure `build_*` functions over a
frozen `Blueprint`; they never talk to the API server and never pick a layout. A layout runs as a *set*
(objects `<name>-<set>-<role>`, pods labelled with the set) so that a transition can run two side by side;
the entry Service selects the pods that take client traffic (aggregated engines, PD routers) of the serving
sets, switching traffic by its selector alone, without restarting a pod.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servingtopology.operator.api.resource import API_VERSION, GROUP, KIND
from servingtopology.operator.render.network import NetworkKnobs, network_args, network_capabilities, network_env, network_resources
from servingtopology.operator.render.pod_template import (
    ENGINE_CONTAINER,
    GPU_RESOURCE,
    ROUTER_CONTAINER,
    engine_container_security,
    engine_pod_security,
    merge_pod_template,
    router_container_security,
    router_pod_security,
)
from servingtopology.planner.engines.command import (
    DEFAULT_ROUTER_IMAGES,
    ENGINE_PORT,
    NIXL_SIDE_CHANNEL_PORT,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    SGLANG_BOOTSTRAP_PORT,
    EngineCommand,
    engine_command,
    router_command,
    router_kind,
)
from servingtopology.planner.hardware import PRODUCT_LABEL, Gpu, Precision, product_label, resolve_gpu
from servingtopology.planner.layout import Engine, Layout, LayoutKind, Role, RoleLayout
from servingtopology.planner.live.transition import set_name as layout_set_name
from servingtopology.planner.pool.service_split import PD_ROUTER_REPLICAS

__all__ = [
    "API_VERSION",
    "KIND",
    "GROUP",
    "ROLE_LABEL",
    "TOPOLOGY_LABEL",
    "SERVING_LABEL",
    "SET_LABEL",
    "ENTRY_LABEL",
    "MANAGED_BY",
    "LWS_API_VERSION",
    "GPU_KIND_LABEL",
    "NIC_ANNOTATION",
    "KV_LINK_ANNOTATION",
    "Blueprint",
    "role_gpu",
    "role_gpus_per_node",
    "role_node_selector",
    "kv_link_gbit",
    "role_nodes",
    "multinode_roles",
    "object_name",
    "derived_name",
    "MAX_DNS_LABEL",
    "MAX_LWS_NAME",
    "build_labels",
    "build_owner_reference",
    "build_engine_pod_template",
    "engine_host_resources",
    "engine_extra_args",
    "build_deployment",
    "build_leader_worker_set",
    "build_service",
    "build_entry_service",
    "build_router_rbac",
    "router_account",
    "build_set",
    "build_router_deployment",
    "build_workloads",
    "build_topology",
]

ROLE_LABEL = f"{GROUP}/role"
TOPOLOGY_LABEL = f"{GROUP}/topology"
SERVING_LABEL = f"{GROUP}/serving"        # only pods that answer HTTP (not LWS workers) carry "true"
SET_LABEL = f"{GROUP}/set"                # the workload set (one layout's shapes) a pod or object belongs to
ENTRY_LABEL = f"{GROUP}/entry"            # "true" on pods that take client traffic: aggregated engines, PD routers
LAYOUT_ANNOTATION = f"{GROUP}/layout"
GPU_KIND_LABEL = f"{GROUP}/gpu"           # the catalog id of an engine pod's GPU kind, on layouts whose roles name kinds
NIC_ANNOTATION = f"{GROUP}/nic-gbps"      # the per-GPU NIC the plan assumed for the pod's kind
KV_LINK_ANNOTATION = f"{GROUP}/kv-link-gbps"   # PD across two kinds: the link the KV transfer was priced over (slower NIC)
MANAGED_BY = "servingtopology-operator"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
ROUTER = "router"
ENTRY = "entry"


@dataclass(frozen=True, slots=True)
class Blueprint:
    """Everything the builders need about one ServingTopology and its plan; no pydantic, no client."""

    name: str
    namespace: str
    uid: str
    engine: Engine
    image: str
    model: str                 # what the engine loads: a Hugging Face id or a path in the image
    served_model_name: str
    layout: Layout
    gpus_per_node: int
    router_image: str = ""     # empty: the router's own image (engine_args.DEFAULT_ROUTER_IMAGES)
    extra_args: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    transfer_backend: str = "nixl"
    shm_gib: int = 16
    set_name: str = ""         # empty: derived from the layout's shapes (planner.live.transition.set_name)
    engine_version: str = ""   # the engine release the commands are spelled for (empty: the newest covered)
    # spec.podTemplate (engine pods) and spec.rolePodTemplates (prefill, decode, router), as plain dicts.
    pod_template: Mapping[str, Any] = field(default_factory=dict)
    role_templates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    network: NetworkKnobs = field(default_factory=NetworkKnobs)
    gpu_id: str = ""           # catalog id of the spec's GPU: the kind of roles that name none (RoleLayout.gpu)
    # Per-GPU NIC (Gb/s) the plan assumed, by catalog id (the spec's nicGbps, a pool's per-kind NIC); absent: the catalog's.
    nic_gbit: Mapping[str, float] = field(default_factory=dict)

    @property
    def precision(self) -> Precision:
        return self.layout.precision

    @property
    def label(self) -> str:
        """The layout in the engine's words (EngineNamed: Layout.label_for), as every surface names it."""
        return self.layout.label_for(self.engine)

    @property
    def set(self) -> str:
        return self.set_name or layout_set_name(self.layout)


def role_gpu(bp: Blueprint, role_layout: RoleLayout) -> Gpu | None:
    """The catalog GPU a role runs on when its layout names kinds (RoleLayout.gpu; the spec's GPU for a role naming
    none), else None: a one-kind layout runs where spec.hardware.nodeSelector puts it, as it always has.

    Raises ValueError when a kind is named but neither the role nor the blueprint says which GPU it is."""
    if not bp.layout.kinds_named:
        return None
    gid = role_layout.gpu or bp.gpu_id
    if not gid:
        raise ValueError(f"{bp.label}: a role names no GPU kind and the blueprint has no default (gpu_id)")
    return resolve_gpu(gid)


def role_gpus_per_node(bp: Blueprint, role_layout: RoleLayout) -> int:
    """GPUs in one node of the role's kind: the blueprint's (the spec's gpusPerNode) for the spec's own GPU, the
    catalog's node for another kind."""
    if role_layout.gpu and role_layout.gpu != bp.gpu_id:
        return resolve_gpu(role_layout.gpu).gpus_per_node
    return bp.gpus_per_node


def role_node_selector(bp: Blueprint, role_layout: RoleLayout) -> dict[str, str]:
    """KindByProductLabel: the nodes a role's pods may run on. spec.hardware.nodeSelector, and when the layout names
    GPU kinds, the kind's `nvidia.com/gpu.product` value (planner.hardware.product_label, the inverse of the rule the
    capacity read uses; it replaces a product the spec's selector names), so prefill and decode of a mixed-kind layout
    each land on their own kind.

    Raises ValueError for a kind whose catalog name is no label value (no node selector can name it)."""
    gpu = role_gpu(bp, role_layout)
    selector = dict(bp.node_selector)
    if gpu is not None:
        value = product_label(gpu)
        if value is None:
            raise ValueError(f"{gpu.id} ({gpu.name!r}) has no {PRODUCT_LABEL} value a node selector can name; it cannot "
                             "run one role of a mixed-kind layout")
        selector[PRODUCT_LABEL] = value
    return dict(sorted(selector.items()))


def _nic_gbit(bp: Blueprint, gpu: Gpu) -> float:
    return float(bp.nic_gbit.get(gpu.id, gpu.nic_gbit))


def kv_link_gbit(bp: Blueprint) -> float | None:
    """SlowerNicLink: the per-GPU link a mixed-kind PD layout's KV crosses, the slower of the two kinds' NICs (as
    planner.perf.mixed_pd prices it); None unless prefill and decode run on different kinds."""
    if bp.layout.kind is not LayoutKind.PD:
        return None
    p = role_gpu(bp, bp.layout.roles[Role.PREFILL])
    d = role_gpu(bp, bp.layout.roles[Role.DECODE])
    if p is None or d is None or p.id == d.id:
        return None
    return min(_nic_gbit(bp, p), _nic_gbit(bp, d))


def role_nodes(bp: Blueprint, role_layout: RoleLayout) -> int:
    """Nodes one instance of this role spans: 1, or ceil(instance GPUs / GPUs per node of the role's kind)."""
    return max(1, math.ceil(role_layout.parallelism.gpus / role_gpus_per_node(bp, role_layout)))


def multinode_roles(bp: Blueprint) -> tuple[Role, ...]:
    """Roles whose instances span more than one node (they need LeaderWorkerSet)."""
    return tuple(role for role, rl in bp.layout.roles.items() if role_nodes(bp, rl) > 1)


MAX_DNS_LABEL = 63  # Service names (DNS-1035 labels), label values, hostnames
# A LeaderWorkerSet's workers run in a StatefulSet `<lws>-<group index>` whose pods carry a controller-revision-hash
# label `<statefulset>-<10-character hash>` (at most 63, so StatefulSet names at most 52): 47 leaves room for
# `-<group index>` up to 9999.
MAX_LWS_NAME = 47
_HASH_CHARS = 8


def derived_name(base: str, suffix: str, *, limit: int = MAX_DNS_LABEL) -> str:
    """`<base>-<suffix>`, or when longer than `limit`, `base` cut short followed by `-<hash>-<suffix>`: at most `limit`
    characters, stable (the hash is of the full name), distinct for distinct full names (8 hex digits: 32 bits),
    and still ending in the suffix (the role stays readable). `base` is a DNS-1035 label (api.check_resource_name)."""
    full = f"{base}-{suffix}"
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_CHARS]
    keep = limit - len(suffix) - _HASH_CHARS - 2
    if keep < 1:
        raise ValueError(f"suffix {suffix!r} leaves no room for a name within {limit} characters")
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def object_name(bp: Blueprint, component: str, *, limit: int = MAX_DNS_LABEL) -> str:
    """`<name>-<set>-<component>` for the objects of one set (engines, its router, its role Services), shortened with
    a hash past `limit` characters (derived_name)."""
    return derived_name(bp.name, f"{bp.set}-{component}", limit=limit)


def build_labels(bp: Blueprint, component: str) -> dict[str, str]:
    """The selector labels of one component (stable across plans: Deployment selectors are immutable)."""
    return {
        "app.kubernetes.io/name": bp.engine.value if component != ROUTER else f"{bp.engine.value}-router",
        "app.kubernetes.io/instance": bp.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "servingtopology",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        TOPOLOGY_LABEL: bp.name,
        ROLE_LABEL: component,
    }


def _selector(bp: Blueprint, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": bp.name, ROLE_LABEL: component, SET_LABEL: bp.set}


def build_owner_reference(bp: Blueprint) -> dict[str, Any]:
    """The controller reference that lets the garbage collector delete every object with its CR."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": bp.name, "uid": bp.uid, "controller": True,
            "blockOwnerDeletion": True}


def _metadata(bp: Blueprint, component: str, *, name: str | None = None, shared: bool = False) -> dict[str, Any]:
    """Object metadata; `shared` objects (router RBAC, the entry Service) span sets, so they carry neither a set
    label nor a layout annotation (which would change, and be re-applied, at every step of a transition)."""
    meta: dict[str, Any] = {
        "name": name or object_name(bp, component),
        "namespace": bp.namespace,
        "labels": build_labels(bp, component) if shared else {**build_labels(bp, component), SET_LABEL: bp.set},
    }
    if not shared:
        meta["annotations"] = {LAYOUT_ANNOTATION: bp.label}
    meta["ownerReferences"] = [build_owner_reference(bp)]
    return meta


def _http_probe(path: str, port: int, *, period_s: int, failures: int, initial_s: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s,
                             "failureThreshold": failures, "timeoutSeconds": 5}
    if initial_s:
        probe["initialDelaySeconds"] = initial_s
    return probe


# Host CPU and memory an engine pod requests, per GPU it holds plus a base (so engine pods are Burstable, not
# BestEffort, and the scheduler reserves what they use). vLLM and SGLang run one worker process per GPU, each
# needing cores for scheduling, CUDA-graph launches and NCCL proxies, next to the API server, tokenizer and
# engine-core processes (the base); memory holds per-GPU pinned buffers and CPU swap space (vLLM's
# --swap-space, 4 GiB per GPU by default), safetensors shards staged while weights load, and the memory-backed
# /dev/shm (NCCL's and the engines' shared memory, counted against the pod's memory). No CPU limit: throttling
# an engine's scheduler loop shows up directly in TPOT.
ENGINE_CPU_BASE = 2
ENGINE_CPU_PER_GPU = 4
ENGINE_MEMORY_BASE_GIB = 8
ENGINE_MEMORY_PER_GPU_GIB = 16


def engine_host_resources(bp: Blueprint, gpus_per_pod: int) -> dict[str, str]:
    """CPU and memory requests of one engine pod holding `gpus_per_pod` GPUs (see the figures above)."""
    cpu = ENGINE_CPU_BASE + ENGINE_CPU_PER_GPU * gpus_per_pod
    memory_gib = ENGINE_MEMORY_BASE_GIB + ENGINE_MEMORY_PER_GPU_GIB * gpus_per_pod + bp.shm_gib
    return {"cpu": str(cpu), "memory": f"{memory_gib}Gi"}


def _with_templates(rendered: dict[str, Any], *templates: Mapping[str, Any] | None) -> dict[str, Any]:
    """`rendered` with each template merged in order; the operator's labels are put back on top (the
    API model refuses templates that set them, so this only guards the selectors)."""
    labels = dict(rendered["metadata"]["labels"])
    out = rendered
    for template in templates:
        if template:
            out = merge_pod_template(out, template)
    out["metadata"]["labels"] = {**out["metadata"].get("labels", {}), **labels}
    return out


def _engine_env(bp: Blueprint, role: Role) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if bp.engine is Engine.VLLM and role is not Role.AGGREGATED:
        # NIXL's side channel must advertise the pod IP, not localhost, when P and D are on different hosts.
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)})
    return env + network_env(bp.network, engine=bp.engine, role=role, transfer_backend=bp.transfer_backend)


def _engine_ports(bp: Blueprint, role: Role) -> list[dict[str, Any]]:
    ports: list[dict[str, Any]] = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if bp.engine is Engine.SGLANG and role is Role.PREFILL:
        ports.append({"name": "bootstrap", "containerPort": SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"})
    if bp.engine is Engine.VLLM and role is not Role.AGGREGATED:
        ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    return ports


def build_engine_pod_template(bp: Blueprint, role: Role, *, args: tuple[str, ...], command: tuple[str, ...],
                              gpus_per_pod: int, serving: bool = True) -> dict[str, Any]:
    """One engine pod: GPUs, CPU and memory sized from them, /dev/shm, probes (only on pods that serve HTTP),
    no ServiceAccount token; then spec.podTemplate and the role's template merged in (operator/render/pod_template.py).

    Raises ValueError when a template sets the engine container's command or args."""
    entry = serving and role is Role.AGGREGATED
    labels = {**build_labels(bp, role.value), SET_LABEL: bp.set, SERVING_LABEL: "true" if serving else "false",
              ENTRY_LABEL: "true" if entry else "false"}
    role_layout = bp.layout.roles[role]
    gpu = role_gpu(bp, role_layout)
    if gpu is not None:
        labels[GPU_KIND_LABEL] = gpu.id
    # No layout annotation here: a pod template that changed with the layout label would restart every
    # pod when only the replica count changes.
    annotations: dict[str, str] = {}
    if serving:
        annotations |= {"prometheus.io/scrape": "true", "prometheus.io/port": str(ENGINE_PORT), "prometheus.io/path": "/metrics"}
    if bp.engine is Engine.SGLANG and role is Role.PREFILL:
        annotations["sglang.ai/bootstrap-port"] = str(SGLANG_BOOTSTRAP_PORT)
    if gpu is not None:
        annotations[NIC_ANNOTATION] = f"{_nic_gbit(bp, gpu):g}"
    link = kv_link_gbit(bp) if role is not Role.AGGREGATED else None
    if link is not None:
        annotations[KV_LINK_ANNOTATION] = f"{link:g}"
    plan_resources = {GPU_RESOURCE: str(gpus_per_pod), **network_resources(bp.network)}
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": bp.image,
        "command": list(command),
        "args": list(args),
        "ports": _engine_ports(bp, role),
        "resources": {"requests": {**engine_host_resources(bp, gpus_per_pod), **plan_resources}, "limits": dict(plan_resources)},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        # An engine that refuses its arguments exits with the error on stderr: the kubelet keeps its last
        # lines as the container's termination message, which the operator reports in the conditions.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    env = _engine_env(bp, role)
    if env:
        container["env"] = env
    container["securityContext"] = engine_container_security(network_capabilities(bp.network))
    if serving:
        # Loading weights can take many minutes: the startup probe holds liveness off for up to 30 min.
        container["startupProbe"] = _http_probe("/health", ENGINE_PORT, period_s=10, failures=180)
        container["readinessProbe"] = _http_probe("/health", ENGINE_PORT, period_s=5, failures=3)
        container["livenessProbe"] = _http_probe("/health", ENGINE_PORT, period_s=15, failures=4)
    spec: dict[str, Any] = {
        "containers": [container],
        # Engines never call the API server: no token in the pod (a template may turn it back on).
        "automountServiceAccountToken": False,
        "securityContext": engine_pod_security(),
        "terminationGracePeriodSeconds": 60,
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{bp.shm_gib}Gi"}}],
    }
    selector = role_node_selector(bp, role_layout)
    if selector:
        spec["nodeSelector"] = selector
    if bp.tolerations:
        spec["tolerations"] = [dict(t) for t in bp.tolerations]
    rendered = {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}
    return _plan_resources_on_top(_with_templates(rendered, bp.pod_template, bp.role_templates.get(role.value)), plan_resources)


def _plan_resources_on_top(pod: dict[str, Any], plan_resources: Mapping[str, str]) -> dict[str, Any]:
    """PlanOwnsGpus: the engine container's GPUs (and spec.network's RDMA devices) requested and limited as the plan says,
    whatever a template merged in. The tenancy policy refuses such templates before anything is rendered
    (operator/render/tenancy.py); this keeps the engine's count the plan's on every other path too."""
    for c in pod["spec"]["containers"]:
        if c.get("name") == ENGINE_CONTAINER:
            resources = c.setdefault("resources", {})
            for key in ("requests", "limits"):
                resources[key] = {**(resources.get(key) or {}), **plan_resources}
    return pod


def engine_extra_args(bp: Blueprint, role: Role) -> tuple[str, ...]:
    """Flags after the plan's: the network's (spec.network), then the user's extraArgs (the last one wins)."""
    return (*network_args(bp.network, engine=bp.engine, role=role, transfer_backend=bp.transfer_backend), *bp.extra_args)


def _command(bp: Blueprint, role: Role, rl: RoleLayout, nodes: int) -> EngineCommand:
    return engine_command(engine=bp.engine, model=bp.model, served_name=bp.served_model_name, role=role,
                          par=rl.parallelism, knobs=rl.knobs, precision=bp.precision,
                          extra_args=engine_extra_args(bp, role), nodes=nodes, transfer_backend=bp.transfer_backend,
                          version=bp.engine_version, gpu=rl.gpu or bp.gpu_id)


def build_deployment(bp: Blueprint, role: Role) -> dict[str, Any]:
    """A Deployment of `count` single-node engine instances of one role."""
    rl = bp.layout.roles[role]
    cmd = _command(bp, role, rl, 1)
    template = build_engine_pod_template(bp, role, args=cmd.args, command=cmd.command, gpus_per_pod=rl.parallelism.gpus)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(bp, role.value),
        "spec": {
            "replicas": rl.count,
            "selector": {"matchLabels": _selector(bp, role.value)},
            # A GPU pod cannot surge on a full node: replace one instance at a time, never below count-1.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": template,
        },
    }


def build_leader_worker_set(bp: Blueprint, role: Role) -> dict[str, Any]:
    """A LeaderWorkerSet of `count` multi-node instances: the leader serves, workers join headless.

    Raises ValueError when the instance's GPUs do not split evenly over whole nodes.
    """
    rl = bp.layout.roles[role]
    nodes = role_nodes(bp, rl)
    if rl.parallelism.gpus % nodes:
        raise ValueError(f"{rl.parallelism.gpus} GPUs per instance do not split evenly over {nodes} nodes of {role_gpus_per_node(bp, rl)}")
    per_pod = rl.parallelism.gpus // nodes
    cmd = _command(bp, role, rl, nodes)
    leader = build_engine_pod_template(bp, role, args=cmd.args, command=cmd.command, gpus_per_pod=per_pod)
    worker = build_engine_pod_template(bp, role, args=cmd.worker_args, command=cmd.command, gpus_per_pod=per_pod, serving=False)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": _metadata(bp, role.value, name=object_name(bp, role.value, limit=MAX_LWS_NAME)),
        "spec": {
            "replicas": rl.count,
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def build_service(bp: Blueprint, component: str) -> dict[str, Any]:
    """A headless Service over the serving pods of one role of one set (`<name>-<set>-<role>`)."""
    spec: dict[str, Any] = {
        "clusterIP": "None",
        "selector": {**_selector(bp, component), SERVING_LABEL: "true"},
        "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(bp, component), "spec": spec}


def build_entry_service(bp: Blueprint, *, serving: Sequence[str]) -> dict[str, Any]:
    """The client Service `<name>` on port 8000: the entry pods of the serving sets (named port `http`, so an
    aggregated engine on 8000 and a PD router on 8080 both answer). One serving set pins the selector to it;
    two (mid-transition) select both. `bp` gives the labels (the set that takes over, or the only one)."""
    selector = {"app.kubernetes.io/instance": bp.name, ENTRY_LABEL: "true"}
    if len(serving) == 1:
        selector[SET_LABEL] = serving[0]
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(bp, ENTRY, name=bp.name, shared=True), "spec": spec}


def router_account(bp: Blueprint) -> str:
    """The ServiceAccount (and Role, RoleBinding) every PD router of this topology runs as (shared by the sets)."""
    return derived_name(bp.name, ROUTER)


def build_router_rbac(bp: Blueprint) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding that let the routers watch engine pods in their namespace."""
    name = router_account(bp)
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    ]
    meta = _metadata(bp, ROUTER, name=name, shared=True)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": bp.namespace}]},
    ]


def _label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def build_router_deployment(bp: Blueprint) -> dict[str, Any]:
    """The PD router of one set: pairs a prefill and a decode instance of that set (two replicas, no GPU)."""
    serving = {SERVING_LABEL: "true"}
    cmd = router_command(
        engine=bp.engine, namespace=bp.namespace,
        prefill_selector=_label_selector({**_selector(bp, Role.PREFILL.value), **serving}),
        decode_selector=_label_selector({**_selector(bp, Role.DECODE.value), **serving}),
    )
    container = {
        "name": ROUTER_CONTAINER,
        "image": bp.router_image or DEFAULT_ROUTER_IMAGES[router_kind(bp.engine)],
        "command": list(cmd.command),
        "args": list(cmd.args),
        # The router's Prometheus endpoint (sgl-model-gateway's --prometheus-port, 29000 by default), named for
        # the chart's router PodMonitor.
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "readinessProbe": _http_probe("/health", ROUTER_PORT, period_s=5, failures=3),
        "livenessProbe": _http_probe("/health", ROUTER_PORT, period_s=15, failures=4, initial_s=10),
        "securityContext": router_container_security(),
    }
    # The router watches the engine pods through the API server: it needs its ServiceAccount's token.
    spec: dict[str, Any] = {"serviceAccountName": router_account(bp), "automountServiceAccountToken": True,
                            "securityContext": router_pod_security(), "containers": [container]}
    if bp.node_selector:
        spec["nodeSelector"] = dict(sorted(bp.node_selector.items()))
    if bp.tolerations:
        spec["tolerations"] = [dict(t) for t in bp.tolerations]
    meta = {"labels": {**build_labels(bp, ROUTER), SET_LABEL: bp.set, ENTRY_LABEL: "true"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(ROUTER_METRICS_PORT), "prometheus.io/path": "/metrics"}}
    template = _with_templates({"metadata": meta, "spec": spec}, bp.role_templates.get(ROUTER))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(bp, ROUTER),
        "spec": {
            "replicas": PD_ROUTER_REPLICAS,
            "selector": {"matchLabels": _selector(bp, ROUTER)},
            "template": template,
        },
    }


def build_set(bp: Blueprint) -> list[dict[str, Any]]:
    """The objects of one set: engines per role, and for PD its router and per-role headless Services.

    Multi-node roles become LeaderWorkerSets; the caller must have checked that the LWS CRD exists.
    """
    objects: list[dict[str, Any]] = []
    for role in (Role.AGGREGATED, Role.PREFILL, Role.DECODE):
        rl = bp.layout.roles.get(role)
        if rl is None:
            continue
        multinode = role_nodes(bp, rl) > 1
        objects.append(build_leader_worker_set(bp, role) if multinode else build_deployment(bp, role))
    if bp.layout.kind is LayoutKind.PD:
        objects.append(build_router_deployment(bp))
        objects.append(build_service(bp, Role.PREFILL.value))
        objects.append(build_service(bp, Role.DECODE.value))
    return objects


def build_topology(sets: Sequence[Blueprint], *, serving: Sequence[str]) -> list[dict[str, Any]]:
    """Every object of one or two sets side by side, in apply order (router RBAC, sets, entry Service).

    `serving` names the sets that take client traffic; the last of them (else the last set) labels the
    shared objects. Raises ValueError on no sets or two sets with one name.
    """
    if not sets or len({bp.set for bp in sets}) != len(sets):
        raise ValueError(f"need distinct sets, got {[bp.set for bp in sets]}")
    objects: list[dict[str, Any]] = []
    pd = [bp for bp in sets if bp.layout.kind is LayoutKind.PD]
    if pd:
        objects += build_router_rbac(pd[-1])
    for bp in sets:
        objects += build_set(bp)
    lead = next((bp for bp in reversed(sets) if bp.set in serving), sets[-1])
    objects.append(build_entry_service(lead, serving=[s for s in serving if any(bp.set == s for bp in sets)]))
    return objects


def build_workloads(bp: Blueprint) -> list[dict[str, Any]]:
    """Every object of one plan running alone as its set, in apply order."""
    return build_topology([bp], serving=(bp.set,))
