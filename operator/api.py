"""The ServingTopology API (servingtopology.io/v1alpha1): pydantic models of the resource's spec and status.

The single source of crds/servingtopology.yaml (operator/crd.py generates it) and the trust boundary
of the reconcile: `parse_topology_spec` validates a CR's spec. The spec composes the planning spec of
servingtopology/spec.py (it does not restate it) and adds the cluster-only parts: node placement,
policy, a pinned layout and the metrics source. Must not import kopf or kubernetes.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from ..planner.layout import LayoutKind
from ..spec import EngineSpec, HardwareSpec, LayoutSpec, PlanSpec, SpecError

__all__ = [
    "Mode",
    "ConditionType",
    "Toleration",
    "ClusterEngineSpec",
    "ClusterHardwareSpec",
    "ConfigMapRef",
    "SecretRef",
    "PolicySpec",
    "MetricsSpec",
    "TopologySpec",
    "PodTemplate",
    "RolePodTemplates",
    "NetworkSpec",
    "RdmaSpec",
    "RESERVED_LABEL_PREFIXES",
    "Condition",
    "RolePlan",
    "Predicted",
    "PlanStatus",
    "ProposalStatus",
    "ObservedStatus",
    "HistoryEntry",
    "TopologyStatus",
    "HISTORY_LIMIT",
    "parse_topology_spec",
    "duration_s",
]

HISTORY_LIMIT = 20
CONFIGMAP_PREFIX = "configmap:"  # modelConfig placeholder until the reconcile reads the ConfigMap
_DURATION = re.compile(r"^([0-9]+)(s|m|h)$")
DURATION_PATTERN = _DURATION.pattern


def duration_s(text: str) -> int:
    """Seconds in a duration like `90s`, `10m`, `1h` (the CRD's pattern guarantees the shape)."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"duration {text!r} must look like 90s, 10m or 1h")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


class Mode(enum.StrEnum):
    AUTO = "Auto"        # plan and apply
    DRY_RUN = "DryRun"   # plan, write status.proposal and an Event; never touch workloads
    PINNED = "Pinned"    # apply spec.pinned as is; still report its predicted figures


class ConditionType(enum.StrEnum):
    READY = "Ready"
    PLANNED = "Planned"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    DRIFT_DETECTED = "DriftDetected"
    METRICS_AVAILABLE = "MetricsAvailable"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"  # True: the plan's GPUs are not free in the cluster


class _Api(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Toleration(_Api):
    key: str | None = None
    operator: str = Field(default="Equal", pattern="^(Equal|Exists)$")
    value: str | None = None
    effect: str | None = Field(default=None, pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")
    tolerationSeconds: int | None = None


class ClusterEngineSpec(EngineSpec):
    """The planning spec's engine with the image made mandatory (a cluster has to pull something)."""

    image: str = Field(min_length=1, description="container image of the engine (vllm/vllm-openai:..., lmsysorg/sglang:...)")
    routerImage: str | None = Field(default=None, description="image of the PD router (vllm-router for vLLM, smg for SGLang); "
                                    "default: the router's own image at the covered version")
    transferBackend: str = Field(default="nixl", pattern="^(nixl|mooncake)$", description="SGLang PD KV transfer backend")


class ClusterHardwareSpec(HardwareSpec):
    """The planning spec's hardware plus where the engine pods may run."""

    nodeSelector: dict[str, str] = Field(default_factory=dict, description="node labels every engine pod requires")
    tolerations: list[Toleration] = Field(default_factory=list, description="tolerations of every engine pod")


# ---- the pod template (merged into the rendered pods by operator/pod_template.py) ----

_OPEN = {"x-kubernetes-preserve-unknown-fields": True}
_OPEN_ITEMS = {"items": {"type": "object", **_OPEN}}
# Label keys the operator's selectors and Services depend on; a template may not set them.
RESERVED_LABEL_PREFIXES = ("servingtopology.io/", "app.kubernetes.io/")


def _open(what: str) -> Any:
    """A field that holds a Kubernetes object as is (the API server validates it when the pod is applied)."""
    return Field(default=None, description=what, json_schema_extra=_OPEN)


_QUANTITY = r"^[0-9.]+([eE][-+]?[0-9]+|[KMGTPE]i?|[mkMGTPE])?$"


def _quantity(value: Any) -> Any:
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not re.match(_QUANTITY, text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return text


Quantity = Annotated[str, BeforeValidator(_quantity), WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": _QUANTITY})]


class EnvVar(_Api):
    name: str = Field(min_length=1, description="variable name")
    value: str | None = Field(default=None, description="literal value")
    valueFrom: dict[str, Any] | None = _open("a core/v1 EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef")


class VolumeMount(_Api):
    name: str = Field(min_length=1, description="a volume of the pod (spec.volumes or the rendered dshm)")
    mountPath: str = Field(min_length=1, description="where the volume appears in the container")
    subPath: str | None = Field(default=None, description="a path inside the volume to mount instead of its root")
    readOnly: bool | None = Field(default=None, description="mount read-only")


class ResourceRequirements(_Api):
    requests: dict[str, Quantity] = Field(default_factory=dict, description="cpu, memory, ephemeral-storage, rdma/... requests "
                                          "(merged over the operator's: GPUs from the plan, CPU and memory sized from it)")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="limits, merged over the operator's (nvidia.com/gpu is the plan's)")


class ContainerTemplate(_Api):
    """A container merged by name into the rendered pod: `engine` (engine pods) or `router` (PD routers); any other
    name adds a sidecar."""

    name: str = Field(min_length=1, description="engine, router, or the name of a container to add")
    image: str | None = Field(default=None, description="image of an added container; for engine/router use spec.engine")
    command: list[str] | None = Field(default=None, description="command of an added container (the engine's is the plan's)")
    args: list[str] | None = Field(default=None, description="arguments of an added container (engine flags: spec.engine.extraArgs)")
    env: list[EnvVar] = Field(default_factory=list, description="environment variables, merged by name (e.g. HF_TOKEN from a Secret)")
    envFrom: list[dict[str, Any]] = Field(default_factory=list, description="core/v1 EnvFromSource entries (secretRef, configMapRef), added",
                                          json_schema_extra=_OPEN_ITEMS)
    volumeMounts: list[VolumeMount] = Field(default_factory=list, description="mounts, merged by mountPath (e.g. the model cache)")
    resources: ResourceRequirements | None = Field(default=None, description="requests and limits, merged key by key")
    securityContext: dict[str, Any] | None = _open("a core/v1 SecurityContext, merged over the rendered one (e.g. capabilities.add: [IPC_LOCK])")
    ports: list[dict[str, Any]] = Field(default_factory=list, description="core/v1 ContainerPort entries, merged by containerPort",
                                        json_schema_extra=_OPEN_ITEMS)

    @model_validator(mode="after")
    def _plan_owns_the_command(self) -> ContainerTemplate:
        if self.name in ("engine", "router") and (self.command is not None or self.args is not None or self.image is not None):
            raise ValueError(f"container {self.name!r}: command, args and image come from the plan and spec.engine "
                             "(use spec.engine.extraArgs, spec.engine.image or spec.engine.routerImage)")
        if self.name not in ("engine", "router") and not self.image:
            raise ValueError(f"container {self.name!r} is added to the pod: it needs an image")
        return self


class Volume(_Api):
    """A core/v1 Volume: its name plus one source (persistentVolumeClaim, hostPath, secret, emptyDir, ...)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True,
                              json_schema_extra=_OPEN)
    name: str = Field(min_length=1, description="volume name, merged by name (a template `dshm` replaces the rendered /dev/shm)")


class LocalObjectReference(_Api):
    name: str = Field(min_length=1)


class PodMetadataTemplate(_Api):
    labels: dict[str, str] = Field(default_factory=dict, description="labels added to the pods (not servingtopology.io/* or "
                                   "app.kubernetes.io/*: the operator's selectors use them)")
    annotations: dict[str, str] = Field(default_factory=dict, description="annotations added to the pods")

    @field_validator("labels")
    @classmethod
    def _not_reserved(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in labels if k.startswith(RESERVED_LABEL_PREFIXES))
        if reserved:
            raise ValueError(f"labels {reserved} are the operator's (prefixes {', '.join(RESERVED_LABEL_PREFIXES)}); pick other keys")
        return labels


class PodSpecTemplate(_Api):
    """The parts of a core/v1 PodSpec a template may set; merged into the rendered spec (strategic-merge rules)."""

    containers: list[ContainerTemplate] = Field(default_factory=list, description="containers merged by name (engine, router) or added")
    initContainers: list[dict[str, Any]] = Field(default_factory=list, description="core/v1 Containers run before the engine "
                                                 "(e.g. a model download into the cache), merged by name", json_schema_extra=_OPEN_ITEMS)
    volumes: list[Volume] = Field(default_factory=list, description="volumes merged by name: a model-cache PVC or hostPath, Secrets")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="node labels the pods require, added to hardware.nodeSelector")
    tolerations: list[Toleration] = Field(default_factory=list, description="tolerations added to hardware.tolerations")
    affinity: dict[str, Any] | None = _open("a core/v1 Affinity (nodeAffinity, podAffinity, podAntiAffinity), as is")
    imagePullSecrets: list[LocalObjectReference] = Field(default_factory=list, description="Secrets to pull the images with, merged by name")
    serviceAccountName: str | None = Field(default=None, description="the pods' ServiceAccount (routers: default is the operator-made one)")
    automountServiceAccountToken: bool | None = Field(default=None, description="mount the ServiceAccount token; default false on engine pods")
    securityContext: dict[str, Any] | None = _open("a core/v1 PodSecurityContext (runAsUser, fsGroup, ...), merged over the rendered one")
    priorityClassName: str | None = Field(default=None, description="the pods' PriorityClass")
    runtimeClassName: str | None = Field(default=None, description="the pods' RuntimeClass (e.g. nvidia)")
    schedulerName: str | None = Field(default=None, description="the scheduler that places the pods")
    terminationGracePeriodSeconds: int | None = Field(default=None, ge=0, description="seconds to drain before the pod is killed")
    hostIPC: bool | None = Field(default=None, description="share the node's IPC namespace")


class PodTemplate(_Api):
    """Merged into rendered pods like a strategic-merge patch: maps merge, containers/env/volumes merge by name."""

    metadata: PodMetadataTemplate = Field(default_factory=PodMetadataTemplate, description="labels and annotations of the pods")
    spec: PodSpecTemplate = Field(default_factory=PodSpecTemplate, description="pod spec fields merged into the rendered pods")


class RolePodTemplates(_Api):
    """Per-role templates for PD layouts, merged after spec.podTemplate (prefill, decode) or alone (router)."""

    prefill: PodTemplate | None = Field(default=None, description="merged into prefill engine pods after spec.podTemplate")
    decode: PodTemplate | None = Field(default=None, description="merged into decode engine pods after spec.podTemplate")
    router: PodTemplate | None = Field(default=None, description="merged into the PD router pods (spec.podTemplate does not apply)")


class RdmaSpec(_Api):
    resource: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                          description="the RDMA device plugin's extended resource, e.g. rdma/rdma_shared_device_a (k8s-rdma-shared-dev-plugin) "
                                      "or nvidia.com/hostdev")
    count: int = Field(default=1, ge=1, le=64, description="devices of that resource per engine pod")


class NetworkSpec(_Api):
    """The KV-transfer and collective network of the engine pods (RDMA for PD KV transfer and multi-node TP/PP)."""

    rdma: RdmaSpec | None = Field(default=None, description="RDMA devices each engine pod requests (and limits)")
    ipcLock: bool | None = Field(default=None, description="add the IPC_LOCK capability (pinned memory for RDMA); default: true with rdma")
    ibDevices: list[str] = Field(default_factory=list, description="RDMA NICs (HCAs) to use, e.g. [mlx5_0, mlx5_1]: NCCL_IB_HCA, "
                                 "UCX_NET_DEVICES for NIXL, SGLang --disaggregation-ib-device for mooncake",
                                 json_schema_extra={"items": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$"}})
    ibPort: int = Field(default=1, ge=1, le=255, description="the HCAs' port for UCX (mlx5_0:1)")
    socketInterface: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:^,-]+$",
                                        description="NIC for NCCL and Gloo sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), e.g. eth0")

    @field_validator("ibDevices")
    @classmethod
    def _device_names(cls, devices: list[str]) -> list[str]:
        bad = [d for d in devices if not re.match(r"^[A-Za-z0-9_.-]+$", d)]
        if bad:
            raise ValueError(f"{bad} are not RDMA device names (letters, digits, _ . -; e.g. mlx5_0, as `ibv_devices` lists them)")
        return devices


class ConfigMapRef(_Api):
    name: str = Field(min_length=1)
    key: str = Field(default="config.json", min_length=1)


class SecretRef(_Api):
    name: str = Field(min_length=1)
    key: str = Field(default="token", min_length=1)


class PolicySpec(_Api):
    mode: Mode = Field(default=Mode.DRY_RUN, description="Auto applies plans; DryRun only proposes; Pinned applies spec.pinned")
    replanInterval: str = Field(default="5m", pattern=DURATION_PATTERN, description="how often to re-plan from live metrics")
    cooldown: str = Field(default="15m", pattern=DURATION_PATTERN, description="least time between two applied changes")
    minImprovement: float = Field(default=0.1, ge=0.0, le=10.0, description="relative gain a new plan needs to replace the current one")
    allowedLayouts: list[LayoutKind] | None = Field(default=None, description="layout kinds the operator may choose (replicas, pd)")
    maxSurgeGPUs: int = Field(default=0, ge=0, le=4096, description="GPUs a transition may use above hardware.maxGPUs")


class MetricsSpec(_Api):
    prometheusUrl: str = Field(pattern=r"^https?://", description="base URL of the Prometheus HTTP API")
    bearerTokenSecret: SecretRef | None = Field(default=None, description="Secret (same namespace) holding a bearer token")
    selector: dict[str, str] = Field(default_factory=dict, description="extra PromQL label matchers for the engine series")


class TopologySpec(PlanSpec):
    """spec of a ServingTopology: the planning spec plus placement, policy, pinned layout and metrics."""

    engine: ClusterEngineSpec
    hardware: ClusterHardwareSpec
    modelConfigMap: ConfigMapRef | None = Field(default=None, description="a ConfigMap holding a Hugging Face config.json")
    modelSource: str | None = Field(default=None, description="what the engine loads (Hugging Face id or a path in the image); "
                                    "default: model; required with modelConfigMap")
    servedModelName: str | None = Field(default=None, description="the model name clients send; default: model")
    policy: PolicySpec = Field(default_factory=PolicySpec)
    pinned: LayoutSpec | None = Field(default=None, description="the layout to run as is (policy.mode Pinned)")
    metrics: MetricsSpec | None = None
    podTemplate: PodTemplate | None = Field(default=None, description="merged into every engine pod (aggregated, prefill, decode, "
                                            "multi-node workers): env, Secrets, volumes, resources, placement, security")
    network: NetworkSpec | None = Field(default=None, description="RDMA devices, IPC_LOCK and the NICs for KV transfer and NCCL")
    rolePodTemplates: RolePodTemplates | None = Field(default=None, description="per-role templates for PD: prefill, decode, router")

    @model_validator(mode="before")
    @classmethod
    def _config_map_stands_for_model(cls, data: Any) -> Any:
        # PlanSpec wants exactly one of model / modelConfig; a ConfigMap is resolved to a modelConfig
        # path by the reconcile before planning, so let it count as the model here.
        if isinstance(data, dict) and data.get("modelConfigMap"):
            if data.get("model") or data.get("modelConfig"):
                raise ValueError("give exactly one of 'model' (catalog or Hugging Face id) or 'modelConfigMap'")
            ref = data["modelConfigMap"]
            return {**data, "modelConfig": f"{CONFIGMAP_PREFIX}{ref.get('name', '') if isinstance(ref, dict) else ''}"}
        return data

    @model_validator(mode="after")
    def _pinned_when_pinned(self) -> TopologySpec:
        if self.policy.mode is Mode.PINNED and self.pinned is None:
            raise ValueError("policy.mode Pinned needs 'pinned' (a layout: kind, replicas, tp, pp or prefill/decode)")
        if self.modelConfigMap is not None and self.modelSource is None:
            raise ValueError("modelConfigMap gives the architecture only: also set 'modelSource' (what the engine loads)")
        if self.layout is not None:
            raise ValueError("'layout' is for the CLI; in a ServingTopology use 'pinned' with policy.mode Pinned")
        return self


def parse_topology_spec(data: Any) -> TopologySpec:
    """Validate a CR's spec; raise SpecError naming every bad field (same shape as the CLI's errors)."""
    if not isinstance(data, dict):
        raise SpecError([("spec", "must be a mapping")])
    try:
        return TopologySpec.model_validate(data)
    except ValidationError as exc:
        errors = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "constrained-"))) or "spec"
            msg = "unknown field" if e["type"] == "extra_forbidden" else str(e["msg"]).removeprefix("Value error, ")
            errors.append((f"spec.{loc}" if loc != "spec" else loc, msg))
        raise SpecError(errors) from None


# ---- status ----


class Condition(_Api):
    type: ConditionType
    status: str = Field(pattern="^(True|False|Unknown)$")
    reason: str = Field(min_length=1)
    message: str = ""
    lastTransitionTime: str = Field(json_schema_extra={"format": "date-time"})
    observedGeneration: int | None = None


class RolePlan(_Api):
    """One role of a plan: enough to rebuild the layout and to read its engine command line."""

    role: str
    replicas: int = Field(ge=0)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    ep: bool = False
    gpusPerInstance: int = Field(ge=1)
    nodesPerInstance: int = Field(ge=1)
    maxNumSeqs: int = Field(ge=1)
    maxNumBatchedTokens: int = Field(ge=1)
    memoryFraction: float
    kvCacheDtype: str
    blockSize: int = Field(ge=1)
    enablePrefixCaching: bool = True
    engineArgs: list[str] = Field(default_factory=list)


class Predicted(_Api):
    ttftMs: float
    tpotMs: float
    throughputTokS: float
    capacityRps: float
    goodputRps: float
    meetsSlo: bool
    source: str = "analytical"


class PlanStatus(_Api):
    layout: str = Field(description="short label, e.g. 4×TP2 or 2P3D@TP4")
    kind: LayoutKind
    precision: str
    gpus: int = Field(ge=0)
    pd: str = Field(description="prefill:decode instance counts, '-' for replicas")
    roles: list[RolePlan]
    predicted: Predicted | None = None
    reasons: list[str] = Field(default_factory=list)
    decidedAt: str = Field(json_schema_extra={"format": "date-time"})
    generation: int = Field(ge=0, description="metadata.generation the plan was made for")
    set: str | None = Field(default=None, max_length=16, description="the workload set running this plan (objects are named <name>-<set>-<role>)")


class ProposalStatus(PlanStatus):
    fromLayout: str | None = None
    fromGPUs: int | None = None
    before: Predicted | None = None
    reason: str = ""
    message: str = ""


class ObservedStatus(_Api):
    at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    arrivalRateRps: float | None = None
    inputTokensMean: float | None = None
    outputTokensMean: float | None = None
    prefixHitRate: float | None = None
    ttftMsP95: float | None = None
    tpotMsP95: float | None = None
    ttftError: float | None = Field(default=None, description="observed/predicted - 1")
    tpotError: float | None = Field(default=None, description="observed/predicted - 1")


class HistoryEntry(_Api):
    at: str = Field(json_schema_extra={"format": "date-time"})
    action: str = Field(pattern="^(Applied|Proposed|Refused)$")
    layout: str
    gpus: int = Field(ge=0)
    reason: str = ""


class TopologyStatus(_Api):
    conditions: list[Condition] = Field(default_factory=list)
    observedGeneration: int | None = None
    plan: PlanStatus | None = None
    proposal: ProposalStatus | None = None
    observed: ObservedStatus | None = None
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_LIMIT)
    replan: dict[str, Any] | None = Field(default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
                                          description="live-replanning memory (metric window, drift, calibration, the running "
                                                      "transition); written by the operator, resumed after a restart")
