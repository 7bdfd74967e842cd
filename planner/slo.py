"""The SLO test and its margins: whether predicted latencies meet a `Slo`, and whether a load fits a capacity.

Called by the funnel (stage 5 and its PD picks), `predict` (SLO capacity, a Prediction's `meets_slo`), `pd_ratio`,
`decide` (stage 6), `advice` and the simulator's results. Array-aware: a figure may be a float or a numpy array, and
the tests combine element-wise. Pure; imports only the Slo value.

Two spellings, one per unit, so that no comparison moves by a rounding: figures in seconds (the analytical
estimates) compare as `t_s × margin ≤ slo_ms / 1000`; figures already in ms (a Prediction, simulated requests)
compare as `t_ms ≤ slo_ms`.
"""

from __future__ import annotations

from typing import Any

from servingtopology.planner.workload import Slo

__all__ = ["SLO_MARGIN", "LOAD_MARGIN", "ttft_within", "tpot_within", "load_within", "meets_slo", "meets_slo_and_load",
           "meets_slo_ms"]

SLO_MARGIN = 1.10   # predicted TTFT and TPOT × this stay within the SLOs (stage 5, the P:D ratio, the advice)
LOAD_MARGIN = 0.90  # the load stays within this share of a layout's capacity


def ttft_within(slo: Slo, ttft_s: Any, *, margin: float = SLO_MARGIN) -> Any:
    """TTFT (s) × margin within the TTFT target."""
    return ttft_s * margin <= slo.ttft_ms / 1e3


def tpot_within(slo: Slo, tpot_s: Any, *, margin: float = SLO_MARGIN) -> Any:
    """TPOT (s) × margin within the TPOT target."""
    return tpot_s * margin <= slo.tpot_ms / 1e3


def load_within(rate_rps: Any, capacity_rps: Any, *, load_margin: float = LOAD_MARGIN) -> Any:
    """The load at most `load_margin` of the capacity (req/s)."""
    return rate_rps <= load_margin * capacity_rps


def meets_slo(slo: Slo, *, ttft_s: Any, tpot_s: Any, margin: float = SLO_MARGIN) -> Any:
    """Both latencies (s) × margin within their targets."""
    return ttft_within(slo, ttft_s, margin=margin) & tpot_within(slo, tpot_s, margin=margin)


def meets_slo_and_load(slo: Slo, *, ttft_s: Any, tpot_s: Any, rate_rps: Any, capacity_rps: Any, margin: float = SLO_MARGIN,
                       load_margin: float = LOAD_MARGIN) -> Any:
    """Both latencies (s) × margin within their targets and the load within `load_margin` of the capacity."""
    return meets_slo(slo, ttft_s=ttft_s, tpot_s=tpot_s, margin=margin) & load_within(rate_rps, capacity_rps, load_margin=load_margin)


def meets_slo_ms(slo: Slo, *, ttft_ms: Any, tpot_ms: Any) -> Any:
    """Both latencies, already in ms, within their targets (no margin: measured or simulated figures)."""
    return (ttft_ms <= slo.ttft_ms) & (tpot_ms <= slo.tpot_ms)
