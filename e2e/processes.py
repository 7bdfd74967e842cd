"""Starts and stops the harness's child processes so that none outlives the test run.

Every child runs in its own process group with a parent-death signal (Linux prctl), so it dies even if the
test runner is killed; `stop_all` terminates groups in reverse start order, then kills stragglers. Used by
e2e/cluster.py and the scenarios. Must not signal any process it did not start.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ComponentDied(RuntimeError):
    """A supervised process exited while something waited for it; carries its log tail."""


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the parent thread goes away."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Child:
    """One supervised process and the log file that holds its stdout and stderr."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def raise_if_dead(self) -> None:
        """Raises ComponentDied, with the log tail, when the process has exited."""
        if not self.alive():
            raise ComponentDied(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Supervisor:
    """Owns the children; `stop_all` leaves none behind."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Child:
        """Starts `argv` in a new process group, logging to `<log_dir>/<name>.log`."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
            )
        child = Child(name=name, popen=popen, log_path=log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child, *, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signals the child's process group, waits `grace_s`, then kills the group."""
        if child.alive():
            _signal_group(child.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=grace_s)
        _signal_group(child.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(timeout=5)
        if child in self.children:
            self.children.remove(child)

    def kill(self, child: Child) -> None:
        """Kills the child at once (SIGKILL), as a crash would."""
        self.stop(child, grace_s=0.0, sig=signal.SIGKILL)

    def stop_all(self) -> None:
        """Stops every child, newest first."""
        for child in reversed(list(self.children)):
            self.stop(child, grace_s=5.0)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the child leads its own group (start_new_session)


def wait_until(predicate: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.5,
               on_timeout: Callable[[], str] | None = None) -> None:
    """Polls `predicate` until it is true; raises TimeoutError naming `what` (plus `on_timeout()` details)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except ComponentDied:
            raise
        except Exception:  # a failing probe counts as "not yet"
            pass
        if time.monotonic() > deadline:
            detail = on_timeout() if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{detail}")
        time.sleep(interval_s)


def http_ok(url: str, *, context: object | None = None, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:  # type: ignore[arg-type]
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# Ports handed out by live e2e processes on this host, one "PORT PID" line each, read and written under an exclusive
# flock: `make e2e` runs its scenarios in parallel workers (pytest-xdist), each with its own cluster, and a port one
# worker was handed (etcd's, or the API server's or Prometheus' while a scenario has stopped it) must not be handed to
# another before its process binds it again. Lines of processes that have ended are dropped.
PORT_CLAIMS = Path(tempfile.gettempdir()) / "st-e2e-ports"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that no live e2e process on this host (this one
    included) has handed out before (PORT_CLAIMS).

    The kernel may hand the same free port to two bind(0) calls in a row (etcd's client and peer ports are asked
    for back to back, before either process binds); a port handed out once is never handed out again while the
    process it was handed to lives."""
    import socket

    with PORT_CLAIMS.open("a+") as claims:
        fcntl.flock(claims, fcntl.LOCK_EX)
        claims.seek(0)
        held: dict[int, int] = {}
        for line in claims.read().splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and _pid_alive(int(fields[1])):
                held[int(fields[0])] = int(fields[1])
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in held:
                held[port] = os.getpid()
                claims.seek(0)
                claims.truncate()
                claims.write("".join(f"{p} {pid}\n" for p, pid in held.items()))
                claims.flush()
                return port
    raise OSError("no fresh free port after 100 tries")
