"""The pool's move sequencer: receivers grow inside the surge before donors shrink, never over the inventory, run to the end."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from servingtopology.planner.pool.moves import MemberMove, PoolStepKind, next_pool_step


def _m(name: str, cap: Mapping[str, int] | None, target: Mapping[str, int], *, held: Mapping[str, int] | None = None,
       moving: bool = False, priority: int = 0) -> MemberMove:
    return MemberMove(name, priority, cap, dict(cap or {}) if held is None else held, moving, target)


def _run(members: list[MemberMove], *, inventory: dict[str, int], surge: int, limit: int = 50) -> list[tuple[PoolStepKind, dict[str, dict[str, int]]]]:
    """Iterate the sequencer against members that take each new cap at once, each changed one passing through its worst
    moment (its new cap plus all the surge granted to it held together); every step's held GPUs, that moment included."""
    trace = []
    for _ in range(limit):
        step = next_pool_step(members, inventory=inventory, surge_gpus=surge)
        changed = {c.name: c for c in step.changes}
        peak = {m.name: ({k: c.after.get(k, 0) + c.surge.get(k, 0) for k in {*c.after, *c.surge}} if (c := changed.get(m.name)) else dict(m.held))
                for m in members}
        trace.append((step.kind, peak))
        members = [MemberMove(m.name, m.priority, dict(c.after), dict(c.after), False, m.target, dict(c.surge)) if (c := changed.get(m.name))
                   else m for m in members]
        trace.append((step.kind, {m.name: dict(m.held) for m in members}))
        if step.kind in (PoolStepKind.DONE, PoolStepKind.BLOCKED) and not step.changes:
            return trace
    raise AssertionError(f"no end after {limit} steps: {trace}")


def test_a_receiver_grows_inside_the_surge_before_the_donor_shrinks() -> None:
    # 16 h100: chat holds 12 and needs 4, rag holds 4 and needs 12; the surge (8) would let rag grow first, the kind holds
    # only 16: rag reaches 12 only after chat shrinks
    members = [_m("chat", {"h100": 12}, {"h100": 4}), _m("rag", {"h100": 4}, {"h100": 12})]
    trace = _run(members, inventory={"h100": 16}, surge=8)
    assert _kinds(trace) == [PoolStepKind.SHRINK, PoolStepKind.GROW, PoolStepKind.DONE]
    # with idle GPUs (24) and the surge (8) the receiver goes first
    trace = _run(members, inventory={"h100": 24}, surge=8)
    # (then the surge granted to chat for its own move down is taken back: a Done step that writes it, and Done)
    assert _kinds(trace) == [PoolStepKind.GROW, PoolStepKind.SHRINK, PoolStepKind.DONE, PoolStepKind.DONE]
    assert trace[1][1] == {"chat": {"h100": 12}, "rag": {"h100": 12}}


def test_the_surge_bounds_how_far_receivers_grow_before_donors_shrink() -> None:
    members = [_m("chat", {"h100": 12}, {"h100": 4}), _m("rag", {"h100": 4}, {"h100": 12})]
    # 24 GPUs, final 16: a surge of 4 is not enough for rag's +8 before chat gives 8 back
    # (rag is granted 4 beside its new cap for its own move, taken back by a last Done step)
    assert _kinds(_run(members, inventory={"h100": 24}, surge=4)) == [PoolStepKind.SHRINK, PoolStepKind.GROW, PoolStepKind.DONE,
                                                                      PoolStepKind.DONE]


def test_a_moving_member_is_waited_for() -> None:
    step = next_pool_step([_m("chat", {"h100": 8}, {"h100": 4}, moving=True), _m("rag", {"h100": 4}, {"h100": 8})],
                          inventory={"h100": 32}, surge_gpus=8)
    assert step.kind is PoolStepKind.WAIT and "chat" in step.reason and not step.changes


