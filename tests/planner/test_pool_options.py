"""A pool member's options: members that ask the same of a kind share one search (SameWorkOnce), and get what each
would get alone."""

from __future__ import annotations

from typing import Any

import pytest

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.pool import options
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import GpuKind, PoolObjective
from servingtopology.spec import parse_spec, to_problem

KINDS = (GpuKind("h100", resolve_gpu("h100_sxm"), 4, 3.0, 400.0), GpuKind("a100", resolve_gpu("a100_sxm"), 4, 1.6, 200.0))
PROBLEM = to_problem(parse_spec({"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": {"gpu": "h100_sxm", "maxGPUs": 8},
                                 "workload": {"arrivalRate": 8.0, "inputTokens": 2048, "outputTokens": 256},
                                 "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 60}}}))


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The funnels and mixed-pair capacity searches build_pool runs, by kind."""
    ran: list[str] = []
    funnel, mixed = options.run_funnel, options.mixed_slo_capacity_rps

    def run_funnel(problem: Any, **kw: Any) -> Any:
        ran.append(problem.gpu.id)
        return funnel(problem, **kw)

    def mixed_slo_capacity_rps(problem: Any, layouts: Any, **kw: Any) -> Any:
        ran.append(f"{kw['prefill_gpu'].id}→{kw['decode_gpu'].id}")
        return mixed(problem, layouts, **kw)

    monkeypatch.setattr(options, "run_funnel", run_funnel)
    monkeypatch.setattr(options, "mixed_slo_capacity_rps", mixed_slo_capacity_rps)
    return ran


def test_members_asking_the_same_of_a_kind_are_searched_once_and_offered_what_each_gets_alone(searches: list[str]) -> None:
    _, alone = build_pool(KINDS, [MemberRequest("chat", PROBLEM, 8)], objective=PoolObjective.MIN_COST)
    once = list(searches)
    assert set(once) == {"h100_sxm", "a100_sxm", "h100_sxm→a100_sxm", "a100_sxm→h100_sxm"}
    searches.clear()
    # the same model and workload under other names and priorities: searched once, offered the same
    _, found = build_pool(KINDS, [MemberRequest("chat", PROBLEM, 8), MemberRequest("chat-eu", PROBLEM, 8, priority=2),
                                  MemberRequest("chat-us", PROBLEM, 8, priority=1)], objective=PoolObjective.MIN_COST)
    assert searches == once
    assert found["chat"] == found["chat-eu"] == found["chat-us"] == alone["chat"]
    searches.clear()
    # a member with a smaller cap asks for less on each kind: searched on its own
    build_pool(KINDS, [MemberRequest("chat", PROBLEM, 8), MemberRequest("small", PROBLEM, 2)], objective=PoolObjective.MIN_COST)
    assert len(searches) > len(once)
