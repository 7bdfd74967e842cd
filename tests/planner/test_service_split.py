"""One plain Service over a member's parts on two GPU kinds: each part's share is its share of the entry pods, and the
member carries what its most loaded part allows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servingtopology.planner.pool.service_split import PartLoad, service_split


@pytest.mark.parametrize(("parts", "shares", "capacity_rps"), [
    # 3 H100 replicas of 10 req/s, 2 A100 replicas of 6: 60 %:40 % per pod, 71 %:29 % by capacity; the A100s bind at 12 / 0.4
    ([PartLoad("h100", 3, 30.0), PartLoad("a100", 2, 12.0)], (0.6, 0.4), 30.0),
    # replica counts in proportion to capacity (each pod 6 req/s): the per-pod split is the capacity split, nothing lost
    ([PartLoad("h100", 2, 12.0), PartLoad("a100", 3, 18.0)], (0.4, 0.6), 30.0),
    # PD parts enter through two routers each: an even split whatever their capacities
    ([PartLoad("h100→a100", 2, 20.0), PartLoad("a100", 2, 5.0)], (0.5, 0.5), 10.0),
])
def test_a_plain_service_splits_per_entry_pod_and_the_member_carries_its_bottleneck(
        parts: list[PartLoad], shares: tuple[float, float], capacity_rps: float) -> None:
    split = service_split(parts)
    assert tuple(round(s.pod_share, 6) for s in split.shares) == shares
    assert split.capacity_rps == pytest.approx(capacity_rps)
    assert split.weighted_capacity_rps == pytest.approx(sum(p.capacity_rps for p in parts))
    assert split.reason.startswith("PerPodSplit: one plain Service") and f"{capacity_rps:.3g} req/s" in split.reason


@given(st.lists(st.tuples(st.integers(1, 64), st.floats(0.0, 1e4)), min_size=1, max_size=4))
def test_the_per_pod_split_never_carries_more_than_the_capacity_split(raw: list[tuple[int, float]]) -> None:
    split = service_split([PartLoad(f"k{i}", n, c) for i, (n, c) in enumerate(raw)])
    assert split.capacity_rps <= split.weighted_capacity_rps * (1 + 1e-9) + 1e-12
    assert sum(s.pod_share for s in split.shares) == pytest.approx(1.0)


def test_a_part_without_entry_pods_is_refused() -> None:
    with pytest.raises(ValueError, match="entry pods"):
        service_split([PartLoad("h100", 0, 1.0)])
