"""What the cluster shows of the workload sets (ready and present instances per set and role), for the transition
step planner.

Called by the reconcile (operator/reconcile.py) on every pass of a transition; the sets themselves are
operator/render/sets.py's. It only reads (the Cluster seam): it never applies, deletes or decides anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from servingtopology.operator.cluster.cluster import Cluster, ObjectRef
from servingtopology.operator.render.manifests import LWS_API_VERSION, MAX_LWS_NAME, ROLE_LABEL, SET_LABEL, Blueprint, object_name, role_nodes
from servingtopology.operator.render.sets import Rendering
from servingtopology.planner.layout import Role
from servingtopology.planner.live.transition import ClusterView

__all__ = ["read_cluster_view"]

_GONE_PHASES = ("Succeeded", "Failed")              # pods in these phases no longer hold their GPUs


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
