"""Mutable per-request and per-step records of one simulation run, turned into a `SimResult` at the end.

Written by the ranks and the event loop while they run; read only through `SimResult`. Arrays are
indexed by request id (the position in the `RequestSet`). Times are simulated seconds.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from servingtopology.planner.sim.requests import RequestSet

__all__ = ["Ledger"]


class Ledger:
    """Per-request timestamps and counters plus a step timeline, appended cheaply (lists of arrays)."""

    __slots__ = (
        "_itl_s",
        "_itl_w",
        "_tl",
        "arrival_s",
        "cached_tokens",
        "finish_s",
        "first_token_s",
        "now_s",
        "out_done",
        "preempted_at_s",
        "preemption_times_s",
        "preemptions",
        "preemptions_total",
        "prefill_done_s",
        "prefix_key_of",
        "prompt_of",
        "requests",
        "scheduled_s",
    )

    def __init__(self, requests: RequestSet) -> None:
        n = len(requests)
        self.requests = requests
        self.prompt_of: list[int] = requests.prompt_tokens.tolist()  # per request, read without numpy scalars
        self.prefix_key_of: list[int] = requests.prefix_key.tolist()
        self.arrival_s = np.full(n, np.nan)
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.prefill_done_s = np.full(n, np.nan)
        self.out_done: list[int] = [0] * n  # outputs a request had produced when it last left a rank (read per admission)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.preempted_at_s = np.full(n, np.nan)
        self._itl_s: list[npt.NDArray[np.float64] | float] = []  # a burst's step durations, or one step's
        self._itl_w: list[float] = []
        self._tl: list[tuple[float, float, int, int, int]] = []  # (t_s, kv_used_frac, running, waiting, instance)
        self.preemptions_total = 0
        self.preemption_times_s: list[float] = []
        self.now_s = 0.0

    def gaps(self, durations_s: npt.NDArray[np.float64], weight: float) -> None:
        """Record inter-token gaps: each step duration counts once per sequence that decoded in it."""
        if weight > 0 and len(durations_s):
            self._itl_s.append(durations_s)
            self._itl_w.append(float(weight))  # expanded to one weight per gap by itl()

    def gap(self, duration_s: float, weight: float = 1.0) -> None:
        """One step's gap, counted `weight` times (kept as a float: no array per step)."""
        if weight > 0:
            self._itl_s.append(duration_s)
            self._itl_w.append(float(weight))

    def sample(self, t_s: float, instance: int, kv_used_frac: float, running: int, waiting: int) -> None:
        """Append one timeline point (after a step or a burst of steps)."""
        if t_s < self.now_s - 1e-9:
            raise AssertionError(f"simulated time went back: {t_s} < {self.now_s}")
        if t_s > self.now_s:
            self.now_s = t_s
        self._tl.append((t_s, kv_used_frac, running, waiting, instance))

    def itl(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        if not self._itl_s:
            return np.zeros(0), np.zeros(0)
        values: list[float] = []
        counts: list[int] = []
        for d in self._itl_s:
            if isinstance(d, float):
                values.append(d)
                counts.append(1)
            else:
                values.extend(d.tolist())  # the same floats
                counts.append(len(d))
        return np.array(values, dtype=np.float64), np.repeat(np.asarray(self._itl_w, dtype=np.float64), counts)

    def timeline(self) -> dict[str, npt.NDArray[np.float64]]:
        columns = np.array(self._tl, dtype=np.float64).reshape(-1, 5).T.copy()  # one row per field, contiguous
        return dict(zip(("t_s", "kv_used_frac", "running", "waiting", "instance"), columns, strict=True))
