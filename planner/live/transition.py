"""Transitions between layouts as a pure step planner: `next_step(state, view, ...)` returns one step.

LeaderWorkerSet's "compute next step" shape: the operator's reconcile executes the returned step (scale a
set, route traffic, delete a set), saves `step.state` in status and calls again on the next pass, so a
restarted operator resumes. Same kind and per-role shapes → scale in place; otherwise the new layout comes
up beside the old within the surge budget, takes the traffic, and the old drains and goes. Pure: the
cluster is an observed value, capacity a caller's function, time an argument; never talks to the API.

Invariants every step keeps (checked by the property tests):
- GPUs held (desired or still present, over every set) never exceed max_gpus + surge_gpus;
- the ready capacity of the serving sets never drops below `floor_rps` because of a step, and never to zero
  while `keep_serving` (the default); the floor is fixed when the transition starts (for a change a person
  asked for, at most the target's own capacity), and lowered in one place only: `start_requested`, for a spec
  edit that no step sequence can make above the full floor, and only as far as the person's `CapacityDrop`
  allows (the default, Never, lowers nothing: the change is not started and `StartVerdict` says why, with the
  GPUs a sequence keeping the floor would need);
- one transition at a time; a step that stays pending or blocked past `ready_timeout_s` rolls back once,
  and a rollback that also times out stops in phase Failed with everything left as it is.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.figure_text import gpus_text
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, LayoutKind, Parallelism, Role, RoleLayout

__all__ = [
    "Mode", "Phase", "Action", "Budget", "CapacityDrop", "StartVerdict", "ClusterView", "TransitionState", "Step", "Capacity",
    "set_name", "in_place", "start_transition", "start_requested", "Requested", "next_step", "serving_capacity_rps", "run_ideal",
    "layout_to_state", "layout_from_state",
]

Capacity = Callable[[Layout], float]  # requests/s a layout carries within the SLOs (its counts as given)


class Mode(enum.StrEnum):
    IN_PLACE = "InPlace"   # same kind and per-role shapes: change replica counts only
    SURGE = "Surge"        # a second set beside the first, then traffic moves over


class Phase(enum.StrEnum):
    PROGRESSING = "Progressing"
    DRAINING = "Draining"
    DONE = "Done"
    FAILED = "Failed"


class Action(enum.StrEnum):
    SCALE = "Scale"        # render `layout` as set `set_name` (create it, or change its replica counts)
    ROUTE = "Route"        # send traffic to the sets in `serving` only
    DELETE = "Delete"      # remove set `set_name`
    WAIT = "Wait"          # nothing to change: requeue after `requeue_after_s`
    ROLLBACK = "Rollback"  # nothing to change yet; the state now heads back to the source layout
    DONE = "Done"


class CapacityDrop(enum.StrEnum):
    """How far a change a person asked for may lower the serving floor when no step sequence keeps it
    (spec.policy.capacityDrop). Changes the operator starts itself (drift) always keep the full floor."""

    NEVER = "Never"            # keep min(load, running capacity) above zero at every step, or do not start
    ABOVE_ZERO = "AboveZero"   # keep the highest floor some sequence holds, but never zero: something always serves
    ANY = "Any"                # as AboveZero, down to zero: the service may stop serving during the move


class StartVerdict(enum.StrEnum):
    """What `start_requested` decided, by name."""

    FLOOR_KEPT = "FloorKept"              # started; the full floor holds at every step
    FLOOR_LOWERED = "FloorLowered"        # started with a lower floor above zero, as CapacityDrop allows
    FLOOR_DROPPED = "FloorDroppedToZero"  # started with floor zero (CapacityDrop Any): serving may stop during the move
    FLOOR_WOULD_DROP = "FloorWouldDrop"   # not started: no sequence keeps the floor CapacityDrop requires
    OVER_BUDGET = "OverBudget"            # not started: no sequence within the GPU budget at all, even at floor zero


@dataclass(frozen=True, slots=True)
class Budget:
    max_gpus: int
    surge_gpus: int
    floor_rps: float               # min(observed load, capacity of the running layout): never go below
    ready_timeout_s: float = 900.0
    drain_s: float = 60.0
    keep_serving: bool = True      # the serving capacity stays above zero too (False only for CapacityDrop Any)

    def holds(self, capacity_rps: float) -> bool:
        """Whether a serving capacity keeps this budget's floor (and, while keep_serving, is above zero)."""
        return capacity_rps >= self.floor_rps and (capacity_rps > 0 or not self.keep_serving)

    @property
    def limit_gpus(self) -> int:
        return self.max_gpus + self.surge_gpus


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the cluster shows: ready instances and instances still holding GPUs (incl. terminating), per set and role."""

    ready: Mapping[str, Mapping[Role, int]]
    present: Mapping[str, Mapping[Role, int]] = field(default_factory=dict)
    failed: bool = False           # e.g. pods of the arriving set crash-looping: roll back without waiting


@dataclass(frozen=True, slots=True)
class TransitionState:
    mode: Mode
    phase: Phase
    source: Layout                 # the layout that ran when this leg started (rollback target)
    target: Layout
    from_set: str                  # the set being left (== to_set in place)
    to_set: str
    desired: Mapping[str, Mapping[Role, int]]
    serving: tuple[str, ...]
    since_s: float                 # time of the last change issued; timeouts count from it
    started_s: float
    rolled_back: bool = False
    drain_since_s: float | None = None
    message: str = ""
    engine: Engine = Engine.VLLM   # whose words the messages name the layouts in (EngineNamed: Layout.label_for)

    def name(self, layout: Layout) -> str:
        """`layout` as this transition's messages, Events and status name it: in its engine's words (Layout.label_for),
        as the command line's record names it."""
        return layout.label_for(self.engine)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for status (role names and layout fields as strings and numbers)."""
        return {
            "mode": self.mode.value, "phase": self.phase.value, "source": layout_to_state(self.source),
            "target": layout_to_state(self.target), "fromSet": self.from_set, "toSet": self.to_set,
            "desired": {s: {r.value: n for r, n in c.items()} for s, c in self.desired.items()},
            "serving": list(self.serving), "sinceS": self.since_s, "startedS": self.started_s, "rolledBack": self.rolled_back,
            "drainSinceS": self.drain_since_s, "message": self.message, "engine": self.engine.value,
        }

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> TransitionState:
        desired = d["desired"]
        serving = d["serving"]
        assert isinstance(desired, Mapping) and isinstance(serving, list | tuple)
        drain = d.get("drainSinceS")
        return TransitionState(
            mode=Mode(str(d["mode"])), phase=Phase(str(d["phase"])), source=layout_from_state(_map(d["source"])),
            target=layout_from_state(_map(d["target"])), from_set=str(d["fromSet"]), to_set=str(d["toSet"]),
            desired={str(s): {Role(str(r)): int(_num(n)) for r, n in _map(c).items()} for s, c in desired.items()},
            serving=tuple(str(s) for s in serving), since_s=_num(d["sinceS"]), started_s=_num(d["startedS"]),
            rolled_back=bool(d.get("rolledBack", False)), drain_since_s=None if drain is None else _num(drain),
            message=str(d.get("message", "")), engine=Engine(str(d.get("engine", Engine.VLLM.value))),
        )


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    state: TransitionState
    set_name: str = ""
    layout: Layout | None = None   # SCALE: the set's layout at its new counts
    serving: tuple[str, ...] = ()  # ROUTE: the sets that take traffic
    requeue_after_s: float | None = None
    message: str = ""


def _map(x: object) -> Mapping[str, object]:
    assert isinstance(x, Mapping)
    return x


def _num(x: object) -> float:
    assert isinstance(x, int | float | str)
    return float(x)


def layout_to_state(layout: Layout) -> dict[str, object]:
    """Every field of a layout, for status; `layout_from_state` inverts it exactly."""
    roles: dict[str, object] = {}
    for role, rl in layout.roles.items():
        p, k = rl.parallelism, rl.knobs
        roles[role.value] = {"count": rl.count, "tp": p.tp, "pp": p.pp, "dp": p.dp, "ep": p.ep, "maxNumSeqs": k.max_num_seqs,
                             "maxNumBatchedTokens": k.max_num_batched_tokens, "memoryFraction": k.memory_fraction,
                             "kvDtype": k.kv_dtype.value, "blockSize": k.block_size_tokens, "prefixCaching": k.enable_prefix_caching,
                             **({"epSize": p.ep_size} if p.ep_size else {})}
    return {"kind": layout.kind.value, "precision": layout.precision.value, "roles": roles}


def layout_from_state(d: Mapping[str, object]) -> Layout:
    roles: dict[Role, RoleLayout] = {}
    for name, raw in _map(d["roles"]).items():
        r = _map(raw)
        par = Parallelism(tp=int(_num(r["tp"])), pp=int(_num(r["pp"])), dp=int(_num(r["dp"])), ep=bool(r["ep"]),
                          ep_size=int(_num(r.get("epSize", 0))))
        knobs = EngineKnobs(max_num_seqs=int(_num(r["maxNumSeqs"])), max_num_batched_tokens=int(_num(r["maxNumBatchedTokens"])),
                            memory_fraction=_num(r["memoryFraction"]), kv_dtype=KvDtype(str(r["kvDtype"])),
                            block_size_tokens=int(_num(r["blockSize"])), enable_prefix_caching=bool(r["prefixCaching"]))
        roles[Role(name)] = RoleLayout(int(_num(r["count"])), par, knobs)
    return Layout(LayoutKind(str(d["kind"])), roles, Precision(str(d["precision"])))


def set_name(layout: Layout) -> str:
    """A stable short name for the set running this layout's shapes (not its counts): `s` + 6 hex digits."""
    shapes = sorted((r.value, rl.parallelism, rl.knobs) for r, rl in layout.roles.items())
    # GPU kinds enter the hash only when a role names one, so a one-kind layout keeps the name it always had; so does
    # a role's EP size below its GPUs (Parallelism.ep_size, out of Parallelism's repr).
    kinds = tuple(sorted((r.value, rl.gpu) for r, rl in layout.roles.items())) if layout.kinds_named else ()
    ep_sizes = tuple(sorted((r.value, rl.parallelism.ep_size) for r, rl in layout.roles.items() if rl.parallelism.ep_size))
    extra = (*kinds, *((("epSize", ep_sizes),) if ep_sizes else ()))
    return "s" + hashlib.sha1(repr((layout.kind.value, layout.precision.value, shapes, *extra)).encode()).hexdigest()[:6]


