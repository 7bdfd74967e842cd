"""The planner's stage 6 through the simulator: one `Problem` and one `Layout` in, SLO-percentile figures out.

`stage6_figures` has the `decide.Simulate` shape once its keywords are bound (functools.partial), so the
CLI and the operator can hand it to `decide(problem, simulate=...)`. Pure, deterministic under the seed.
"""

from __future__ import annotations

from servingtopology.planner.hardware import Gpu
from servingtopology.planner.layout import Layout, LayoutKind, Role, RoleLayout
from servingtopology.planner.perf.mixed_pd import kv_link_transfer_s, kv_pool_of, mixed_kinds
from servingtopology.planner.perf.predict import front_end_s
from servingtopology.planner.perf.step import InstancePerf
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import SimFigures
from servingtopology.planner.search.stage6_size import stage6_requests
from servingtopology.planner.sim import RememberedSteps, simulate
from servingtopology.planner.sim.requests import from_workload
from servingtopology.planner.sim.results import SimResult

__all__ = ["simulate_problem", "simulate_mixed", "stage6_figures"]


def simulate_problem(problem: Problem, layout: Layout, *, num_requests: int = 600, seed: int = 0) -> SimResult:
    """Simulate `layout` under the problem's workload (open loop at its rate, or its closed-loop clients); a PD layout
    whose roles run on other GPU kinds runs each role on its own kind, the KV over the slower NIC (planner.perf.mixed_pd)."""
    kinds = mixed_kinds(problem, layout)
    if kinds is not None:
        return simulate_mixed(problem, layout, prefill_gpu=kinds.prefill_gpu, decode_gpu=kinds.decode_gpu, link_gbit=kinds.link_gbit,
                              num_requests=num_requests, seed=seed)
    requests = from_workload(problem.workload, num_requests=num_requests, seed=seed)
    return simulate(layout, model=problem.model, gpu=problem.gpu, engine=problem.engine, requests=requests,
                    precision=problem.precision)


def simulate_mixed(problem: Problem, layout: Layout, *, prefill_gpu: Gpu, decode_gpu: Gpu, link_gbit: float, num_requests: int = 1000,
                   seed: int = 0) -> SimResult:
    """Replay the problem's workload on a mixed-kind PD layout: each role's steps and KV pool on its own GPU, every KV
    hand-off over the link (the simulator's own hooks: per-role step models, pools and transfer time)."""
    gpus = {Role.PREFILL: prefill_gpu, Role.DECODE: decode_gpu}
    prec = layout.precision

    def step_model(role: Role, rl: RoleLayout) -> RememberedSteps:
        return RememberedSteps(InstancePerf(problem.model, gpus[role], prec, rl.knobs.kv_dtype, problem.engine, rl.parallelism))

    pools = {role: kv_pool_of(problem, gpus[role], layout, role) for role in gpus}
    return simulate(layout, model=problem.model, gpu=decode_gpu, engine=problem.engine, workload=problem.workload, num_requests=num_requests,
                    seed=seed, precision=prec, step_model=step_model, pool_tokens=pools,
                    transfer_s=lambda tokens: float(kv_link_transfer_s(problem, float(tokens), link_gbit=link_gbit)))


def stage6_figures(problem: Problem, layout: Layout, *, num_requests: int | None = None, seed: int | None = None,
                   warmup_requests: int = 50) -> SimFigures:
    """TTFT (with the per-request front-end overhead) and TPOT (s) at the SLO's percentiles and the mean TPOT, after a warm-up; unfinished requests
    (still queued when the run ends) count as infinitely late so an overloaded layout fails its SLO. `num_requests` and
    `seed` default to the problem's: planner.search.stage6_size's count from its simulation budget, and its seed."""
    if num_requests is None:
        num_requests = stage6_requests(problem).requests
    if seed is None:
        seed = problem.simulation.seed
    result = simulate_problem(problem, layout, num_requests=num_requests, seed=seed)
    s = result.summary(problem.slo, warmup_requests=min(warmup_requests, num_requests // 4))
    slo = problem.slo
    if s.unfinished > 0 or s.finished == 0:
        inf = float("inf")
        return SimFigures(ttft_s=inf, tpot_s=inf, tpot_mean_s=inf)
    overhead = front_end_s(problem, disaggregated=layout.kind is LayoutKind.PD)  # client-side TTFT, as the funnel's
    return SimFigures(ttft_s=s.ttft_ms.at(slo.ttft_percentile) / 1e3 + overhead, tpot_s=s.tpot_ms.at(slo.tpot_percentile) / 1e3,
                      tpot_mean_s=s.tpot_ms.mean / 1e3)
