"""An in-memory `Cluster` for reconcile tests: server-side apply as replace-with-version, owner-reference
garbage collection, Events in a list, and a switch for whether the LeaderWorkerSet CRD is installed.

Deployments and LeaderWorkerSets report every replica ready unless `ready` is turned off (or the object is
named in `unready`), so tests can drive readiness; pods are synthesised from them (`terminating` adds pods
that linger after a delete or a scale-down). Not a Kubernetes emulator: no admission, no defaulting, no watches.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from servingtopology.operator.cluster.admission import AdmissionRefusal
from servingtopology.operator.cluster.cluster import MANAGED_KINDS, ObjectRef, ref_of
from servingtopology.operator.render.manifests import LWS_API_VERSION, MANAGED_BY, TOPOLOGY_LABEL


@dataclass
class RecordedEvent:
    type: str
    reason: str
    message: str
    regarding: str


@dataclass
class FakeCluster:
    lws_installed: bool = False
    ready: bool = True
    objects: dict[ObjectRef, dict[str, Any]] = field(default_factory=dict)
    events: list[RecordedEvent] = field(default_factory=list)
    config_maps: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)   # namespace -> its labels
    unready: set[str] = field(default_factory=set)              # object names whose replicas never become ready
    refused: dict[str, str] = field(default_factory=dict)       # Deployment name -> why its pods cannot be created
    terminating: list[dict[str, Any]] = field(default_factory=list)  # pods still holding GPUs after their owner shrank
    nodes: list[dict[str, Any]] | None = None                   # None: capacity unknown (not checked)
    other_pods: list[dict[str, Any]] = field(default_factory=list)  # other tenants' pods, bound to nodes
    grace_passes: int = 0        # > 0: pods removed by a scale-down or a delete linger as terminating for this many ticks
    applies: int = 0
    reads: list[ObjectRef] = field(default_factory=list)   # every GET, in order
    lists: int = 0                                          # owned_objects() calls (a LIST per kind each)
    admission_refusals: dict[str, tuple[str, str]] = field(default_factory=dict)   # object name -> (reason, message) its dry-run gets
    dry_runs: list[ObjectRef] = field(default_factory=list)                       # every admit() call, in order
    removed_annotations: list[tuple[ObjectRef, str, str]] = field(default_factory=list)   # (object, key, the value tested)
    _version: int = 0

    def apply(self, obj: Mapping[str, Any]) -> bool:
        before = self._pods_of(ref_of(obj))
        changed = self._apply(obj)
        self._linger(before, self._pods_of(ref_of(obj)))
        return changed

    def _apply(self, obj: Mapping[str, Any]) -> bool:
        ref = ref_of(obj)
        if ref.api_version == LWS_API_VERSION and not self.lws_installed:
            raise AssertionError("applied a LeaderWorkerSet without its CRD")
        self.applies += 1
        old = self.objects.get(ref)
        body = json.loads(json.dumps(obj))  # JSON-serialisable, as the real client requires
        if old is not None:
            same = {k: v for k, v in old.items() if k != "status"}
            same["metadata"] = {k: v for k, v in old["metadata"].items() if k not in ("resourceVersion", "generation")}
            if same == body:
                return False
            body["metadata"]["generation"] = old["metadata"]["generation"] + 1
        else:
            body["metadata"]["generation"] = 1
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)
        self.objects[ref] = body
        return True

    def _with_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        if out["kind"] in ("Deployment", "LeaderWorkerSet"):
            n = int(out["spec"]["replicas"]) if self.ready and out["metadata"]["name"] not in self.unready else 0
            out["status"] = {"readyReplicas": n, "updatedReplicas": n}
            if out["kind"] == "Deployment":  # LeaderWorkerSet's status has no observedGeneration
                out["status"]["observedGeneration"] = out["metadata"]["generation"]
                why = self.refused.get(out["metadata"]["name"])
                if why is not None:   # the controller's ReplicaFailure condition, as a ReplicaSet's FailedCreate sets it
                    out["status"] = {"readyReplicas": 0, "updatedReplicas": 0, "observedGeneration": out["metadata"]["generation"],
                                     "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": why}]}
        return out

    def admit(self, obj: Mapping[str, Any]) -> AdmissionRefusal | None:
        """The API server's dry-run: refused when the object's name is in `admission_refusals` (no memo: every call counts)."""
        ref = ref_of(obj)
        self.dry_runs.append(ref)
        found = self.admission_refusals.get(ref.name)
        return AdmissionRefusal(str(ref), 422, found[0], found[1]) if found is not None else None

    def read(self, ref: ObjectRef) -> Mapping[str, Any] | None:
        self.reads.append(ref)
        obj = self.objects.get(ref)
        return self._with_status(obj) if obj is not None else None

    def annotate(self, ref: ObjectRef, annotations: Mapping[str, str]) -> None:
        obj = self.objects.get(ref)
        if obj is not None:
            obj["metadata"].setdefault("annotations", {}).update(annotations)

    def remove_annotation(self, ref: ObjectRef, key: str, *, value: str) -> bool:
        """Recorded in `removed_annotations` (the resource itself is not among `objects`: tests hand it to the reconcile)."""
        self.removed_annotations.append((ref, key, value))
        obj = self.objects.get(ref)
        annotations = obj["metadata"].get("annotations", {}) if obj is not None else {}
        if obj is not None and annotations.get(key) == value:
            del annotations[key]
        return True

    def delete(self, ref: ObjectRef) -> None:
        before = self._pods_of(ref)
        self.objects.pop(ref, None)
        self._linger(before, [])

    def _pods_of(self, ref: ObjectRef) -> list[dict[str, Any]]:
        return [p for p in self._synthesised(ref.namespace) if p["metadata"]["name"].rsplit("-", 1)[0] == ref.name]

    def _linger(self, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
        if self.grace_passes <= 0:
            return
        kept = {p["metadata"]["name"] for p in after}
        for pod in before:
            if pod["metadata"]["name"] not in kept:
                meta = {**pod["metadata"], "name": pod["metadata"]["name"] + "-terminating", "deletionTimestamp": "2026-01-01T00:00:00Z"}
                self.terminating.append({**pod, "metadata": meta, "ticks": self.grace_passes})

    def tick(self) -> None:
        """Time passes between reconciles: terminating pods count down their grace period and go."""
        for pod in self.terminating:
            pod["ticks"] = pod.get("ticks", 1) - 1
        self.terminating = [p for p in self.terminating if p["ticks"] > 0]

    def list_owned(self, namespace: str, name: str) -> list[ObjectRef]:
        return sorted(self.owned_objects(namespace, name))

    def owned_objects(self, namespace: str, name: str) -> dict[ObjectRef, Mapping[str, Any]]:
        kinds = set(MANAGED_KINDS)
        self.lists += 1
        return {ref: self._with_status(obj) for ref, obj in sorted(self.objects.items())
                if ref.namespace == namespace and (ref.api_version, ref.kind) in kinds
                and obj["metadata"].get("labels", {}).get(TOPOLOGY_LABEL) == name
                and obj["metadata"]["labels"].get("app.kubernetes.io/managed-by") == MANAGED_BY}

    def has_leader_worker_set(self) -> bool:
        return self.lws_installed

    def read_config_map(self, namespace: str, name: str, key: str) -> str | None:
        return self.config_maps.get((namespace, name), {}).get(key)

    def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        return self.secrets.get((namespace, name), {}).get(key)

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.namespaces.get(namespace)

    def list_pods(self, namespace: str, selector: str) -> list[Mapping[str, Any]]:
        want = dict(part.split("=", 1) for part in selector.split(",") if part)
        pods = self._synthesised(namespace) + [p for p in self.terminating if p["metadata"]["namespace"] == namespace]
        return [p for p in pods if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]

    def list_nodes(self) -> list[Mapping[str, Any]] | None:
        return self.nodes

    def list_all_pods(self) -> list[Mapping[str, Any]]:
        namespaces = {ref.namespace for ref in self.objects}
        return [p for ns in sorted(namespaces) for p in self._synthesised(ns)] + list(self.other_pods)

    def _synthesised(self, namespace: str) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = []
        for ref, obj in sorted(self.objects.items()):
            if ref.namespace != namespace:
                continue
            if obj["kind"] == "Deployment":
                templates = [obj["spec"]["template"]] * int(obj["spec"]["replicas"])
            elif obj["kind"] == "LeaderWorkerSet":
                lwt = obj["spec"]["leaderWorkerTemplate"]
                group = [lwt["leaderTemplate"]] + [lwt["workerTemplate"]] * (int(lwt["size"]) - 1)
                templates = group * int(obj["spec"]["replicas"])
            else:
                continue
            for i, t in enumerate(templates):
                pods.append({"metadata": {"name": f"{ref.name}-{i}", "namespace": namespace, "labels": dict(t["metadata"]["labels"])},
                             "spec": t["spec"], "status": {"phase": "Running"}})
        return pods

    def gpus_held(self, namespace: str) -> int:
        """GPUs requested by every engine pod, terminating ones included (what the e2e sampler counts)."""
        total = 0
        for pod in self.list_pods(namespace, ""):
            for c in pod["spec"]["containers"]:
                total += int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        return total

    def record_event(self, owner: Mapping[str, Any], *, type: str, reason: str, message: str, now: datetime) -> None:
        self.events.append(RecordedEvent(type, reason, message, owner["metadata"]["name"]))

    def collect_garbage(self, owner_uid: str) -> None:
        """What the garbage collector does after the owner is deleted: remove every dependent."""
        for ref in [r for r, o in self.objects.items()
                    if any(ref_.get("uid") == owner_uid for ref_ in o["metadata"].get("ownerReferences", []))]:
            del self.objects[ref]

    def kinds(self) -> list[str]:
        return sorted(str(r) for r in self.objects)