def _labels(s: TransitionState, sets: tuple[str, ...]) -> list[str]:
    """The layouts that sets run, as messages name them (a set's name is an internal hash, never shown to people)."""
    names = {s.from_set: s.name(s.source), s.to_set: s.name(s.target)}
    return [names.get(n, "the other workloads") for n in sets]


def in_place(current: Layout, target: Layout) -> bool:
    """Whether only replica counts differ (same kind, precision, per-role parallelism, knobs and GPU kind)."""
    return (current.kind is target.kind and current.precision is target.precision and current.roles.keys() == target.roles.keys()
            and all(current.roles[r].parallelism == target.roles[r].parallelism and current.roles[r].knobs == target.roles[r].knobs
                    and current.roles[r].gpu == target.roles[r].gpu for r in current.roles))


def _counts(layout: Layout) -> dict[Role, int]:
    return {r: rl.count for r, rl in layout.roles.items()}


def _at(layout: Layout, counts: Mapping[Role, int]) -> Layout:
    return Layout(layout.kind, {r: replace(rl, count=counts.get(r, 0)) for r, rl in layout.roles.items()}, layout.precision)


def _cap(capacity: Capacity, layout: Layout, counts: Mapping[Role, int]) -> float:
    if any(counts.get(r, 0) <= 0 for r in layout.roles):
        return 0.0
    return float(capacity(_at(layout, counts)))


