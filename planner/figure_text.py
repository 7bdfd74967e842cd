"""How a figure reads when a user reads it: latencies, rates, shares and ratios, never `inf`, `nan` or a 13-digit ratio.

Called by the record (planner.search.record), the reasons of a decision (planner.search.decide, record_facts), the
infeasible advice (planner.errors), the pool and the CLI's tables (plan, compare, simulate). The lowest module of the
planner: it imports nothing of it, so every room formats a figure by the same rule. Formatting only: what a figure is
comes from the planner, and a layout that carries nothing says why in words (planner.search.limits `idle_miss`).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["UNBOUNDED", "json_number", "finite_json", "count_text", "gpus_text", "ms_text", "rps_text", "per_gpu_text", "share_text",
           "ratio_text", "against_pinned_text"]

UNBOUNDED = "unbounded"   # a latency or share with no finite value: the queue grows without end, or nothing finishes
RATIO_SHOWN_UP_TO = 1000.0   # past this a ratio is noise: the figure below it is next to nothing, said in words
SMALLEST_SHOWN = 1e-4        # a rate below it reads "under 0.0001", never 1e-12


def json_number(value: float, digits: int) -> float | None:
    """A figure for JSON: rounded, or null where it has no finite value (JSON has no inf or nan; `Infinity` is not JSON)."""
    return round(float(value), digits) if math.isfinite(value) else None


def finite_json(value: Any) -> Any:
    """`value` (dicts, lists, tuples and scalars) with every float that has no finite value as null: what a command prints
    as JSON parses as JSON (`json.dumps` writes inf as `Infinity`, which no JSON reader accepts)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def count_text(count: int, noun: str) -> str:
    """`1 point`, `3 points`: a count with its noun in the number it takes (English plural by `s`)."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def gpus_text(gpus: int) -> str:
    """`1 GPU`, `8 GPUs`."""
    return count_text(gpus, "GPU")


def ms_text(ms: float | None) -> str:
    """A latency in ms: whole ms from 100 up, one decimal below, `unbounded` where it has no finite value."""
    if ms is None or not math.isfinite(ms):
        return UNBOUNDED
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:,.1f}"


def rps_text(rps: float | None) -> str:
    """A rate in req/s with the digits it needs: 0.02 stays 0.02 (never 0.0), 14.3 keeps one decimal."""
    if rps is None or not math.isfinite(rps):
        return UNBOUNDED
    if rps == 0:
        return "0"
    if abs(rps) < SMALLEST_SHOWN:
        return f"under {SMALLEST_SHOWN:g}"
    return f"{rps:.2g}" if abs(rps) < 0.995 else f"{rps:,.1f}"


def per_gpu_text(rps_per_gpu: float | None) -> str:
    """Requests/s per GPU: two decimals, two significant digits below 0.1 (0.004, not 0.00)."""
    if rps_per_gpu is None or not math.isfinite(rps_per_gpu):
        return UNBOUNDED
    if rps_per_gpu == 0:
        return "0"
    if abs(rps_per_gpu) < SMALLEST_SHOWN:
        return f"under {SMALLEST_SHOWN:g}"
    return f"{rps_per_gpu:.2g}" if abs(rps_per_gpu) < 0.1 else f"{rps_per_gpu:,.2f}"


def share_text(share: float | None, of: str) -> str:
    """A figure as a share of its limit `of`: `57% of its SLO` below 10×, then `572× its SLO` (`57159%` reads as
    noise), `unbounded` where it has no finite value."""
    if share is None or not math.isfinite(share):
        return f"{UNBOUNDED} against {of}"
    return f"{share:.0%} of {of}" if share < 10 else f"{share:,.0f}× {of}"


def ratio_text(a: float, b: float) -> str | None:
    """`a / b` as `6.5×`, or None where `b` is nothing (or so near it that the ratio is noise): the caller says why in
    words instead."""
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0 or a / b > RATIO_SHOWN_UP_TO:
        return None
    return f"{a / b:,.1f}×"


def against_pinned_text(alt_per_gpu: float, pinned_per_gpu: float) -> str:
    """An alternative's req/s per GPU within the SLOs beside the pinned layout's: `6.5× the pinned layout's 0.01`, or
    in words where the pin carries nothing (no ratio against 0)."""
    ratio = ratio_text(alt_per_gpu, pinned_per_gpu)
    if ratio is not None:
        return f"{ratio} the pinned layout's {per_gpu_text(pinned_per_gpu)}"
    if pinned_per_gpu <= 0:
        return "where the pinned layout carries none"
    return f"where the pinned layout carries next to none ({per_gpu_text(pinned_per_gpu)})"
