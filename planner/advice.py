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
from dataclasses import dataclass, replace

import numpy as np

from .funnel import LOAD_MARGIN, SLO_MARGIN, FunnelResult, Miss, Stage, run_funnel
from .predict import slo_capacity_rps
from .problem import Problem

__all__ = ["ClosestLayout", "InfeasibleAdvice", "infeasible_advice", "MAX_BUDGET_FACTOR", "MAX_ADVICE_GPUS"]

MAX_BUDGET_FACTOR = 64    # the GPU search looks up to 64 × the budget ...
MAX_ADVICE_GPUS = 4096    # ... and never beyond this many GPUs


@dataclass(frozen=True, slots=True)
class ClosestLayout:
    """The candidate nearest to passing, with its predicted figures at the problem's load (ms, req/s)."""

    label: str
    gpus: int
    ttft_ms: float
    tpot_ms: float
    capacity_rps: float        # the load at which it saturates (queueing grows without bound beyond)


@dataclass(frozen=True, slots=True)
class InfeasibleAdvice:
    """What would make the problem feasible; None where that lever alone does not (or was not searched)."""

    load_rps: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    ttft_percentile: float
    tpot_percentile: float
    budget_gpus: int
    gpu: str
    closest: ClosestLayout | None    # the nearest miss that carries the load, else the nearest (saturated)
    min_gpus: int | None             # the smallest budget of this GPU with a feasible layout
    searched_gpus: int               # the largest budget the GPU search tried
    min_gpus_layout: str | None      # the best layout the funnel admits at min_gpus (its analytical proxy)
    feasible_load_rps: float | None  # the largest load the nearest layouts carry within the SLOs
    feasible_load_layout: str | None
    needed_ttft_ms: float | None     # the SLOs the closest layout meets at this load (with the funnel's margin)
    needed_tpot_ms: float | None

    def lines(self) -> tuple[str, ...]:
        """The advice as sentences, most direct first."""
        out = []
        if self.min_gpus is not None:
            out.append(f"needs ≥ {self.min_gpus} GPUs of this kind ({self.gpu}; budget {self.budget_gpus}): "
                       f"{self.min_gpus_layout} is feasible at {self.min_gpus}")
        else:
            out.append(f"more {self.gpu} GPUs alone do not help: no layout up to {self.searched_gpus} GPUs is feasible")
        c = self.closest
        if c is not None:
            if self.needed_ttft_ms is not None and self.needed_tpot_ms is not None:
                out.append(f"the closest layout ({c.label}, {c.gpus} GPUs) meets p{self.ttft_percentile:g} TTFT at {self.needed_ttft_ms:.0f} ms "
                           f"(SLO {self.slo_ttft_ms:g}) and p{self.tpot_percentile:g} TPOT at {self.needed_tpot_ms:.1f} ms "
                           f"(SLO {self.slo_tpot_ms:g}) at {self.load_rps:g} req/s")
            else:
                out.append(f"the closest layout ({c.label}, {c.gpus} GPUs) saturates at {c.capacity_rps:.1f} req/s, below the load of "
                           f"{self.load_rps:g} req/s, so no SLO is met at this load")
        if self.feasible_load_rps is not None and self.feasible_load_rps > 0:
            out.append(f"feasible at ≤ {self.feasible_load_rps:.3g} req/s ({self.feasible_load_layout} meets both SLOs up to that load)")
        elif c is not None:
            out.append("no lighter load helps: the nearest layouts miss the SLOs even when idle")
        return tuple(out)


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
    return hi, hi, found.survivors[0].layout.label


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
        m = next((n for n in nearest if np.isfinite(n.ttft_s) and np.isfinite(n.tpot_s) and rate <= LOAD_MARGIN * n.capacity_rps), nearest[0])
        closest = ClosestLayout(m.layout.label, m.layout.gpus, m.ttft_s * 1e3, m.tpot_s * 1e3, m.capacity_rps)
        if rate <= LOAD_MARGIN * m.capacity_rps:
            needed_ttft, needed_tpot = m.ttft_s * 1e3 * SLO_MARGIN, m.tpot_s * 1e3 * SLO_MARGIN
        caps = slo_capacity_rps(problem, [n.layout for n in nearest], margin=SLO_MARGIN, load_margin=LOAD_MARGIN)
        j = int(np.argmax(caps))
        feasible, feasible_layout = float(caps[j]), nearest[j].layout.label
    return InfeasibleAdvice(
        load_rps=rate, slo_ttft_ms=slo.ttft_ms, slo_tpot_ms=slo.tpot_ms, ttft_percentile=slo.ttft_percentile,
        tpot_percentile=slo.tpot_percentile, budget_gpus=problem.max_gpus, gpu=problem.gpu.id, closest=closest, min_gpus=min_gpus,
        searched_gpus=searched, min_gpus_layout=min_layout, feasible_load_rps=feasible, feasible_load_layout=feasible_layout,
        needed_ttft_ms=needed_ttft, needed_tpot_ms=needed_tpot,
    )
