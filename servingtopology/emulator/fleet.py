"""Keeps one emulated engine per Ready engine pod, serving at the pod's own address as the real engine would.

Called by `servingtopology emulate` in cluster mode. Each poll lists pods (and nodes, for the GPU product),
starts an `EmulatedInstance` for every new Ready pod whose command is vLLM or SGLang, stops those whose pod
went away, and rewrites a status JSON (instances and argument errors). With `at_pod_address` an instance
listens on the pod's IP and the port of its command line (kwok gives pods loopback IPs in the e2e cluster),
so Prometheus finds it through Kubernetes discovery like a real engine; the fleet plays no part in
discovery. A pod whose arguments are wrong, or whose address cannot be bound, gets no metrics endpoint.
A pod the real-engine rules select (`real_engines`, see emulator/real_engine.py) runs the real engine from its own
command line instead (at the pod's address too); one that exits is reported with its exit status and log tail.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servingtopology.emulator.command_parser import EngineArgsError, EngineConfig, is_engine_command, parse_engine_command
from servingtopology.emulator.engine import SimulatorKind, build_simulator, gpu_for_label
from servingtopology.emulator.instance import EmulatedInstance, Share
from servingtopology.emulator.real_engine import RealEngineInstance, RealEngineRules, RealEngineRulesError
from servingtopology.emulator.traffic import TrafficProfile
from servingtopology.planner.engines.caps import load_caps
from servingtopology.planner.layout import Role

__all__ = ["Fleet", "PodView", "pod_view"]

log = logging.getLogger("servingtopology.emulate")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# Where each engine listens when its command line names no --port (vLLM's and SGLang's own defaults).
DEFAULT_ENGINE_PORT = {"vllm": 8000, "sglang": 30000}


@dataclass(frozen=True, slots=True)
class PodView:
    """What the fleet needs from a pod (taken from the API object so tests can build it directly)."""

    namespace: str
    name: str
    uid: str
    node: str
    ip: str
    labels: Mapping[str, str]
    argv: tuple[str, ...]
    container: str
    gpus: int
    ready: bool
    image: str = ""


def pod_view(pod: Mapping[str, Any]) -> PodView | None:
    """A `PodView` for a pod whose first engine container runs vLLM or SGLang, else None."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
    for container in spec.get("containers", []):
        argv = _expand(tuple(container.get("command") or ()) + tuple(container.get("args") or ()), container.get("env") or [])
        if is_engine_command(argv) is None:
            continue
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = (container.get("resources") or {}).get("requests") or {}
        gpus = int(limits.get(GPU_RESOURCE) or requests.get(GPU_RESOURCE) or 0)
        ready = status.get("phase") == "Running" and not meta.get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        return PodView(
            namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
            node=spec.get("nodeName") or "", ip=status.get("podIP") or "", labels=dict(meta.get("labels") or {}),
            argv=argv, container=container.get("name", ""), gpus=gpus, ready=ready, image=container.get("image") or "",
        )
    return None


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(argv: tuple[str, ...], env: list[Mapping[str, Any]]) -> tuple[str, ...]:
    """What the kubelet does to command and args: `$(NAME)` becomes the container env's literal value (LeaderWorkerSet
    injects LWS_WORKER_INDEX, LWS_LEADER_ADDRESS, LWS_GROUP_SIZE); a reference it cannot resolve stays as written."""
    values = {e["name"]: str(e["value"]) for e in env if "name" in e and "value" in e}
    return tuple(_VAR_REF.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in argv)


