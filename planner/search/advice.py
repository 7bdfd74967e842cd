"""What would make an infeasible problem feasible: more GPUs of the same kind, a looser SLO, or a lighter load.

Called by `decide` when the funnel leaves no candidate; the result rides on the Infeasible error (its message, so
the operator's condition carries it, and `.advice` for the CLI). Three answers, each from the candidates nearest
to passing (the funnel's own misses, `FunnelResult.closest`, evaluated at the problem's load):
- GPUs: the smallest budget of this GPU at which the funnel (stages 1-5, the same ladder) admits a layout, found
  by doubling the budget and then bisecting (feasibility only grows with the budget: stage 2 is the only stage
  that reads it), at most 2 log2(MAX_BUDGET_FACTOR) + 1 funnel runs and never over MAX_ADVICE_GPUS;
- SLO: the closest layout's predicted TTFT and TPOT at the load, times the funnel's SLO margin;
- load: the largest load one of the nearest layouts carries within the SLOs (predict.slo_capacity_rps with the
  funnel's margins), so that planning at or below it passes stage 5.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from servingtopology.planner.errors import ClosestLayout, InfeasibleAdvice
from servingtopology.planner.perf.predict import slo_capacity_rps
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.funnel import FunnelResult, Miss, Stage, run_funnel
from servingtopology.planner.search.limits import floor_lines
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN, load_within

__all__ = ["ClosestLayout", "InfeasibleAdvice", "infeasible_advice", "MAX_BUDGET_FACTOR", "MAX_ADVICE_GPUS"]

MAX_BUDGET_FACTOR = 64    # the GPU search looks up to 64 × the budget ...
MAX_ADVICE_GPUS = 4096    # ... and never beyond this many GPUs


def _budget_feasible(problem: Problem, gpus: int, ladder: Sequence[tuple[str, Stage]] | None) -> FunnelResult | None:
    result = run_funnel(replace(problem, max_gpus=gpus), keep=1, ladder=ladder)
    return result if result.survivors else None


def _min_gpus(problem: Problem, ladder: Sequence[tuple[str, Stage]] | None) -> tuple[int | None, int, str | None]:
    """(smallest feasible budget or None, the largest budget tried, the funnel's best layout there)."""
    cap = max(problem.max_gpus + 1, min(problem.max_gpus * MAX_BUDGET_FACTOR, MAX_ADVICE_GPUS))
    lo, hi = problem.max_gpus, min(problem.max_gpus * 2, cap)   # lo: known infeasible
    found = _budget_feasible(problem, hi, ladder)
    while found is None and hi < cap:
        lo, hi = hi, min(hi * 2, cap)
        found = _budget_feasible(problem, hi, ladder)
    if found is None:
        return None, hi, None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        at_mid = _budget_feasible(problem, mid, ladder)
        if at_mid is None:
            lo = mid
        else:
            hi, found = mid, at_mid
    return hi, hi, found.survivors[0].layout.label_for(problem.engine)


def infeasible_advice(problem: Problem, result: FunnelResult, *, ladder: Sequence[tuple[str, Stage]] | None = None) -> InfeasibleAdvice:
    """Advice for a problem whose funnel (`result`) admitted nothing; `ladder` as given to `decide`."""
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    slo = problem.slo
    min_gpus, searched, min_layout = _min_gpus(problem, ladder)
    nearest: tuple[Miss, ...] = result.closest
    closest = needed_ttft = needed_tpot = None
    feasible = feasible_layout = None
    if nearest:
        # The nearest layout that carries the load (its latencies mean something); else the nearest, which saturates.
        m = next((n for n in nearest if np.isfinite(n.ttft_s) and np.isfinite(n.tpot_s) and load_within(rate, n.capacity_rps)), nearest[0])
        closest = ClosestLayout(m.layout.label_for(problem.engine), m.layout.gpus, m.ttft_s * 1e3, m.tpot_s * 1e3, m.capacity_rps)
        if load_within(rate, m.capacity_rps):
            needed_ttft, needed_tpot = m.ttft_s * 1e3 * SLO_MARGIN, m.tpot_s * 1e3 * SLO_MARGIN
        caps = slo_capacity_rps(problem, [n.layout for n in nearest], margin=SLO_MARGIN, load_margin=LOAD_MARGIN)
        j = int(np.argmax(caps))
        feasible, feasible_layout = float(caps[j]), nearest[j].layout.label_for(problem.engine)
    return InfeasibleAdvice(
        load_rps=rate, slo_ttft_ms=slo.ttft_ms, slo_tpot_ms=slo.tpot_ms, ttft_percentile=slo.ttft_percentile,
        tpot_percentile=slo.tpot_percentile, budget_gpus=problem.max_gpus, gpu=problem.gpu.id, closest=closest, min_gpus=min_gpus,
        searched_gpus=searched, min_gpus_layout=min_layout, feasible_load_rps=feasible, feasible_load_layout=feasible_layout,
        needed_ttft_ms=needed_ttft, needed_tpot_ms=needed_tpot, floors=floor_lines(problem),
    )