class _Pass:
    """One call's derived views of the state, the cluster and the budget."""

    def __init__(self, state: TransitionState, view: ClusterView, budget: Budget, capacity: Capacity, now_s: float) -> None:
        self.s, self.view, self.budget, self.capacity, self.now_s = state, view, budget, capacity, now_s
        self.shapes = {state.from_set: state.source, state.to_set: state.target}

    def ready(self, name: str) -> dict[Role, int]:
        got = self.view.ready.get(name, {})
        return {r: min(got.get(r, 0), n) for r, n in self.s.desired.get(name, {}).items()}

    def gpus(self, desired: Mapping[str, Mapping[Role, int]]) -> int:
        total = 0
        for name in set(desired) | set(self.view.present):
            layout = self.shapes.get(name)
            if layout is None:
                continue
            have = self.view.present.get(name, {})
            want = desired.get(name, {})
            total += sum(max(want.get(r, 0), have.get(r, 0)) * rl.parallelism.gpus for r, rl in layout.roles.items())
        return total

    def serving_capacity(self, name: str | None = None, counts: Mapping[Role, int] | None = None,
                         serving: tuple[str, ...] | None = None) -> float:
        """Ready capacity of the serving sets, with set `name` at min(ready, counts) when given."""
        total = 0.0
        for s in serving if serving is not None else self.s.serving:
            ready = self.ready(s)
            if s == name and counts is not None:
                ready = {r: min(n, counts.get(r, 0)) for r, n in ready.items()}
            total += _cap(self.capacity, self.shapes[s], ready)
        return total

    def with_counts(self, name: str, counts: Mapping[Role, int]) -> dict[str, Mapping[Role, int]]:
        return {**self.s.desired, name: dict(counts)}


