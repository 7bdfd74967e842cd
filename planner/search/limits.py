"""Physical floors under the SLOs, and how a miss is told: the figure against the limit, one figure per miss.

- TPOT floor: every decode step reads the weights one token multiplies at least once; spread over the most GPUs
  the search may give one instance (its largest TP, times its DP for a MoE's experts, within the budget), at the
  GPU's peak HBM bandwidth: active weight bytes / (GPUs × HBM GB/s).
- TTFT floor: the prompt at the TTFT percentile (at least that share of requests is that long) must be computed,
  uncached tokens × 2 × active parameters FLOPs at the GPUs' dense peak, and the weights streamed once: the larger.
An SLO under its floor cannot be met by any layout of this GPU kind, whatever the budget. Called by the funnel's
closest miss, the infeasible advice, the record and the CLI. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servingtopology.planner.figure_text import gpus_text, ms_text, rps_text
from servingtopology.planner.layout import Layout
from servingtopology.planner.perf.memory import language_model_bytes
from servingtopology.planner.perf.predict import predict_figures
from servingtopology.planner.problem import Problem
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN

__all__ = ["SloFloors", "slo_floors", "miss_text", "floor_lines", "idle_miss"]


@dataclass(frozen=True, slots=True)
class SloFloors:
    """The floors (ms) and what they are made of: the GPUs of one instance, the prompt, the bytes and FLOPs."""

    tpot_floor_ms: float
    ttft_floor_ms: float
    gpus: int
    streamed_bytes: float
    prompt_tokens: float
    prefill_flops: float
    hbm_gbps: float
    peak_tflops: float

    def tpot_reason(self) -> str:
        return (f"streaming the {self.streamed_bytes / 1e9:,.1f} GB of weights each token multiplies over {self.gpus} GPU"
                f"{'s' if self.gpus != 1 else ''} at {self.hbm_gbps:,.0f} GB/s each takes {self.tpot_floor_ms:,.2f} ms per token")

    def ttft_reason(self) -> str:
        return (f"computing a {self.prompt_tokens:,.0f}-token prompt ({self.prefill_flops / 1e12:,.1f} TFLOP) on {self.gpus} GPU"
                f"{'s' if self.gpus != 1 else ''} at {self.peak_tflops:,.0f} TFLOP/s each, or streaming the weights once, takes "
                f"{self.ttft_floor_ms:,.1f} ms")


def slo_floors(problem: Problem) -> SloFloors:
    """The TTFT and TPOT floors of `problem` (ms): what no layout of this GPU kind beats."""
    m, g, s = problem.model, problem.gpu, problem.search
    node = g.gpus_per_node if not s.allow_cross_node_tp else problem.max_gpus
    tp = max(min(max(s.tp), node), 1)
    gpus = max(1, min(problem.max_gpus, tp * (max(s.dp) if m.is_moe else 1)))
    per_param = language_model_bytes(m, problem.precision) / max(m.total_params, 1)
    streamed = m.active_params_per_token * per_param
    tpot_s = streamed / (gpus * g.hbm_gbps * 1e9)
    prompt = problem.workload.input_tokens.quantile(problem.slo.ttft_percentile / 100.0)
    uncached = prompt * (1.0 - problem.workload.prefix_share)
    flops = 2.0 * m.active_params_per_token * uncached
    peak = g.peak_tflops(problem.precision)
    ttft_s = max(flops / (gpus * peak * 1e12), tpot_s)
    return SloFloors(tpot_s * 1e3, ttft_s * 1e3, gpus, streamed, prompt, flops, g.hbm_gbps, peak)


def miss_text(problem: Problem, *, label: str, gpus: int, ttft_s: float, tpot_s: float, capacity_rps: float) -> str:
    """A candidate's miss as figures against limits, the binding one first: `1×TP4 on 4 GPUs: p95 TPOT 41.2 ms against
    the 35 ms SLO (with the planning margin of 10 %, at most 31.8 ms); p95 TTFT 120 ms within 200 ms; capacity ...`."""
    slo, rate = problem.slo, float(problem.workload.arrival_rate_rps or 0.0)
    tt, tp = f"p{slo.ttft_percentile:g} TTFT", f"p{slo.tpot_percentile:g} TPOT"
    ratios = {"TTFT": ttft_s * 1e3 * SLO_MARGIN / slo.ttft_ms, "TPOT": tpot_s * 1e3 * SLO_MARGIN / slo.tpot_ms,
              "load": rate / max(LOAD_MARGIN * capacity_rps, 1e-12)}
    overloaded = not rate <= LOAD_MARGIN * capacity_rps
    # Over its capacity a layout's latencies are the queue's, not the layout's: the load is what binds.
    binding = "load" if overloaded else max(ratios, key=lambda k: ratios[k] if math.isfinite(ratios[k]) else math.inf)

    def latency(name: str, value_ms: float, limit_ms: float) -> str:
        if not math.isfinite(value_ms):
            return f"{name} unbounded (the queue grows without end at this load) against the {limit_ms:,.6g} ms SLO"
        if value_ms * SLO_MARGIN <= limit_ms:
            return f"{name} {ms_text(value_ms)} ms within {limit_ms:,.6g} ms"
        margin = "" if value_ms > limit_ms else (f" (the planning margin of {SLO_MARGIN - 1:.0%} allows at most "
                                                 f"{ms_text(limit_ms / SLO_MARGIN)} ms)")
        queue = " (queueing: the load is over its capacity)" if overloaded and name.endswith("TTFT") else ""
        return f"{name} {ms_text(value_ms)} ms{queue} against the {limit_ms:,.6g} ms SLO{margin}"
    if overloaded:
        load = f"capacity {rps_text(capacity_rps)} req/s against the load of {rate:g} req/s" + (
            "" if rate > capacity_rps else f" (the load may use at most {LOAD_MARGIN:.0%} of it)")
    else:
        load = f"capacity {rps_text(capacity_rps)} req/s carries the load of {rate:g} req/s"
    parts = {"TTFT": latency(tt, ttft_s * 1e3, slo.ttft_ms), "TPOT": latency(tp, tpot_s * 1e3, slo.tpot_ms), "load": load}
    order = [binding, *(k for k in parts if k != binding)]
    return f"{label} on {gpus_text(gpus)}: " + "; ".join(parts[k] for k in order)


def floor_lines(problem: Problem, floors: SloFloors | None = None) -> tuple[str, ...]:
    """Sentences for each SLO under its physical floor (empty when both are above)."""
    f = floors or slo_floors(problem)
    slo = problem.slo
    out = []
    if slo.tpot_ms < f.tpot_floor_ms:
        out.append(f"p{slo.tpot_percentile:g} TPOT ≤ {slo.tpot_ms:g} ms is under the physical floor of {f.tpot_floor_ms:,.2f} ms on "
                   f"{problem.gpu.id}: {f.tpot_reason()}")
    if slo.ttft_ms < f.ttft_floor_ms:
        out.append(f"p{slo.ttft_percentile:g} TTFT ≤ {slo.ttft_ms:g} ms is under the physical floor of {f.ttft_floor_ms:,.1f} ms on "
                   f"{problem.gpu.id}: {f.ttft_reason()}")
    return tuple(out)


IDLE_RPS = 1e-6   # the load "idle" is predicted at: one request at a time, no queue


def idle_miss(problem: Problem, layout: Layout) -> str:
    """Why a layout carries nothing within the SLOs (its SLO capacity is 0): the SLOs it misses even idle, each figure
    against its limit (analytical: one request alone, no queue), or that it saturates before any load it could carry."""
    slo = problem.slo
    f = predict_figures(problem, [layout], [IDLE_RPS])
    ttft_ms, tpot_ms = float(f.ttft_s[0]) * 1e3, float(f.tpot_s[0]) * 1e3
    misses = [f"p{pct:g} {name} {ms_text(ms)} ms against the {limit:g} ms SLO"
              for name, pct, ms, limit in (("TTFT", slo.ttft_percentile, ttft_ms, slo.ttft_ms), ("TPOT", slo.tpot_percentile, tpot_ms, slo.tpot_ms))
              if not ms <= limit]
    if misses:
        return "even idle (one request alone, predicted) its " + " and ".join(misses)
    return "it meets the SLOs only with no load at all: any rate it could carry pushes a percentile over its SLO"
