"""Whether each role's KV pool per rank holds what that role must hold: the one memory-and-context test.

The funnel's stage 3 asks it of arrays of rows (planner.search.funnel, planner.search.pd_space); a pinned, compared or
simulated layout asks it of each of its roles (`memory_refusal`: planner.search.decide, the CLI's simulate); a
mixed-kind PD layout on each role's own kind (planner.perf.mixed_pd). Pure arithmetic over planner.perf.memory's pools;
the pools of attention-DP ranks are never added to admit one request.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from servingtopology.planner.hardware import Gpu
from servingtopology.planner.layout import Layout, LayoutKind, Role
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.problem import Problem

__all__ = ["MemoryShortfall", "Longest", "MemoryRefusal", "longest_of", "tokens_to_hold", "shortfall", "memory_refusal"]


class MemoryShortfall(enum.StrEnum):
    """Why a role's rank pool fails stage 3; the values are the funnel's reason keys."""

    NO_POOL = "weights and activations leave no KV pool"
    SHORT = "KV pool shorter than the longest request"


@dataclass(frozen=True, slots=True)
class Longest:
    """The longest prompt and the longest request (prompt + output) a layout must hold, in tokens, and whose they are
    (`source`: "the workload's p99", "the trace's longest")."""

    prompt_tokens: float
    request_tokens: float
    source: str = "the workload's p99"


def longest_of(problem: Problem) -> Longest:
    """What the search holds every candidate to: the p99 prompt, and the p99 prompt plus the p99 output
    (planner.perf.analytic.load_shape's longest_prompt_tokens and longest_request_tokens)."""
    w = problem.workload
    return Longest(prompt_tokens=w.input_tokens.p99_tokens, request_tokens=w.input_tokens.p99_tokens + w.output_tokens.p99_tokens)


def tokens_to_hold(role: Role, longest: Longest) -> float:
    """Tokens one rank of `role` must hold for one request: a prefill rank the prompt (its KV stays there until it moves to
    decode; the output is generated on decode), a decode or aggregated rank the prompt and the whole output."""
    return longest.prompt_tokens if role is Role.PREFILL else longest.request_tokens


def shortfall(pool_tokens: Any, need_tokens: Any) -> tuple[Any, Any]:
    """(no pool, too short) masks of rank pools against the tokens they must hold; a pool passes when neither is set."""
    pool = np.asarray(pool_tokens, dtype=np.float64)
    no_pool = pool <= 0
    return no_pool, ~no_pool & (pool < need_tokens)


@dataclass(frozen=True, slots=True)
class MemoryRefusal:
    """A role whose rank pool cannot hold what it must: the spec's field for it, the pool and the need (tokens), and the
    sentence a user reads."""

    role: Role
    field: str
    pool_tokens: int
    need_tokens: int
    shortfall: MemoryShortfall
    reason: str


def memory_refusal(problem: Problem, layout: Layout, *, longest: Longest | None = None,
                   gpus: Mapping[Role, Gpu] | None = None) -> MemoryRefusal | None:
    """The first role of `layout` whose rank pool fails stage 3's test (`shortfall`), or None.

    `longest`: what to hold (default: the search's, `longest_of`); `gpus`: each role's GPU kind (default: the problem's).
    The pool is the engine's per rank with the role's own knobs (planner.perf.memory.kv_pool_tokens).
    """
    need = longest or longest_of(problem)
    for role, r in layout.roles.items():
        gpu = (gpus or {}).get(role, problem.gpu)
        pool = kv_pool_tokens(problem.model, gpu, engine=problem.engine, precision=problem.precision, parallelism=r.parallelism,
                              knobs=r.knobs)
        hold = tokens_to_hold(role, need)
        no_pool, short = shortfall(pool, hold)
        if not (no_pool or short):
            continue
        kind = MemoryShortfall.NO_POOL if no_pool else MemoryShortfall.SHORT
        field = "layout" if layout.kind is LayoutKind.REPLICAS else f"layout.{role.value}"
        what = "prompt" if role is Role.PREFILL else "request (prompt + output)"
        who = "engine" if role is Role.AGGREGATED else role.value
        rank = f"each {who} rank ({r.parallelism.label_for(problem.engine)}, memoryFraction {r.knobs.memory_fraction:g}, on {gpu.id})"
        has = (f"{rank} has no KV pool: its weights and activations take all the memory the fraction leaves" if no_pool
               else f"{rank} holds {pool:,} KV tokens")
        stays = " (its KV stays on the prefill rank until it moves to decode)" if role is Role.PREFILL else ""
        reason = (f"{has}; {need.source} {what} is {math.ceil(hold):,} tokens{stays}. Ranks' pools are never added for one "
                  f"request: raise {field}.engineArgs.memoryFraction, shard the weights wider (TP or PP), or shorten the requests")
        return MemoryRefusal(role, field, int(pool), math.ceil(hold), kind, reason)
    return None
