"""`servingtopology emulate`: serves vLLM- or SGLang-shaped `/metrics` for engines that are not really running.

Cluster mode (default): one emulated engine per Ready engine pod found through the kubeconfig, listening at
the pod's address with `--at-pod-address`, and a status file kept current (see servingtopology/emulator/fleet.py).
Single mode (`--args`): one engine from a command line, for demos without a cluster or GPUs. `--real-engines` names
rules under which chosen pods run the real engine from their own command line instead (emulator/real_engine.py).
Reads the traffic profile and rules files here; the
emulator package does no file reading of its own beyond the files it is told to write.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from servingtopology.cli.output_paths import check_output
from servingtopology.emulator.command_parser import EngineArgsError, parse_engine_command
from servingtopology.emulator.engine import SimulatorKind, build_simulator, gpu_for_label
from servingtopology.emulator.fleet import Fleet, pod_view, refused_status
from servingtopology.emulator.instance import EmulatedInstance, Share
from servingtopology.emulator.real_engine import RealEngineRules, RealEngineRulesError, parse_rules
from servingtopology.emulator.traffic import TrafficProfile, TrafficProfileError
from servingtopology.planner.errors import InvalidSpec
from servingtopology.spec import load_yaml

__all__ = ["add_parser", "run"]

log = logging.getLogger("servingtopology.emulate")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "emulate", help="serve engine-shaped /metrics from the simulator, for tests and demos",
        description="Serve vLLM- or SGLang-shaped /metrics for engines that are not really running, driven by the step-level "
                    "simulator and a traffic profile. Cluster mode (default): one emulated engine per Ready engine pod found "
                    "through the kubeconfig, read from the pod's own engine command line. Single mode (--args): one engine "
                    "from a command line, for demos without a cluster or GPUs. For tests and demos; it serves no completions.")
    p.add_argument("--profile", type=Path, help="traffic profile YAML/JSON (phases of rate_rps, input_tokens, output_tokens, "
                   "duration_s); re-read when it changes. Default: 2 rps of 1000 in / 200 out tokens")
    p.add_argument("--kubeconfig", help="cluster mode: kubeconfig to list pods and nodes with (default: the usual lookup)")
    p.add_argument("--namespace", help="cluster mode: only this namespace (default: all)")
    p.add_argument("--selector", default="", help="cluster mode: pod label selector (default: every pod running an engine)")
    p.add_argument("--group-label", default="app.kubernetes.io/instance",
                   help="pods with the same value share one traffic profile (default: %(default)s)")
    p.add_argument("--role-label", default="servingtopology.io/role", help="label naming a pod's PD role (a tie-breaker)")
    p.add_argument("--at-pod-address", action="store_true",
                   help="cluster mode: serve each engine at its pod's IP and engine port, where Prometheus' Kubernetes "
                        "discovery looks (needs pod IPs local to this host, e.g. kwok with a 127.0.0.0/8 pod CIDR)")
    p.add_argument("--status", type=Path, help="cluster mode: JSON file listing instances and argument errors")
    p.add_argument("--interval-s", type=float, default=1.0, help="cluster mode: seconds between pod listings")
    p.add_argument("--args", dest="engine_args", help="single mode: the engine command line, e.g. 'vllm serve llama-3.1-8b -tp 1'")
    gpu = p.add_argument("--gpu", default="h100_sxm", help="single mode: GPU type (default: %(default)s)")
    gpu.catalog = "gpu"  # completes with the catalog's ids (cli/completion.py)
    p.add_argument("--host", default="127.0.0.1", help="address the metrics servers bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=0, help="single mode: metrics port (default: any free port)")
    p.add_argument("--simulator", choices=[k.value for k in SimulatorKind], default=SimulatorKind.PROJECT.value,
                   help="project: planner.sim replayed in chunks (aggregated engines); builtin: the emulator's own "
                        "continuous-batching stepper (default: %(default)s; PD roles always use builtin)")
    p.add_argument("--real-engines", type=Path,
                   help="cluster mode: YAML rules choosing pods that run the real engine from their own command line instead of "
                        "an emulated one (re-read on change; see servingtopology/emulator/real_engine.py)")
    p.add_argument("--log-level", default="INFO")


class _ProfileFile:
    """The traffic profile, re-read when the file's modification time changes; a bad edit keeps the last good one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.mtime_ns = -1
        self.profile = TrafficProfile.constant(rate_rps=2.0, input_tokens=1000, output_tokens=200)
        self._lock = threading.Lock()
        if path is not None:
            self.profile = _load_profile(path)
            self.mtime_ns = path.stat().st_mtime_ns

    def __call__(self) -> TrafficProfile:
        if self.path is None:
            return self.profile
        with self._lock:
            try:
                mtime_ns = self.path.stat().st_mtime_ns
                if mtime_ns != self.mtime_ns:
                    self.mtime_ns = mtime_ns
                    self.profile = _load_profile(self.path)
                    log.info("traffic profile reloaded: %s", self.profile)
            except (OSError, TrafficProfileError, yaml.YAMLError) as exc:
                log.error("traffic profile %s unusable, keeping the previous one: %s", self.path, exc)
            return self.profile