def _grow(p: _Pass) -> dict[Role, int] | None:
    """Add instances to the arriving set toward the target, one at a time, lowest share of its target first."""
    s = p.s
    counts = dict(s.desired.get(s.to_set, {r: 0 for r in s.target.roles}))
    goal = _counts(s.target)
    changed = False
    while True:
        short = [r for r in s.target.roles if counts.get(r, 0) < goal[r]]
        short.sort(key=lambda r: (counts.get(r, 0) / goal[r], r.value))
        for r in short:
            trial = {**counts, r: counts.get(r, 0) + 1}
            if p.gpus(p.with_counts(s.to_set, trial)) <= p.budget.limit_gpus:
                counts, changed = trial, True
                break
        else:
            return counts if changed else None


def _shrink(p: _Pass) -> dict[Role, int] | None:
    """Remove instances from the set being left (toward the target in place), keeping the serving capacity ≥ floor."""
    s = p.s
    name = s.from_set
    counts = dict(s.desired.get(name, {}))
    goal = _counts(s.target) if s.mode is Mode.IN_PLACE else {r: 0 for r in counts}
    base = _counts(s.source)
    changed = False
    while True:
        extra = [r for r in counts if counts[r] > goal.get(r, 0)]
        extra.sort(key=lambda r: (-counts[r] / max(base.get(r, 1), 1), r.value))
        for r in extra:
            trial = {**counts, r: counts[r] - 1}
            if p.budget.holds(p.serving_capacity(name, trial)):
                counts, changed = trial, True
                break
        else:
            return counts if changed else None


def _rollback(p: _Pass, why: str) -> Step:
    s = p.s
    if s.rolled_back:
        failed = replace(s, phase=Phase.FAILED, message=f"rollback stalled: {why}; left as it is")
        return Step(Action.WAIT, failed, message=failed.message)
    back = replace(s, source=_at(s.target, s.desired.get(s.to_set, {})), target=s.source, from_set=s.to_set, to_set=s.from_set,
                   rolled_back=True, since_s=p.now_s, message=f"rolling back to {s.name(s.source)}: {why}")
    if s.mode is Mode.IN_PLACE:
        back = replace(back, source=_at(s.source, s.desired.get(s.from_set, {})))
    return Step(Action.ROLLBACK, back, requeue_after_s=0.0, message=back.message)


def _mutate(p: _Pass, action: Action, *, desired: Mapping[str, Mapping[Role, int]] | None = None, serving: tuple[str, ...] | None = None,
            set_name: str = "", message: str, phase: Phase | None = None) -> Step:
    s = p.s
    new = replace(s, desired=dict(desired) if desired is not None else s.desired, serving=serving if serving is not None else s.serving,
                  since_s=p.now_s, message=message, phase=phase or s.phase,
                  drain_since_s=p.now_s if phase is Phase.DRAINING else s.drain_since_s)
    layout = _at(p.shapes[set_name], new.desired[set_name]) if action is Action.SCALE else None
    return Step(action, new, set_name=set_name, layout=layout, serving=new.serving, message=message)


