"""The ServingTopology API (servingtopology.io/v1alpha1): pydantic models of the resource's spec and status.

The single source of crds/servingtopology.yaml (operator/api/crd.py generates it) and the trust boundary
of the reconcile: `parse_topology_spec` validates a CR's spec. The spec composes the planning spec of
servingtopology/spec.py (it does not restate it) and adds the cluster-only parts: node placement,
policy, a pinned layout and the metrics source. Must not import kopf or kubernetes.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import gpu_catalog, gpu_names, resolve_gpu
from servingtopology.planner.layout import LayoutKind
from servingtopology.planner.live.policy import Mode
from servingtopology.planner.live.transition import CapacityDrop
from servingtopology.spec import (
    MAX_ARG,
    MAX_ARGS,
    MAX_GPUS,
    MAX_ID,
    MAX_IMAGE,
    MAX_LIST,
    MAX_PATH,
    EngineSpec,
    HardwareSpec,
    LayoutSpec,
    PlanSpec,
    SpecError,
    unknown_field_hint,
)

__all__ = [
    "GROUP", "VERSION", "API_VERSION", "KIND",
    "Mode",
    "Approval",
    "APPROVE_ANNOTATION",
    "ApprovalStatus",
    "CalibrationState",
    "CalibrationStatus",
    "IntervalBand",
    "ConditionType",
    "PoolRef",
    "Toleration",
    "ClusterEngineSpec",
    "ClusterHardwareSpec",
    "ConfigMapRef",
    "CalibrationRef",
    "CalibrationSourceStatus",
    "SecretRef",
    "PolicySpec",
    "MetricsSpec",
    "MetricsTls",
    "PemSource",
    "PemKeyRef",
    "SecretPem",
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
    "SummaryStatus",
    "HistoryEntry",
    "TopologyStatus",
    "HISTORY_LIMIT",
    "parse_topology_spec",
    "duration_s",
    "check_resource_name", "check_namespace",
    "RESOURCE_NAME_PATTERN",
    "MAX_RESOURCE_NAME",
]

HISTORY_LIMIT = 20
CONFIGMAP_PREFIX = "configmap:"  # modelConfig placeholder until the reconcile reads the ConfigMap
# At most 6 digits: "400 digits" durations were admitted and overflowed the timers (issue #17); 999999h is far past any
# bound below, and Go's time.ParseDuration (CEL's duration()) reads every such string without overflow.
_DURATION = re.compile(r"^([0-9]{1,6})(s|m|h)$")
DURATION_PATTERN = _DURATION.pattern
REPLAN_INTERVAL_S = (10, 86_400)  # every 10 s (the timer's granularity) to once a day
COOLDOWN_S = (0, 7 * 86_400)      # none to a week

# ---- bounds of the cluster-only fields (Kubernetes' own limits where it has them; apimachinery validation) ----
# A ServingTopology's name is the client Service's name, so it is a DNS-1035 label (Service names are: a letter first,
# no dots, at most 63); it is also the value of the app.kubernetes.io/instance label (at most 63). Derived object names
# (`<name>-<set>-<role>`, `<name>-router`) are shortened with a hash when longer (operator/render/manifests.py derived_name).
# The resource's identity: its API group, version and kind (the CRD, the owner references, the labels' prefix).
GROUP = "servingtopology.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ServingTopology"

MAX_RESOURCE_NAME = 63
RESOURCE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_OBJECT_NAME = 253  # a DNS-1123 subdomain: ConfigMap, Secret, ServiceAccount, PriorityClass names
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # container and volume names (DNS-1123 label, at most 63)
MAX_LABEL_VALUE = 63
MAX_LABEL_KEY = 317  # a DNS subdomain prefix (253) + "/" + a name (63)
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_IMAGE = r"^[^\s]+$"  # an image reference has no whitespace (issue #17: an image with spaces was admitted)
MAX_MAP = 64  # entries of a label, annotation or selector map
MAX_ANNOTATION_VALUE = 4096  # apimachinery caps all annotations of an object at 256 KiB together
MAX_ITEMS = 64  # tolerations, env, mounts, volumes, ports, ... of a template
MAX_CONTAINERS = 16
MAX_ENV_VALUE = 32_768
MAX_GRACE_S = 7 * 86_400


def check_resource_name(name: str) -> None:
    """Raise SpecError on `metadata.name` when it cannot name the client Service (a DNS-1035 label, at most 63).

    Matched whole (`re.fullmatch`): `$` alone also matches before a final newline, which a YAML header would carry."""
    if len(name) > MAX_RESOURCE_NAME or not re.fullmatch(RESOURCE_NAME_PATTERN, name):
        raise SpecError([("metadata.name", f"{name[:80]!r} must be a DNS-1035 label: at most {MAX_RESOURCE_NAME} lowercase "
                                           "letters, digits and '-', starting with a letter and ending with a letter or digit "
                                           "(it names the client Service)")])


def check_namespace(namespace: str) -> None:
    """Raise SpecError on `metadata.namespace` when it is no namespace name (a DNS-1123 label, at most 63), matched whole."""
    if len(namespace) > MAX_RESOURCE_NAME or not re.fullmatch(_DNS_LABEL, namespace):
        raise SpecError([("metadata.namespace", f"{namespace[:80]!r} must be a DNS-1123 label: at most {MAX_RESOURCE_NAME} "
                                                "lowercase letters, digits and '-', starting and ending with a letter or digit")])


def duration_s(text: str) -> int:
    """Seconds in a duration like `90s`, `10m`, `1h` (the CRD's pattern guarantees the shape)."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"duration {text!r} must look like 90s, 10m or 1h")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


class Approval(enum.StrEnum):
    NOT_REQUIRED = "NotRequired"   # Auto applies its plans itself
    REQUIRED = "Required"          # Auto proposes, as DryRun does; a proposal runs once approved by its id


APPROVE_ANNOTATION = "servingtopology.io/approve"   # its value: the id of the proposal to apply (status.proposal.id)


class ConditionType(enum.StrEnum):
    READY = "Ready"
    PLANNED = "Planned"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    DRIFT_DETECTED = "DriftDetected"
    METRICS_AVAILABLE = "MetricsAvailable"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"  # True: the plan's GPUs are not free in the cluster
    CONFLICT = "Conflict"                          # True: an object to apply exists and is not this resource's
    RECONCILED = "Reconciled"   # False: the last pass failed (reason ApiError / InternalError) and is retried with back-off
    APPROVED = "Approved"       # True: the proposal the approve annotation names was applied; False: ProposalStale
    POOL_MEMBER = "PoolMember"  # spec.pool: True while the named ServingPool exists in this namespace (PoolNotFound, PoolInOtherNamespace)
    CALIBRATED = "Calibrated"   # spec.calibration: True CalibrationApplied; False names the refusal (OtherModel, TooFewPoints, ...)


class _Api(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _cel(*rules: tuple[str, str]) -> ConfigDict:
    """Model config carrying CEL rules (`x-kubernetes-validations`) into the CRD; each mirrors a validator of the model."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]})


LabelKey = Annotated[str, Field(max_length=MAX_LABEL_KEY, pattern=_LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=_LABEL_VALUE)]


class Toleration(_Api):
    """A core/v1 Toleration of the engine pods."""

    model_config = _cel(("self.operator != 'Exists' || !has(self.value) || self.value == ''",
                         "a toleration with operator Exists takes no value"),
                        ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                         "tolerationSeconds needs effect NoExecute"),
                        ("(has(self.key) && self.key != '') || self.operator == 'Exists'",
                         "a toleration without a key needs operator Exists (it tolerates every taint)"))
    key: LabelKey | None = Field(default=None, description="the taint key to tolerate; empty with operator Exists: every taint")
    operator: Literal["Equal", "Exists"] = Field(default="Equal", description="Equal (key and value match) or Exists "
                                                 "(any value of the key)")
    value: LabelValue | None = Field(default=None, description="the taint value to match (operator Equal)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="the taint effect to match: NoSchedule, PreferNoSchedule or NoExecute; default: all")
    tolerationSeconds: int | None = Field(default=None, ge=0, le=MAX_GRACE_S, description="with effect NoExecute: seconds the pod "
                                          "stays bound after the taint appears; default: forever")

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("value: a toleration with operator Exists takes no value")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds: needs effect NoExecute")
        if not self.key and self.operator != "Exists":
            raise ValueError("operator: a toleration without a key needs operator Exists (it tolerates every taint)")
        return self


class ClusterEngineSpec(EngineSpec):
    """The planning spec's engine with the image made mandatory (a cluster has to pull something)."""

    image: str = Field(min_length=1, max_length=MAX_IMAGE, pattern=_IMAGE,
                       description="container image of the engine (vllm/vllm-openai:..., lmsysorg/sglang:...); its tag picks "
                                   "the engine release when version is not set")
    routerImage: str | None = Field(default=None, min_length=1, max_length=MAX_IMAGE, pattern=_IMAGE,
                                    description="image of the PD router (vllm-router for vLLM, smg for SGLang); "
                                    "default: the router's own image at the covered version")
    transferBackend: Literal["nixl", "mooncake"] = Field(default="nixl", description="SGLang PD KV transfer backend: nixl or mooncake")


def _gpu_rule() -> dict[str, Any]:
    """GpuKnownAtAdmission: spec.hardware.gpu must name a catalog GPU (an id or an alias, compared as resolve_gpu
    compares them), so `kubectl apply` refuses an unknown kind at once instead of a later pass. Generated from the
    planner's GPU catalog (planner/data/gpus.toml)."""
    names = ", ".join(f"'{n}'" for n in gpu_names())
    ids = ", ".join(sorted(gpu_catalog()))
    return {"x-kubernetes-validations": [{
        "rule": f"self.trim().lowerAscii().replace('-', '_').replace(' ', '_') in [{names}]",
        "message": f"spec.hardware.gpu: unknown GPU; allowed: {ids} (or an alias such as H100, h100-sxm)"}]}


class ClusterHardwareSpec(HardwareSpec):
    """The planning spec's hardware plus where the engine pods may run."""

    gpu: str = Field(min_length=1, max_length=MAX_ID, json_schema_extra=_gpu_rule(),
                     description="GPU id from the catalog (h100_sxm, h200_sxm, b200_sxm, a100_sxm, ...) or an alias (H100); "
                                 "an unknown GPU is refused at admission")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        try:
            resolve_gpu(v)
        except InvalidSpec as exc:
            raise ValueError(exc.message) from None
        return v

    nodeSelector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP,
                                                     description="node labels every engine pod requires, e.g. "
                                                                 "{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_ITEMS, description="tolerations of every engine pod")


# ---- the pod template (merged into the rendered pods by operator/render/pod_template.py) ----

_OPEN: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}
_OPEN_ITEMS: JsonDict = {"items": {"type": "object", **_OPEN}}
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
    """An environment variable of a container."""

    name: str = Field(min_length=1, max_length=256, description="variable name")
    value: str | None = Field(default=None, max_length=MAX_ENV_VALUE, description="literal value")
    valueFrom: dict[str, Any] | None = _open("a core/v1 EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef")


class VolumeMount(_Api):
    """A volume mounted into a container."""

    name: str = Field(min_length=1, max_length=63, description="a volume of the pod (spec.volumes or the rendered dshm)")
    mountPath: str = Field(min_length=1, max_length=MAX_PATH, description="where the volume appears in the container")
    subPath: str | None = Field(default=None, max_length=MAX_PATH, description="a path inside the volume to mount instead of its root")
    readOnly: bool | None = Field(default=None, description="mount read-only")


ResourceName = Annotated[str, Field(max_length=MAX_LABEL_KEY, pattern=_LABEL_KEY)]


class ResourceRequirements(_Api):
    """Compute resources of a container, merged over the rendered ones."""

    requests: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=MAX_MAP,
                                                   description="cpu, memory, ephemeral-storage, hugepages-<size> requests (merged over "
                                                               "the operator's: CPU and memory sized from the plan); GPUs and every other "
                                                               "extended resource are the plan's and spec.network's (PodTemplateRefused)")
    limits: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=MAX_MAP,
                                                 description="cpu, memory, ephemeral-storage, hugepages-<size> limits, merged over the "
                                                             "operator's (nvidia.com/gpu is the plan's)")


