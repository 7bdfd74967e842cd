"""Workload sets: which sets a plan or a running transition renders (one, or two side by side) and what the
cluster shows of them (ready and present instances per set and role) for the transition step planner.

Called by the reconcile (operator/reconcile.py) on every pass. Pure apart from `read_cluster_view`, which
only reads (the Cluster seam): it never applies, deletes or decides anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...planner.layout import Layout, Role
from ...planner.transition import ClusterView, Phase, TransitionState
from ..runtime.cluster import Cluster, ObjectRef
from .manifests import LWS_API_VERSION, MAX_LWS_NAME, ROLE_LABEL, SET_LABEL, Blueprint, object_name, role_nodes

__all__ = ["Rendering", "BlueprintFor", "steady_rendering", "transition_rendering", "layout_at", "read_cluster_view"]

BlueprintFor = Callable[[Layout, str], Blueprint]   # (layout at its counts, set name) -> the builders' input
_GONE_PHASES = ("Succeeded", "Failed")              # pods in these phases no longer hold their GPUs


@dataclass(frozen=True, slots=True)
class Rendering:
    """The sets to render this pass, which of them take client traffic, and a one-line account of it."""

    sets: tuple[Blueprint, ...]
    serving: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return sum(bp.layout.gpus for bp in self.sets)


def layout_at(layout: Layout, counts: Mapping[Role, int]) -> Layout:
    """The layout with its per-role instance counts replaced (absent roles at 0)."""
    return Layout(layout.kind, {r: replace(rl, count=counts.get(r, 0)) for r, rl in layout.roles.items()}, layout.precision)


def steady_rendering(layout: Layout, set_name: str, bp_for: BlueprintFor) -> Rendering:
    """One plan running alone as its set."""
    return Rendering((bp_for(layout, set_name),), (set_name,))


def transition_rendering(state: TransitionState, bp_for: BlueprintFor) -> Rendering:
    """Every set the transition state wants, at its desired counts; the old set first.

    A finished transition renders its target alone; a failed one stays as it is (see planner/transition.py).
    """
    if state.phase is Phase.DONE:
        counts = state.desired.get(state.to_set, {r: rl.count for r, rl in state.target.roles.items()})
        return steady_rendering(layout_at(state.target, counts), state.to_set, bp_for)
    shapes = {state.from_set: state.source, state.to_set: state.target}
    order = list(dict.fromkeys(s for s in (state.from_set, state.to_set) if s in state.desired))
    order += sorted(s for s in state.desired if s not in order)
    sets = tuple(bp_for(layout_at(shapes[s], state.desired[s]), s) for s in order if s in shapes)
    serving = tuple(s for s in state.serving if s in state.desired)
    return Rendering(sets, serving or (sets[0].set,))


def _workload_ref(bp: Blueprint, role: Role) -> ObjectRef:
    if role_nodes(bp, bp.layout.roles[role]) > 1:
        return ObjectRef(LWS_API_VERSION, "LeaderWorkerSet", bp.namespace, object_name(bp, role.value, limit=MAX_LWS_NAME))
    return ObjectRef("apps/v1", "Deployment", bp.namespace, object_name(bp, role.value))


def _ready_instances(live: Mapping[str, Any] | None) -> int:
    """Ready instances of a Deployment or LeaderWorkerSet (its ready replicas that run the current template)."""
    if live is None:
        return 0
    st = live.get("status") or {}
    ready = int(st.get("readyReplicas") or 0)
    updated = int(st.get("updatedReplicas", ready) or 0)
    return min(ready, updated)


def read_cluster_view(cluster: Cluster, rendering: Rendering, *, namespace: str, name: str) -> ClusterView:
    """Ready instances from each set's workloads; present instances from the pods, terminating ones included
    (a pod holds its GPUs until it is gone), per set and role."""
    ready: dict[str, dict[Role, int]] = {}
    pods_per_instance: dict[tuple[str, str], int] = {}
    for bp in rendering.sets:
        ready[bp.set] = {}
        for role, rl in bp.layout.roles.items():
            ready[bp.set][role] = _ready_instances(cluster.read(_workload_ref(bp, role)))
            pods_per_instance[(bp.set, role.value)] = role_nodes(bp, rl)
    held: dict[tuple[str, str], int] = {}
    for pod in cluster.list_pods(namespace, f"app.kubernetes.io/instance={name}"):
        labels = (pod.get("metadata") or {}).get("labels") or {}
        key = (str(labels.get(SET_LABEL, "")), str(labels.get(ROLE_LABEL, "")))
        if key not in pods_per_instance or (pod.get("status") or {}).get("phase") in _GONE_PHASES:
            continue
        held[key] = held.get(key, 0) + 1
    present: dict[str, dict[Role, int]] = {}
    for (set_name, role_name), pods in held.items():
        present.setdefault(set_name, {})[Role(role_name)] = math.ceil(pods / pods_per_instance[(set_name, role_name)])
    return ClusterView(ready=ready, present=present)
