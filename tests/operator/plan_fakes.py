"""Planner stand-ins for the plan worker's tests; module level, so the worker's child process can import them."""

from __future__ import annotations

import os
import time

from cases import decision

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.layout import Layout, Parallelism
from servingtopology.planner.problem import Decision, Problem


def quick(problem: Problem) -> Decision:
    return decision(Layout.replicas(2, Parallelism(tp=4)))


def slow(problem: Problem) -> Decision:
    """A plan that takes 1.5 s (longer than a pass waits for it)."""
    time.sleep(1.5)
    return quick(problem)


def endless(problem: Problem) -> Decision:
    time.sleep(3600)
    return quick(problem)


def hungry(problem: Problem) -> Decision:
    """Touches 4 GiB, as the #17 plan of maxNumSeqs 20,000,000 grew past the chart's 1 GiB limit."""
    chunks = [bytearray(256 << 20) for _ in range(16)]
    assert len(chunks) == 16
    return quick(problem)


def infeasible(problem: Problem) -> Decision:
    raise Infeasible("slo", "p95 TTFT 2000 ms > 300 ms", funnel=("row",))


def crash(problem: Problem) -> Decision:
    os._exit(3)


def spinning(problem: Problem) -> Decision:
    """A plan that works (burns CPU) without end."""
    while True:
        sum(range(10_000))
