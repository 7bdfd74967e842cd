"""The pool spec: a GPU inventory by kind with prices, an objective, and members (inline planning specs or spec files).

Read by `servingtopology plan --pool POOL.yaml` and the benchmarks. `load_pool` validates (pydantic, camelCase, every
number bounded) and `to_pool_inputs` converts to the planner's values: the kinds (planner.pool.plan.GpuKind) and, per
member, its Problem (servingtopology.spec.to_problem) and its GPU cap. Errors are SpecError naming the dotted field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.pool.plan import GpuKind, PoolObjective
from servingtopology.planner.problem import Problem
from servingtopology.spec import MAX_GPUS, MAX_RATE_RPS, SpecError, parse_spec, read_spec_data, to_problem

__all__ = ["InventorySpec", "MemberSpec", "PoolSpec", "PoolInputs", "MemberInput", "load_pool", "parse_pool", "to_pool_inputs",
           "MAX_KINDS", "MAX_MEMBERS"]

MAX_KINDS = 8            # GPU kinds in one pool (the catalog has 13)
MAX_MEMBERS = 64         # members of one pool: the planner's work grows with members × kinds²
MAX_PRICE = 10_000.0     # $ per GPU-hour: 1000x a B200's on-demand price
MAX_BUDGET = 10_000_000.0
MAX_PRIORITY = 1000
NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"   # a DNS-1123 label, as a Kubernetes object name


class _PoolBase(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


class InventorySpec(_PoolBase):
    """GPUs of one kind in the pool."""

    kind: str = Field(pattern=NAME, description="the kind's name in the pool (a DNS-1123 label: h100, a100-spot)")
    gpu: str = Field(min_length=1, max_length=256, description="GPU id or alias from the catalog (h100_sxm, a100_sxm, l40s, ...)")
    count: int = Field(ge=0, le=MAX_GPUS, description="GPUs of this kind the pool may use")
    pricePerHour: float = Field(gt=0, le=MAX_PRICE, description="price of one GPU of this kind for an hour, in $")
    nicGbps: float | None = Field(default=None, ge=0, le=100_000, description="network per GPU between this kind's nodes and "
                                  "others, in Gb/s (carries the KV of prefill on one kind and decode on another); 0: none (no "
                                  "mixed-kind PD with this kind); default: the catalog GPU's")
    gpusPerNode: int | None = Field(default=None, ge=1, le=72, description="GPUs in one node; default: the catalog GPU's")


class MemberSpec(_PoolBase):
    """One model served from the pool: an inline planning spec (`spec`) or a spec file (`specFile`)."""

    name: str = Field(pattern=NAME, description="the member's name (a DNS-1123 label)")
    priority: int = Field(default=0, ge=0, le=MAX_PRIORITY, description="when the pool is short, higher priorities are met first")
    minRps: float = Field(default=0.0, ge=0, le=MAX_RATE_RPS, description="serving floor: SLO capacity the member keeps whatever "
                          "the objective, in req/s (default 0)")
    maxGPUs: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="cap on the member's GPUs of all kinds together; "
                                "default: the spec's hardware.maxGPUs, else the whole inventory")
    spec: dict[str, Any] | None = Field(default=None, description="the member's planning spec (as `servingtopology plan` reads it); "
                                        "its hardware block may be left out: the pool gives the GPUs")
    specFile: str | None = Field(default=None, min_length=1, max_length=4096, description="path of the member's spec file, "
                                 "relative to the pool file")

    @model_validator(mode="after")
    def _one_source(self) -> MemberSpec:
        if (self.spec is None) == (self.specFile is None):
            raise ValueError("spec: give exactly one of spec (inline) and specFile")
        return self


class PoolSpec(_PoolBase):
    """A GPU pool planned as one: inventory by kind with prices, the objective, the members."""

    objective: PoolObjective = Field(default=PoolObjective.MIN_COST, description="min-cost: meet every member's SLO at the lowest "
                                     "$/hour; max-goodput: the most goodput within budgetPerHour")
    budgetPerHour: float | None = Field(default=None, gt=0, le=MAX_BUDGET, description="$/hour the pool may spend (max-goodput)")
    inventory: list[InventorySpec] = Field(min_length=1, max_length=MAX_KINDS, description="GPU kinds of the pool")
    members: list[MemberSpec] = Field(min_length=1, max_length=MAX_MEMBERS, description="models served from the pool")
    mixedKinds: bool = Field(default=True, description="let a member run prefill on one kind and decode on another")
    maxKindsPerMember: int | None = Field(default=None, ge=1, le=MAX_KINDS, description="GPU kinds one member may use together "
                                          "(its replicas on several kinds, or prefill and decode on two); default: no bound. "
                                          "Parts on several kinds serve behind one plain Service, which sends each entry pod "
                                          "an equal share: the planner counts a member's capacity that way")

    @model_validator(mode="after")
    def _consistent(self) -> PoolSpec:
        kinds = [k.kind for k in self.inventory]
        if len(set(kinds)) != len(kinds):
            raise ValueError("inventory: kind names must be unique")
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError("members: member names must be unique")
        if self.objective is PoolObjective.MAX_GOODPUT and self.budgetPerHour is None:
            raise ValueError("budgetPerHour: the max-goodput objective needs a $/hour budget")
        if sum(k.count for k in self.inventory) > MAX_GPUS:
            raise ValueError(f"inventory: at most {MAX_GPUS} GPUs in all")
        return self


@dataclass(frozen=True, slots=True)
class MemberInput:
    name: str
    priority: int
    min_rps: float
    cap_gpus: int
    problem: Problem


@dataclass(frozen=True, slots=True)
class PoolInputs:
    kinds: tuple[GpuKind, ...]
    members: tuple[MemberInput, ...]
    objective: PoolObjective
    budget_per_hour: float | None
    mixed: bool
    max_kinds_per_member: int | None = None


def _errors(exc: ValidationError) -> SpecError:
    out = []
    for e in exc.errors():
        field = ".".join(str(p) for p in e["loc"]) or "pool"
        msg = str(e["msg"]).removeprefix("Value error, ")
        if ": " in msg and (field == "pool" or msg.split(": ", 1)[0] in ("inventory", "members", "budgetPerHour", "spec")):
            head, msg = msg.split(": ", 1)
            field = head if field == "pool" else f"{field}.{head}"
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append((field, msg))
    return SpecError(out)


def parse_pool(data: Any) -> PoolSpec:
    """Validate a parsed pool document; SpecError names every bad field."""
    if not isinstance(data, dict):
        raise SpecError([("pool", "must be a mapping (objective, budgetPerHour, inventory, members, mixedKinds)")])
    try:
        return PoolSpec.model_validate(data)
    except ValidationError as exc:
        raise _errors(exc) from None


def load_pool(path: str | Path) -> PoolSpec:
    """Read (bounded, as spec files are) and validate a pool file."""
    return parse_pool(read_spec_data(path))


def to_pool_inputs(pool: PoolSpec, *, base: Path | None = None) -> PoolInputs:
    """The planner's inputs; member specs are validated as `plan` validates a spec, their errors named under members[i]."""
    kinds = []
    for i, k in enumerate(pool.inventory):
        try:
            gpu = resolve_gpu(k.gpu, field=f"inventory[{i}].gpu", gpus_per_node=k.gpusPerNode)
        except InvalidSpec as exc:
            raise SpecError([(exc.field, exc.message)]) from None
        kinds.append(GpuKind(k.kind, gpu, k.count, k.pricePerHour, gpu.nic_gbit if k.nicGbps is None else k.nicGbps))
    total = min(sum(k.count for k in pool.inventory), MAX_GPUS)
    members = []
    for i, m in enumerate(pool.members):
        where = f"members[{i}]"
        if m.spec is not None:
            data: Any = dict(m.spec)
        else:
            assert m.specFile is not None
            path = Path(m.specFile) if base is None or Path(m.specFile).is_absolute() else base / m.specFile
            try:
                data = read_spec_data(path)
            except SpecError as exc:
                raise SpecError([(f"{where}.specFile", msg) for _, msg in exc.errors]) from None
            if isinstance(data, dict) and data.get("kind") == "ServingTopology":
                data = data.get("spec")
        if not isinstance(data, dict):
            raise SpecError([(f"{where}.spec", "must be a mapping of planning-spec fields (model, workload, slo, ...)")])
        hardware = dict(data.get("hardware") or {})
        cap = m.maxGPUs or int(hardware.get("maxGPUs") or total)
        hardware.setdefault("gpu", kinds[0].gpu.id)
        hardware["maxGPUs"] = max(1, min(cap, MAX_GPUS))
        data["hardware"] = hardware
        try:
            spec = parse_spec(data)
            problem = to_problem(spec)
        except SpecError as exc:
            raise SpecError([(f"{where}.spec.{f}", msg) for f, msg in exc.errors]) from None
        except InvalidSpec as exc:
            raise SpecError([(f"{where}.spec.{exc.field}", exc.message)]) from None
        if problem.workload.arrival_rate_rps is None:
            raise SpecError([(f"{where}.spec.workload.arrivalRate", "a pool member needs an arrival rate in requests/s")])
        members.append(MemberInput(m.name, m.priority, m.minRps, max(1, min(cap, total)), problem))
    return PoolInputs(tuple(kinds), tuple(members), pool.objective, pool.budgetPerHour, pool.mixedKinds, pool.maxKindsPerMember)