class ContainerTemplate(_Api):
    """A container merged by name into the rendered pod: `engine` (engine pods) or `router` (PD routers); any other
    name adds a sidecar."""

    model_config = _cel(("!(self.name in ['engine', 'router']) || (!has(self.command) && !has(self.args) && !has(self.image))",
                         "containers engine and router take command, args and image from the plan and spec.engine (use "
                         "spec.engine.extraArgs, spec.engine.image or spec.engine.routerImage)"),
                        ("self.name in ['engine', 'router'] || (has(self.image) && self.image != '')",
                         "a container other than engine or router is added to the pod: it needs an image"))
    name: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL, description="engine, router, or the name of a container to add")
    image: str | None = Field(default=None, min_length=1, max_length=MAX_IMAGE, pattern=_IMAGE,
                              description="image of an added container; for engine/router use spec.engine")
    command: list[Annotated[str, Field(max_length=MAX_ARG)]] | None = Field(
        default=None, max_length=MAX_ARGS, description="command of an added container (the engine's is the plan's)")
    args: list[Annotated[str, Field(max_length=MAX_ARG)]] | None = Field(
        default=None, max_length=MAX_ARGS, description="arguments of an added container (engine flags: spec.engine.extraArgs)")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ITEMS * 4,
                              description="environment variables, merged by name (e.g. HF_TOKEN from a Secret)")
    envFrom: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_ITEMS,
                                          description="core/v1 EnvFromSource entries (secretRef, configMapRef), added",
                                          json_schema_extra=_OPEN_ITEMS)
    volumeMounts: list[VolumeMount] = Field(default_factory=list, max_length=MAX_ITEMS,
                                            description="mounts, merged by mountPath (e.g. the model cache)")
    resources: ResourceRequirements | None = Field(default=None, description="requests and limits, merged key by key")
    securityContext: dict[str, Any] | None = _open("a core/v1 SecurityContext, merged over the rendered one (e.g. capabilities.add: [IPC_LOCK])")
    ports: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_ITEMS,
                                        description="core/v1 ContainerPort entries, merged by containerPort",
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
    name: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL,
                      description="volume name, merged by name (a template `dshm` replaces the rendered /dev/shm)")


