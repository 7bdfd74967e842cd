"""The ServingTopology API (servingtopology.io/v1alpha1): pydantic models of the resource's spec and status.

The single source of crds/servingtopology.yaml (operator/crd.py generates it) and the trust boundary
of the reconcile: `parse_topology_spec` validates a CR's spec. The spec composes the planning spec of
servingtopology/spec.py (it does not restate it) and adds the cluster-only parts: node placement,
policy, a pinned layout and the metrics source. Must not import kopf or kubernetes.
"""

from __future__ import annotations

import enum
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
