"""Fakes for the replan loop's tests (tests/planner/live/test_loop.py drives planner/live/loop.py `step` with them,
tests/operator/test_replan.py the operator's wording of it): a predictor where each replica carries 5 req/s, planners
that pick the fewest replicas, refuse, or find nothing, and metric samples of 1,000-token prompts."""

from __future__ import annotations

import math
from dataclasses import replace

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role
from servingtopology.planner.live.drift import DriftPolicy
from servingtopology.planner.live.observe import MetricSample
from servingtopology.planner.live.policy import Mode, ReplanPolicy
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.problem import Candidate, Decision, Prediction, Problem
from servingtopology.planner.workload import LengthDist, Slo, Workload

__all__ = ["PROBLEM", "PER_INSTANCE_RPS", "PREDICTED_TTFT_MS", "ONE", "fake_point", "fake_predict", "fake_planner", "refusing_planner",
           "infeasible_planner", "sample", "policy", "gainful_planner", "predict_knobs"]

PROBLEM = Problem(model=resolve_model("llama-3.1-8b"), gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, precision=Precision.BF16,
                  max_gpus=8, workload=Workload(LengthDist.fixed(1000), LengthDist.fixed(200), arrival_rate_rps=4.0),
                  slo=Slo(ttft_ms=500.0, tpot_ms=40.0))
PER_INSTANCE_RPS = 5.0
PREDICTED_TTFT_MS = 100.0
ONE = Layout.replicas(1, Parallelism())


def fake_point(problem: Problem, layout: Layout) -> tuple[float, float]:
    """TTFT 100 ms times the request-overhead factor, TPOT 20 ms times the weights factor (the problem's calibration)."""
    factors = dict(problem.factors)
    return PREDICTED_TTFT_MS * factors.get("request_overhead", 1.0), 20.0 * factors.get("weights", 1.0)


def fake_predict(problem: Problem, layout: Layout) -> Candidate:
    """Each instance carries 5 req/s; TTFT 100 ms and TPOT 20 ms before the calibration's factors (`fake_point`)."""
    n = layout.roles[Role.AGGREGATED].count
    rate = problem.workload.arrival_rate_rps or 0.0
    cap = PER_INSTANCE_RPS * n
    ttft, tpot = fake_point(problem, layout)
    pred = Prediction(ttft_ms=ttft, tpot_ms=tpot, throughput_tok_s=rate * 200, capacity_rps=cap, goodput_rps=rate, goodput_per_gpu=cap / n,
                      tokens_per_s_per_user=1000 / tpot, kv_pool_tokens=10**5, max_request_tokens=10**5,
                      meets_slo=rate <= cap and ttft <= problem.slo.ttft_ms and tpot <= problem.slo.tpot_ms)
    return Candidate(layout, pred, pred.goodput_per_gpu)


def fake_planner(problem: Problem) -> Decision:
    """The fewest replicas that carry the load."""
    n = max(1, math.ceil((problem.workload.arrival_rate_rps or 0.0) / PER_INSTANCE_RPS))
    best = fake_predict(problem, Layout.replicas(n, Parallelism()))
    current = fake_predict(problem, problem.current) if problem.current is not None else None
    return Decision(best=best, alternatives=(), funnel=(), candidates_total=1, kv_bytes_per_token=1, weight_bytes=1.0, current=current)


def refusing_planner(problem: Problem) -> Decision:
    raise AssertionError("the planner must not be called here")


def infeasible_planner(problem: Problem) -> Decision:
    raise Infeasible("5 SLO and load feasibility", "8×TP1 on 8 GPUs: 40% short")


def sample(at_s: float, rate: float = 4.0, *, ttft_ms: float = 100.0, tpot_ms: float = 20.0) -> MetricSample:
    return MetricSample(at_s=at_s, interval_s=60.0, request_rate_rps=rate, input_tokens_mean=1000.0, output_tokens_mean=200.0,
                        ttft_ms=ttft_ms, tpot_ms=tpot_ms, running=3.0, waiting=0.0)


def policy(mode: Mode = Mode.DRY_RUN, **drift: float) -> ReplanPolicy:
    return ReplanPolicy(mode=mode, interval_s=60.0, drift=DriftPolicy(**{"persist_intervals": 3, "cooldown_s": 600.0, **drift}),
                        max_surge_gpus=2)


def gainful_planner(gain: float):  # type: ignore[no-untyped-def]
    """A planner whose best is 2×TP1 with `gain` more goodput per GPU than the running 1×TP1, which meets the SLO: the
    move would be made for its gain alone."""
    def planner(problem: Problem) -> Decision:
        current = fake_predict(problem, problem.current or ONE)
        layout = Layout.replicas(2, Parallelism())
        c = fake_predict(problem, layout)
        better = Candidate(layout, replace(c.prediction, goodput_per_gpu=current.prediction.goodput_per_gpu * (1 + gain),
                                           tpot_ms=c.prediction.tpot_ms / (1 + gain)), c.score * (1 + gain))
        return Decision(best=better, alternatives=(), funnel=(), candidates_total=1, kv_bytes_per_token=1, weight_bytes=1.0, current=current)
    return planner


def predict_knobs(planner):  # type: ignore[no-untyped-def]
    """A predictor that agrees with `planner` on its 2×TP1 and with `fake_predict` elsewhere."""
    def predict(problem: Problem, layout: Layout) -> Candidate:
        if layout.roles[Role.AGGREGATED].count == 2:
            return planner(problem).best
        return fake_predict(problem, layout)
    return predict
