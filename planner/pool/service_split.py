"""How one plain Service splits a member's traffic over its parts on two GPU kinds, and what the member carries then.

Called by the operator's rendering of a member whose replicas sit on two kinds (operator/render/sets.py `parts_rendering`)
and by its tests. The product renders no gateway with weighted routes: the parts' entry pods (aggregated engines, PD
routers) sit behind one ClusterIP Service, and kube-proxy picks a ready endpoint uniformly, so a part's share of the
traffic is its share of the entry pods (`PerPodSplit`), not its share of the capacity. The pool planner weighs parts by
capacity (planner.pool.plan `Part.routing_weight`); this module says how far the Service's split is from those weights and
the member's capacity under it: every part must carry its share, so the member carries min over parts of
capacity / share. Equal only when each entry pod stands for the same capacity (same per-replica capacity on both
kinds, or replica counts in proportion to it). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PD_ROUTER_REPLICAS", "PartLoad", "PartShare", "ServiceSplit", "service_split"]

PD_ROUTER_REPLICAS = 2   # routers of one PD set (operator/render/manifests.py renders this many): a PD part's entry pods


@dataclass(frozen=True, slots=True)
class PartLoad:
    """One part as the Service sees it: a name (its GPU kind), its ready entry pods, its capacity within the SLOs."""

    name: str
    entry_pods: int
    capacity_rps: float


@dataclass(frozen=True, slots=True)
class PartShare:
    name: str
    pod_share: float          # the traffic a per-endpoint Service sends it
    capacity_share: float     # the traffic its capacity calls for (the pool planner's routing weight)


@dataclass(frozen=True, slots=True)
class ServiceSplit:
    shares: tuple[PartShare, ...]
    capacity_rps: float            # what the member carries within the SLOs under the per-pod split
    weighted_capacity_rps: float   # what it would carry split by capacity (the sum of the parts)
    reason: str


def service_split(parts: Sequence[PartLoad]) -> ServiceSplit:
    """PerPodSplit: each part's share of one Service's traffic and the member's capacity under it.

    Raises ValueError on no parts, a part without entry pods, or a negative capacity."""
    if not parts or any(p.entry_pods < 1 or p.capacity_rps < 0 for p in parts):
        raise ValueError(f"parts need entry pods and capacities >= 0: {parts}")
    pods = sum(p.entry_pods for p in parts)
    weighted = sum(p.capacity_rps for p in parts)
    shares = tuple(PartShare(p.name, p.entry_pods / pods, p.capacity_rps / weighted if weighted > 0 else 1.0 / len(parts)) for p in parts)
    capacity = min(p.capacity_rps / s.pod_share for p, s in zip(parts, shares, strict=True))
    split = ", ".join(f"{p.name} {p.entry_pods} of {pods} pods ({s.pod_share:.0%}; by capacity {s.capacity_share:.0%})"
                      for p, s in zip(parts, shares, strict=True))
    reason = (f"PerPodSplit: one plain Service (no weighted gateway) sends each ready entry pod an equal share: {split}; the member "
              f"carries {capacity:.3g} req/s within the SLOs under this split, {weighted:.3g} req/s were it split by capacity")
    return ServiceSplit(shares, capacity, weighted, reason)