def next_step(state: TransitionState, view: ClusterView, *, budget: Budget, capacity: Capacity, now_s: float,
              poll_s: float = 15.0) -> Step:
    """The one step to take now (see the module docstring for the invariants it keeps)."""
    p = _Pass(state, view, budget, capacity, now_s)
    s = state
    if s.phase in (Phase.DONE, Phase.FAILED):
        return Step(Action.DONE if s.phase is Phase.DONE else Action.WAIT, s, message=s.message)
    if s.phase is Phase.DRAINING:
        left = budget.drain_s - (now_s - (now_s if s.drain_since_s is None else s.drain_since_s))
        if left > 0:
            return Step(Action.WAIT, s, requeue_after_s=left, message=f"draining {s.name(s.source)} for another {left:.0f} s")
        desired = {k: v for k, v in s.desired.items() if k != s.from_set}
        done = replace(s, desired=desired, phase=Phase.DONE, since_s=now_s, message=f"now running {s.name(s.target)}")
        return Step(Action.DELETE, done, set_name=s.from_set, message=f"deleted the {s.name(s.source)} workloads after draining")
    if view.failed:
        return _rollback(p, f"the new {s.name(s.target)} workloads failed")
    late = now_s - s.since_s > budget.ready_timeout_s
    goal = _counts(s.target)
    ready_to = p.ready(s.to_set)
    # Instances above the target (a rollback in place) are about to go: only those that stay must be ready.
    pending = any(ready_to.get(r, 0) < n for r, n in s.desired.get(s.to_set, {}).items() if n <= goal.get(r, 0)) or any(
        view.present.get(n, {}).get(r, 0) > c for n, counts in s.desired.items() for r, c in counts.items())
    if pending:
        if late:
            return _rollback(p, f"{s.name(s.target)} not ready within {budget.ready_timeout_s:.0f} s")
        return Step(Action.WAIT, s, requeue_after_s=poll_s, message=f"waiting for {s.name(s.target)} to become ready")
    at_goal = dict(s.desired.get(s.to_set, {})) == goal
    if at_goal and s.mode is Mode.IN_PLACE:
        done = replace(s, phase=Phase.DONE, message=f"now running {s.name(s.target)}")
        return Step(Action.DONE, done, message=done.message)
    if at_goal and budget.holds(p.serving_capacity(serving=(s.to_set,))):
        return _mutate(p, Action.ROUTE, serving=(s.to_set,), phase=Phase.DRAINING,
                       message=f"traffic to {s.name(s.target)} only; draining {s.name(s.source)}")
    grown = _grow(p) if not at_goal else None
    if grown is not None:
        return _mutate(p, Action.SCALE, desired=p.with_counts(s.to_set, grown), set_name=s.to_set,
                       message=f"scale the new {s.name(s.target)} workloads to {s.name(_at(s.target, grown))}")
    if s.mode is Mode.SURGE and s.to_set not in s.serving and p.serving_capacity(serving=(s.to_set,)) > 0:
        return _mutate(p, Action.ROUTE, serving=(*s.serving, s.to_set), message=f"traffic to {' and '.join(_labels(s, (*s.serving, s.to_set)))}")
    shrunk = _shrink(p)
    if shrunk is not None:
        return _mutate(p, Action.SCALE, desired=p.with_counts(s.from_set, shrunk), set_name=s.from_set,
                       message=f"scale the old {s.name(s.source)} workloads to {s.name(_at(p.shapes[s.from_set], shrunk))}")
    if late:
        return _rollback(p, f"blocked for {budget.ready_timeout_s:.0f} s by the GPU budget and the capacity floor")
    return Step(Action.WAIT, s, requeue_after_s=poll_s, message="blocked: no step keeps both the GPU budget and the capacity floor")


def serving_capacity_rps(state: TransitionState, view: ClusterView, *, capacity: Capacity) -> float:
    """Requests/s the ready instances of the serving sets carry (each set at min(ready, desired)): the yardstick
    `next_step` keeps at or above the floor."""
    p = _Pass(state, view, Budget(max_gpus=0, surge_gpus=0, floor_rps=0.0), capacity, state.since_s)
    return p.serving_capacity()


