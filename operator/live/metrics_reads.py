"""Metrics reads off the reconcile threads: a bounded pool of readers, at most one read in flight per resource.

Called by operator/live_replan.py (the production metrics factory) and built once per Runtime by operator/entry/handlers.py.
A Prometheus URL is a resource author's: its server may be slow on purpose. A pass therefore never waits on a read
longer than `wait_s`; a read still running raises `MetricsPending`, the pass goes on without a sample (nothing is
written about metrics), and a later pass of the same resource takes the finished read. Must not decide anything.

Rules it names:
- OneReadPerResource: a resource's second pass while its read runs starts no other read; its readers slot is
  freed only when the read ends (each read is bounded by its own deadline, operator/live/metrics.py READ_DEADLINE_S), so
  ten slow tenants hold at most `readers` threads and no reconcile thread at all.
- FreshAnswer: a finished read answers only the request it was started for (same URL, token, queries) and only for
  `keep_s`; otherwise it is dropped and a new read starts.
- SaturationShown: a read still waiting for a reader `saturated_s` after it was queued (every reader busy with other
  resources' reads) is `MetricsUnavailable` with reason MetricsReadersSaturated, naming the readers and the wait, so
  MetricsAvailable stops saying MetricsFlowing about figures no read has refreshed; the read stays queued, and its
  answer is taken by the first pass after it ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from servingtopology.operator.live.metrics import MetricsSource, MetricsUnavailable
from servingtopology.planner.live.observe import MetricSample

__all__ = ["MetricsPending", "MetricsReads", "READERS", "READ_WAIT_S", "KEEP_S", "SATURATED_S", "READERS_SATURATED"]

READERS = 4          # reads at once, all resources together
READ_WAIT_S = 1.0    # how long a pass waits for the read it started
KEEP_S = 600.0       # a finished read nobody took is dropped after this long
SATURATED_S = 10.0   # a read queued this long without a reader shows the saturation (SaturationShown)
READERS_SATURATED = "MetricsReadersSaturated"


class MetricsPending(Exception):
    """The resource's read runs (or waits for a reader); the pass writes nothing about metrics this time."""


@dataclass
class _Read:
    request: Any
    future: Future[MetricSample]
    queued_s: float = 0.0
    started_s: float | None = None     # when a reader took it (None: every reader busy)
    finished_s: float | None = None


@dataclass
class MetricsReads:
    """A metrics factory whose sources read in a bounded pool (see the module docstring)."""

    inner: Callable[[Any], MetricsSource]
    readers: int = READERS
    wait_s: float = READ_WAIT_S
    keep_s: float = KEEP_S
    saturated_s: float = SATURATED_S
    clock: Callable[[], float] = time.monotonic
    _reads: dict[str, _Read] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.readers), thread_name_prefix="metrics-read")

    def __call__(self, request: Any) -> MetricsSource:
        return _PooledSource(self, request)

    def in_flight(self) -> int:
        """Reads queued or running."""
        with self._lock:
            return sum(1 for r in self._reads.values() if not r.future.done())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def read(self, request: Any, *, at_s: float, interval_s: float) -> MetricSample:
        """The sample of `request`'s finished read; else start one (OneReadPerResource) and wait up to `wait_s` for it.

        Raises MetricsPending while it runs, MetricsUnavailable (MetricsReadersSaturated) while it has waited over
        `saturated_s` for a reader (SaturationShown), and whatever the read raised (MetricsUnavailable) once it ended."""
        key = str(getattr(request, "owner", "") or id(request))
        now = self.clock()
        with self._lock:
            self._forget_stale(now)
            read = self._reads.get(key)
            if read is not None and read.future.done():
                del self._reads[key]
                if read.request == request:
                    return read.future.result()
                read = None     # an answer to an older request (FreshAnswer)
            started = read is None
            if read is None:
                read = _Read(request, Future(), queued_s=now)
                self._reads[key] = read
                assert self._pool is not None
                self._pool.submit(self._run, read, request, at_s, interval_s)
        if started:
            try:
                sample = read.future.result(timeout=self.wait_s)
            except FutureTimeout:
                raise MetricsPending(f"reading Prometheus (up to {self.wait_s:g} s waited; the answer is taken next pass)") from None
            except BaseException:
                self._take(key, read)
                raise
            self._take(key, read)
            return sample
        if read.started_s is None and now - read.queued_s > self.saturated_s:
            raise MetricsUnavailable(f"the operator's {self.readers} metrics readers are all busy with other resources' reads: "
                                     f"this resource's read has waited {now - read.queued_s:.0f} s for one and is still queued "
                                     "(its answer is taken once it runs); the figures in status are not fresh", READERS_SATURATED)
        raise MetricsPending("a read of this resource's Prometheus is still running; the answer is taken next pass")

    def _take(self, key: str, read: _Read) -> None:
        with self._lock:
            if self._reads.get(key) is read:
                del self._reads[key]

    def _forget_stale(self, now: float) -> None:
        stale = [k for k, r in self._reads.items() if r.finished_s is not None and now - r.finished_s > self.keep_s]
        for k in stale:
            del self._reads[k]

    def _run(self, read: _Read, request: Any, at_s: float, interval_s: float) -> None:
        read.started_s = self.clock()
        try:
            sample = self.inner(request).fetch_sample(at_s=at_s, interval_s=interval_s)
        except BaseException as exc:
            read.finished_s = self.clock()
            read.future.set_exception(exc)
            return
        read.finished_s = self.clock()
        read.future.set_result(sample)


@dataclass(frozen=True, slots=True)
class _PooledSource:
    reads: MetricsReads
    request: Any

    def fetch_sample(self, *, at_s: float, interval_s: float) -> MetricSample:
        return self.reads.read(self.request, at_s=at_s, interval_s=interval_s)
