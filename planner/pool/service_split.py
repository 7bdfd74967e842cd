"""How one plain Service splits a member's traffic over its parts on two GPU kinds, and what the member carries then.

Called by the operator's rendering of a member whose replicas sit on two kinds (operator/render/sets.py `parts_rendering`)
and by its tests. The product renders no gateway with weighted routes: the parts' entry pods (aggregated engines, PD
routers) sit behind one ClusterIP Service, and kube-proxy picks a ready endpoint uniformly, so a part's share of the
traffic is its share of the entry pods (`PerPodSplit`), not its share of the capacity. Every part must carry its share,
so the member carries min over parts of capacity / share = (entry pods in all) × (the slowest entry pod's capacity)
(`per_pod_capacity_rps`). The pool planner plans with this figure (planner.pool.plan, PlanTheRenderedSplit): its MILP,
greedy, verdict, shortages and marginal values all read the member's capacity under the per-pod split, never the sum of
the parts' capacities (the sum holds only when each entry pod stands for the same capacity). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PD_ROUTER_REPLICAS", "PartLoad", "PartShare", "ServiceSplit", "per_pod_capacity_rps", "service_split"]

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


def per_pod_capacity_rps(*, entry_pods: Sequence[int], capacity_rps: Sequence[float]) -> float:
    """PerPodSplit: what parts behind one plain Service carry together within the SLOs, in req/s.

    (Σ entry pods) × min over parts of (capacity / entry pods): each pod takes an equal share, so the part whose pods are
    slowest binds. One part: its own capacity. Raises ValueError on no parts, a part without entry pods, or a negative
    capacity."""
    if not entry_pods or len(entry_pods) != len(capacity_rps) or any(n < 1 for n in entry_pods) or any(c < 0 for c in capacity_rps):
        raise ValueError(f"parts need entry pods and capacities >= 0: {list(entry_pods)}, {list(capacity_rps)}")
    return sum(entry_pods) * min(c / n for n, c in zip(entry_pods, capacity_rps, strict=True))


def service_split(parts: Sequence[PartLoad]) -> ServiceSplit:
    """PerPodSplit: each part's share of one Service's traffic and the member's capacity under it.

    Raises ValueError on no parts, a part without entry pods, or a negative capacity."""
    if not parts or any(p.entry_pods < 1 or p.capacity_rps < 0 for p in parts):
        raise ValueError(f"parts need entry pods and capacities >= 0: {parts}")
    pods = sum(p.entry_pods for p in parts)
    weighted = sum(p.capacity_rps for p in parts)
    shares = tuple(PartShare(p.name, p.entry_pods / pods, p.capacity_rps / weighted if weighted > 0 else 1.0 / len(parts)) for p in parts)
    capacity = per_pod_capacity_rps(entry_pods=[p.entry_pods for p in parts], capacity_rps=[p.capacity_rps for p in parts])
    split = ", ".join(f"{p.name} {p.entry_pods} of {pods} pods ({s.pod_share:.0%}; by capacity {s.capacity_share:.0%})"
                      for p, s in zip(parts, shares, strict=True))
    reason = (f"PerPodSplit: one plain Service (no weighted gateway) sends each ready entry pod an equal share: {split}; the member "
              f"carries {capacity:.3g} req/s within the SLOs under this split, {weighted:.3g} req/s were it split by capacity")
    return ServiceSplit(shares, capacity, weighted, reason)
