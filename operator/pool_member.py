"""A ServingTopology's side of a ServingPool: whether the pool it names exists, and the GPU cap an Auto pool assigned it.

Called by operator/reconcile.py once the spec is admitted: `membership` reads the pool (one GET) and the allocation
annotation and returns the PoolMember condition and the cap; `capped` narrows the spec's hardware.maxGPUs to the cap, so
every plan, transition budget and capacity check of the pass keeps within it. Decides nothing the pool decides.

- no spec.pool (nor the label of before it): no condition, no cap;
- spec.pool.namespace another namespace: PoolInOtherNamespace (a pool plans its own namespace's members), no cap;
- the pool does not exist: PoolNotFound, no cap (the member plans alone within hardware.maxGPUs);
- the pool exists: PoolMember=True; an allocation of this pool (and of this GPU) is the cap, one of another pool, of
  another GPU kind or unreadable is ignored and named (AllocationIgnored).
"""

from __future__ import annotations

from dataclasses import dataclass

from servingtopology.operator.api.pool import ALLOCATION_ANNOTATION, POOL_KIND, Allocation, pool_of, read_allocation
from servingtopology.operator.api.resource import API_VERSION, TopologySpec
from servingtopology.operator.cluster.cluster import Cluster, ObjectRef
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import resolve_gpu

__all__ = ["Membership", "membership", "capped"]


@dataclass(frozen=True, slots=True)
class Membership:
    status: bool | None         # the PoolMember condition's status (None: no pool named, no condition)
    reason: str
    message: str
    cap_gpus: int | None        # the pool-assigned cap honoured this pass (None: none)
    surge_gpus: int = 0         # with a cap: the GPUs the pool lets this member's own transition use beside it


def membership(spec: TopologySpec, *, cluster: Cluster, namespace: str, labels: dict[str, str],
               annotations: dict[str, str]) -> Membership:
    """The PoolMember condition and the cap this pass honours."""
    named = pool_of(spec.model_dump(mode="json", exclude_none=True), {"labels": labels, "annotations": annotations})
    if named is None:
        return Membership(None, "", "", None)
    if named.namespace is not None and named.namespace != namespace:
        return Membership(False, "PoolInOtherNamespace", f"spec.pool.namespace {named.namespace!r}: a ServingPool plans the members of "
                          f"its own namespace only (this resource is in {namespace!r}); planning alone within spec.hardware.maxGPUs", None)
    where = "the servingtopology.io/pool label" if named.by_label else "spec.pool.name"
    if cluster.read(ObjectRef(API_VERSION, POOL_KIND, namespace, named.pool)) is None:
        return Membership(False, "PoolNotFound", f"{where}: ServingPool {namespace}/{named.pool} does not exist; planning alone within "
                          "spec.hardware.maxGPUs", None)
    head = f"member of ServingPool {named.pool} (priority {named.priority})"
    got = read_allocation(annotations)
    if got is None:
        return Membership(True, "PoolMember", f"{head}; no GPU cap assigned (the pool is DryRun, or has not planned this member yet)", None)
    if isinstance(got, str):
        return Membership(True, "AllocationIgnored", f"{head}; {got}: planning within spec.hardware.maxGPUs", None)
    why = _ignored(got, spec, pool=named.pool)
    if why is not None:
        return Membership(True, "AllocationIgnored", f"{head}; {ALLOCATION_ANNOTATION} ignored: {why}", None)
    cap = min(got.max_gpus, spec.hardware.maxGPUs)
    return Membership(True, "PoolAssigned", f"{head}; the pool assigns {got.max_gpus} {got.kind} GPUs (step {got.step or '-'}): plans keep "
                      f"within {cap} (spec.hardware.maxGPUs {spec.hardware.maxGPUs}), a transition within {cap} + {got.surge_gpus} "
                      "surge granted by the pool", cap, got.surge_gpus)


def _ignored(got: Allocation, spec: TopologySpec, *, pool: str) -> str | None:
    if got.pool != pool:
        return f"written by ServingPool {got.pool!r}, not {pool!r}"
    try:
        own = resolve_gpu(spec.hardware.gpu).id
    except InvalidSpec:
        return None   # the planning path names the unknown GPU
    if got.gpu != own:
        return f"it assigns {got.gpu} GPUs and this resource runs on {own} (spec.hardware.gpu)"
    if got.max_gpus < 1:
        return "it assigns no GPUs; the running layout is kept"
    return None


def capped(spec: TopologySpec, member: Membership) -> TopologySpec:
    """The spec with hardware.maxGPUs lowered to the pool's cap and policy.maxSurgeGPUs the surge the pool granted (the pool's
    GPUs are shared: a member's own surge would take them from the others); unchanged without a cap."""
    if member.cap_gpus is None:
        return spec
    policy = spec.policy.model_copy(update={"maxSurgeGPUs": member.surge_gpus})
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"maxGPUs": min(member.cap_gpus, spec.hardware.maxGPUs)}),
                                   "policy": policy})
