"""Mutable per-request and per-step records of one simulation run, turned into a `SimResult` at the end.

Written by the ranks and the event loop while they run; read only through `SimResult`. Arrays are
indexed by request id (the position in the `RequestSet`). Times are simulated seconds.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .requests import RequestSet

__all__ = ["Ledger"]


class Ledger:
    """Per-request timestamps and counters plus a step timeline, appended cheaply (lists of arrays)."""

    __slots__ = (
        "_itl_s",
        "_itl_w",
        "_tl_instance",
        "_tl_kv",
        "_tl_run",
        "_tl_t",
        "_tl_wait",
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
        "requests",
        "scheduled_s",
    )

    def __init__(self, requests: RequestSet) -> None:
        n = len(requests)
        self.requests = requests
        self.arrival_s = np.full(n, np.nan)
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.prefill_done_s = np.full(n, np.nan)
        self.out_done = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.preempted_at_s = np.full(n, np.nan)
        self._itl_s: list[npt.NDArray[np.float64]] = []
        self._itl_w: list[float] = []
        self._tl_t: list[float] = []
        self._tl_kv: list[float] = []
        self._tl_run: list[int] = []
        self._tl_wait: list[int] = []
        self._tl_instance: list[int] = []
        self.preemptions_total = 0
        self.preemption_times_s: list[float] = []
        self.now_s = 0.0

    def gaps(self, durations_s: npt.NDArray[np.float64], weight: float) -> None:
        """Record inter-token gaps: each step duration counts once per sequence that decoded in it."""
        if weight > 0 and len(durations_s):
            self._itl_s.append(durations_s)
            self._itl_w.append(float(weight))  # expanded to one weight per gap by itl()

    def gap(self, duration_s: float) -> None:
        self._itl_s.append(np.array([duration_s]))
        self._itl_w.append(1.0)

    def sample(self, *, t_s: float, instance: int, kv_used_frac: float, running: int, waiting: int) -> None:
        """Append one timeline point (after a step or a burst of steps)."""
        if t_s < self.now_s - 1e-9:
            raise AssertionError(f"simulated time went back: {t_s} < {self.now_s}")
        self.now_s = max(self.now_s, t_s)
        self._tl_t.append(t_s)
        self._tl_kv.append(kv_used_frac)
        self._tl_run.append(running)
        self._tl_wait.append(waiting)
        self._tl_instance.append(instance)

    def itl(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        if not self._itl_s:
            return np.zeros(0), np.zeros(0)
        counts = np.fromiter((len(d) for d in self._itl_s), dtype=np.int64, count=len(self._itl_s))
        return np.concatenate(self._itl_s), np.repeat(np.asarray(self._itl_w, dtype=np.float64), counts)

    def timeline(self) -> dict[str, npt.NDArray[np.float64]]:
        return {
            "t_s": np.asarray(self._tl_t, dtype=np.float64),
            "kv_used_frac": np.asarray(self._tl_kv, dtype=np.float64),
            "running": np.asarray(self._tl_run, dtype=np.float64),
            "waiting": np.asarray(self._tl_wait, dtype=np.float64),
            "instance": np.asarray(self._tl_instance, dtype=np.float64),
        }
