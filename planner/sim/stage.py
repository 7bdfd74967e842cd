"""The planner's stage 6 through the simulator: one `Problem` and one `Layout` in, SLO-percentile figures out.

`stage6_figures` has the `decide.Simulate` shape, so the CLI and the operator hand it to `decide(problem, simulate=...)`;
`slo_figures` and `warmup_of` are the one reading of a run at the SLO percentiles (stage 6, `plan`, `compare`, the
operator and `simulate` alike: OneSimulatedFigure). Pure, deterministic under the seed.
"""

from __future__ import annotations

from collections.abc import Callable

from servingtopology.planner.hardware import Gpu
from servingtopology.planner.layout import Layout, LayoutKind, Role, RoleLayout
from servingtopology.planner.perf.mixed_pd import kv_link_transfer_s, kv_pool_of, mixed_kinds
from servingtopology.planner.perf.predict import front_end_s, layout_delivery_s
from servingtopology.planner.perf.step import InstancePerf
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import SimFigures
from servingtopology.planner.search.stage6_size import stage6_requests
from servingtopology.planner.sim import RememberedSteps, simulate
from servingtopology.planner.sim.requests import from_workload
from servingtopology.planner.sim.results import SimResult, SimSummary

__all__ = ["simulate_problem", "simulate_mixed", "slo_figures", "stage6_figures", "warmup_of"]


def simulate_problem(problem: Problem, layout: Layout, *, num_requests: int = 600, seed: int = 0,
                     progress: Callable[[int], None] | None = None) -> SimResult:
    """Simulate `layout` under the problem's workload (open loop at its rate, or its closed-loop clients); a PD layout
    whose roles run on other GPU kinds runs each role on its own kind, the KV over the slower NIC (planner.perf.mixed_pd)."""
    kinds = mixed_kinds(problem, layout)
    if kinds is not None:
        return simulate_mixed(problem, layout, prefill_gpu=kinds.prefill_gpu, decode_gpu=kinds.decode_gpu, link_gbit=kinds.link_gbit,
                              num_requests=num_requests, seed=seed, progress=progress)
    requests = from_workload(problem.workload, num_requests=num_requests, seed=seed)
    return simulate(layout, model=problem.model, gpu=problem.gpu, engine=problem.engine, requests=requests,
                    precision=problem.precision, progress=progress)


def simulate_mixed(problem: Problem, layout: Layout, *, prefill_gpu: Gpu, decode_gpu: Gpu, link_gbit: float, num_requests: int = 1000,
                   seed: int = 0, progress: Callable[[int], None] | None = None) -> SimResult:
    """Replay the problem's workload on a mixed-kind PD layout: each role's steps and KV pool on its own GPU, every KV
    hand-off over the link (the simulator's own hooks: per-role step models, pools and transfer time)."""
    gpus = {Role.PREFILL: prefill_gpu, Role.DECODE: decode_gpu}
    prec = layout.precision

    def step_model(role: Role, rl: RoleLayout) -> RememberedSteps:
        return RememberedSteps(InstancePerf(problem.model, gpus[role], prec, rl.knobs.kv_dtype, problem.engine, rl.parallelism))

    pools = {role: kv_pool_of(problem, gpus[role], layout, role) for role in gpus}
    return simulate(layout, model=problem.model, gpu=decode_gpu, engine=problem.engine, workload=problem.workload, num_requests=num_requests,
                    seed=seed, precision=prec, step_model=step_model, pool_tokens=pools,
                    transfer_s=lambda tokens: float(kv_link_transfer_s(problem, float(tokens), link_gbit=link_gbit)), progress=progress)


def warmup_of(problem: Problem, num_requests: int) -> int:
    """The first requests left out of the percentiles of a run of `num_requests`: the spec's warm-up, at most a quarter."""
    return min(problem.simulation.warmup_requests, num_requests // 4)


def slo_figures(problem: Problem, layout: Layout, summary: SimSummary) -> SimFigures:
    """A run's figures at the SLO's percentiles (s): TTFT as a client sees it (the engines' plus the front end,
    predict.front_end_s, and the delivery steps, perf.delivery_s, as the analytical figure counts them), TPOT,
    and the mean TPOT. Unfinished requests (still queued when the run ends) count as infinitely late, so an overloaded
    layout fails its SLO."""
    if summary.unfinished > 0 or summary.finished == 0:
        inf = float("inf")
        return SimFigures(ttft_s=inf, tpot_s=inf, tpot_mean_s=inf)
    slo = problem.slo
    tpot_mean_s = summary.tpot_ms.mean / 1e3
    # The engine's TTFT is the step that computed the first token (on PD, the first decode step); the client has it
    # `delivery_s` later: that many mean steps (as the analytical estimate counts them).
    overhead = front_end_s(problem, disaggregated=layout.kind is LayoutKind.PD) + layout_delivery_s(layout, tpot_mean_s)
    return SimFigures(ttft_s=summary.ttft_ms.at(slo.ttft_percentile) / 1e3 + overhead, tpot_s=summary.tpot_ms.at(slo.tpot_percentile) / 1e3,
                      tpot_mean_s=tpot_mean_s)


def stage6_figures(problem: Problem, layout: Layout, *, num_requests: int | None = None, seed: int | None = None,
                   warmup_requests: int | None = None) -> SimFigures:
    """TTFT and TPOT (s) at the SLO's percentiles and the mean TPOT after a warm-up (`slo_figures`). `num_requests`,
    `seed` and `warmup_requests` default to the problem's: planner.search.stage6_size's count from its simulation budget,
    its seed and its warm-up (`warmup_of`), so `plan`, `plan --manifests` and the operator read one run alike."""
    if num_requests is None:
        num_requests = stage6_requests(problem).requests
    if seed is None:
        seed = problem.simulation.seed
    result = simulate_problem(problem, layout, num_requests=num_requests, seed=seed)
    warmup = warmup_of(problem, num_requests) if warmup_requests is None else min(warmup_requests, num_requests // 4)
    return slo_figures(problem, layout, result.summary(problem.slo, warmup_requests=warmup))