class LocalObjectReference(_Api):
    """A reference to an object in the resource's namespace, by name."""

    name: str = Field(min_length=1, max_length=MAX_OBJECT_NAME, description="the object's name")


class PodMetadataTemplate(_Api):
    """Labels and annotations added to the rendered pods."""

    model_config = _cel(("!has(self.labels) || self.labels.all(k, " + " && ".join(f"!k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES) + ")",
                         "labels under " + " and ".join(RESERVED_LABEL_PREFIXES) + " are the operator's; pick other keys"),)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP,
                                               description="labels added to the pods (not servingtopology.io/* or "
                                                           "app.kubernetes.io/*: the operator's selectors use them)")
    annotations: dict[LabelKey, Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]] = Field(
        default_factory=dict, max_length=MAX_MAP, description="annotations added to the pods")

    @field_validator("labels")
    @classmethod
    def _not_reserved(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in labels if k.startswith(RESERVED_LABEL_PREFIXES))
        if reserved:
            raise ValueError(f"labels {reserved} are the operator's (prefixes {', '.join(RESERVED_LABEL_PREFIXES)}); pick other keys")
        return labels


class PodSpecTemplate(_Api):
    """The parts of a core/v1 PodSpec a template may set; merged into the rendered spec (strategic-merge rules)."""

    containers: list[ContainerTemplate] = Field(default_factory=list, max_length=MAX_CONTAINERS,
                                                description="containers merged by name (engine, router) or added")
    initContainers: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_CONTAINERS,
                                                 description="core/v1 Containers run before the engine "
                                                 "(e.g. a model download into the cache), merged by name", json_schema_extra=_OPEN_ITEMS)
    volumes: list[Volume] = Field(default_factory=list, max_length=MAX_ITEMS,
                                  description="volumes merged by name: emptyDir, configMap, secret, persistentVolumeClaim, "
                                              "downwardAPI, ephemeral, csi, projected (configMap, secret, downwardAPI); hostPath "
                                              "and a projected serviceAccountToken need the podTemplatePolicy's HostPath and "
                                              "ServiceAccount grants; other kinds are refused")
    nodeSelector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP,
                                                     description="node labels the pods require, added to hardware.nodeSelector")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_ITEMS, description="tolerations added to hardware.tolerations")
    affinity: dict[str, Any] | None = _open("a core/v1 Affinity (nodeAffinity, podAffinity, podAntiAffinity), as is")
    imagePullSecrets: list[LocalObjectReference] = Field(default_factory=list, max_length=MAX_ITEMS,
                                                         description="Secrets to pull the images with, merged by name")
    serviceAccountName: str | None = Field(default=None, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN,
                                           description="the pods' ServiceAccount (routers: default is the operator-made one); refused "
                                                       "unless the operator's podTemplatePolicy grants ServiceAccount")
    automountServiceAccountToken: bool | None = Field(default=None, description="mount the ServiceAccount token; default false on engine pods; true is "
                                                         "refused unless the operator's podTemplatePolicy grants ServiceAccount")
    securityContext: dict[str, Any] | None = _open("a core/v1 PodSecurityContext (runAsUser, fsGroup, ...), merged over the rendered one")
    priorityClassName: str | None = Field(default=None, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN,
                                          description="the pods' PriorityClass; refused unless the operator's podTemplatePolicy "
                                                      "grants Priority, and a system-* class always")
    runtimeClassName: str | None = Field(default=None, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN,
                                         description="the pods' RuntimeClass (e.g. nvidia); refused unless the operator's "
                                                     "podTemplatePolicy grants RuntimeClass")
    schedulerName: str | None = Field(default=None, max_length=MAX_OBJECT_NAME,
                                      description="the scheduler that places the pods; refused unless the operator's "
                                                  "podTemplatePolicy grants Scheduler")
    terminationGracePeriodSeconds: int | None = Field(default=None, ge=0, le=MAX_GRACE_S,
                                                      description="seconds to drain before the pod is killed")
    hostIPC: bool | None = Field(default=None, description="share the node's IPC namespace; refused unless the operator's "
                                 "podTemplatePolicy grants HostNamespaces")


class PodTemplate(_Api):
    """Merged into rendered pods like a strategic-merge patch: maps merge, containers/env/volumes merge by name. Creating a
    ServingTopology creates these pods in its namespace. By default a template may not ask for more than the pods the
    operator renders: GPUs or any extended resource or resource claim (the plan's, in any container), volume kinds
    beyond the restricted ones, privileged or escalating containers and Unconfined profiles (fields or annotations),
    hostPath volumes, hostNetwork/hostPID/hostIPC/hostPort, capabilities beyond spec.network's IPC_LOCK, a
    ServiceAccount or its token, a priority class, scheduler or RuntimeClass are refused (Ready=False, reason
    PodTemplateRefused, naming the field) unless the operator's podTemplatePolicy grants them; some never are."""

    metadata: PodMetadataTemplate = Field(default_factory=PodMetadataTemplate, description="labels and annotations of the pods")
    spec: PodSpecTemplate = Field(default_factory=PodSpecTemplate, description="pod spec fields merged into the rendered pods")


class RolePodTemplates(_Api):
    """Per-role templates for PD layouts, merged after spec.podTemplate (prefill, decode) or alone (router)."""

    prefill: PodTemplate | None = Field(default=None, description="merged into prefill engine pods after spec.podTemplate")
    decode: PodTemplate | None = Field(default=None, description="merged into decode engine pods after spec.podTemplate")
    router: PodTemplate | None = Field(default=None, description="merged into the PD router pods (spec.podTemplate does not apply)")


