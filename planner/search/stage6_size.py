"""How many requests stage 6 simulates per layout (`stage6_requests`), from the spec's `simulation.requests` and the work
one simulation may take. Called by planner/sim/stage.py (which simulates that many) and `decide` (which says so in stage
6's reasons when the work rule lowers the count). Pure arithmetic on the Problem; simulates nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servingtopology.planner.problem import Problem

__all__ = ["STAGE6_MIN_REQUESTS", "STAGE6_REQUESTS", "STAGE6_TOKENS", "Stage6Requests", "stage6_requests"]

# At most this many requests per simulated layout, whatever simulation.requests says (more steadies the percentiles
# little and costs CPU in every plan; `simulate` alone runs the spec's full count).
STAGE6_REQUESTS = 600
# At most this many simulated tokens (prompt + output) per layout: the simulator advances at least 10 M simulated tokens
# per CPU s (its floor in benchmarks/sim_speed.py; a 510k-token-prompt MoE under DP attention measured 9.7 M), so
# 2^25 tokens is about 3.4 CPU s a layout. Prompts of up to ~55k tokens (600 requests) are not affected.
STAGE6_TOKENS = 1 << 25
# Never fewer than this by the token rule: after the warm-up (at most a quarter) 75 requests are measured, so a p95 rests
# on the 4 slowest and a queue that outgrows the layout still shows as a miss (a 510k-token-prompt PD pin at 80 % of its
# analytical capacity: p95 TTFT 568 s over 32 requests, 1,408 s over 64, 2,071 s over 128, against a 600 s SLO).
STAGE6_MIN_REQUESTS = 100


@dataclass(frozen=True, slots=True)
class Stage6Requests:
    """Requests to simulate per layout, and why fewer than asked ("" when the spec's count, at most 600, stands)."""

    requests: int
    reason: str = ""


def stage6_requests(problem: Problem) -> Stage6Requests:
    """Requests per simulated layout (Stage6SizedToTheWork): min(simulation.requests, STAGE6_REQUESTS), lowered to
    STAGE6_TOKENS / (mean prompt + mean output tokens) for long requests, never below STAGE6_MIN_REQUESTS by that rule.

    The simulator's cost grows with the tokens it simulates (prefill chunks, decode steps), not with the request count, so
    a 510k-token prompt costs what 250 prompts of 2k do; 600 of them are 311 M tokens, 30 CPU s or more a layout.
    """
    asked = min(problem.simulation.requests, STAGE6_REQUESTS)
    w = problem.workload
    per_request_tokens = max(w.input_tokens.expected_tokens + w.output_tokens.expected_tokens, 1.0)
    by_tokens = max(STAGE6_MIN_REQUESTS, math.floor(STAGE6_TOKENS / per_request_tokens))
    if by_tokens >= asked:
        return Stage6Requests(asked)
    return Stage6Requests(by_tokens, f"{by_tokens:,} requests simulated per layout, not {asked:,}: requests of ~{per_request_tokens:,.0f} "
                                     f"tokens, at most {STAGE6_TOKENS:,} simulated tokens a layout (never under "
                                     f"{STAGE6_MIN_REQUESTS} requests)")
