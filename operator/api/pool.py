"""The ServingPool API (servingtopology.io/v1alpha1): one GPU inventory by kind with prices, planned for its members.

A ServingTopology joins a pool with `spec.pool` (name, priority; same namespace); its hardware.maxGPUs is its cap inside
the pool. The label `servingtopology.io/pool: <pool name>` with the annotation `servingtopology.io/pool-priority` is still
read for resources written before spec.pool (`pool_of`: spec.pool wins). In Auto the pool writes each member's GPU cap
into the annotation `servingtopology.io/pool-allocation` (`Allocation`, JSON), which the member's plans keep within.
The pydantic models here are the single source of crds/servingpool.yaml (`build_pool_crd`, golden-tested) and the trust
boundary of the pool pass (`parse_pool_spec`). Must not import kopf or kubernetes.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servingtopology.operator.api.crd import VERSION, structural_schema, write_generated
from servingtopology.operator.api.resource import GROUP
from servingtopology.planner.pool.plan import PoolObjective
from servingtopology.spec import MAX_GPUS, SpecError

__all__ = ["POOL_KIND", "POOL_PLURAL", "POOL_SHORT_NAME", "POOL_LABEL", "PRIORITY_ANNOTATION", "ALLOCATION_ANNOTATION", "POOL_CRD_PATHS",
           "PoolMode", "PoolKindSpec", "ServingPoolSpec", "parse_pool_spec", "build_pool_crd", "render_pool_crd_yaml", "main",
           "MemberOf", "pool_of", "Allocation", "read_allocation"]

POOL_KIND = "ServingPool"
POOL_PLURAL = "servingpools"
POOL_SHORT_NAME = "spool"
POOL_LABEL = f"{GROUP}/pool"
PRIORITY_ANNOTATION = f"{GROUP}/pool-priority"
ALLOCATION_ANNOTATION = f"{GROUP}/pool-allocation"
POOL_CRD_PATHS = ("crds/servingpool.yaml", "charts/servingtopology/crds/servingpool.yaml")
NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class PoolMode(enum.StrEnum):
    DRY_RUN = "DryRun"      # plan the pool and show the proposal (status, one Event per change); members keep planning alone
    AUTO = "Auto"           # also move GPUs: each member's cap (ALLOCATION_ANNOTATION), receivers grown inside spec.surge first


@dataclass(frozen=True, slots=True)
class MemberOf:
    """The pool a ServingTopology names, its priority, and the namespace it names (None: its own)."""

    pool: str
    priority: int
    namespace: str | None
    by_label: bool          # named by the label of before spec.pool


def pool_of(spec: Mapping[str, Any] | None, metadata: Mapping[str, Any]) -> MemberOf | None:
    """The pool a ServingTopology body joins: spec.pool, else the servingtopology.io/pool label (with the priority
    annotation, a non-integer read as 0); None when it names none. Reads the raw body: the pool pass indexes members
    before (and whether or not) their whole spec is valid."""
    ref = (spec or {}).get("pool") if isinstance(spec, Mapping) else None
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref.get("name"):
        prio = ref.get("priority", 0)
        ns = ref.get("namespace")
        return MemberOf(str(ref["name"]), int(prio) if isinstance(prio, int) else 0, str(ns) if isinstance(ns, str) else None, False)
    label = (metadata.get("labels") or {}).get(POOL_LABEL)
    if not label:
        return None
    raw = str((metadata.get("annotations") or {}).get(PRIORITY_ANNOTATION, "0")).strip()
    return MemberOf(str(label), int(raw) if raw.lstrip("-").isdigit() else 0, None, True)


@dataclass(frozen=True, slots=True)
class Allocation:
    """What an Auto pool assigned a member: the pool, the GPU kind and its catalog id, the cap in GPUs, the move step, and
    the GPUs its own transition may use beside the cap while it moves (granted by the pool; its policy.maxSurgeGPUs is
    not used inside a pool)."""

    pool: str
    kind: str
    gpu: str
    max_gpus: int
    step: str
    surge_gpus: int = 0

    def to_json(self) -> str:
        return json.dumps({"pool": self.pool, "kind": self.kind, "gpu": self.gpu, "maxGPUs": self.max_gpus, "step": self.step,
                           "surgeGPUs": self.surge_gpus}, sort_keys=True)


def read_allocation(annotations: Mapping[str, Any]) -> Allocation | str | None:
    """The member's ALLOCATION_ANNOTATION: an Allocation, None when absent, or why it cannot be read (a string)."""
    raw = annotations.get(ALLOCATION_ANNOTATION)
    if raw is None:
        return None
    try:
        data = json.loads(str(raw))
        out = Allocation(str(data["pool"]), str(data["kind"]), str(data["gpu"]), int(data["maxGPUs"]), str(data.get("step", "")),
                         int(data.get("surgeGPUs", 0)))
    except (ValueError, KeyError, TypeError) as exc:
        return f"{ALLOCATION_ANNOTATION} is not an allocation the pool writes ({type(exc).__name__}: {str(exc)[:120]})"
    if out.max_gpus < 0 or out.surge_gpus < 0:
        return f"{ALLOCATION_ANNOTATION}: maxGPUs {out.max_gpus} and surgeGPUs {out.surge_gpus} must be ≥ 0"
    return out


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