class RdmaSpec(_Api):
    """RDMA devices each engine pod requests."""

    resource: str = Field(max_length=MAX_LABEL_KEY, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                          description="the RDMA device plugin's extended resource, e.g. rdma/rdma_shared_device_a (k8s-rdma-shared-dev-plugin) "
                                      "or nvidia.com/hostdev")
    count: int = Field(default=1, ge=1, le=64, description="devices of that resource per engine pod")


class NetworkSpec(_Api):
    """The KV-transfer and collective network of the engine pods (RDMA for PD KV transfer and multi-node TP/PP)."""

    rdma: RdmaSpec | None = Field(default=None, description="RDMA devices each engine pod requests (and limits)")
    ipcLock: bool | None = Field(default=None, description="add the IPC_LOCK capability (pinned memory for RDMA); default: true with rdma")
    ibDevices: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=MAX_LIST, description="RDMA NICs (HCAs) to use, e.g. [mlx5_0, mlx5_1]: NCCL_IB_HCA, "
                                                              "UCX_NET_DEVICES for NIXL, SGLang --disaggregation-ib-device for mooncake",
        json_schema_extra={"items": {"type": "string", "maxLength": 64, "pattern": r"^[A-Za-z0-9_.-]+$"}})
    ibPort: int = Field(default=1, ge=1, le=255, description="the HCAs' port for UCX (mlx5_0:1)")
    socketInterface: str | None = Field(default=None, max_length=256, pattern=r"^[A-Za-z0-9_.:^,-]+$",
                                        description="NIC for NCCL and Gloo sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), e.g. eth0")

    @field_validator("ibDevices")
    @classmethod
    def _device_names(cls, devices: list[str]) -> list[str]:
        bad = [d for d in devices if not re.match(r"^[A-Za-z0-9_.-]+$", d)]
        if bad:
            raise ValueError(f"{bad} are not RDMA device names (letters, digits, _ . -; e.g. mlx5_0, as `ibv_devices` lists them)")
        return devices


_DATA_KEY = r"^[-._a-zA-Z0-9]+$"  # a ConfigMap or Secret key


class ConfigMapRef(_Api):
    """A key of a ConfigMap in the resource's namespace."""

    name: str = Field(min_length=1, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN, description="the ConfigMap's name")
    key: str = Field(default="config.json", min_length=1, max_length=MAX_OBJECT_NAME, pattern=_DATA_KEY,
                     description="the key holding the config.json")


class CalibrationRef(_Api):
    """A deployment calibration (the CAL.yaml `servingtopology calibrate --out` writes) in a ConfigMap key of the
    resource's namespace."""

    name: str = Field(min_length=1, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN, description="the ConfigMap's name")
    key: str = Field(default="calibration.yaml", min_length=1, max_length=MAX_OBJECT_NAME, pattern=_DATA_KEY,
                     description="the key holding the calibration file")


class SecretRef(_Api):
    """A key of a Secret in the resource's namespace."""

    name: str = Field(min_length=1, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN, description="the Secret's name")
    key: str = Field(default="token", min_length=1, max_length=MAX_OBJECT_NAME, pattern=_DATA_KEY,
                     description="the key holding the token")


def _duration_rule(low_s: int, high_s: int) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": f"duration(self) >= duration('{low_s}s') && duration(self) <= duration('{high_s}s')",
                                          "message": f"must be between {_human_s(low_s)} and {_human_s(high_s)}"}]}


