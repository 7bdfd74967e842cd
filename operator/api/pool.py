"""The ServingPool API (servingtopology.io/v1alpha1): one GPU inventory by kind with prices, planned for its members.

A ServingTopology joins a pool with the label `servingtopology.io/pool: <pool name>` (same namespace) and its priority
with the annotation `servingtopology.io/pool-priority` (an integer, default 0); its hardware.maxGPUs is its cap inside
the pool. The pydantic models here are the single source of crds/servingpool.yaml (`build_pool_crd`, golden-tested)
and the trust boundary of the pool pass (`parse_pool_spec`). Must not import kopf or kubernetes.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servingtopology.operator.api.crd import VERSION, structural_schema, write_generated
from servingtopology.operator.api.resource import GROUP
from servingtopology.planner.pool import PoolObjective
from servingtopology.spec import MAX_GPUS, SpecError

__all__ = ["POOL_KIND", "POOL_PLURAL", "POOL_SHORT_NAME", "POOL_LABEL", "PRIORITY_ANNOTATION", "POOL_CRD_PATHS", "PoolMode",
           "PoolKindSpec", "ServingPoolSpec", "parse_pool_spec", "build_pool_crd", "render_pool_crd_yaml", "main"]

POOL_KIND = "ServingPool"
POOL_PLURAL = "servingpools"
POOL_SHORT_NAME = "spool"
POOL_LABEL = f"{GROUP}/pool"
PRIORITY_ANNOTATION = f"{GROUP}/pool-priority"
POOL_CRD_PATHS = ("crds/servingpool.yaml", "charts/servingtopology/crds/servingpool.yaml")
NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class PoolMode(enum.StrEnum):
    DRY_RUN = "DryRun"      # plan the pool and show the proposal (status, one Event per change); members keep planning alone


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
    """A GPU pool planned as one for the ServingTopologies labelled servingtopology.io/pool=<name> in its namespace."""

    inventory: list[PoolKindSpec] = Field(min_length=1, max_length=8, description="GPU kinds of the pool with prices")
    objective: PoolObjective = Field(default=PoolObjective.MIN_COST, description="min-cost: meet every member's SLO at the lowest "
                                     "$/hour; max-goodput: the most goodput within budgetPerHour")
    budgetPerHour: float | None = Field(default=None, gt=0, le=10_000_000, description="$/hour the pool may spend (max-goodput)")
    mode: PoolMode = Field(default=PoolMode.DRY_RUN, description="DryRun: the pool's proposal in status and Events (the only mode so far)")
    mixedKinds: bool = Field(default=True, description="let a member run prefill on one kind and decode on another")

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
        "description": "A GPU pool (kinds with prices) planned as one for the ServingTopologies labelled servingtopology.io/pool=<name> "
                       "in its namespace (priority: the servingtopology.io/pool-priority annotation).",
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
