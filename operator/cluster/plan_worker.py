"""Planning off the operator's threads: every plan runs in a child process of its own, with a wall-time and a
memory budget, so one resource's plan can fail (or be killed) without taking the operator or another resource down.

Called by operator/entry/handlers.py (the Runtime's planner) and operator/entry/main.py (which builds the worker). The reconcile
sees a plain `Planner` (Problem -> Decision) and three outcomes besides a Decision:

- `PlanPending`: the plan runs (or waits for a slot) in the worker; the pass stops and is requeued, so the handler
  thread is free for other resources' passes at once (a plan never holds a pass longer than `wait_s`);
- `PlanBudgetExceeded`: the child went over its budget (wall time, or address space: RLIMIT_AS in the child) and was
  killed; the resource gets a condition naming the budget;
- the planner's own errors (InvalidSpec, Infeasible, ...), raised again in the caller.

Plans are keyed by the Problem's digest (the planner is pure: the same Problem gives the same Decision), so a pass
that comes again for the same generation, or a queued pass holding a stale copy of the object, never plans twice.
`run(fn, argument)` puts any other pure planning function (a ServingPool's plan, operator/pool_pass.py) in the same
children, slots and budget, keyed by the function's name and the argument's digest.
A failed plan (over budget, crashed child) is kept for an exponentially growing back-off before it is tried again.

Children are started from a forkserver (a single-threaded process that has the planner imported), never forked
from the operator's threaded process; see the multiprocessing docs, "Contexts and start methods".
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
import os
import pickle
import resource
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from servingtopology.planner.problem import Decision, Problem

__all__ = ["PlanBudget", "PlanBudgetExceeded", "PlanCost", "PlanPending", "PlanWorker", "plan_with_simulator", "blocking", "FAILURE_BACKOFF_S",
           "FAILURE_BACKOFF_CAP_S"]

LOG = logging.getLogger(__name__)
MIB = 1 << 20
FAILURE_BACKOFF_S = 60.0          # a failed plan of the same Problem is tried again after 60 s, 120 s, ... at most 30 min
FAILURE_BACKOFF_CAP_S = 1800.0
RESULT_TTL_S = 1800.0             # a finished plan is reused for 30 min (a pure function: only memory bounds it)
MAX_RESULTS = 256
# What the forkserver imports once, so that every child starts with the planner loaded (fork, not a fresh import);
# plan_preload, last, runs a small plan (what plans load lazily) and freezes the collector's view of it all.
PRELOAD = ("servingtopology.planner.search.decide", "servingtopology.planner.sim.stage", "servingtopology.operator.cluster.plan_worker",
           "servingtopology.operator.entry.plan_preload")


@dataclass(frozen=True, slots=True)
class PlanBudget:
    """What one plan may use: wall seconds, and MiB of address space beyond what the child starts with.

    The defaults (PlanBudgetFollowsTheWork) are the operator's (--plan-timeout-s, --plan-memory-mib) and the chart's
    (operator.plan.timeoutSeconds, .memoryMiB), raised to what the largest measured plans the spec allows need, with a
    margin (benchmarks/long_prompt.py and benchmarks/README.md, "Budgets that follow the work"): a plan of
    hardware.maxGPUs 16,384 (the spec's limit, the wide 70B example) grew 550 MiB and took 6.1 CPU s; 8,192 GPUs 275
    MiB; seed 000's 510k-token MoE plan 55-62 MiB and 2.6-4.8 CPU s; a small model's plan 34-40 MiB."""

    wall_s: float = 30.0
    memory_mib: int = 768


@dataclass(frozen=True, slots=True)
class PlanCost:
    """What one answered plan used: CPU seconds, and MiB of address space beyond the child's start (its peak)."""

    cpu_s: float
    memory_mib: float


class PlanBudgetExceeded(Exception):
    """The plan went over its budget and was killed; `kind` is "time" or "memory". The message names the budget, what
    the plan had used when it was stopped (`detail`), the spec fields that make a plan smaller (each one the operator's
    problem reads: spec.search, spec.simulation, spec.hardware, policy.mode Pinned) and the setting that raises the
    budget (the chart's value and the operator's flag)."""

    def __init__(self, budget: PlanBudget, kind: str, detail: str = "") -> None:
        what = (f"planning took > {budget.wall_s:g} s wall" if kind == "time"
                else f"planning needed > {budget.memory_mib} MiB of address space")
        raise_it = ("operator.plan.timeoutSeconds (--plan-timeout-s)" if kind == "time"
                    else "operator.plan.memoryMiB (--plan-memory-mib) with resources.limits.memory")
        super().__init__(f"{what}{f' ({detail})' if detail else ''}; the plan was stopped. Narrow spec.search (layouts, tp, "
                         "pp, dp, preset), lower spec.search.topK, spec.simulation.requests or spec.hardware.maxGPUs, pin a "
                         f"layout (policy.mode Pinned with spec.pinned), or raise the operator's budget: {raise_it}")
        self.budget, self.kind, self.detail = budget, kind, detail


class PlanPending(Exception):
    """The plan runs in the worker (or waits for a slot); ask again after `retry_after_s`."""

    def __init__(self, *, running_s: float, queued_ahead: int, retry_after_s: float, future: Future[Any] | None = None) -> None:
        state = f"running for {running_s:.0f} s" if queued_ahead < 0 else f"queued behind {queued_ahead} other plans"
        super().__init__(f"planning in the worker ({state})")
        self.running_s, self.queued_ahead, self.retry_after_s = running_s, queued_ahead, retry_after_s
        self.future = future      # done when the plan is: a caller may wait on it without holding a thread


def plan_with_simulator(problem: Problem) -> Decision:
    """The operator's planner: stage 6 (the step-level simulator) checks the top K, as `servingtopology plan` does, with
    the spec's simulation.requests and .seed (the Problem's SimulationBudget, sized to the work by
    planner.search.stage6_size: what PlanBudgetExceeded's advice to lower spec.simulation.requests acts on)."""
    from servingtopology.planner.search.decide import decide
    from servingtopology.planner.sim.stage import stage6_figures

    return decide(problem, simulate=stage6_figures)


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _peak_address_space_bytes() -> int:
    """VmPeak: the most address space this process has held (what RLIMIT_AS bounds)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    return _address_space_bytes()


def _cpu_s_of(pid: int) -> float | None:
    """A live child's CPU seconds (user + system, /proc/PID/stat), read before it is killed; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _portable(exc: BaseException) -> tuple[type[BaseException], str, dict[str, Any]]:
    """An exception as (class, message, attributes): the planner's exceptions take keyword-only arguments, which
    plain pickling of `args` cannot rebuild."""
    attrs = dict(getattr(exc, "__dict__", {}))
    try:
        pickle.dumps((type(exc), attrs))
    except Exception:
        attrs = {}
    return type(exc), str(exc), attrs


def _rebuild(cls: type[BaseException], message: str, attrs: dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls)
    BaseException.__init__(exc, message)
    exc.__dict__.update(attrs)
    return exc


def _child(conn: Any, fn: Callable[[Any], Any], problem: Any, memory_mib: int) -> None:
    """In the child: cap the address space, plan, send ("ok", decision) or ("raise", portable exception), with the
    plan's cost: its CPU seconds and the address space it grew by (VmPeak over the start: at most what it held)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    start = _address_space_bytes()
    if memory_mib > 0:
        limit = start + memory_mib * MIB
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        out: tuple[str, Any] = ("ok", fn(problem))
    except MemoryError:
        out = ("memory", "")
    except BaseException as exc:
        out = ("raise", _portable(exc))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cost = PlanCost(cpu_s=usage.ru_utime + usage.ru_stime, memory_mib=max(0, _peak_address_space_bytes() - start) / MIB)
    try:
        conn.send((*out, cost))
    except MemoryError:
        conn.send(("memory", "while sending the result", cost))
    finally:
        conn.close()


@dataclass
class _Job:
    future: Future[Any]
    submitted_s: float
    started_s: float | None = None
    finished_s: float | None = None
    failures: int = 0              # consecutive failed attempts of this Problem (over budget, crashed)


def problem_digest(problem: Any) -> str:
    return hashlib.sha256(pickle.dumps(problem, protocol=5)).hexdigest()


def _fn_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass
class PlanWorker:
    """A bounded number of plan children (`slots`), each under `budget`; plans are shared by Problem digest."""

    fn: Callable[[Problem], Decision] = plan_with_simulator
    budget: PlanBudget = field(default_factory=PlanBudget)
    slots: int = 2
    wait_s: float = 1.0            # how long a pass waits for its plan before it is requeued
    start_method: str = "forkserver"
    clock: Callable[[], float] = time.monotonic
    on_plan_s: Callable[[float], None] | None = None     # told each plan's wall seconds (answered or not)
    _jobs: OrderedDict[str, _Job] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: ThreadPoolExecutor | None = None
    _ctx: Any = None
    plans_started: int = 0
    plans_failed: int = 0
    plans_cpu_s: float = 0.0       # CPU seconds of the children that answered
    last_cost: PlanCost | None = None   # the cost of the last plan that answered (benchmarks/long_prompt.py prints it)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.slots), thread_name_prefix="plan")
        self._ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            self._ctx.set_forkserver_preload(list(PRELOAD))

    # --- the Planner seam -------------------------------------------------------------------------------------

    def __call__(self, problem: Problem) -> Decision:
        """Plan, waiting at most `wait_s`; PlanPending when the plan is still running (the pass is requeued)."""
        return self.plan(problem, wait_s=self.wait_s)

    def plan(self, problem: Problem, *, wait_s: float | None) -> Decision:
        """The plan of `problem`; wait_s None waits for it (each child is bounded by the budget's wall time)."""
        key = problem_digest(problem)
        job = self._job(key, self.fn, problem)
        try:
            return job.future.result(timeout=wait_s)  # type: ignore[no-any-return]
        except FutureTimeout:
            raise self._pending(job) from None

    def run(self, fn: Callable[[Any], Any], argument: Any, *, wait_s: float | None) -> Any:
        """`fn(argument)` in a child under the budget, as a plan is (`fn` a pure, module-level function: the child gets
        it pickled); PlanPending after `wait_s`, PlanBudgetExceeded over the budget, `fn`'s own errors raised again."""
        job = self._job(f"{_fn_name(fn)}:{problem_digest(argument)}", fn, argument)
        try:
            return job.future.result(timeout=wait_s)
        except FutureTimeout:
            raise self._pending(job) from None

    def blocking(self, problem: Problem) -> Decision:
        """For callers whose Problem changes from pass to pass (live replans): wait for the plan in the worker."""
        return self.plan(problem, wait_s=None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- bookkeeping --------------------------------------------------------------------------------------------

    def _job(self, key: str, fn: Callable[[Any], Any], problem: Any) -> _Job:
        now = self.clock()
        with self._lock:
            self._expire(now)
            job = self._jobs.get(key)
            if job is not None and not self._due_again(job, now):
                self._jobs.move_to_end(key)
                return job
            failures = job.failures if job is not None else 0
            new = _Job(future=Future(), submitted_s=now, failures=failures)
            self._jobs[key] = new
            assert self._pool is not None
            self._pool.submit(self._run, new, fn, problem)
            return new

    def _due_again(self, job: _Job, now: float) -> bool:
        """A failed job is tried again once its back-off has passed; a finished plan is reused."""
        if job.finished_s is None or not job.future.done() or not isinstance(job.future.exception(), PlanBudgetExceeded | ChildFailed):
            return False
        backoff: float = min(FAILURE_BACKOFF_S * 2 ** max(0, job.failures - 1), FAILURE_BACKOFF_CAP_S)
        return now - job.finished_s >= backoff

    def _expire(self, now: float) -> None:
        stale = [k for k, j in self._jobs.items() if j.finished_s is not None and now - j.finished_s > max(RESULT_TTL_S, FAILURE_BACKOFF_CAP_S)]
        for k in stale:
            del self._jobs[k]
        while len(self._jobs) > MAX_RESULTS:
            oldest = next((k for k, j in self._jobs.items() if j.finished_s is not None), None)
            if oldest is None:
                break
            del self._jobs[oldest]

    def _pending(self, job: _Job) -> PlanPending:
        now = self.clock()
        with self._lock:
            if job.started_s is not None:
                return PlanPending(running_s=now - job.started_s, queued_ahead=-1, retry_after_s=min(self.budget.wall_s, 5.0),
                                   future=job.future)
            ahead = sum(1 for j in self._jobs.values() if j.finished_s is None and j.submitted_s < job.submitted_s)
        waiting = max(0, ahead - self.slots + 1)
        return PlanPending(running_s=0.0, queued_ahead=waiting, retry_after_s=min(2.0 + waiting, 10.0), future=job.future)

    def pending(self) -> int:
        """Plans queued or running."""
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.finished_s is None)

    # --- the child ----------------------------------------------------------------------------------------------

    def _run(self, job: _Job, fn: Callable[[Any], Any], problem: Any) -> None:
        job.started_s = self.clock()
        self.plans_started += 1
        try:
            decision = self._in_child(fn, problem)
        except BaseException as exc:
            if isinstance(exc, PlanBudgetExceeded | ChildFailed):
                job.failures += 1
                self.plans_failed += 1
            job.finished_s = self.clock()
            job.future.set_exception(exc)
            return
        job.failures = 0
        job.finished_s = self.clock()
        job.future.set_result(decision)

    def _in_child(self, fn: Callable[[Any], Any], problem: Any) -> Any:
        receiver, sender = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=_child, args=(sender, fn, problem, self.budget.memory_mib), daemon=True,
                                 name="servingtopology-plan")
        started = time.monotonic()
        try:
            return self._answer(proc, receiver, sender, problem, started)
        finally:
            if self.on_plan_s is not None:
                self.on_plan_s(time.monotonic() - started)

    def _answer(self, proc: Any, receiver: Any, sender: Any, problem: Any, started: float) -> Any:
        proc.start()
        sender.close()
        try:
            if not receiver.poll(self.budget.wall_s):
                used_s = _cpu_s_of(proc.pid)
                proc.kill()
                raise PlanBudgetExceeded(self.budget, "time", "" if used_s is None else f"{used_s:.1f} CPU s used")
            try:
                kind, payload, cost = receiver.recv()
                with self._lock:
                    self.plans_cpu_s += cost.cpu_s
                    self.last_cost = cost
                LOG.debug("plan %s: %s after %.1f s wall, %.2f CPU s, %.0f MiB", problem_digest(problem)[:12], kind,
                          time.monotonic() - started, cost.cpu_s, cost.memory_mib)
            except (EOFError, OSError):
                proc.join(5.0)
                code = proc.exitcode
                if code == -signal.SIGKILL:   # the kernel's OOM killer (the container's memory limit)
                    raise PlanBudgetExceeded(self.budget, "memory", "killed by the kernel's OOM killer") from None
                raise ChildFailed(f"the planning process exited with {code} after {time.monotonic() - started:.1f} s") from None
        finally:
            receiver.close()
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
            with contextlib.suppress(Exception):
                proc.close()
        if kind == "ok":
            return payload
        if kind == "memory":
            raise PlanBudgetExceeded(self.budget, "memory", payload)
        raise _rebuild(*payload)


class ChildFailed(Exception):
    """The planning process died without an answer (not over a budget we set)."""


def blocking(planner: Callable[[Problem], Decision]) -> Callable[[Problem], Decision]:
    """The waiting form of a planner when it is a PlanWorker (live replans), else the planner itself."""
    wait = getattr(planner, "blocking", None)
    return wait if callable(wait) else planner