def _human_s(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds and seconds % 3600 == 0 else f"{seconds}s"


class PolicySpec(_Api):
    """How the operator acts on its plans."""

    mode: Mode = Field(default=Mode.DRY_RUN, description="Auto applies plans; DryRun only proposes (status.proposal and an "
                       "Event); Pinned applies spec.pinned as is")
    replanInterval: str = Field(default="5m", max_length=7, pattern=DURATION_PATTERN, json_schema_extra=_duration_rule(*REPLAN_INTERVAL_S),
                                description=f"how often to re-plan from live metrics: a duration like 90s, 10m or 1h, "
                                            f"{_human_s(REPLAN_INTERVAL_S[0])} to {_human_s(REPLAN_INTERVAL_S[1])}")
    cooldown: str = Field(default="15m", max_length=7, pattern=DURATION_PATTERN, json_schema_extra=_duration_rule(*COOLDOWN_S),
                          description=f"least time between two applied changes: a duration like 90s, 10m or 1h, "
                                      f"{_human_s(COOLDOWN_S[0])} to {_human_s(COOLDOWN_S[1])}")
    minImprovement: float = Field(default=0.1, ge=0.0, le=10.0, description="relative gain a new plan needs to replace the current "
                                  "one (0.1: 10 % more goodput per GPU, or 10 % fewer GPUs)")
    gainWithinError: bool = Field(default=False, description="change a running layout for its predicted gain only when that gain "
                                  "exceeds the combined uncertainty of the before and after predictions (their nominal 80 % "
                                  "intervals from the model's measured error); otherwise nothing changes and one Event "
                                  "GainWithinError names both intervals")
    allowedLayouts: list[LayoutKind] | None = Field(default=None, max_length=MAX_LIST, description="layout kinds the operator may "
                                                    "choose (replicas, pd); default: spec.search.layouts")
    maxSurgeGPUs: int = Field(default=0, ge=0, le=MAX_GPUS, description="GPUs a transition may use above hardware.maxGPUs while "
                              "the old and new layouts run side by side")
    capacityDrop: CapacityDrop = Field(default=CapacityDrop.NEVER, description="how far a spec edit's transition may lower the "
                                       "serving capacity when no step sequence within hardware.maxGPUs + maxSurgeGPUs keeps "
                                       "its floor, min(load (measured while metrics flow, else the spec's), the running layout's capacity, the target's "
                                       "capacity): Never (the change waits, Planned=False TransitionBlocked, "
                                       "naming the GPUs it needs), AboveZero (dip, but something always serves) or Any (serving "
                                       "may stop during the move). Changes the operator starts on drift always keep the full floor")
    approval: Approval = Field(default=Approval.NOT_REQUIRED, description="NotRequired (Auto applies its plans) or Required "
                               "(Auto proposes as DryRun does; a proposal is applied once approved: kubectl annotate stopo NAME "
                               f"{APPROVE_ANNOTATION}=<status.proposal.id>, which DryRun proposals accept too)")

    @field_validator("replanInterval", "cooldown")
    @classmethod
    def _duration_range(cls, v: str, info: ValidationInfo) -> str:
        low, high = REPLAN_INTERVAL_S if info.field_name == "replanInterval" else COOLDOWN_S
        if not low <= duration_s(v) <= high:
            raise ValueError(f"{v!r} must be between {_human_s(low)} and {_human_s(high)}")
        return v


_PROM_LABEL = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


class PemKeyRef(_Api):
    """A key of a Secret or ConfigMap in the resource's namespace holding PEM text."""

    name: str = Field(min_length=1, max_length=MAX_OBJECT_NAME, pattern=_SUBDOMAIN, description="the object's name")
    key: str = Field(min_length=1, max_length=MAX_OBJECT_NAME, pattern=_DATA_KEY, description="the key holding the PEM text, "
                     "e.g. ca.crt, tls.crt, tls.key")


class PemSource(_Api):
    """PEM certificates from exactly one of a Secret or a ConfigMap of the resource's namespace."""

    model_config = _cel(("has(self.secret) != has(self.configMap)", "give exactly one of secret or configMap"))
    secret: PemKeyRef | None = Field(default=None, description="a Secret's key (read only when the Secret carries the "
                                     "operator's opt-in label, as spec.metrics.bearerTokenSecret)")
    configMap: PemKeyRef | None = Field(default=None, description="a ConfigMap's key")

    @model_validator(mode="after")
    def _exactly_one(self) -> PemSource:
        if (self.secret is None) == (self.configMap is None):
            raise ValueError("give exactly one of secret or configMap")
        return self


class SecretPem(_Api):
    """A private key: from a Secret only (never a ConfigMap, which any reader of the namespace may see)."""

    secret: PemKeyRef = Field(description="the Secret's key holding the PEM private key (unencrypted, PKCS#8 or "
                              "traditional); read only when the Secret carries the operator's opt-in label")


class MetricsTls(_Api):
    """How the operator verifies an https Prometheus, and the client certificate it shows. Verification is always on:
    the server's certificate must chain to `ca` and name the URL's host."""

    model_config = _cel(("has(self.cert) == has(self.key)", "give cert and key together (a client certificate and its "
                         "private key), or neither"))
    ca: PemSource = Field(description="the CA bundle (PEM) the Prometheus server's certificate must chain to, in place of "
                          "the system's CAs")
    cert: PemSource | None = Field(default=None, description="a client certificate (PEM, its chain may follow) for a "
                                   "Prometheus that asks for one; with key")
    key: SecretPem | None = Field(default=None, description="the client certificate's private key; with cert")

    @model_validator(mode="after")
    def _pair(self) -> MetricsTls:
        if (self.cert is None) != (self.key is None):
            raise ValueError("give cert and key together (a client certificate and its private key), or neither")
        return self


class MetricsSpec(_Api):
    """Where the operator reads the engines' live metrics."""

    model_config = _cel(("!has(self.tls) || self.prometheusUrl.startsWith('https://')",
                         "tls needs an https:// prometheusUrl"))

    prometheusUrl: str = Field(max_length=2048, pattern=r"^https?://", description="base URL of the Prometheus HTTP API, e.g. "
                               "http://prometheus-operated.monitoring:9090")
    bearerTokenSecret: SecretRef | None = Field(default=None, description="Secret (same namespace) holding a bearer token; read "
                                                "only when it carries the operator's opt-in label (by default "
                                                "servingtopology.io/metrics-token=true) and sent only to an allowed prometheusUrl")
    selector: dict[Annotated[str, Field(max_length=128, pattern=_PROM_LABEL)], Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict, max_length=MAX_MAP, description="extra PromQL label matchers for the engine series, e.g. {model: llama}; "
        "a namespace matcher naming another namespace (or a __ label) is refused (MetricsSelectorRefused) unless the operator allows it")
    tls: MetricsTls | None = Field(default=None, description="for an https prometheusUrl: the CA that signed the server's "
                                   "certificate (default: the system's CAs) and an optional client certificate; a failure "
                                   "is MetricsAvailable=False PrometheusCertificateUntrusted, PrometheusTLSFailed or "
                                   "PrometheusTLSConfigInvalid (naming the field)")

    @model_validator(mode="after")
    def _tls_over_https(self) -> MetricsSpec:
        if self.tls is not None and not self.prometheusUrl.startswith("https://"):
            raise ValueError("tls needs an https:// prometheusUrl")
        return self


_PINNED_MODE = "!has(self.pinned) || !has(self.policy) || self.policy.mode != 'Pinned'"   # policy.mode has a schema default
_PINNED_GPUS_MESSAGE = ("spec.pinned takes more GPUs than spec.hardware.maxGPUs (replicas x tp x pp x dp, dp left out under "
                        "dpAttention, or the sum over prefill and decode)")


def _pinned_gpus_cel() -> tuple[str, str]:
    """CEL for the GPUs of spec.pinned within spec.hardware.maxGPUs, as LayoutSpec.gpus counts them: replicas x tp x pp x dp
    (kind replicas, the first rule) or the sum over the pd roles (the second), dp left out where dpAttention splits the tp
    GPUs' attention (SGLang's tp 4, dp 4 is four GPUs; a role's own dpAttention, else the layout's). Two rules, each well
    under the API server's cost bound. Every knob and the layout's kind and dpAttention have schema defaults, which the API
    server fills in before it evaluates a rule; a role's dpAttention has none (absent: the layout's)."""
    def gpus(node: str, count: str, attention: str) -> str:
        return f"{node}.{count} * {node}.tp * {node}.pp * ({attention} ? 1 : {node}.dp)"

    def role(name: str) -> str:
        node = f"self.pinned.{name}"
        return gpus(node, "count", f"(has({node}.dpAttention) ? {node}.dpAttention : self.pinned.dpAttention)")

    replicas = f"{_PINNED_MODE} || self.pinned.kind == 'pd' || {gpus('self.pinned', 'replicas', 'self.pinned.dpAttention')} <= self.hardware.maxGPUs"
    pd = (f"{_PINNED_MODE} || self.pinned.kind != 'pd' || !has(self.pinned.prefill) || !has(self.pinned.decode) || "
          f"{role('prefill')} + {role('decode')} <= self.hardware.maxGPUs")
    return replicas, pd


class PoolRef(_Api):
    """The ServingPool a ServingTopology joins: its name, and the member's priority when the pool is short."""

    name: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL, description="the ServingPool's name, in this namespace")
    namespace: str | None = Field(default=None, max_length=63, pattern=_DNS_LABEL, description="the pool's namespace: a pool plans "
                                  "the members of its own namespace only, so another one is refused (PoolMember=False, "
                                  "PoolInOtherNamespace); default: this resource's")
    priority: int = Field(default=0, ge=-1000, le=1000, description="when the pool cannot meet every member, a higher priority is "
                          "met before every lower one together")


