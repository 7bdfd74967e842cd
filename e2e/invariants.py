"""Watches one ServingTopology while a fault scenario runs and checks, at every sample, the two promises a
transition makes: the GPU budget and the serving floor.

Every `interval_s` (1 s) it reads, as the cluster admin, the resource's engine pods, its entry Service and its
status, and keeps one `Sample`:
- GPU budget: the GPUs requested by every engine pod of the resource that still exists (a terminating pod holds
  its GPUs until it is gone) never exceed spec.hardware.maxGPUs + spec.policy.maxSurgeGPUs.
- Serving floor: the pods that take client traffic are the Ready, not terminating pods that the entry Service
  (`<name>`) routes to (its set, or every set while it spans two). Their capacity in req/s, priced by the operator's own capacity function
  (planner/live/replan_decision.py `capacity_of`, at the workload and calibration the transition is judged at, as
  `transition_step` does), never falls below the floor the transition declared (status.replan
  transitionFloorRps). The floor holds from the change that started the transition (`mark_change`) to the next
  change: the first step may run in the pass whose status declares it, and a transition only finishes when its
  target alone carries the floor (planner/live/transition.py).

Sampling continues through faults (an API server that is down gives no sample; the gap is reported: nothing in
the cluster can change while it is down). Used by e2e/test_faults.py; reads only, never writes.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.replan import ReplanMemory
from servingtopology.planner.layout import Layout, Role
from servingtopology.planner.live.calibration import combined
from servingtopology.planner.live.replan_decision import capacity_of
from servingtopology.planner.live.transition import Phase
from servingtopology.spec import to_problem

GROUP, VERSION, PLURAL = "servingtopology.io", "v1alpha1", "servingtopologies"
INSTANCE = "app.kubernetes.io/instance"
SET_LABEL = "servingtopology.io/set"
ROLE_LABEL = "servingtopology.io/role"
SERVING_LABEL = "servingtopology.io/serving"
GPU = "nvidia.com/gpu"
REQUEST_TIMEOUT_S = (3.0, 10.0)   # connect, read: a hung call must not stall the sampler
# The floor check allows the float noise of re-pricing the same layouts in another process, nothing more.
FLOOR_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the resource: GPUs held, what serves traffic, and the transition its status declares."""

    at_s: float
    segment: int                                   # how many `mark_change` calls came before it
    gpus_held: int
    budget_gpus: int
    serving: Mapping[tuple[str, str], int]         # (set, role) -> Ready, not terminating serving pods
    floor_rps: float | None                        # the running transition's declared floor; None when none runs
    transition: str                                # "from→to phase" of status.replan.transition, "" when none
    started_s: float | None                        # the transition's startedS (a resumed transition keeps it)

    @property
    def ready_serving(self) -> int:
        return sum(self.serving.values())


@dataclass
class _Pricing:
    """The capacity function of one transition and the shapes of the sets it names."""

    capacity: Callable[[Layout], float]
    shapes: dict[str, Layout]
    floor_rps: float


@dataclass
class Report:
    """What the checks found over the whole watch."""

    samples: int
    errors: int
    longest_gap_s: float
    max_gpus_held: int
    budget_gpus: int
    min_serving_rps: float | None                  # over the samples a floor applied to
    floor_rps: float | None                        # the highest floor any transition declared
    min_ready_serving: int
    transitions: list[str]
    over_budget: list[Sample]
    under_floor: list[tuple[Sample, float, float]]  # (sample, capacity, floor)
    unknown_sets: list[str]
    started_per_change: dict[int, list[float]]     # segment -> the distinct startedS of the transitions seen in it

    def line(self) -> str:
        cap = "-" if self.min_serving_rps is None else f"{self.min_serving_rps:.2f}"
        floor = "-" if self.floor_rps is None else f"{self.floor_rps:.2f}"
        return (f"{self.samples} samples ({self.errors} failed reads, longest gap {self.longest_gap_s:.1f} s); "
                f"GPUs held max {self.max_gpus_held} of budget {self.budget_gpus}; serving capacity min {cap} req/s "
                f"against floor {floor} req/s; Ready serving pods min {self.min_ready_serving}; "
                f"transitions {' | '.join(self.transitions) or '-'}; transitions started per change "
                f"{[len(v) for v in self.started_per_change.values() if v] or '-'}")

    @property
    def changes_started_twice(self) -> int:
        """Changes for which more than one transition was started (a pass that planned from a stale copy, or a
        restart that began again instead of carrying on from status)."""
        return sum(1 for v in self.started_per_change.values() if len(v) > 1)


