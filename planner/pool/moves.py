"""Moving GPUs between the members of a pool: the next step from the caps in force to the allocation the pool planner chose.

Called by operator/pool_pass.py in Auto once per pool pass ("compute the next step", as planner/live/transition.py does for
one deployment). The operator writes a step's caps into the members; each member then moves inside its cap through its
own floor-keeping transition, and the next pass waits for it. Pure: no clock, no I/O.

The rules (`next_pool_step`), GPUs counted by kind, a member's GPUs being the larger of its cap plus the surge granted to
it and what its pods hold:
- Wait: a member whose own transition runs, or that has not planned under its newest cap yet, is waited for;
- Grow: receivers' caps rise to their targets, higher priority first, where every kind stays within the inventory and
  the caps together within the final allocation plus the surge (a receiver is grown before its donor is shrunk);
- Shrink: when no receiver can grow, every donor's cap falls to its target (a target carries the member's load, and the
  member's own transition keeps its serving floor on the way down);
- Blocked: a receiver that cannot grow and no donor left to shrink (GPUs held outside the pool, a surge too small);
- Surge granted (SurgeForOwnMove): a member whose cap changes in a Grow or Shrink step may need GPUs beside its cap for
  its own move (a new layout of another shape comes up beside the old one: at most what it holds now); it is granted
  that much where the inventory and the pool's surge leave room, and it is taken back once every cap is its target;
- Done: every cap is its target and no surge is granted.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    surge: Mapping[str, int] = field(default_factory=dict)   # GPUs granted above the cap for its own move, by kind


@dataclass(frozen=True, slots=True)
class CapChange:
    name: str
    before: Mapping[str, int] | None
    after: Mapping[str, int]
    surge: Mapping[str, int] = field(default_factory=dict)   # granted above `after` for the member's own move


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


def _footprint(cap: Mapping[str, int], held: Mapping[str, int], surge: Mapping[str, int]) -> dict[str, int]:
    return {k: max(int(cap.get(k, 0)) + int(surge.get(k, 0)), int(held.get(k, 0))) for k in _kinds(cap, held, surge)}


def _fits(caps: Mapping[str, Mapping[str, int]], surges: Mapping[str, Mapping[str, int]], members: Sequence[MemberMove], *,
          inventory: Mapping[str, int], limit_gpus: int) -> str | None:
    """Why these caps do not fit (None: they do): a kind over the inventory, or the caps (with the surge granted) over the
    final allocation + the pool's surge."""
    for kind in sorted(_kinds(inventory, *caps.values())):
        used = sum(_footprint(caps[m.name], m.held, surges[m.name]).get(kind, 0) for m in members)
        if used > int(inventory.get(kind, 0)):
            return f"{used} {kind} over the inventory's {int(inventory.get(kind, 0))}"
    total = sum(sum(c.values()) + sum(surges[n].values()) for n, c in caps.items())
    if total > limit_gpus:
        return f"{total} GPUs of caps over the final allocation plus surge ({limit_gpus})"
    return None


def _grant(changed: list[CapChange], caps: dict[str, dict[str, int]], surges: dict[str, dict[str, int]],
           members: Sequence[MemberMove], *, inventory: Mapping[str, int], limit_gpus: int) -> list[CapChange]:
    """SurgeForOwnMove: each changed member, in order, gets up to what it holds beside its new cap, GPU by GPU while the
    inventory and the pool's surge leave room."""
    held = {m.name: m.held for m in members}
    out = []
    for c in changed:
        want = {k: int(v) for k, v in held[c.name].items() if v and k in c.after}
        got: dict[str, int] = {}
        for kind in sorted(want):
            for _ in range(want[kind]):
                trial = {**surges, c.name: {**got, kind: got.get(kind, 0) + 1}}
                if _fits(caps, trial, members, inventory=inventory, limit_gpus=limit_gpus) is not None:
                    break
                got[kind] = got.get(kind, 0) + 1
        surges[c.name] = got
        out.append(CapChange(c.name, c.before, c.after, got))
    return out