def run_ideal(state: TransitionState, *, budget: Budget, capacity: Capacity, now_s: float, max_steps: int = 1000) -> list[Step]:
    """Run the planner against a cluster where everything asked for is ready at once; stop at Done or a stall."""
    steps: list[Step] = []
    for _ in range(max_steps):
        view = ClusterView(ready={k: dict(v) for k, v in state.desired.items()})
        step = next_step(state, view, budget=budget, capacity=capacity, now_s=now_s)
        steps.append(step)
        state = step.state
        if step.action in (Action.DONE, Action.WAIT) and step.state.phase is not Phase.DRAINING:
            return steps
        now_s += budget.drain_s if step.state.phase is Phase.DRAINING else 0.0
    return steps


def start_transition(current: Layout, target: Layout, *, budget: Budget, capacity: Capacity, now_s: float,
                     engine: Engine) -> TransitionState:
    """The state of a new transition from `current` to `target`; raise Infeasible when no safe path exists
    (the target cannot carry the floor, or the budget and the floor block every step even on an ideal cluster).
    `engine`: the engine both run, whose words every message of the transition names the layouts in."""
    cur, tgt = current.label_for(engine), target.label_for(engine)
    if target.gpus > budget.max_gpus:
        raise Infeasible("transition", f"{tgt} needs {target.gpus} GPUs, over the budget of {budget.max_gpus}")
    if not budget.holds(_cap(capacity, target, _counts(target))):
        raise Infeasible("transition", f"{tgt} carries less than the floor of {_rps(budget.floor_rps)} req/s")
    mode = Mode.IN_PLACE if in_place(current, target) else Mode.SURGE
    old = set_name(current)
    new = old if mode is Mode.IN_PLACE else set_name(target)
    if new == old and mode is Mode.SURGE:
        new = old + "b"
    state = TransitionState(mode=mode, phase=Phase.PROGRESSING, source=current, target=target, from_set=old, to_set=new,
                            desired={old: _counts(current)}, serving=(old,), since_s=now_s, started_s=now_s,
                            message=f"{cur} → {tgt} ({mode.value})", engine=engine)
    last = run_ideal(state, budget=budget, capacity=capacity, now_s=now_s)[-1]
    if last.state.phase is not Phase.DONE:
        raise Infeasible("transition", f"{cur} → {tgt}: {last.message} "
                         f"(GPUs {budget.max_gpus}+{budget.surge_gpus} surge, floor {_rps(budget.floor_rps)} req/s)")
    return state


def _rps(rate: float) -> str:
    """A floor in req/s as messages print it: two decimals, or two significant digits under 0.01 req/s so that a
    dip to 0.004 req/s never reads as 0.00 (which the messages reserve for a floor of exactly zero)."""
    return f"{rate:.2f}" if rate == 0 or rate >= 0.01 else f"{rate:.2g}"


@dataclass(frozen=True, slots=True)
class Requested:
    """A change a person asked for, decided: the transition (None when not started), the floor it keeps, and why.

    `floor_rps` is the floor the started transition keeps (blocked: the full floor it would need);
    `holdable_rps` the highest floor some sequence within the budget holds (None: no sequence at all);
    `gpus_needed` the GPUs (hardware.maxGPUs + surge) a sequence keeping the full floor needs (None: no GPU
    count does, the target itself carries less; equal to the budget's limit when the floor is kept)."""

    verdict: StartVerdict
    state: TransitionState | None
    floor_rps: float
    full_floor_rps: float
    holdable_rps: float | None
    gpus_needed: int | None
    message: str = ""

    @property
    def started(self) -> bool:
        return self.state is not None

    @property
    def lowered(self) -> str:
        """The warning for a started transition whose floor is lower than the full one; empty otherwise."""
        return self.message if self.verdict in (StartVerdict.FLOOR_LOWERED, StartVerdict.FLOOR_DROPPED) else ""


FLOOR_SEARCH_STEPS = 8   # bisections of [0, floor] for the highest floor a step sequence can hold (floor/256)