def test_a_receiver_that_cannot_grow_with_no_donor_is_blocked_naming_the_kind() -> None:
    step = next_pool_step([_m("rag", {"h100": 4}, {"h100": 12})], inventory={"h100": 8}, surge_gpus=8)
    assert step.kind is PoolStepKind.BLOCKED and "h100" in step.reason and "rag" in step.reason


def test_a_joiner_without_a_cap_gets_its_target_and_one_holding_gpus_gets_a_cap_written() -> None:
    trace = _run([_m("new", None, {"a100": 4}, held={}), _m("old", None, {"h100": 4}, held={"h100": 4})], inventory={"h100": 8, "a100": 8}, surge=0)
    assert trace[-1][0] is PoolStepKind.DONE and trace[-1][1] == {"new": {"a100": 4}, "old": {"h100": 4}}


def test_a_member_that_left_frees_its_gpus_for_the_others() -> None:
    # batch is gone (not a member): its GPUs count no more; chat may grow at once
    assert _kinds(_run([_m("chat", {"h100": 4}, {"h100": 8})], inventory={"h100": 8}, surge=0)) == [PoolStepKind.GROW, PoolStepKind.DONE]


def _kinds(trace: list[tuple[PoolStepKind, dict[str, dict[str, int]]]]) -> list[PoolStepKind]:
    return [k for k, _ in trace[::2]]


def test_a_donor_that_changes_shape_is_granted_what_it_holds_beside_its_new_cap_where_there_is_room() -> None:
    # batch runs 1×TP2 (2 GPUs) and its target is one GPU: a 1×TP1 beside the old set needs 3 during the move
    step = next_pool_step([_m("batch", None, {"a100": 1}, held={"a100": 2})], inventory={"a100": 4}, surge_gpus=2)
    assert step.kind is PoolStepKind.SHRINK and [(c.name, dict(c.after), dict(c.surge)) for c in step.changes] == [("batch", {"a100": 1}, {"a100": 2})]
    assert "surge for its own move" in step.reason
    # with no pool surge, no room beside the cap: nothing granted (its own move then waits, by its own TransitionBlocked)
    (c,) = next_pool_step([_m("batch", None, {"a100": 1}, held={"a100": 2})], inventory={"a100": 4}, surge_gpus=0).changes
    assert dict(c.surge) == {}
    # once every cap is its target, the grant is taken back
    done = next_pool_step([MemberMove("batch", 0, {"a100": 1}, {"a100": 1}, False, {"a100": 1}, {"a100": 2})], inventory={"a100": 4}, surge_gpus=2)
    assert done.kind is PoolStepKind.DONE and [dict(c.surge) for c in done.changes] == [{}]


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 12), st.integers(0, 12), st.integers(-2, 2)),
                min_size=1, max_size=4),
       st.integers(0, 8))
def test_caps_never_exceed_the_inventory_and_moves_converge(rows: list[tuple[int, int, int, int, int]], surge: int) -> None:
    members = [_m(f"m{i}", {"h100": ch, "a100": ca}, {"h100": th, "a100": ta}, priority=p) for i, (ch, ca, th, ta, p) in enumerate(rows)]
    inventory = {"h100": max(sum(r[0] for r in rows), sum(r[2] for r in rows)),
                 "a100": max(sum(r[1] for r in rows), sum(r[3] for r in rows))}
    start_total = sum(r[0] + r[1] for r in rows)
    final_total = sum(r[2] + r[3] for r in rows)
    trace = _run(members, inventory=inventory, surge=surge)
    assert trace[-1][0] is PoolStepKind.DONE                  # every target fits the inventory: the moves end there
    assert {n: {k: v for k, v in h.items() if v} for n, h in trace[-1][1].items()} == {
        m.name: {k: v for k, v in m.target.items() if v} for m in members}
    for _, held in trace:
        for kind, count in inventory.items():
            assert sum(h.get(kind, 0) for h in held.values()) <= count
        # above the final allocation by the surge at most, once the start's own excess is gone
        assert sum(sum(h.values()) for h in held.values()) <= max(start_total, final_total + surge)
