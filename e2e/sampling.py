"""Samples a topology's engine pods in the background while a scenario changes it: GPUs held and Ready pods.

Used by the transition scenarios to check the invariants throughout, not only at the end: the GPUs held by
every engine pod that exists (terminating ones too, they still hold them) never exceed the budget, and the
Ready serving pods never drop below a floor once the topology has served.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTANCE = "app.kubernetes.io/instance"


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    gpus_held: int
    ready_serving_pods: int
    pods: int


@dataclass
class PodSampler:
    """Lists the topology's pods every `interval_s` until stopped; a context manager."""

    kubeconfig: Path
    namespace: str
    name: str
    interval_s: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started_s: float = 0.0

    def __enter__(self) -> PodSampler:
        from kubernetes import client, config

        self._api = client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))
        # The first sample is taken here, before the scenario changes anything: scenarios read it as "what served
        # before the change", which a first sample left to the thread could miss on a loaded machine.
        self._started_s = time.monotonic()
        self.samples.append(_sample(0.0, self._list()))
        self._thread = threading.Thread(target=self._run, name="pod-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _list(self) -> list[Any]:
        return list(self._api.list_namespaced_pod(self.namespace, label_selector=f"{INSTANCE}={self.name}").items)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                pods = self._list()
                self.samples.append(_sample(time.monotonic() - self._started_s, pods))
            except Exception as exc:  # keep sampling; the scenario decides whether gaps matter
                self.errors.append(repr(exc))

    def max_gpus_held(self) -> int:
        return max((s.gpus_held for s in self.samples), default=0)

    def min_ready_after_first_serving(self) -> int:
        """Fewest Ready serving pods seen after the first sample that had one (0 if it never served)."""
        seen = False
        low = 0
        for s in self.samples:
            if s.ready_serving_pods and not seen:
                seen, low = True, s.ready_serving_pods
            elif seen:
                low = min(low, s.ready_serving_pods)
        return low


def _sample(at_s: float, pods: list[Any]) -> Sample:
    gpus = ready = 0
    for pod in pods:
        engine = [c for c in pod.spec.containers if c.name == "engine"]
        if not engine:
            continue
        limits = (engine[0].resources.limits or {}) if engine[0].resources else {}
        gpus += int(limits.get("nvidia.com/gpu", 0))
        serving = (pod.metadata.labels or {}).get("servingtopology.io/serving", "true") == "true"
        is_ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
        if serving and is_ready and pod.metadata.deletion_timestamp is None:
            ready += 1
    return Sample(at_s=at_s, gpus_held=gpus, ready_serving_pods=ready, pods=len(pods))