class TopologySpec(PlanSpec):
    """The desired state of a ServingTopology: the model, the GPUs, the traffic and its SLO, and how to act on plans."""

    model_config = _cel(
        ("has(self.model) != has(self.modelConfigMap)", "give exactly one of spec.model (catalog or Hugging Face id) or spec.modelConfigMap"),
        ("!has(self.modelConfigMap) || has(self.modelSource)",
         "spec.modelConfigMap gives the architecture only: also set spec.modelSource (what the engine loads)"),
        ("!has(self.policy) || !has(self.policy.mode) || self.policy.mode != 'Pinned' || has(self.pinned)",
         "spec.policy.mode Pinned needs spec.pinned (a layout: kind, replicas, tp, pp or prefill/decode)"),
        # The planner refuses a pin over the budget (its stage-2 rule, as for the CLI's `layout`); the API server says
        # so at once. Products stay far inside int64: at most 4,096 x 64 x 64 x 64 per role.
        (_pinned_gpus_cel()[0], _PINNED_GPUS_MESSAGE),
        (_pinned_gpus_cel()[1], _PINNED_GPUS_MESSAGE),
    )
    model: str | None = Field(default=None, min_length=1, max_length=MAX_ID, description="the model: a catalog id or a Hugging Face "
                              "id (meta-llama/Llama-3.1-8B-Instruct); exactly one of model or modelConfigMap")
    engine: ClusterEngineSpec = Field(description="the serving engine (vllm or sglang), its image and release")
    hardware: ClusterHardwareSpec = Field(description="the GPU type, the GPU budget, the node shape and where engine pods may run")
    modelConfigMap: ConfigMapRef | None = Field(default=None, description="a ConfigMap holding a Hugging Face config.json, for "
                                                "a model outside the catalog; exactly one of model or modelConfigMap")
    policy: PolicySpec = Field(default_factory=PolicySpec, description="how the operator acts on plans: mode (DryRun by "
                               "default), re-plan interval, cooldown")
    pinned: LayoutSpec | None = Field(default=None, description="the layout to run as is (policy.mode Pinned)")
    metrics: MetricsSpec | None = Field(default=None, description="the Prometheus holding the engines' metrics, for live "
                                        "re-planning; default: plan from spec.workload only")
    podTemplate: PodTemplate | None = Field(default=None, description="merged into every engine pod (aggregated, prefill, decode, "
                                            "multi-node workers): env, Secrets, volumes, resources, placement, security. "
                                            "GPUs and other extended resources (the plan's), privileged containers, hostPath, "
                                            "host namespaces, extra capabilities, a ServiceAccount, a priority class are refused "
                                            "(PodTemplateRefused) unless the operator's podTemplatePolicy grants them")
    network: NetworkSpec | None = Field(default=None, description="RDMA devices, IPC_LOCK and the NICs for KV transfer and NCCL")
    rolePodTemplates: RolePodTemplates | None = Field(default=None, description="per-role templates for PD: prefill, decode, router")
    pool: PoolRef | None = Field(default=None, description="join a ServingPool of this namespace: the pool plans its members "
                                 "together and, in Auto, assigns each a GPU cap (annotation servingtopology.io/pool-allocation) "
                                 "this resource's plans keep within, as within hardware.maxGPUs")
    calibration: CalibrationRef | None = Field(default=None, description="this deployment's calibration (servingtopology "
                                               "calibrate --out CAL.yaml, held in a ConfigMap of this namespace): plans are "
                                               "made with it, its uncalibrated figures beside them; a calibration of another "
                                               "model, GPU, engine or release is refused (condition Calibrated=False) and "
                                               "nothing is planned or applied until it is fixed")

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
            msg = (unknown_field_hint(TopologySpec, tuple(e["loc"])) if e["type"] == "extra_forbidden"
                   else str(e["msg"]).removeprefix("Value error, "))
            errors.append((f"spec.{loc}" if loc != "spec" else loc, msg))
        raise SpecError(errors) from None


# ---- status ----


class Condition(_Api):
    """One aspect of the resource's state, in the Kubernetes condition conventions."""

    type: ConditionType = Field(description="the aspect: Ready, Planned, Progressing, Degraded, DriftDetected, "
                                "MetricsAvailable, InsufficientCapacity, Conflict (an object to apply exists and is not this resource's), "
                                "Reconciled, Approved or Calibrated (spec.calibration applied or refused)")
    status: str = Field(pattern="^(True|False|Unknown)$", description="True, False or Unknown")
    reason: str = Field(min_length=1, description="a CamelCase word saying why (e.g. InvalidSpec, Infeasible, DryRun)")
    message: str = Field(default="", description="the reason in a sentence, with the figures behind it")
    lastTransitionTime: str = Field(json_schema_extra={"format": "date-time"}, description="when status last changed")
    observedGeneration: int | None = Field(default=None, description="metadata.generation the condition was computed for")


class RolePlan(_Api):
    """One role of a plan: enough to rebuild the layout and to read its engine command line."""

    role: str = Field(description="aggregated, prefill or decode")
    replicas: int = Field(ge=0, description="engine instances of this role")
    tp: int = Field(ge=1, description="tensor-parallel GPUs per instance")
    pp: int = Field(ge=1, description="pipeline stages per instance")
    dp: int = Field(ge=1, description="data-parallel ranks per instance")
    ep: bool = Field(default=False, description="expert parallelism across the instance's GPUs")
    epSize: int | None = Field(default=None, ge=2, description="the GPUs of a stage the experts are spread over when fewer than "
                               "tp x dp (SGLang --ep-size); absent: all of them under ep")
    gpusPerInstance: int = Field(ge=1, description="GPUs of one instance (tp x pp x dp)")
    nodesPerInstance: int = Field(ge=1, description="nodes one instance spans (more than 1: a LeaderWorkerSet)")
    maxNumSeqs: int = Field(ge=1, description="sequences one engine batches (--max-num-seqs)")
    maxNumBatchedTokens: int = Field(ge=1, description="tokens per engine step (--max-num-batched-tokens)")
    memoryFraction: float = Field(description="fraction of GPU memory the engine uses (--gpu-memory-utilization)")
    kvCacheDtype: str = Field(description="KV cache dtype: auto, bf16 or fp8")
    blockSize: int = Field(ge=1, description="KV cache block size in tokens")
    enablePrefixCaching: bool = Field(default=True, description="prefix caching on")
    engineArgs: list[str] = Field(default_factory=list, description="the engine's command-line arguments as rendered")
    gpu: str | None = Field(default=None, max_length=MAX_ID, description="the GPU kind (catalog id) this role's pods run on, "
                            "selected by the nodes' nvidia.com/gpu.product label; set when the layout names kinds (prefill on "
                            "one kind, decode on another); absent: spec.hardware.gpu, placed by spec.hardware.nodeSelector")