@dataclass
class TopologyWatch:
    """Samples `namespace/name` every `interval_s` until stopped; a context manager. `check()` asserts."""

    kubeconfig: Path
    namespace: str
    name: str
    interval_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _segment: int = 0
    _pricing: dict[tuple[int, float], _Pricing] = field(default_factory=dict)   # (segment, startedS) -> pricing
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _started: float = 0.0

    def __enter__(self) -> TopologyWatch:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        configuration.retries = False   # a failed read is a gap in the samples, not three retries' worth of warnings
        api = client.ApiClient(configuration)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="topology-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def mark_change(self) -> None:
        """Call right before the scenario changes the resource: a new transition's floor holds from here."""
        with self._lock:
            self._segment += 1

    def sample_now(self) -> Sample | None:
        """Takes one sample at once (besides the periodic ones); None when the read failed."""
        return self._take()

    def read(self) -> dict[str, Any]:
        """The resource as the API server has it now."""
        return dict(self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                              _request_timeout=REQUEST_TIMEOUT_S))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self.interval_s)

    def _take(self) -> Sample | None:
        with self._lock:
            segment = self._segment
        try:
            # The Service before the pods: the operator points it at a set only once that set's pods are Ready and
            # drains the old set after it, so pods listed after the selector was read are never the new set's, not
            # yet Ready, under a selector that already names it (the other order can see that mix on a slow read).
            selector = self._entry_selector()
            obj = self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                            _request_timeout=REQUEST_TIMEOUT_S)
            pods = self._core.list_namespaced_pod(self.namespace, label_selector=f"{INSTANCE}={self.name}",
                                                  _request_timeout=REQUEST_TIMEOUT_S).items
        except Exception as exc:  # an API server that is down: keep sampling, report the gap
            self.errors.append(f"{time.monotonic() - self._started:.1f} s: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        sample = self._sample(time.monotonic() - self._started, segment, obj, pods, selector)
        with self._lock:
            self.samples.append(sample)
        return sample

    def _entry_selector(self) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            service = self._core.read_namespaced_service(self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(service.spec.selector or {})

    def _sample(self, at_s: float, segment: int, obj: Mapping[str, Any], pods: list[Any],
                selector: Mapping[str, str] | None) -> Sample:
        spec = obj.get("spec") or {}
        budget = int(spec.get("hardware", {}).get("maxGPUs", 0)) + int(spec.get("policy", {}).get("maxSurgeGPUs", 0))
        gpus = 0
        serving: dict[tuple[str, str], int] = {}
        # The sets taking traffic: the one the entry Service pins, or every set when it selects across sets
        # (operator/render/manifests.py build_entry_service); none while the Service does not exist.
        pinned_set = None if selector is None else selector.get(SET_LABEL)
        for pod in pods:
            if (pod.status.phase or "") in ("Succeeded", "Failed"):
                continue   # a finished pod no longer holds its GPUs (as the operator counts, operator/cluster/cluster_view.py)
            for container in pod.spec.containers:
                limits = (container.resources.limits or {}) if container.resources else {}
                gpus += int(limits.get(GPU, 0))
            labels = pod.metadata.labels or {}
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            engine = any(c.name == "engine" for c in pod.spec.containers)
            in_serving_set = selector is not None and (pinned_set is None or labels.get(SET_LABEL) == pinned_set)
            if (ready and engine and in_serving_set and pod.metadata.deletion_timestamp is None
                    and labels.get(SERVING_LABEL) == "true"):
                key = (labels.get(SET_LABEL, ""), labels.get(ROLE_LABEL, ""))
                serving[key] = serving.get(key, 0) + 1
        memory = ReplanMemory.from_dict((obj.get("status") or {}).get("replan"))
        state = memory.transition
        floor: float | None = None
        described = ""
        started: float | None = None
        if state is not None:
            described = f"{state.from_set}→{state.to_set} {state.phase.value}"
            started = state.started_s
            if state.phase not in (Phase.DONE, Phase.FAILED):
                floor = memory.transition_floor_rps
                key = (segment, state.started_s)
                if key not in self._pricing:
                    self._pricing[key] = _pricing(spec, memory)
        return Sample(at_s=at_s, segment=segment, gpus_held=gpus, budget_gpus=budget, serving=serving, floor_rps=floor,
                      transition=described, started_s=started)

    # ---- the checks ------------------------------------------------------------------------------------

    def report(self) -> Report:
        with self._lock:
            samples = list(self.samples)
            pricing = dict(self._pricing)
        per_segment: dict[int, list[_Pricing]] = {}
        for (segment, _), p in sorted(pricing.items(), key=lambda kv: kv[0]):
            per_segment.setdefault(segment, []).append(p)
        under: list[tuple[Sample, float, float]] = []
        unknown: set[str] = set()
        low: float | None = None
        for s in samples:
            chosen = per_segment.get(s.segment)
            if not chosen:
                continue     # no transition declared since the last change: no floor to hold
            shapes: dict[str, Layout] = {}
            for p in chosen:
                shapes.update(p.shapes)
            p = max(chosen, key=lambda x: x.floor_rps)
            cap = _serving_capacity(s.serving, shapes, p.capacity, unknown)
            low = cap if low is None else min(low, cap)
            if cap < p.floor_rps * (1 - FLOOR_TOLERANCE):
                under.append((s, cap, p.floor_rps))
        gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(samples)]
        served = [s.ready_serving for s in samples]
        first = next((i for i, n in enumerate(served) if n), len(served))
        return Report(
            samples=len(samples), errors=len(self.errors), longest_gap_s=max(gaps, default=0.0),
            max_gpus_held=max((s.gpus_held for s in samples), default=0),
            budget_gpus=max((s.budget_gpus for s in samples), default=0),
            min_serving_rps=low, floor_rps=max((p.floor_rps for p in pricing.values()), default=None),
            min_ready_serving=min(served[first:], default=0),
            transitions=list(dict.fromkeys(s.transition.rsplit(" ", 1)[0] for s in samples if s.transition)),
            over_budget=[s for s in samples if s.gpus_held > s.budget_gpus], under_floor=under, unknown_sets=sorted(unknown),
            started_per_change={seg: sorted({s.started_s for s in samples if s.segment == seg and s.started_s is not None})
                                for seg in sorted({s.segment for s in samples})},
        )

    def check(self, *, min_samples: int = 5) -> Report:
        """Asserts the budget and the floor at every sample; returns the report (print its `line()`)."""
        report = self.report()
        assert report.samples >= min_samples, f"only {report.samples} samples: {self.errors[-5:]}"
        assert not report.over_budget, ("GPUs held over the budget", report.over_budget[:5])
        assert not report.under_floor, ("serving capacity below the transition's floor",
                                        [(s.at_s, s.serving, round(c, 3), round(f, 3)) for s, c, f in report.under_floor[:5]])
        assert not report.unknown_sets, f"pods of sets no transition names took traffic: {report.unknown_sets}"
        return report


def _pricing(spec: Mapping[str, Any], memory: ReplanMemory) -> _Pricing:
    """The capacity function `transition_step` judges this transition by (operator/replan.py), and its sets' shapes."""
    state = memory.transition
    assert state is not None
    problem = to_problem(parse_topology_spec(dict(spec)))
    problem = replace(problem, workload=memory.assumed or problem.workload, factors=combined(problem.factors, memory.calibration.factors))
    return _Pricing(capacity=capacity_of(problem), shapes={state.from_set: state.source, state.to_set: state.target},
                    floor_rps=memory.transition_floor_rps)


def _serving_capacity(serving: Mapping[tuple[str, str], int], shapes: Mapping[str, Layout],
                      capacity: Callable[[Layout], float], unknown: set[str]) -> float:
    """Capacity of the serving pods: each set's layout at its Ready counts (a role with none carries nothing)."""
    per_set: dict[str, dict[Role, int]] = {}
    for (set_name, role), n in serving.items():
        if set_name not in shapes or role not in {r.value for r in shapes[set_name].roles}:
            unknown.add(f"{set_name}/{role}")
            continue
        per_set.setdefault(set_name, {})[Role(role)] = n
    total = 0.0
    for set_name, counts in per_set.items():
        layout = shapes[set_name]
        if any(counts.get(r, 0) <= 0 for r in layout.roles):
            continue
        at = Layout(layout.kind, {r: replace(rl, count=counts[r]) for r, rl in layout.roles.items()}, layout.precision)
        value = float(capacity(at))
        total += value if math.isfinite(value) else 0.0
    return total