class _RealEngineRulesFile:
    """The real-engine rules, re-read when the file changes; a bad edit keeps the last good rules."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.stamp: tuple[int, int] | None = None
        self.rules = RealEngineRules()

    def __call__(self) -> RealEngineRules:
        if self.path is None:
            return self.rules
        try:
            st = self.path.stat()
        except OSError:
            self.stamp, self.rules = None, RealEngineRules()
            return self.rules
        if (st.st_mtime_ns, st.st_size) != self.stamp:
            self.stamp = (st.st_mtime_ns, st.st_size)
            try:
                self.rules = parse_rules(load_yaml(self.path.read_text()))
                log.info("real-engine rules reloaded: %d rule(s)", len(self.rules.rules))
            except (OSError, RealEngineRulesError, yaml.YAMLError) as exc:
                log.error("real-engine rules %s unusable, keeping the previous ones: %s", self.path, exc)
        return self.rules


def _load_profile(path: Path) -> TrafficProfile:
    raw = load_yaml(path.read_text())
    if not isinstance(raw, dict):
        raise TrafficProfileError(f"{path}: expected a mapping with 'phases'")
    return TrafficProfile.from_mapping(raw)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        profile = _ProfileFile(args.profile)
    except (OSError, TrafficProfileError, yaml.YAMLError) as exc:
        print(f"error: --profile: {exc}", file=sys.stderr)
        return 2
    try:
        check_output("--status", args.status)
    except InvalidSpec as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.engine_args:
        return _run_single(args, profile, stop)
    return _run_cluster(args, profile, stop)


def _run_single(args: argparse.Namespace, profile: _ProfileFile, stop: threading.Event) -> int:
    import shlex

    try:
        config = parse_engine_command(shlex.split(args.engine_args))
        simulator = build_simulator(config, gpu=gpu_for_label(args.gpu), kind=SimulatorKind(args.simulator))
    except EngineArgsError as exc:
        print(f"error: --args: {exc}", file=sys.stderr)
        return 2
    instance = EmulatedInstance(name="engine", config=config, simulator=simulator, host=args.host, port=args.port,
                                share=lambda _t: Share(profile().phase_at(_t), 1.0)).start()
    print(json.dumps({"metrics": f"http://{instance.address}/metrics", "engine": str(config.engine),
                      "role": str(config.role)}), flush=True)
    stop.wait()
    instance.stop()
    return 0


def _report_refusals(api: Any, fleet: Fleet, views: list[Any], raw: dict[str, Any]) -> None:
    """Write the status the kubelet would for engines that refuse their arguments (the engine's message as the
    container's termination message), as kwok's pods run nothing."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for view in views:
        key = f"{view.namespace}/{view.name}/{view.uid}"
        message = fleet.refusal(key)
        body = refused_status(raw[key], view.container, message, now=now) if message else None
        if body is not None:
            api.patch_namespaced_pod_status(view.name, view.namespace, body)
            log.info("pod %s: engine exited: %s", key, message)


def _run_cluster(args: argparse.Namespace, profile: _ProfileFile, stop: threading.Event) -> int:
    from kubernetes import client, config

    config.load_kube_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    api = client.CoreV1Api()
    fleet = Fleet(profile=profile, group_label=args.group_label, role_label=args.role_label, status_path=args.status,
                  host=args.host, at_pod_address=args.at_pod_address, simulator=SimulatorKind(args.simulator),
                  real_engines=_RealEngineRulesFile(args.real_engines))
    serialize: Callable[[object], dict[str, Any]] = client.ApiClient().sanitize_for_serialization
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                if args.namespace:
                    pods = api.list_namespaced_pod(args.namespace, label_selector=args.selector)
                else:
                    pods = api.list_pod_for_all_namespaces(label_selector=args.selector)
                nodes = api.list_node()
                products = {n.metadata.name: (n.metadata.labels or {}).get("nvidia.com/gpu.product", "") for n in nodes.items
                            if n.metadata is not None and n.metadata.name is not None}   # the API server always sets both
                raw = {f"{p.metadata.namespace}/{p.metadata.name}/{p.metadata.uid}": serialize(p) for p in pods.items if p.metadata is not None}
                views = [v for v in (pod_view(r) for r in raw.values()) if v is not None]
                fleet.sync(views, products)
                _report_refusals(api, fleet, views, raw)
            except Exception as exc:  # the API server may restart under us; keep serving what we have
                log.warning("pod listing failed, retrying: %s", exc)
            stop.wait(max(args.interval_s - (time.monotonic() - started), 0.05))
    finally:
        fleet.stop()
    return 0