def _try_start(current: Layout, target: Layout, budget: Budget, capacity: Capacity, now_s: float,
               engine: Engine) -> TransitionState | None:
    try:
        return start_transition(current, target, budget=budget, capacity=capacity, now_s=now_s, engine=engine)
    except Infeasible:
        return None


def _lowest_serving(state: TransitionState, *, budget: Budget, capacity: Capacity, now_s: float) -> float:
    """The lowest serving capacity along the ideal run of a transition (everything asked for ready at once)."""
    lowest = _Pass(state, ClusterView(ready={k: dict(v) for k, v in state.desired.items()}), budget, capacity, now_s).serving_capacity()
    for step in run_ideal(state, budget=budget, capacity=capacity, now_s=now_s):
        if step.state.phase in (Phase.PROGRESSING, Phase.DRAINING):
            view = ClusterView(ready={k: dict(v) for k, v in step.state.desired.items()})
            lowest = min(lowest, _Pass(step.state, view, budget, capacity, now_s).serving_capacity())
    return lowest


GPU_SEARCH_STEPS = 16   # bisections of the GPU count that keeps the full floor (enough for 2 x MAX_GPUS)


def gpus_to_keep_floor(current: Layout, target: Layout, *, budget: Budget, capacity: Capacity) -> int | None:
    """GPUs (hardware.maxGPUs + surge, maxGPUs at least the target's) with which a step sequence keeps the full floor;
    None when no count does (the target carries less than the floor). Both layouts side by side always suffice;
    bisection between the budget and that (at most GPU_SEARCH_STEPS rounds, so a pass's work stays bounded) finds
    a count that does, one fewer failing: the fewest wherever more GPUs never hurt the step planner's greedy order."""
    if not budget.holds(_cap(capacity, target, _counts(target))):
        return None
    max_gpus = max(budget.max_gpus, target.gpus)

    def keeps(limit: int) -> bool:
        trial = replace(budget, max_gpus=max_gpus, surge_gpus=limit - max_gpus)
        return _try_start(current, target, trial, capacity, 0.0, Engine.VLLM) is not None   # only whether it starts: no words

    low = max(budget.limit_gpus, max_gpus)
    high = max(low, current.gpus + target.gpus)
    if keeps(low):
        return low
    if not keeps(high):
        return None
    for _ in range(GPU_SEARCH_STEPS):   # keeps(high) and not keeps(low)
        if high - low <= 1:
            break
        mid = (low + high) // 2
        low, high = (low, mid) if keeps(mid) else (mid, high)
    return high


