"""Request routing between the instances of one role: round robin, least outstanding, prefix affinity.

Called by the event loop at each arrival (and, under PD, at each hand-off to a decode instance).
Deterministic: ties go to the lowest instance index.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

__all__ = ["RouterPolicy", "Router"]


class RouterPolicy(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_OUTSTANDING = "least-outstanding"
    PREFIX_AFFINITY = "prefix-affinity"


class _Target(Protocol):
    @property
    def outstanding(self) -> int: ...


class Router:
    """Picks an instance index for a request.

    - round robin: instances in turn, whatever their load;
    - least outstanding: the fewest requests routed and not yet finished (vLLM router, SGLang gateway);
    - prefix affinity: requests with the same prefix key stick to the instance that first served the
      key (cache-aware routing), others go to the least outstanding instance.
    """

    def __init__(self, policy: RouterPolicy, targets: Sequence[_Target]) -> None:
        self.policy = policy
        self.targets = targets
        self._next = 0
        self._home: dict[int, int] = {}

    def _least(self) -> int:
        best = 0
        for i in range(1, len(self.targets)):
            if self.targets[i].outstanding < self.targets[best].outstanding:
                best = i
        return best

    def pick(self, prefix_key: int) -> int:
        if len(self.targets) == 1:
            return 0
        if self.policy is RouterPolicy.ROUND_ROBIN:
            i = self._next
            self._next = (self._next + 1) % len(self.targets)
            return i
        if self.policy is RouterPolicy.PREFIX_AFFINITY and prefix_key >= 0:
            home = self._home.get(prefix_key)
            if home is None:
                home = self._home[prefix_key] = self._least()
            return home
        return self._least()