class IntervalBand(_Api):
    """A prediction's nominal interval (planner/live/error_bars.py): from the model's leave-one-model-out error on its class,
    narrowed by the deployment's own calibration residuals once fitted, widened 1.5× per missed move."""

    low: float = Field(description="lower end, in ms")
    high: float = Field(description="upper end, in ms")
    level: float = Field(gt=0, lt=1, description="nominal coverage, e.g. 0.8")
    classKey: str = Field(max_length=128, description="the error class it comes from: engine/layout kind/load bucket")
    calibrated: bool = Field(default=False, description="narrowed by this deployment's own calibration")


class Predicted(_Api):
    """The planner's prediction for a layout at the spec's (or the measured) load."""

    ttftMs: float = Field(description="predicted time to first token at the SLO percentile, in ms")
    tpotMs: float = Field(description="predicted time per output token at the SLO percentile, in ms")
    throughputTokS: float = Field(description="predicted output tokens per second of the whole layout")
    capacityRps: float = Field(description="most requests per second the layout serves within the SLO")
    goodputRps: float = Field(description="requests per second served within the SLO at the load")
    meetsSlo: bool = Field(description="whether both latency bounds hold at the load")
    source: str = Field(default="analytical", description="what made the figures: analytical (the model) or simulated")
    ttftInterval: IntervalBand | None = Field(default=None, description="ttftMs's nominal interval (plans and proposals)")
    tpotInterval: IntervalBand | None = Field(default=None, description="tpotMs's nominal interval (plans and proposals)")


class PlanStatus(_Api):
    layout: str = Field(description="short label, e.g. 4×TP2 or 2P3D@TP4")
    kind: LayoutKind = Field(description="replicas or pd")
    precision: str = Field(description="weight precision served: bf16, fp8, fp4 or int4")
    gpus: int = Field(ge=0, description="GPUs the layout occupies")
    pd: str = Field(description="prefill:decode instance counts, '-' for replicas")
    roles: list[RolePlan] = Field(description="each role's shape and engine settings")
    predicted: Predicted | None = Field(default=None, description="the planner's figures for this layout")
    reasons: list[str] = Field(default_factory=list, description="why this layout was chosen, one line each")
    decidedAt: str = Field(json_schema_extra={"format": "date-time"}, description="when the plan was made")
    generation: int = Field(ge=0, description="metadata.generation the plan was made for")
    set: str | None = Field(default=None, max_length=16, description="the workload set running this plan (objects are named <name>-<set>-<role>)")
    poolGPUs: int | None = Field(default=None, ge=0, description="the GPU cap its ServingPool had assigned when the plan was made "
                                 "(absent: none); a new cap is planned as a spec change is")
    uncalibrated: Predicted | None = Field(default=None, description="with spec.calibration: the same layout predicted without "
                                           "the calibration (predicted is the calibrated figure)")
    calibrationSha256: str | None = Field(default=None, max_length=64, description="the sha256 of the calibration file "
                                          "predicted was made with (status.calibrationSource); absent: uncalibrated")


class ProposalStatus(PlanStatus):
    """A plan the operator would apply (DryRun) or has not applied yet, and what it replaces."""

    id: str | None = Field(default=None, max_length=16, description=f"this proposal's id (p1, p2, ...): approve it with kubectl "
                           f"annotate stopo NAME {APPROVE_ANNOTATION}=<id> while it is the current proposal")
    fromLayout: str | None = Field(default=None, description="the running layout it would replace")
    fromGPUs: int | None = Field(default=None, description="GPUs of the running layout")
    before: Predicted | None = Field(default=None, description="the running layout's figures at the same load")
    loadRps: float | None = Field(default=None, description="the arrival rate 'before' and 'predicted' are both predicted at, in req/s")
    reason: str = Field(default="", description="a CamelCase word: why it is proposed")
    message: str = Field(default="", description="the proposal in a sentence, with before and after figures")


class CalibrationState(enum.StrEnum):
    COLLECTING = "Collecting"
    APPLIED = "Applied"


class CalibrationStatus(_Api):
    """The operator's own calibration of this deployment (planner/live/calibration.py): bounded factors fitted to the TTFT and
    TPOT measured in steady replan intervals, applied to every replan's predictions once there are enough points."""

    state: CalibrationState = Field(description="Collecting: fewer points than minimumPoints, the model's own figures are used; "
                                    "Applied: replans predict with the corrections")
    pointsUsed: int = Field(ge=0, description="steady intervals kept as points (the newest, at most 8, each weighing half as "
                            "much per hour of age)")
    minimumPoints: int = Field(ge=1, description="points below which nothing is fitted")
    corrections: dict[str, float] = Field(default_factory=dict, description="time factor per model term (gemm, weights, attention, "
                                          "communication, overhead, request_overhead, prompt_overhead, queueing), each within "
                                          "[0.5, 2]; 1 = as modelled")
    atBound: list[str] = Field(default_factory=list, description="terms whose factor sits at its bound: the deployment is further "
                               "from the model than a correction carries")
    residualPercent: dict[str, float] | None = Field(default=None, description="RMS error of the calibrated model over the points, "
                                                     "per metric (ttft, tpot), in %")
    uncalibratedResidualPercent: dict[str, float] | None = Field(default=None, description="the same error of the model "
                                                                 "without the corrections, in %")
    fittedAt: str | None = Field(default=None, json_schema_extra={"format": "date-time"}, description="when the corrections were fitted")
    message: str = Field(default="", description="the calibration in a sentence")
    missedMoves: int = Field(default=0, ge=0, description="moves whose measured TPOT missed the interval predicted for it")
    intervalWidening: float = Field(default=1.0, ge=1.0, description="the factor the missed moves put on every interval the next "
                                    "move's bar is made of (1.5 per miss, at most 4): the raised bar")


