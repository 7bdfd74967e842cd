"""The planner's stage 6 through the simulator: one `Problem` and one `Layout` in, SLO-percentile figures out.

`stage6_figures` has the `decide.Simulate` shape once its keywords are bound (functools.partial), so the
CLI and the operator can hand it to `decide(problem, simulate=...)`. Pure, deterministic under the seed.
"""

from __future__ import annotations

from servingtopology.planner.decide import SimFigures
from servingtopology.planner.layout import Layout, LayoutKind
from servingtopology.planner.predict import front_end_s
from servingtopology.planner.problem import Problem
from servingtopology.planner.sim import simulate
from servingtopology.planner.sim.requests import from_workload
from servingtopology.planner.sim.results import SimResult

__all__ = ["simulate_problem", "stage6_figures"]


def simulate_problem(problem: Problem, layout: Layout, *, num_requests: int = 600, seed: int = 0) -> SimResult:
    """Simulate `layout` under the problem's workload (open loop at its rate, or its closed-loop clients)."""
    requests = from_workload(problem.workload, num_requests=num_requests, seed=seed)
    return simulate(layout, model=problem.model, gpu=problem.gpu, engine=problem.engine, requests=requests,
                    precision=problem.precision)


def stage6_figures(problem: Problem, layout: Layout, *, num_requests: int = 600, seed: int = 0,
                   warmup_requests: int = 50) -> SimFigures:
    """TTFT (with the per-request front-end overhead) and TPOT (s) at the SLO's percentiles and the mean TPOT, after a warm-up; unfinished requests
    (still queued when the run ends) count as infinitely late so an overloaded layout fails its SLO."""
    result = simulate_problem(problem, layout, num_requests=num_requests, seed=seed)
    s = result.summary(problem.slo, warmup_requests=min(warmup_requests, num_requests // 4))
    slo = problem.slo
    if s.unfinished > 0 or s.finished == 0:
        inf = float("inf")
        return SimFigures(ttft_s=inf, tpot_s=inf, tpot_mean_s=inf)
    overhead = front_end_s(problem, disaggregated=layout.kind is LayoutKind.PD)  # client-side TTFT, as the funnel's
    return SimFigures(ttft_s=s.ttft_ms.at(slo.ttft_percentile) / 1e3 + overhead, tpot_s=s.tpot_ms.at(slo.tpot_percentile) / 1e3,
                      tpot_mean_s=s.tpot_ms.mean / 1e3)
