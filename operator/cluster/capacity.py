"""GPU capacity as the cluster has it: nodes' allocatable `nvidia.com/gpu` and `nvidia.com/gpu.product` labels,
minus what other pods hold, and whether a layout's pods fit in what is free.

Called by the reconcile (operator/reconcile.py) before it plans and before it applies a plan; pure over the
node and pod objects the Cluster lists. Products are matched to catalog GPUs by the catalog's own names (GPU
feature discovery labels a node with the NVML name, spaces as dashes: `NVIDIA H100 80GB HBM3` →
`NVIDIA-H100-80GB-HBM3`); a product the catalog does not know is reported, never guessed. It counts
requests, as the scheduler does: a pod holds its GPUs from the moment it is bound to a node until it ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from servingtopology.planner.hardware import PRODUCT_LABEL, gpu_for_product, resolve_gpu  # the one product-label rule (planner.hardware); re-exported
from servingtopology.planner.layout import Layout, Role, RoleLayout

__all__ = ["GPU_RESOURCE", "GPU_PRODUCT_LABEL", "NodeGpus", "Capacity", "gpu_for_product", "read_capacity",
           "pod_gpus", "layout_pod_gpus", "unplaced_gpus", "missing_by_kind"]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = PRODUCT_LABEL
_TERMINAL_PHASES = ("Succeeded", "Failed")


def _quantity_int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def pod_gpus(pod: Mapping[str, object]) -> int:
    """GPUs a pod holds: its containers' `nvidia.com/gpu` requests (or limits), as the scheduler counts them."""
    spec = pod.get("spec") or {}
    assert isinstance(spec, Mapping)
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        total += _quantity_int(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE, 0)))
    init = [_quantity_int(((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE, 0))
            for c in spec.get("initContainers") or []]
    return max([total, *init])


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """One schedulable GPU node: its product, catalog GPU id ('' if unknown), allocatable and free GPUs."""

    name: str
    product: str
    gpu_id: str
    allocatable: int
    free: int


@dataclass(frozen=True, slots=True)
class Capacity:
    """GPU nodes that match a topology's node selector, and the products the catalog does not know."""

    nodes: tuple[NodeGpus, ...]
    unknown_products: tuple[str, ...]

    def of(self, gpu_id: str) -> tuple[NodeGpus, ...]:
        return tuple(n for n in self.nodes if n.gpu_id == gpu_id)

    def free(self, gpu_id: str) -> int:
        return sum(n.free for n in self.of(gpu_id))

    def allocatable(self, gpu_id: str) -> int:
        return sum(n.allocatable for n in self.of(gpu_id))


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _schedulable(node: Mapping[str, object]) -> bool:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    assert isinstance(spec, Mapping) and isinstance(status, Mapping)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and not spec.get("unschedulable")


def read_capacity(nodes: Iterable[Mapping[str, object]], pods: Iterable[Mapping[str, object]], *,
                  node_selector: Mapping[str, str], own: set[str]) -> Capacity:
    """GPU capacity on the Ready, schedulable nodes matching `node_selector`, free after every bound, unfinished
    pod except those whose uid is in `own` (the topology's own pods: a new plan may reuse their GPUs)."""
    used: dict[str, int] = {}
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        assert isinstance(meta, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)
        node = spec.get("nodeName")
        if not node or status.get("phase") in _TERMINAL_PHASES or meta.get("uid") in own:
            continue
        used[str(node)] = used.get(str(node), 0) + pod_gpus(pod)
    out, unknown = [], set()
    for node in nodes:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        assert isinstance(meta, Mapping) and isinstance(status, Mapping)
        labels = meta.get("labels") or {}
        allocatable = _quantity_int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0))
        if allocatable <= 0 or not _matches(labels, node_selector) or not _schedulable(node):
            continue
        product = str(labels.get(GPU_PRODUCT_LABEL, ""))
        gpu = gpu_for_product(product)
        if gpu is None:
            unknown.add(product or "(no nvidia.com/gpu.product label)")
        name = str(meta.get("name", ""))
        out.append(NodeGpus(name=name, product=product, gpu_id=gpu.id if gpu else "", allocatable=allocatable,
                            free=max(0, allocatable - used.get(name, 0))))
    return Capacity(nodes=tuple(sorted(out, key=lambda n: n.name)), unknown_products=tuple(sorted(unknown)))


def layout_pod_gpus(layout: Layout, *, gpus_per_node: int) -> list[int]:
    """GPUs of every pod a layout runs (an instance over several nodes is one pod per node), largest first."""
    pods = []
    for rl in layout.roles.values():
        nodes = max(1, math.ceil(rl.parallelism.gpus / gpus_per_node))
        pods += [rl.parallelism.gpus // nodes] * (nodes * rl.count)
    return sorted(pods, reverse=True)


def unplaced_gpus(pod_gpus_needed: Sequence[int], free_per_node: Sequence[int]) -> int:
    """GPUs of the pods that do not fit, placing the largest first on the node with the least room that takes it
    (best-fit decreasing: the scheduler places one pod at a time, so this is a fair stand-in, not an optimum)."""
    free = sorted(free_per_node)
    missing = 0
    for need in sorted(pod_gpus_needed, reverse=True):
        at = next((i for i, room in enumerate(free) if room >= need), None)
        if at is None:
            missing += need
            continue
        free[at] -= need
        free.sort()
    return missing


def missing_by_kind(layout: Layout, capacity: Capacity, *, default_gpu: str, gpus_per_node: int) -> dict[str, int]:
    """PerKindFit: GPUs of each kind whose pods do not fit that kind's free GPUs node by node, for a layout whose roles
    name GPU kinds (the others run on `default_gpu`, in nodes of `gpus_per_node`; another kind in its catalog node).
    Only kinds with a shortfall are listed."""
    by_kind: dict[str, dict[Role, RoleLayout]] = {}
    for role, gid in layout.role_gpus(default_gpu).items():
        by_kind.setdefault(gid, {})[role] = layout.roles[role]
    out = {}
    for gid, roles in sorted(by_kind.items()):
        part = Layout(layout.kind, roles, layout.precision)
        per_node = gpus_per_node if gid == default_gpu else resolve_gpu(gid).gpus_per_node
        missing = unplaced_gpus(layout_pod_gpus(part, gpus_per_node=per_node), [n.free for n in capacity.of(gid)])
        if missing:
            out[gid] = missing
    return out