class PoolKindSpec(_Base):
    """GPUs of one kind: the nodes whose nvidia.com/gpu.product label names `gpu`, their allocatable GPUs (capped by maxGPUs)."""

    kind: str = Field(pattern=NAME, max_length=63, description="the kind's name in the pool (a DNS-1123 label)")
    gpu: str = Field(min_length=1, max_length=256, description="catalog GPU id or alias (h100_sxm, a100_sxm, l40s, ...): nodes whose "
                     "product label maps to it count")
    maxGPUs: int | None = Field(default=None, ge=0, le=MAX_GPUS, description="cap on this kind's GPUs in the pool; default: all allocatable")
    pricePerHour: float = Field(gt=0, le=10_000, description="$ per GPU-hour of this kind")
    nicGbps: float | None = Field(default=None, ge=0, le=100_000, description="network per GPU to other kinds' nodes in Gb/s (KV of "
                                  "prefill on one kind, decode on another); 0: none; default: the catalog GPU's")


class ServingPoolSpec(_Base):
    """A GPU pool planned as one for the ServingTopologies of its namespace whose spec.pool names it."""

    inventory: list[PoolKindSpec] = Field(min_length=1, max_length=8, description="GPU kinds of the pool with prices")
    objective: PoolObjective = Field(default=PoolObjective.MIN_COST, description="min-cost: meet every member's SLO at the lowest "
                                     "$/hour; max-goodput: the most goodput within budgetPerHour")
    budgetPerHour: float | None = Field(default=None, gt=0, le=10_000_000, description="$/hour the pool may spend (max-goodput)")
    mode: PoolMode = Field(default=PoolMode.DRY_RUN, description="DryRun: the pool's proposal in status and Events; Auto: also move "
                           "GPUs between members (each member's cap in its servingtopology.io/pool-allocation annotation), growing "
                           "receivers inside surge before shrinking donors, each member moving through its own floor-keeping "
                           "transitions; in Auto a member stays on its own hardware.gpu kind")
    surge: int = Field(default=0, ge=0, le=MAX_GPUS, description="GPUs the members' caps may hold together above the final "
                       "allocation while GPUs move (Auto); never more than the inventory")
    mixedKinds: bool = Field(default=True, description="let a member run prefill on one kind and decode on another")
    maxKindsPerMember: int | None = Field(default=None, ge=1, le=8, description="GPU kinds one member may use together (its "
                                          "replicas on several kinds, or prefill and decode on two); default: no bound. Parts "
                                          "on several kinds serve behind one plain Service, which sends each entry pod an "
                                          "equal share: the planner counts a member's capacity that way")

    @model_validator(mode="after")
    def _consistent(self) -> ServingPoolSpec:
        kinds = [k.kind for k in self.inventory]
        if len(set(kinds)) != len(kinds):
            raise ValueError("inventory: kind names must be unique")
        if self.objective is PoolObjective.MAX_GOODPUT and self.budgetPerHour is None:
            raise ValueError("budgetPerHour: the max-goodput objective needs a $/hour budget")
        return self


def parse_pool_spec(data: Any) -> ServingPoolSpec:
    """Validate a ServingPool's spec; SpecError names every bad field (spec.<path>)."""
    try:
        return ServingPoolSpec.model_validate(data if isinstance(data, dict) else {})
    except ValidationError as exc:
        errors = []
        for e in exc.errors():
            msg = str(e["msg"]).removeprefix("Value error, ")
            field = ".".join(str(p) for p in e["loc"])
            if ": " in msg and msg.split(": ", 1)[0] in ("inventory", "budgetPerHour"):
                field, msg = msg.split(": ", 1)
            errors.append((f"spec.{field}" if field else "spec", msg))
        raise SpecError(errors) from None


def _printer_columns() -> list[dict[str, Any]]:
    planned = '.status.conditions[?(@.type=="Planned")]'
    return [
        {"name": "PLANNED", "type": "string", "jsonPath": f"{planned}.status", "description": "the Planned condition"},
        {"name": "REASON", "type": "string", "jsonPath": f"{planned}.reason", "description": "why (PoolPlanned, InvalidSpec, NoMembers, ...)"},
        {"name": "OBJECTIVE", "type": "string", "jsonPath": ".spec.objective"},
        {"name": "MEMBERS", "type": "string", "jsonPath": ".status.summary.members", "description": "members met / members"},
        {"name": "$/HOUR", "type": "string", "jsonPath": ".status.summary.costPerHour", "description": "$/hour of the proposal"},
        {"name": "IDLE", "type": "string", "jsonPath": ".status.summary.idle", "description": "GPUs left idle by kind"},
        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_pool_crd() -> dict[str, Any]:
    """The ServingPool CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    raw = ServingPoolSpec.model_json_schema(by_alias=True)
    spec = structural_schema(raw, raw.get("$defs", {}))
    root = {
        "type": "object",
        "description": "A GPU pool (kinds with prices) planned as one for the ServingTopologies of its namespace whose spec.pool "
                       "names it (or, as before spec.pool, labelled servingtopology.io/pool=<name>).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}, "spec": spec,
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                       "description": "conditions, the proposal per member, $/hour, goodput and idle GPUs by kind"},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{POOL_PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "servingtopology"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": POOL_KIND, "listKind": f"{POOL_KIND}List", "plural": POOL_PLURAL, "singular": POOL_KIND.lower(),
                      "shortNames": [POOL_SHORT_NAME]},
            "scope": "Namespaced",
            "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                          "additionalPrinterColumns": _printer_columns(), "schema": {"openAPIV3Schema": root}}],
        },
    }


def render_pool_crd_yaml() -> str:
    header = "# Generated by `python -m servingtopology.operator.api.pool --write` from operator/api/pool.py. Do not edit.\n"
    return header + yaml.safe_dump(build_pool_crd(), sort_keys=False, allow_unicode=True, width=120)


def main(argv: Sequence[str] | None = None) -> int:
    return write_generated(argv, prog="python -m servingtopology.operator.api.pool", description="the ServingPool CRD",
                           render=render_pool_crd_yaml, paths=POOL_CRD_PATHS)

if __name__ == "__main__":
    sys.exit(main())