def refused_status(pod: Mapping[str, Any], container: str, message: str, *, now: str) -> dict[str, Any] | None:
    """The pod status the kubelet would write for an engine container that exits at start with `message`
    (argparse errors exit 2, the engine's other refusals 1; FallbackToLogsOnError keeps the message), or None
    when the pod already carries it."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container and ((cs.get("lastState") or {}).get("terminated") or {}).get("message") == message:
            return None
    code = 2 if ": error: " in message else 1
    image = next((c.get("image", "") for c in (pod.get("spec") or {}).get("containers", []) if c.get("name") == container), "")
    return {"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now},
                       {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now}],
        "containerStatuses": [{
            "name": container, "ready": False, "started": False, "restartCount": 1, "image": image, "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting failed container {container}"}},
            "lastState": {"terminated": {"exitCode": code, "reason": "Error", "message": message, "startedAt": now, "finishedAt": now}},
        }],
    }}


class Fleet:
    """The set of running emulated engines, reconciled against a pod listing on each `sync`."""

    def __init__(self, *, profile: Callable[[], TrafficProfile], group_label: str, role_label: str,
                 status_path: Path | None, host: str = "127.0.0.1", at_pod_address: bool = False,
                 simulator: SimulatorKind = SimulatorKind.PROJECT, monotonic: Callable[[], float] = time.monotonic,
                 real_engines: Callable[[], RealEngineRules] | None = None) -> None:
        """`at_pod_address`: listen on each pod's IP and engine port (else on `host`, any free port)."""
        self.simulator_kind = simulator
        self.real_engines = real_engines or RealEngineRules
        self.profile = profile
        self.group_label = group_label
        self.role_label = role_label
        self.status_path = status_path
        self.host = host
        self.at_pod_address = at_pod_address
        self._monotonic = monotonic
        self.instances: dict[str, tuple[PodView, EmulatedInstance | RealEngineInstance]] = {}
        self.errors: dict[str, str] = {}
        self._retry: set[str] = set()
        self._retry_seen: set[str] = set()
        self._lock = threading.Lock()
        self._profile_seen: TrafficProfile | None = None
        self._profile_epoch_s = monotonic()

    def _group(self, pod: PodView) -> str:
        return f"{pod.namespace}/{pod.labels.get(self.group_label, '')}"

    def _share(self, pod: PodView, role: Role) -> Callable[[float], Share]:
        group = self._group(pod)

        def share(_instance_s: float) -> Share:
            profile = self.profile()
            if profile != self._profile_seen:  # a new script starts from its first phase
                self._profile_seen, self._profile_epoch_s = profile, self._monotonic()
            with self._lock:
                peers = sum(1 for p, inst in self.instances.values() if self._group(p) == group and inst.role is role)
            phase = profile.phase_at(self._monotonic() - self._profile_epoch_s)
            return Share(phase=phase, fraction=1.0 / max(peers, 1))

        return share

    def sync(self, pods: list[PodView], node_products: Mapping[str, str]) -> None:
        """Starts instances for new Ready pods, stops those of pods gone or not Ready, and rewrites the files."""
        wanted = {f"{p.namespace}/{p.name}/{p.uid}": p for p in pods if p.ready}
        for key, (_, inst) in list(self.instances.items()):
            if isinstance(inst, RealEngineInstance) and (code := inst.exit_code()) is not None:
                self.instances.pop(key)
                inst.stop()
                self.errors[key] = f"the engine exited with status {code}:\n{inst.log_tail()}"
                log.error("engine of pod %s exited with %d", key, code)
        rules = self.real_engines()
        for key in self._retry:  # an address kwok hands out again may have been free only after the last sync
            self.errors.pop(key, None)
        self._retry.clear()
        for key in [k for k in self.instances if k not in wanted]:
            _, gone = self.instances.pop(key)
            gone.stop()
            log.info("stopped %s", key)
        for key in [k for k in self.errors if k not in wanted]:
            del self.errors[key]
        for key, pod in wanted.items():
            if key in self.instances or key in self.errors:
                continue
            rule = rules.for_namespace(pod.namespace)
            instance: EmulatedInstance | RealEngineInstance
            try:
                config = self._config(pod)
                host, port = self._address(pod, config)
                if rule is not None:  # the real engine: no simulator (its model need not be in the catalog)
                    instance = RealEngineInstance(name=pod.name, config=config, argv=pod.argv, rule=rule,
                                                  host=host if self.at_pod_address else None, port=port or None)
                else:
                    seed = zlib.crc32(key.encode())  # deterministic per pod, unlike hash()
                    simulator = build_simulator(config, gpu=gpu_for_label(node_products.get(pod.node)),
                                                kind=self.simulator_kind, seed=seed)
                    instance = EmulatedInstance(name=pod.name, config=config, simulator=simulator,
                                                share=self._share(pod, config.role), host=host, port=port, seed=seed)
            except (EngineArgsError, RealEngineRulesError) as exc:
                self.errors[key] = str(exc)
                log.error("engine in pod %s/%s would not start: %s", pod.namespace, pod.name, exc)
                continue
            except OSError as exc:  # the pod's address is not on this host, or still taken: tried again next sync
                if key not in self._retry_seen:
                    log.error("engine in pod %s/%s: cannot listen on %s:%d: %s", pod.namespace, pod.name, host, port, exc)
                self.errors[key] = f"cannot listen on {host}:{port}: {exc}"
                self._retry.add(key)
                self._retry_seen.add(key)
                continue
            with self._lock:
                self.instances[key] = (pod, instance.start())
            log.info("started %s (%s): %s %s role=%s tp=%d pp=%d dp=%d at %s", key, _backend(instance), config.engine, config.model,
                     config.role, config.tp, config.pp, config.dp, instance.address)
        self._refuse_pd_pairs()
        self._write_files()

    def _address(self, pod: PodView, config: EngineConfig) -> tuple[str, int]:
        if not self.at_pod_address:
            return self.host, 0
        return pod.ip, config.port if config.port is not None else DEFAULT_ENGINE_PORT[str(config.engine)]

    def _refuse_pd_pairs(self) -> None:
        """A decode engine that meets a prefill engine its release cannot pair with fails at the KV hand-off (vLLM
        0.11: "Decode TP cannot be smaller than prefill TP"); it stops with the rule's message."""
        for key, (pod, inst) in list(self.instances.items()):
            config = inst.config
            if config.role is not Role.DECODE or isinstance(inst, RealEngineInstance):  # a real engine judges for itself
                continue
            caps = load_caps(config.engine.value, config.version)
            rule = next((r for r in caps.pd_rules if r.id == "decode_tp_below_prefill_tp"), None)
            prefill_tp = max((other.config.tp for p, other in self.instances.values()
                              if other.config.role is Role.PREFILL and self._group(p) == self._group(pod)), default=0)
            if rule is not None and prefill_tp > config.tp:
                self.instances.pop(key)
                inst.stop()
                self.errors[key] = f"{rule.message} (decode TP {config.tp}, prefill TP {prefill_tp}; {caps.label}, {rule.source})"
                log.error("engine in pod %s/%s stopped: %s", pod.namespace, pod.name, self.errors[key])

    def _config(self, pod: PodView) -> EngineConfig:
        hint_raw = pod.labels.get(self.role_label, "")
        hint = Role(hint_raw) if hint_raw in {r.value for r in Role} else None
        config = parse_engine_command(pod.argv, role_hint=hint, image=pod.image)
        if config.ray and pod.gpus:
            # Ray executor: the instance spans the Ray cluster the leader waited for, pods of `pod.gpus` GPUs each.
            config = dataclasses.replace(config, nodes=max(1, config.gpus // pod.gpus))
        if pod.gpus and config.gpus_per_node != pod.gpus:
            raise EngineArgsError(f"arguments ask for {config.gpus_per_node} GPUs per pod (tp={config.tp}, pp={config.pp}, "
                                  f"dp={config.dp}, nnodes={config.nodes}) but the pod has {pod.gpus} {GPU_RESOURCE}")
        return config

    def stop(self) -> None:
        for _, instance in self.instances.values():
            instance.stop()
        self.instances.clear()
        self._write_files()

    def status(self) -> dict[str, Any]:
        return {
            "instances": {key: {"address": inst.address, "backend": _backend(inst), "engine": str(inst.config.engine), "role": str(inst.role),
                                "tp": inst.config.tp, "pp": inst.config.pp, "dp": inst.config.dp,
                                "model": inst.config.model, "version": inst.config.version}
                          for key, (_, inst) in self.instances.items()},
            "errors": dict(self.errors),
        }

    def refusal(self, key: str) -> str | None:
        """The message of an engine that refused to run (its arguments, a PD pairing, an exit), for the pod's status;
        None for an address still taken (tried again at the next sync: a pod marked failed would never be retried)."""
        return None if key in self._retry else self.errors.get(key)

    def _write_files(self) -> None:
        if self.status_path is not None:
            _atomic_write(self.status_path, json.dumps(self.status(), indent=1))


def _backend(instance: EmulatedInstance | RealEngineInstance) -> str:
    """`emulated`, or `real` for an engine run from the pod's own command line."""
    return "real" if isinstance(instance, RealEngineInstance) else "emulated"


def _atomic_write(path: Path, text: str) -> None:
    """Writes through a temporary file and a rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