def start_requested(current: Layout, target: Layout, *, budget: Budget, capacity: Capacity, now_s: float, engine: Engine,
                    allow: CapacityDrop = CapacityDrop.NEVER) -> Requested:
    """Decide a change a person asked for (a spec edit): start it keeping the capacity floor if any sequence can.

    The full floor is min(`budget.floor_rps`, the target's capacity): a smaller target is the person's choice, the
    dip below it on the way is not. When no step sequence holds `budget.floor_rps` (and capacity above zero) within the GPUs plus surge:
    - `allow` Never: nothing starts (FloorWouldDrop), the running layout keeps serving;
    - AboveZero: start with the highest floor some sequence holds (bisection, FLOOR_SEARCH_STEPS rounds; below its
      reach, the floor a sequence that keeps something serving holds) if it is
      above zero (FloorLowered), else nothing starts (FloorWouldDrop);
    - Any: as AboveZero, and with floor zero when no positive floor holds (FloorDroppedToZero).
    A target no sequence reaches even at floor zero (e.g. over hardware.maxGPUs) never starts (OverBudget),
    whatever `allow` says: the GPU budget is not the user's to trade away here. Never raises. Its messages, and the
    started transition's, name the layouts in `engine`'s words (Layout.label_for).
    """
    cur, tgt = current.label_for(engine), target.label_for(engine)
    # Ending at the target is what was asked: the move keeps no more than the target itself carries.
    full = min(budget.floor_rps, _cap(capacity, target, _counts(target)))
    budget = replace(budget, floor_rps=full)
    state = _try_start(current, target, budget, capacity, now_s, engine)
    if state is not None:
        return Requested(StartVerdict.FLOOR_KEPT, state, full, full, full, budget.limit_gpus)
    needed = gpus_to_keep_floor(current, target, budget=budget, capacity=capacity)
    lowest = _try_start(current, target, replace(budget, floor_rps=0.0, keep_serving=False), capacity, now_s, engine)
    move = f"{cur} ({gpus_text(current.gpus)}) → {tgt} ({gpus_text(target.gpus)})"
    within = f"within {budget.limit_gpus} GPUs (hardware.maxGPUs {budget.max_gpus} + policy.maxSurgeGPUs {budget.surge_gpus})"
    if needed is None:
        carries = _cap(capacity, target, _counts(target))
        need = f"{tgt} itself carries {_rps(carries)} req/s, under the floor; no GPU budget keeps it"
    else:
        max_gpus = max(budget.max_gpus, target.gpus)
        raises = ([f"hardware.maxGPUs to {max_gpus}"] if max_gpus > budget.max_gpus else []) + (
            [f"policy.maxSurgeGPUs to {needed - max_gpus}"] if needed - max_gpus > budget.surge_gpus else [])
        need = f"keeping it needs {needed} GPUs during the move: raise {' and '.join(raises)}"
    if lowest is None:
        why = (f"{tgt} needs {target.gpus} GPUs, over hardware.maxGPUs {budget.max_gpus}" if target.gpus > budget.max_gpus
               else f"no step sequence reaches it {within}, even at a serving floor of zero")
        return Requested(StartVerdict.OVER_BUDGET, None, full, full, None, needed, f"{move}: {why}; {need}")
    low, high, best = 0.0, full, lowest
    holds_some = False   # whether a sequence holds a floor above zero (and so capacity above zero at every step)
    for _ in range(FLOOR_SEARCH_STEPS):
        mid = (low + high) / 2
        got = _try_start(current, target, replace(budget, floor_rps=mid), capacity, now_s, engine)
        if got is None:
            high = mid
        else:
            low, best, holds_some = mid, got, True
    serving = None if holds_some else _try_start(current, target, replace(budget, floor_rps=0.0), capacity, now_s, engine)
    if serving is not None:   # something keeps serving, below the bisection's last step (floor/256): the floor it keeps
        kept_rps = _lowest_serving(serving, budget=replace(budget, floor_rps=0.0), capacity=capacity, now_s=now_s)
        exact = _try_start(current, target, replace(budget, floor_rps=kept_rps), capacity, now_s, engine) if kept_rps > 0 else None
        if exact is not None:
            low, best, holds_some = kept_rps, exact, True
    if holds_some:   # the floor the found sequence really keeps (the bisection stops short of it by up to floor/256)
        kept_rps = _lowest_serving(best, budget=replace(budget, floor_rps=low), capacity=capacity, now_s=now_s)
        exact = _try_start(current, target, replace(budget, floor_rps=kept_rps), capacity, now_s, engine) if kept_rps > low else None
        if exact is not None:
            low, best = kept_rps, exact
    kept = f"the serving floor of {_rps(full)} req/s" if full > 0 else "any serving capacity"
    gap = f"no step sequence from {move} keeps {kept} {within}"
    if holds_some and allow is not CapacityDrop.NEVER:
        return Requested(StartVerdict.FLOOR_LOWERED, best, low, full, low, needed,
                         f"{gap}; policy.capacityDrop {allow.value}: serving capacity may dip to {_rps(low)} req/s; {need}")
    if not holds_some and allow is CapacityDrop.ANY:
        return Requested(StartVerdict.FLOOR_DROPPED, lowest, 0.0, full, 0.0, needed,
                         f"{gap}, nor any floor above zero; policy.capacityDrop Any: serving may stop during the move; {need}")
    holdable = low if holds_some else 0.0
    options = ("or set policy.capacityDrop to AboveZero to move keeping at least "
               f"{_rps(holdable)} req/s" if holds_some else "or set policy.capacityDrop to Any to move with serving stopped for a while")
    return Requested(StartVerdict.FLOOR_WOULD_DROP, None, full, full, holdable, needed,
                     f"{gap} (the most a sequence keeps: {_rps(holdable)} req/s); {need}, {options}")