def next_pool_step(members: Sequence[MemberMove], *, inventory: Mapping[str, int], surge_gpus: int) -> PoolStep:
    """The next step towards every member's target; `inventory` is the GPUs by kind the pool may hold (those held outside
    the pool already taken off). Deterministic: members in priority order, then by name."""
    moving = [m.name for m in members if m.moving]
    if moving:
        return PoolStep(PoolStepKind.WAIT, (), f"waiting for {', '.join(sorted(moving))} to finish moving inside the last cap")
    caps = {m.name: _current(m) for m in members}
    # Nobody moves: a grant has served its move and is taken back in this step (`_released`), so none counts here.
    surges: dict[str, dict[str, int]] = {m.name: {} for m in members}
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
        why = _fits(trial, {**surges, m.name: {}}, members, inventory=inventory, limit_gpus=limit)
        if why is None:
            caps, surges[m.name] = trial, {}
            grown.append(CapChange(m.name, m.cap, {k: v for k, v in want.items() if v}))
        else:
            short.append(f"{m.name} to {gpus_text(want)}: {why}")
    if grown:
        grown = _grant(grown, caps, surges, members, inventory=inventory, limit_gpus=limit)
        text = "; ".join(_change_text(c) for c in grown)
        return _released(members, PoolStepKind.GROW, grown, f"receivers grow first, inside the inventory and a surge of {surge_gpus}: {text}"
                        + (f" (waiting: {'; '.join(short)})" if short else ""))
    shrunk = []
    for m in order:
        cur = caps[m.name]
        want = {k: min(cur.get(k, 0), int(m.target.get(k, 0))) for k in _kinds(cur, m.target)}
        if any(want[k] < cur.get(k, 0) for k in want):
            caps[m.name], surges[m.name] = want, {}
            shrunk.append(CapChange(m.name, m.cap, {k: v for k, v in want.items() if v}))
    if shrunk:
        shrunk = _grant(shrunk, caps, surges, members, inventory=inventory, limit_gpus=limit)
        text = "; ".join(_change_text(c) for c in shrunk)
        return _released(members, PoolStepKind.SHRINK, shrunk, "donors shrink to their targets (each keeps its load within the SLOs): "
                        + text + (f"; then {'; '.join(short)}" if short else ""))
    if short:
        return _released(members, PoolStepKind.BLOCKED, [], "no donor is left to shrink and " + "; ".join(short))
    unassigned = [m for m in order if m.cap is None or {k: v for k, v in m.cap.items() if v} != {k: v for k, v in m.target.items() if v}]
    if unassigned:   # caps equal to what the members hold already: written so the members plan within them
        changes = [CapChange(m.name, m.cap, {k: int(v) for k, v in m.target.items() if v}) for m in unassigned]
        return _released(members, PoolStepKind.GROW, changes, "caps written as the members hold them: "
                        + "; ".join(f"{c.name} {gpus_text(c.after)}" for c in changes))
    return _released(members, PoolStepKind.DONE, [], "every member's cap is its target")


def _released(members: Sequence[MemberMove], kind: PoolStepKind, changes: list[CapChange], reason: str) -> PoolStep:
    """The step with the surge granted to members it does not change taken back (their moves are over)."""
    named = {c.name for c in changes}
    back = [CapChange(m.name, m.cap, {k: int(v) for k, v in (m.cap or {}).items() if v})
            for m in sorted(members, key=lambda m: m.name) if m.name not in named and any(m.surge.values())]
    if back:
        reason += "; surge taken back from " + ", ".join(c.name for c in back)
    return PoolStep(kind, (*changes, *back), reason)


def _change_text(c: CapChange) -> str:
    grant = f" (+{gpus_text(c.surge)} surge for its own move)" if any(c.surge.values()) else ""
    return f"{c.name} {gpus_text(c.before)} → {gpus_text(c.after)}{grant}"
