"""A real engine for a pod instead of an emulated one: the pod's own command line, run as a process here.

Chosen per pod by the fleet (emulator/fleet.py) from a rules file (`servingtopology emulate --real-engines FILE`,
re-read on every poll): a rule names a namespace and says how a container's world maps onto this machine, as a
kubelet would — the executable the image runs (`commands`, e.g. vllm → a venv's vllm), the volumes
(`paths`: a container path prefix → a local folder) and the environment. The pod's network namespace is the one
thing that cannot be kept: its `--host` becomes the loopback address and its `--port` a free port, because every
engine here shares one network. Every other argument goes to the engine exactly as the operator rendered it,
so the engine's own parser, start-up and /metrics are what the tests see.

Used by the real-engine e2e scenario (e2e/test_real_engine.py), which runs vLLM's CPU build on a tiny model.
"""

from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servingtopology.emulator.command_parser import EngineConfig
from servingtopology.planner.layout import Role

__all__ = ["RealEngineRule", "RealEngineRules", "RealEngineInstance", "RealEngineRulesError", "local_argv", "parse_rules"]

_PR_SET_PDEATHSIG = 1
_HOST_FLAGS = ("--host",)
_PORT_FLAGS = ("--port",)


class RealEngineRulesError(ValueError):
    """The rules file is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class RealEngineRule:
    """Pods in namespaces matching `namespace` (a glob) run the real engine, mapped onto this machine."""

    namespace: str
    commands: Mapping[str, str]             # the container's executable → a local one
    paths: Mapping[str, str] = field(default_factory=dict)   # container path prefix → local folder
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: str = ""
    host: str = "127.0.0.1"

    def matches(self, namespace: str) -> bool:
        return fnmatch.fnmatchcase(namespace, self.namespace)


@dataclass(frozen=True, slots=True)
class RealEngineRules:
    rules: tuple[RealEngineRule, ...] = ()

    def for_namespace(self, namespace: str) -> RealEngineRule | None:
        return next((r for r in self.rules if r.matches(namespace)), None)


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str | int | float) for k, v in value.items()):
        raise RealEngineRulesError(f"{where} must be a mapping of strings to strings")
    return {k: str(v) for k, v in value.items()}


def parse_rules(data: Any) -> RealEngineRules:
    """Rules from `{rules: [{namespace, commands, paths, env, logDir, host}, ...]}`."""
    if data is None:
        return RealEngineRules()
    if not isinstance(data, dict) or not isinstance(data.get("rules", []), list):
        raise RealEngineRulesError("the real-engine rules file must be a mapping with a list 'rules'")
    out = []
    for i, raw in enumerate(data.get("rules", [])):
        where = f"rules[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("namespace"), str):
            raise RealEngineRulesError(f"{where}.namespace must be a string (a glob over namespaces)")
        unknown = set(raw) - {"namespace", "commands", "paths", "env", "logDir", "host"}
        if unknown:
            raise RealEngineRulesError(f"{where}: unknown fields {sorted(unknown)}; allowed: namespace, commands, paths, env, logDir, host")
        commands = _str_map(raw.get("commands"), f"{where}.commands")
        if not commands:
            raise RealEngineRulesError(f"{where}.commands must map the container's executable to a local one, e.g. {{vllm: /venv/bin/vllm}}")
        out.append(RealEngineRule(namespace=raw["namespace"], commands=commands, paths=_str_map(raw.get("paths"), f"{where}.paths"),
                                  env=_str_map(raw.get("env"), f"{where}.env"), log_dir=str(raw.get("logDir") or ""),
                                  host=str(raw.get("host") or "127.0.0.1")))
    return RealEngineRules(tuple(out))


def _map_path(value: str, paths: Mapping[str, str]) -> str:
    for prefix in sorted(paths, key=len, reverse=True):
        if value == prefix or value.startswith(prefix.rstrip("/") + "/"):
            return paths[prefix] + value[len(prefix.rstrip("/")):] if value != prefix else paths[prefix]
    return value


def local_argv(argv: Sequence[str], rule: RealEngineRule, *, port: int, host: str | None = None) -> list[str]:
    """The pod's command line mapped onto this machine: the executable, path prefixes, --host and --port.

    Raises RealEngineRulesError when the rule maps no executable for the container's command."""
    if not argv:
        raise RealEngineRulesError("the pod has no command")
    exe = rule.commands.get(argv[0]) or rule.commands.get(Path(argv[0]).name)
    if exe is None:
        raise RealEngineRulesError(f"no local executable for the container command {argv[0]!r}; the rule maps {sorted(rule.commands)}")
    out = [exe]
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=")
        if flag in _HOST_FLAGS + _PORT_FLAGS:
            new = (host or rule.host) if flag in _HOST_FLAGS else str(port)
            if eq:
                out.append(f"{flag}={new}")
            else:
                out.extend([flag, new])
                i += 1  # skip the pod's value
        elif eq and flag.startswith("--"):
            out.append(f"{flag}={_map_path(value, rule.paths)}")
        else:
            out.append(_map_path(arg, rule.paths))
        i += 1
    return out


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the emulator goes away."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def _descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of the processes below `pid` (the engine's own workers, e.g. vLLM's EngineCore)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        st = _stat(entry) if entry.isdigit() else None
        if st is not None:
            children.setdefault(st[0], []).append((int(entry), st[1]))
    out: list[tuple[int, int]] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p[0], []))
    return out


class RealEngineInstance:
    """One real engine process for one pod; same face as EmulatedInstance to the fleet (address, config, role)."""

    backend = "real"

    def __init__(self, *, name: str, config: EngineConfig, argv: Sequence[str], rule: RealEngineRule,
                 host: str | None = None, port: int | None = None) -> None:
        """`host`/`port`: where the engine listens (the pod's IP and engine port); default the rule's host, a free port."""
        self.name = name
        self.config = config
        self.rule = rule
        self.host = host or rule.host
        self.port = port or _free_port(self.host)
        self.argv = local_argv(argv, rule, port=self.port, host=self.host)
        self.log_path = Path(rule.log_dir or ".") / f"engine-{name}.log"
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def role(self) -> Role:
        return self.config.role

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self) -> RealEngineInstance:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.rule.env}
        with self.log_path.open("ab") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            # Run where the log is, not in the caller's folder: a checkout of this project has an operator/ package that
            # would shadow the standard library's `operator` in the engine's spawned workers.
            self._popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                           cwd=self.log_path.parent, preexec_fn=_die_with_parent)
        return self

    def exit_code(self) -> int | None:
        """None while the engine runs; its exit status once it has exited."""
        return None if self._popen is None else self._popen.poll()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM (vLLM shuts its engine core down), then SIGKILL whatever of it is left."""
        if self._popen is None:
            return
        below = _descendants(self._popen.pid)
        if self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self._popen.poll() is None:
                self._popen.kill()
        for pid, started in below:  # only the very processes seen below it (a reused pid has another start time)
            st = _stat(pid)
            if st is not None and st[1] == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
