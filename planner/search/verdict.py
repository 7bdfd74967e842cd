"""The met/short verdict of one layout's prediction at the problem's load, as every surface states it: what it says and
which figure it rests on. Called by decide's reasons (the record, `plan --json`, the operator's status), `plan`'s summary
and `compare`'s table. Formatting of figures the planner computed; predicts nothing.
"""

from __future__ import annotations

import math

from servingtopology.planner.figure_text import UNBOUNDED, gpus_text, ms_text, per_gpu_text, rps_text
from servingtopology.planner.layout import Layout, LayoutKind
from servingtopology.planner.perf.step import delivery_steps
from servingtopology.planner.problem import Prediction, Problem
from servingtopology.planner.search.limits import idle_miss

__all__ = ["basis_text", "carries_text", "ttft_parts_text", "verdict_text"]


def verdict_text(problem: Problem, layout: Layout, p: Prediction) -> str:
    """`1×TP1 meets p95 TTFT 80.0 ≤ 500 ms and p95 TPOT 15.6 ≤ 40 ms at 15 req/s`, or `... misses the SLOs at ...` (only a
    pin is chosen while missing: never "meets 7.4 ≤ 6 ms"), followed by `basis_text` where the two models disagree.

    The one sentence of the verdict: the record's first reason, `plan`'s summary line and `compare`'s per-layout line
    all state it, so a figure reads the same (ms_text) wherever it is shown."""
    slo, rate = problem.slo, problem.workload.arrival_rate_rps
    tt, tp = f"p{slo.ttft_percentile:g} TTFT", f"p{slo.tpot_percentile:g} TPOT"
    label = layout.label_for(problem.engine)
    if p.meets_slo:
        out = (f"{label} meets {tt} {ms_text(p.ttft_ms)} ≤ {slo.ttft_ms:g} ms and {tp} {ms_text(p.tpot_ms)} ≤ {slo.tpot_ms:g} ms "
               f"at {rate:g} req/s")
    else:
        out = (f"{label} misses the SLOs at {rate:g} req/s: {tt} {_ms(p.ttft_ms)} (SLO {slo.ttft_ms:g}), "
               f"{tp} {_ms(p.tpot_ms)} (SLO {slo.tpot_ms:g})")
        if not (math.isfinite(p.ttft_ms) and math.isfinite(p.tpot_ms)):
            out += f" ({p.source}: requests do not finish at this load, so no percentile is finite)"
    basis = basis_text(problem, p)
    return f"{out} ({basis})" if basis else out


def ttft_parts_text(problem: Problem, layout: Layout, p: Prediction) -> str | None:
    """What the predicted TTFT is made of, as a client reads it: `p95 TTFT 165 ms = the engine's 102 ms + the front end's
    32 ms + the first token's delivery 31 ms (4.2 mean steps, ...)`.
    None where the TTFT is not finite or carries no parts (a prediction made before they were kept)."""
    if not math.isfinite(p.ttft_ms) or (p.delivery_ms <= 0 and p.front_end_ms <= 0):
        return None
    engine = p.ttft_ms - p.front_end_ms - p.delivery_ms
    pd = layout.kind is LayoutKind.PD
    what = "the first token's admission to the decode batch and delivery" if pd else "the first token's delivery"
    steps = float(delivery_steps(disaggregated=pd))
    step = f"{steps:.1f} mean {'decode ' if pd else ''}steps"
    return (f"p{problem.slo.ttft_percentile:g} TTFT {ms_text(p.ttft_ms)} ms = the engine's {ms_text(engine)} ms + the front end's "
            f"{ms_text(p.front_end_ms)} ms + {what} {ms_text(p.delivery_ms)} ms ({step}, fitted on client-timed benchmarks; "
            f"status sets the engine's own TTFT metric beside the rest)")


def carries_text(problem: Problem, layout: Layout, p: Prediction) -> str:
    """What the layout carries within the SLOs, the sentence after the verdict (the record's second reason, `plan`'s
    summary): `it carries up to 14.3 req/s within the SLOs on 1 GPU (14.3 req/s per GPU)`, said to be the analytical
    model's where the verdict rests on the simulation (basis_text), or why it carries nothing."""
    if p.capacity_rps <= 0:
        return f"it carries nothing within the SLOs on {gpus_text(layout.gpus)}: {idle_miss(problem, layout)}"
    by = " by the analytical model" if basis_text(problem, p) else ""
    return (f"it carries up to {rps_text(p.capacity_rps)} req/s within the SLOs on {gpus_text(layout.gpus)}{by} "
            f"({per_gpu_text(p.goodput_per_gpu)} req/s per GPU)")


def _ms(ms: float) -> str:
    """`80.0 ms`, or `unbounded` (never `unbounded ms`)."""
    text = ms_text(ms)
    return text if text == UNBOUNDED else f"{text} ms"


def basis_text(problem: Problem, p: Prediction) -> str:
    """What the verdict rests on where the simulated figures at the load and the analytical SLO capacity disagree
    (VerdictNamesItsBasis): a run that meets the SLOs above the capacity, or misses them below it; '' where they agree
    or the figures are analytical alone (the capacity then follows from the same model as the verdict).

    The SLO capacity is the analytical model's bisection (a simulated one would take a run per probe); the verdict at
    the load is the simulated run's where stage 6 or a pin's simulation ran."""
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    if p.source != "simulated" or rate <= 0 or p.capacity_rps <= 0:
        return ""
    cap = rps_text(p.capacity_rps)
    if p.meets_slo and rate > p.capacity_rps:
        return (f"simulated: its run meets the SLOs at {rate:g} req/s, above the analytical SLO capacity of {cap} req/s; the "
                "verdict rests on the simulation, the capacity and per-GPU figures on the analytical model")
    if not p.meets_slo and rate < p.capacity_rps:
        return (f"simulated: its run misses the SLOs at {rate:g} req/s, below the analytical SLO capacity of {cap} req/s; the "
                "verdict rests on the simulation, so that capacity is not reached in it")
    return ""