class ObservedStatus(_Api):
    """The live traffic and latencies measured from the engines' metrics."""

    at: str | None = Field(default=None, json_schema_extra={"format": "date-time"}, description="when the metrics were read")
    arrivalRateRps: float | None = Field(default=None, description="measured requests per second")
    inputTokensMean: float | None = Field(default=None, description="measured mean prompt length, in tokens")
    outputTokensMean: float | None = Field(default=None, description="measured mean generated length, in tokens")
    prefixHitRate: float | None = Field(default=None, description="measured fraction of prompt tokens served from the prefix cache")
    ttftMs: float | None = Field(default=None, description="measured time to first token at ttftPercentile, in ms")
    ttftPercentile: float | None = Field(default=None, gt=0, lt=100, description="the percentile ttftMs is measured at "
                                         "(spec.slo's TTFT percentile, e.g. 95); absent on figures read from status written "
                                         "before it existed (ttftMsP95, which held this percentile too)")
    tpotMs: float | None = Field(default=None, description="measured time per output token at tpotPercentile, in ms")
    tpotPercentile: float | None = Field(default=None, gt=0, lt=100, description="the percentile tpotMs is measured at "
                                         "(spec.slo's TPOT percentile)")
    ttftError: float | None = Field(default=None, description="observed/predicted - 1")
    tpotError: float | None = Field(default=None, description="observed/predicted - 1")
    predictedTtftMs: float | None = Field(default=None, description="the running layout's TTFT predicted at the observed workload "
                                          "(uncalibrated) as the engine's TTFT metric counts it, without the first token's "
                                          "delivery to the client that a plan's TTFT includes: what ttftError compares the "
                                          "measurement with")
    predictedTpotMs: float | None = Field(default=None, description="the running layout's TPOT predicted at the observed workload "
                                          "(uncalibrated): what tpotError compares the measurement with")

    @model_validator(mode="before")
    @classmethod
    def _read_old_names(cls, data: Any) -> Any:
        """Status written before the rename named the SLO-percentile figures ttftMsP95 / tpotMsP95 whatever the
        percentile was; read them as ttftMs / tpotMs with the percentile unknown."""
        if isinstance(data, dict) and ("ttftMsP95" in data or "tpotMsP95" in data):
            data = dict(data)
            for old, new in (("ttftMsP95", "ttftMs"), ("tpotMsP95", "tpotMs")):
                if old in data:
                    value = data.pop(old)
                    data.setdefault(new, value)
        return data


class SummaryStatus(_Api):
    """What `kubectl get stopo` shows: texts the operator writes on every pass for the printer columns (kubectl's
    JSONPath cannot format a figure or join two fields). Read by people; programs should read plan, observed and
    conditions."""

    mode: str = Field(description="policy.mode in effect (Auto, DryRun, Pinned)")
    layout: str = Field(description="the running layout; 'from → to' while a transition runs; '-' when nothing runs")
    pd: str = Field(description="prefill:decode instances of the running layout ('-' for replicas); 'from → to' while it changes")
    gpus: str = Field(description="GPUs of the running layout; 'from → to' while a transition runs")
    ttft: str = Field(description="TTFT at the SLO percentile, 'measured / predicted' with units (e.g. '4.6s / 40ms'; "
                                  "'-' where there is no figure)")
    tpot: str = Field(description="TPOT at the SLO percentile, 'measured / predicted' with units")
    phase: str = Field(description="'Steady', or the transition's phase and mode with the traffic split, "
                                   "e.g. 'Progressing (Surge): 3×TP1 75%, 3×TP2 25%'")
    proposal: str = Field(description="the proposed layout (DryRun, or a transition's target); '-' when none")
    error: str = Field(description="prediction error at the observed load, measured/predicted - 1 (e.g. 'TTFT +12%, TPOT -3%')")


class CalibrationSourceStatus(_Api):
    """spec.calibration as the operator last read it: where it came from, whether it was applied, what it holds."""

    configMap: str = Field(description="the ConfigMap's name (in the resource's namespace)")
    key: str = Field(description="the key holding the calibration file")
    resourceVersion: str | None = Field(default=None, max_length=64, description="the ConfigMap's resourceVersion when read")
    sha256: str | None = Field(default=None, max_length=64, description="sha256 of the calibration file's bytes")
    applied: bool = Field(description="whether plans are made with it")
    reason: str = Field(description="CalibrationApplied, or why it was refused: CalibrationNotFound, InvalidCalibration, "
                                    "OtherModel, OtherGpu, OtherEngine, OtherRelease, TooFewPoints or NonFinite")
    message: str = Field(default="", max_length=1024, description="the reason in a sentence, naming the field")
    at: str = Field(json_schema_extra={"format": "date-time"}, description="when it was read")
    deployment: dict[str, str] = Field(default_factory=dict, description="what it was measured on: model, gpu, engine, release, "
                                       "link, layout")
    pointsUsed: int | None = Field(default=None, ge=0, description="measured points the fit used")
    factors: dict[str, float] = Field(default_factory=dict, description="the time factor per model term (1 = as modelled, "
                                      "bounded to [0.5, 2])")
    atBound: list[str] = Field(default_factory=list, description="terms whose factor is at its bound")
    residualBefore: dict[str, float] = Field(default_factory=dict, description="RMS log error of ttft and tpot over the "
                                             "points, uncalibrated")
    residualAfter: dict[str, float] = Field(default_factory=dict, description="the same, calibrated")
    sources: list[str] = Field(default_factory=list, max_length=64, description="the result files it was fitted on: tool, "
                               "version, sha256")


class HistoryEntry(_Api):
    """One decision in the resource's life."""

    at: str = Field(json_schema_extra={"format": "date-time"}, description="when it was decided")
    action: str = Field(pattern="^(Applied|Proposed|Refused)$", description="Applied, Proposed or Refused")
    layout: str = Field(description="the layout's short label")
    gpus: int = Field(ge=0, description="its GPUs")
    reason: str = Field(default="", description="why, in a few words")


class ApprovalStatus(_Api):
    """The last proposal applied because the approve annotation named it."""

    id: str = Field(max_length=16, description="the approved proposal's id")
    layout: str = Field(description="its layout")
    gpus: int = Field(ge=0, description="its GPUs")
    at: str = Field(json_schema_extra={"format": "date-time"}, description="when the operator applied it")
    generation: int = Field(ge=0, description="metadata.generation it was proposed for")


class TopologyStatus(_Api):
    """What the operator planned, runs and measured (written by the operator only)."""

    conditions: list[Condition] = Field(default_factory=list, description="Ready, Planned, Progressing, ... (see each reason)")
    observedGeneration: int | None = Field(default=None, description="the metadata.generation last reconciled")
    plan: PlanStatus | None = Field(default=None, description="the layout running (or being rolled out)")
    proposal: ProposalStatus | None = Field(default=None, description="a better layout found and not applied yet (DryRun, or "
                                            "waiting for its turn)")
    observed: ObservedStatus | None = Field(default=None, description="the last live metrics and the prediction error")
    calibration: CalibrationStatus | None = Field(default=None, description="the operator's own calibration of this deployment "
                                                  "from its measured TTFT and TPOT")
    approval: ApprovalStatus | None = Field(default=None, description="the last approved proposal (servingtopology.io/approve)")
    proposals: int | None = Field(default=None, ge=0, description="proposals made so far: the number in the latest proposal's id")
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_LIMIT,
                                        description=f"the last {HISTORY_LIMIT} decisions, oldest first")
    summary: SummaryStatus | None = Field(default=None, description="the printer columns' texts (kubectl get stopo)")
    calibrationSource: CalibrationSourceStatus | None = Field(default=None, description="spec.calibration as last read: its "
                                                              "provenance and whether it is applied")
    replan: dict[str, Any] | None = Field(default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
                                          description="live-replanning memory (metric window, drift, calibration, the running "
                                                      "transition); written by the operator, resumed after a restart")
