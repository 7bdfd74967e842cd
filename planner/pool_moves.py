"""Moving GPUs between the members of a pool: the next step from the caps in force to the allocation the pool planner chose.

Called by operator/pool_pass.py in Auto once per pool pass ("compute the next step", as planner/transition.py does for
one deployment). The operator writes a step's caps into the members; each member then moves inside its cap through its
own floor-keeping transition, and the next pass waits for it. Pure: no clock, no I/O.

The rules (`next_pool_step`), GPUs counted by kind, a member's GPUs being the larger of its cap and what its pods hold:
- Wait: a member whose own transition runs, or that has not planned under its newest cap yet, is waited for;
- Grow: receivers' caps rise to their targets, higher priority first, where every kind stays within the inventory and
  the caps together within the final allocation plus the surge (a receiver is grown before its donor is shrunk);
- Shrink: when no receiver can grow, every donor's cap falls to its target (a target carries the member's load, and the
  member's own transition keeps its serving floor on the way down);
- Blocked: a receiver that cannot grow and no donor left to shrink (GPUs held outside the pool, a surge too small);
- Done: every cap is its target.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PoolStepKind", "MemberMove", "CapChange", "PoolStep", "next_pool_step", "gpus_text"]


class PoolStepKind(enum.StrEnum):
    WAIT = "Wait"          # a member is still moving inside its last cap
    GROW = "Grow"          # receivers' caps rise (inside the inventory and the surge)
    SHRINK = "Shrink"      # donors' caps fall to their targets
    BLOCKED = "Blocked"    # a receiver cannot grow and no donor is left to shrink
    DONE = "Done"          # every cap is its target


@dataclass(frozen=True, slots=True)
class MemberMove:
    """One member as the pool pass sees it: the cap in force (None: none assigned yet), the GPUs its pods hold, whether it
    is still moving, and its target (the pool plan's GPUs by kind)."""

    name: str
    priority: int
    cap: Mapping[str, int] | None
    held: Mapping[str, int]
    moving: bool
    target: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class CapChange:
    name: str
    before: Mapping[str, int] | None
    after: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PoolStep:
    kind: PoolStepKind
    changes: tuple[CapChange, ...]
    reason: str


def gpus_text(gpus: Mapping[str, int] | None) -> str:
    """`4 h100 + 2 a100`, `0` for none, `none` when no cap is assigned."""
    if gpus is None:
        return "none"
    return " + ".join(f"{v} {k}" for k, v in sorted(gpus.items()) if v) or "0"


def _kinds(*maps: Mapping[str, int] | None) -> set[str]:
    return {k for m in maps if m is not None for k in m}


def _current(m: MemberMove) -> dict[str, int]:
    """The cap in force, or what the member holds when it has none (a member that planned alone before it joined)."""
    src = m.cap if m.cap is not None else m.held
    return {k: int(v) for k, v in src.items()}


def _footprint(cap: Mapping[str, int], held: Mapping[str, int]) -> dict[str, int]:
    return {k: max(int(cap.get(k, 0)), int(held.get(k, 0))) for k in _kinds(cap, held)}


def _fits(caps: Mapping[str, Mapping[str, int]], members: Sequence[MemberMove], *, inventory: Mapping[str, int],
          limit_gpus: int) -> str | None:
    """Why these caps do not fit (None: they do): a kind over the inventory, or the caps over the final allocation + surge."""
    for kind in sorted(_kinds(inventory, *caps.values())):
        used = sum(_footprint(caps[m.name], m.held).get(kind, 0) for m in members)
        if used > int(inventory.get(kind, 0)):
            return f"{used} {kind} over the inventory's {int(inventory.get(kind, 0))}"
    total = sum(sum(c.values()) for c in caps.values())
    if total > limit_gpus:
        return f"{total} GPUs of caps over the final allocation plus surge ({limit_gpus})"
    return None


def next_pool_step(members: Sequence[MemberMove], *, inventory: Mapping[str, int], surge_gpus: int) -> PoolStep:
    """The next step towards every member's target; `inventory` is the GPUs by kind the pool may hold (those held outside
    the pool already taken off). Deterministic: members in priority order, then by name."""
    moving = [m.name for m in members if m.moving]
    if moving:
        return PoolStep(PoolStepKind.WAIT, (), f"waiting for {', '.join(sorted(moving))} to finish moving inside the last cap")
    caps = {m.name: _current(m) for m in members}
    limit = sum(sum(int(v) for v in m.target.values()) for m in members) + surge_gpus
    order = sorted(members, key=lambda m: (-m.priority, m.name))
    grown: list[CapChange] = []
    short: list[str] = []
    for m in order:
        cur = caps[m.name]
        want = {k: max(cur.get(k, 0), int(m.target.get(k, 0))) for k in _kinds(cur, m.target)}
        if all(want[k] <= cur.get(k, 0) for k in want):
            continue
        trial = {**caps, m.name: want}
        why = _fits(trial, members, inventory=inventory, limit_gpus=limit)
        if why is None:
            caps = trial
            grown.append(CapChange(m.name, m.cap, {k: v for k, v in want.items() if v}))
        else:
            short.append(f"{m.name} to {gpus_text(want)}: {why}")
    if grown:
        text = "; ".join(f"{c.name} {gpus_text(c.before)} → {gpus_text(c.after)}" for c in grown)
        return PoolStep(PoolStepKind.GROW, tuple(grown), f"receivers grow first, inside the inventory and a surge of {surge_gpus}: {text}"
                        + (f" (waiting: {'; '.join(short)})" if short else ""))
    shrunk = []
    for m in order:
        cur = caps[m.name]
        want = {k: min(cur.get(k, 0), int(m.target.get(k, 0))) for k in _kinds(cur, m.target)}
        if any(want[k] < cur.get(k, 0) for k in want):
            shrunk.append(CapChange(m.name, m.cap, {k: v for k, v in want.items() if v}))
    if shrunk:
        text = "; ".join(f"{c.name} {gpus_text(c.before)} → {gpus_text(c.after)}" for c in shrunk)
        return PoolStep(PoolStepKind.SHRINK, tuple(shrunk), "donors shrink to their targets (each keeps its load within the SLOs): "
                        + text + (f"; then {'; '.join(short)}" if short else ""))
    if short:
        return PoolStep(PoolStepKind.BLOCKED, (), "no donor is left to shrink and " + "; ".join(short))
    unassigned = [m for m in order if m.cap is None or {k: v for k, v in m.cap.items() if v} != {k: v for k, v in m.target.items() if v}]
    if unassigned:   # caps equal to what the members hold already: written so the members plan within them
        changes = tuple(CapChange(m.name, m.cap, {k: int(v) for k, v in m.target.items() if v}) for m in unassigned)
        return PoolStep(PoolStepKind.GROW, changes, "caps written as the members hold them: "
                        + "; ".join(f"{c.name} {gpus_text(c.after)}" for c in changes))
    return PoolStep(PoolStepKind.DONE, (), "every member's cap is its target")
