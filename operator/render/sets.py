"""Workload sets: which sets a plan or a running transition renders (one, or two side by side).

Called by the reconcile (operator/reconcile.py) on every pass. Pure: what the cluster shows of the sets is read by
operator/cluster/cluster_view.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from servingtopology.operator.render.manifests import Blueprint
from servingtopology.planner.layout import Layout, Role
from servingtopology.planner.live.transition import Phase, TransitionState
from servingtopology.planner.live.transition import set_name as layout_set_name

__all__ = ["Rendering", "BlueprintFor", "steady_rendering", "transition_rendering", "parts_rendering", "layout_at", "on_kind"]

BlueprintFor = Callable[[Layout, str], Blueprint]   # (layout at its counts, set name) -> the builders' input


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


def on_kind(layout: Layout, gpu: str) -> Layout:
    """The layout with every role on GPU kind `gpu` (a catalog id): its pods select that kind's nodes."""
    return Layout(layout.kind, {r: replace(rl, gpu=gpu) for r, rl in layout.roles.items()}, layout.precision)


def parts_rendering(parts: Sequence[Layout], bp_for: BlueprintFor) -> Rendering:
    """TwoKindsOneService: a member's parts (its replicas on two GPU kinds; each layout's roles name their kind) as one set
    each, every set serving, so the one entry Service selects the entry pods of all of them (planner.pool.service_split says
    how it splits the traffic). Raises ValueError on no parts, a part naming no kind, or two parts on one set."""
    if not parts or any(not lay.kinds_named for lay in parts):
        raise ValueError(f"each part names its GPU kind: {[lay.label for lay in parts]}")
    sets = tuple(bp_for(lay, layout_set_name(lay)) for lay in parts)
    if len({bp.set for bp in sets}) != len(sets):
        raise ValueError(f"two parts run as one set: {[lay.label for lay in parts]}")
    return Rendering(sets, tuple(bp.set for bp in sets))


def transition_rendering(state: TransitionState, bp_for: BlueprintFor) -> Rendering:
    """Every set the transition state wants, at its desired counts; the old set first.

    A finished transition renders its target alone; a failed one stays as it is (see planner/live/transition.py).
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
