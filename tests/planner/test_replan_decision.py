"""The pure replan decision (planner/live/replan_decision.py `choose_move`): keep, propose, blocked or a transition that
holds min(observed load, running capacity), with a stand-in predictor (each instance carries 5 req/s)."""

from __future__ import annotations

from dataclasses import replace

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role
from servingtopology.planner.live.replan_decision import Move, capacity_of, choose_move
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.problem import Candidate, Decision, Prediction, Problem
from servingtopology.planner.workload import LengthDist, Slo, Workload

ONE = Layout.replicas(1, Parallelism())
TWO = Layout.replicas(2, Parallelism())


def problem(rate: float, *, max_gpus: int = 8, current: Layout | None = ONE) -> Problem:
    return Problem(model=resolve_model("llama-3.1-8b"), gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16,
                   max_gpus=max_gpus, workload=Workload(LengthDist.fixed(1000), LengthDist.fixed(200), arrival_rate_rps=rate),
                   slo=Slo(ttft_ms=500.0, tpot_ms=40.0), current=current)


def predict(p: Problem, layout: Layout) -> Candidate:
    n = layout.roles[Role.AGGREGATED].count
    rate, cap = p.workload.arrival_rate_rps or 0.0, 5.0 * n
    pred = Prediction(ttft_ms=100.0, tpot_ms=20.0, throughput_tok_s=rate * 200, capacity_rps=cap, goodput_rps=min(rate, cap),
                      goodput_per_gpu=cap / n, tokens_per_s_per_user=50.0, kv_pool_tokens=10**5, max_request_tokens=10**5,
                      meets_slo=rate <= cap)
    return Candidate(layout, pred, pred.goodput_per_gpu)


def decision(p: Problem, best: Layout) -> Decision:
    current = predict(p, p.current) if p.current is not None else None
    return Decision(best=predict(p, best), alternatives=(), funnel=(), candidates_total=1, kv_bytes_per_token=1, weight_bytes=1.0,
                    current=current)


def choose(p: Problem, best: Layout, *, propose_only: bool = False):
    return choose_move(p, p.current, decision(p, best), predict=predict, min_improvement=0.1, propose_only=propose_only,
                       surge_gpus=0, ready_timeout_s=900.0, drain_s=60.0, now_s=0.0)


def test_the_running_layout_is_kept_when_the_new_one_is_no_better() -> None:
    p = problem(4.0, current=TWO)
    c = choose(p, TWO)
    assert c.move is Move.KEEP and c.transition is None and c.floor_rps is None
    assert c.before is not None and c.before.layout == TWO and c.load_rps == 4.0


def test_a_better_layout_is_only_proposed_in_dry_run_or_with_nothing_running() -> None:
    assert choose(problem(8.0), TWO, propose_only=True).move is Move.PROPOSE
    c = choose(problem(8.0, current=None), TWO)
    assert c.move is Move.PROPOSE and c.before is None and c.transition is None


def test_a_worthwhile_move_starts_a_transition_that_holds_the_load_or_the_running_capacity() -> None:
    p = problem(8.0)   # one instance carries 5 req/s under the stand-in: 1xTP1 misses the SLO at 8 req/s
    c = choose(p, TWO)
    assert c.move is Move.TRANSITION and "misses the SLO" in c.why
    assert c.transition is not None and c.transition.target == TWO and c.after.layout == TWO
    assert c.floor_rps == min(8.0, capacity_of(p)(ONE))


def test_a_move_over_the_gpu_budget_is_blocked_with_the_closest_miss() -> None:
    c = choose(problem(8.0, max_gpus=1), TWO)
    assert c.move is Move.BLOCKED and c.transition is None
    assert "over the budget of 1" in c.why


def test_capacity_of_memoises_each_layout_and_grows_with_replicas() -> None:
    cap = capacity_of(replace(problem(4.0), current=None))
    assert cap(TWO) > cap(ONE) > 0.0
    assert cap(ONE) == cap(Layout.replicas(1, Parallelism()))
