"""The `Cluster` seam: the few API verbs the reconcile uses, and their implementation over the
Kubernetes dynamic client (server-side apply with one field manager, owned-object listing, Events).

Called by the kopf handlers (operator/entry/handlers.py), which pass a `KubeCluster` to the reconcile; tests
pass an in-memory fake with the same protocol. The only module that calls the Kubernetes client for
workloads; it decides nothing.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from servingtopology.operator.cluster.admission import AdmissionMemo, AdmissionRefusal, is_refusal, object_digest, refusal_from_answer
from servingtopology.operator.render.manifests import API_VERSION, KIND, LWS_API_VERSION, MANAGED_BY, TOPOLOGY_LABEL
from servingtopology.operator.render.tenancy import STRICT, TenancyPolicy, secret_refusal

__all__ = ["FIELD_MANAGER", "MANAGED_KINDS", "ObjectRef", "Cluster", "ClusterError", "SecretNotOptedIn", "AdmissionRefused", "KubeCluster",
           "ref_of", "owned_selector", "build_event", "ADMISSION_LOGGER"]

FIELD_MANAGER = "servingtopology-operator"
ADMISSION_LOGGER = "servingtopology.operator.admission"
LOG = logging.getLogger(ADMISSION_LOGGER)
# Every request's (connect, read) timeout: a hung API server fails the pass (ClusterError, retried with back-off)
# instead of holding its thread and the resource's lock for ever.
REQUEST_TIMEOUT_S = (5.0, 30.0)
# How long "is LeaderWorkerSet installed" is trusted: a miss makes the dynamic client rediscover every API group
# (about 25 requests), which every Auto pass did while the CRD was absent.
DISCOVERY_TTL_S = 300.0
# Every kind the builders create, so that pruning can find what an old plan left behind.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    (LWS_API_VERSION, "LeaderWorkerSet"),
)


@dataclass(frozen=True, slots=True, order=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def ref_of(obj: Mapping[str, Any]) -> ObjectRef:
    meta = obj["metadata"]
    return ObjectRef(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def owned_selector(name: str) -> str:
    return f"{TOPOLOGY_LABEL}={name},app.kubernetes.io/managed-by={MANAGED_BY}"


class ClusterError(Exception):
    """A transient API failure (the handler retries with a delay)."""


class SecretNotOptedIn(ClusterError):
    """A token Secret without the opt-in label the operator's policy names: it was not read (not transient: the
    metrics reader reports MetricsAvailable=False with `reason` until the Secret is labelled)."""

    reason = "TokenSecretNotOptedIn"


class AdmissionRefused(ClusterError):
    """The API server refused to apply an object (validation or an admission plugin): not transient; the reconcile
    reports `refusal` (the server's reason and message) as Ready=False AdmissionRefused."""

    def __init__(self, refusal: AdmissionRefusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class Cluster(Protocol):
    def apply(self, obj: Mapping[str, Any]) -> bool:
        """Server-side apply with the operator's field manager; True when the object was created or changed.
        Raises AdmissionRefused when the API server refuses the object."""
        ...

    def admit(self, obj: Mapping[str, Any]) -> AdmissionRefusal | None:
        """The API server's verdict on applying `obj`, from a server-side dry-run (validation and every admission the
        cluster runs); None when admitted. Remembered per rendered object (cluster/admission.py AdmissionMemo): one
        dry-run per change of the object, a refusal checked again with back-off. Raises ClusterError when transient."""
        ...

    def read(self, ref: ObjectRef) -> Mapping[str, Any] | None: ...

    def delete(self, ref: ObjectRef) -> None: ...

    def list_owned(self, namespace: str, name: str) -> list[ObjectRef]:
        """Objects of MANAGED_KINDS that carry the topology's label (whatever plan made them)."""
        ...

    def owned_objects(self, namespace: str, name: str) -> dict[ObjectRef, Mapping[str, Any]]:
        """The same objects, whole (metadata, spec, status): one LIST per kind, read once by a pass."""
        ...

    def has_leader_worker_set(self) -> bool: ...

    def read_config_map(self, namespace: str, name: str, key: str) -> str | None: ...

    def record_event(self, owner: Mapping[str, Any], *, type: str, reason: str, message: str, now: datetime) -> None: ...

    def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        """A key of a Secret; raises SecretNotOptedIn when the Secret lacks the policy's opt-in label."""
        ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """A namespace's labels (None: the namespace cannot be read), for the pod-template policy's namespace rules."""
        ...

    def list_pods(self, namespace: str, selector: str) -> list[Mapping[str, Any]]:
        """Pods matching a label selector, terminating ones included (they still hold their GPUs)."""
        ...

    def list_nodes(self) -> list[Mapping[str, Any]] | None:
        """Every Node; None when this cluster cannot say (then GPU capacity is not checked)."""
        ...

    def list_all_pods(self) -> list[Mapping[str, Any]]:
        """Every pod of every namespace (other tenants' pods hold GPUs too)."""
        ...

    def annotate(self, ref: ObjectRef, annotations: Mapping[str, str]) -> None:
        """Merge `annotations` into an object's metadata (a JSON merge patch; the object's spec and status untouched)."""
        ...

    def remove_annotation(self, ref: ObjectRef, key: str, *, value: str) -> bool:
        """Remove one annotation only while it still holds `value`; True when removed, False when it holds another value
        by now or the object is gone."""
        ...


class KubeCluster:
    """`Cluster` over kubernetes.dynamic.DynamicClient (sync; the handlers run passes on the Runtime's threads).

    Every request has REQUEST_TIMEOUT_S; API and connection errors (urllib3's, which are not OSErrors) become
    ClusterError; the answer to "is LeaderWorkerSet installed" is cached for DISCOVERY_TTL_S. `requests` counts
    requests by kind ("discovery" or "api") for the operator's metrics. Events are stamped when they are written.
    """

    def __init__(self, api_client: Any, *, reporting_instance: str = "", timeout_s: tuple[float, float] = REQUEST_TIMEOUT_S,
                 discovery_ttl_s: float = DISCOVERY_TTL_S, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic, tenancy: TenancyPolicy = STRICT) -> None:
        from kubernetes import dynamic

        self._tenancy = tenancy   # whose token Secrets may be read (the opt-in label)

        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._client_lock = threading.Lock()
        self._lws_lock = threading.Lock()
        self._discovery_lock = threading.Lock()
        self._resources: dict[tuple[str, str], Any] = {}
        self._timeout = timeout_s
        _count_requests(api_client, self._count, timeout_s)
        # Discovery starts on the first request, in a pass (a failure there is the pass's ClusterError, retried),
        # not while the operator starts.
        self._new_client = lambda: dynamic.DynamicClient(api_client)  # type: ignore[no-untyped-call]  # the client is not annotated
        self._dynamic: Any = None
        self._instance = reporting_instance or f"{FIELD_MANAGER}-{uuid.uuid4().hex[:8]}"
        self._ttl, self._clock, self._monotonic = discovery_ttl_s, clock, monotonic
        self._lws: tuple[bool, float] | None = None
        self._admission = AdmissionMemo()
        self.dry_runs: Counter[str] = Counter()   # server-side dry-runs made, by verdict ("admitted", "refused")

    @property
    def _client(self) -> Any:
        with self._client_lock:
            if self._dynamic is None:
                self._dynamic = self._discovering(self._new_client)
            return self._dynamic

    def _count(self, path: str) -> None:
        with self._count_lock:
            self.requests["discovery" if _is_discovery(path) else "api"] += 1

    def _discovering(self, fn: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.dynamic.exceptions import DynamicApiError
        from urllib3.exceptions import HTTPError

        try:
            return fn()
        except (DynamicApiError, ApiException, HTTPError, OSError) as exc:
            raise ClusterError(f"discovery: {_short(exc)}") from exc

    def _resource(self, api_version: str, kind: str) -> Any:
        """The client's Resource for a kind, resolved once (the client's discovery cache is not thread-safe: concurrent
        misses each rediscover every group, 200 requests at start-up with 50 resources)."""
        key = (api_version, kind)
        found = self._resources.get(key)
        if found is None:
            with self._discovery_lock:
                found = self._resources.get(key)
                if found is None:
                    found = self._resources[key] = self._discovering(lambda: self._client.resources.get(api_version=api_version, kind=kind))
        return found

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.dynamic import exceptions
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except exceptions.NotFoundError:
            return None
        except exceptions.DynamicApiError as exc:
            raise ClusterError(_api_error_text(exc)) from exc
        except (ApiException, HTTPError, OSError) as exc:
            raise ClusterError(_short(exc)) from exc

    def apply(self, obj: Mapping[str, Any]) -> bool:
        ref = ref_of(obj)
        res = self._resource(ref.api_version, ref.kind)
        before = self._call(self._client.get, res, name=ref.name, namespace=ref.namespace)
        try:
            after = self._call(self._client.server_side_apply, res, body=dict(obj), namespace=ref.namespace,
                               field_manager=FIELD_MANAGER, force_conflicts=True)
        except ClusterError as exc:
            refusal = _refusal(exc, ref)
            if refusal is None:
                raise
            # Admitted by an earlier dry-run, refused now: the cluster's admission changed. Remembered as refused.
            self._admission.record(object_digest(obj), refusal, now_s=self._monotonic())
            raise AdmissionRefused(refusal) from None
        old_version = before.metadata.resourceVersion if before is not None else None
        return after is None or after.metadata.resourceVersion != old_version

    def admit(self, obj: Mapping[str, Any]) -> AdmissionRefusal | None:
        digest = object_digest(obj)
        standing, refusal = self._admission.standing(digest, now_s=self._monotonic())
        if standing:
            return refusal
        ref = ref_of(obj)
        res = self._resource(ref.api_version, ref.kind)
        try:
            self._call(self._client.server_side_apply, res, body=dict(obj), namespace=ref.namespace, field_manager=FIELD_MANAGER,
                       force_conflicts=True, dry_run="All")
            refusal = None
        except ClusterError as exc:
            refusal = _refusal(exc, ref)
            if refusal is None:
                raise
        self._admission.record(digest, refusal, now_s=self._monotonic())
        with self._count_lock:
            self.dry_runs["admitted" if refusal is None else "refused"] += 1
        if refusal is not None:
            LOG.info("%s/%s: server-side dry-run refused: %s", ref.namespace, ref.name, refusal)
        return refusal

    def read(self, ref: ObjectRef) -> Mapping[str, Any] | None:
        got = self._call(self._client.get, self._resource(ref.api_version, ref.kind), name=ref.name, namespace=ref.namespace)
        return got.to_dict() if got is not None else None

    def annotate(self, ref: ObjectRef, annotations: Mapping[str, str]) -> None:
        self._call(self._client.patch, self._resource(ref.api_version, ref.kind), name=ref.name, namespace=ref.namespace,
                   body={"metadata": {"annotations": dict(annotations)}}, content_type="application/merge-patch+json")

    def remove_annotation(self, ref: ObjectRef, key: str, *, value: str) -> bool:
        # A JSON patch whose `test` fails (the value was rewritten since it was read) is refused as a whole: 422.
        from kubernetes.dynamic import exceptions

        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        try:
            got = self._call(self._client.patch, self._resource(ref.api_version, ref.kind), name=ref.name, namespace=ref.namespace,
                             body=[{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}],
                             content_type="application/json-patch+json")
        except ClusterError as exc:
            if isinstance(exc.__cause__, exceptions.DynamicApiError) and exc.__cause__.status == 422:
                return False
            raise
        return got is not None

    def delete(self, ref: ObjectRef) -> None:
        self._call(self._client.delete, self._resource(ref.api_version, ref.kind), name=ref.name, namespace=ref.namespace,
                   propagation_policy="Background")

    def _kinds(self) -> Iterable[tuple[str, str]]:
        lws = self.has_leader_worker_set()
        return (k for k in MANAGED_KINDS if lws or k[0] != LWS_API_VERSION)

    def list_owned(self, namespace: str, name: str) -> list[ObjectRef]:
        return sorted(self.owned_objects(namespace, name))

    def owned_objects(self, namespace: str, name: str) -> dict[ObjectRef, Mapping[str, Any]]:
        out: dict[ObjectRef, Mapping[str, Any]] = {}
        for api_version, kind in self._kinds():
            listing = self._call(self._client.get, self._resource(api_version, kind), namespace=namespace,
                                 label_selector=owned_selector(name))
            for item in (listing.items if listing is not None else []):
                # A list's items carry no apiVersion/kind of their own: the kind listed names them.
                out[ObjectRef(api_version, kind, namespace, item.metadata.name)] = {"apiVersion": api_version, "kind": kind, **item.to_dict()}
        return dict(sorted(out.items()))

    def has_leader_worker_set(self) -> bool:
        from kubernetes.dynamic import exceptions

        with self._lws_lock:   # one lookup at a time: concurrent misses would each rediscover every group
            now = self._monotonic()
            if self._lws is not None and now - self._lws[1] < self._ttl:
                return self._lws[0]
            try:
                self._resource(LWS_API_VERSION, "LeaderWorkerSet")
                found = True
            except exceptions.ResourceNotFoundError:
                found = False
            self._lws = (found, now)
            return found

    def read_config_map(self, namespace: str, name: str, key: str) -> str | None:
        cm = self._call(self._client.get, self._resource("v1", "ConfigMap"), name=name, namespace=namespace)
        data = (cm.to_dict().get("data") or {}) if cm is not None else {}
        value = data.get(key)
        return str(value) if value is not None else None

    def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        secret = self._call(self._client.get, self._resource("v1", "Secret"), name=name, namespace=namespace)
        body = secret.to_dict() if secret is not None else {}
        if secret is not None:
            refused = secret_refusal((body.get("metadata") or {}).get("labels"), namespace=namespace, name=name, policy=self._tenancy)
            if refused is not None:
                raise SecretNotOptedIn(refused)
        value = (body.get("data") or {}).get(key)
        return base64.b64decode(value).decode() if value is not None else None

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        found = self._call(self._client.get, self._resource("v1", "Namespace"), name=namespace)
        return dict((found.to_dict().get("metadata") or {}).get("labels") or {}) if found is not None else None

    def list_pods(self, namespace: str, selector: str) -> list[Mapping[str, Any]]:
        listing = self._call(self._client.get, self._resource("v1", "Pod"), namespace=namespace, label_selector=selector)
        return list(listing.to_dict().get("items") or []) if listing is not None else []

    def list_nodes(self) -> list[Mapping[str, Any]] | None:
        listing = self._call(self._client.get, self._resource("v1", "Node"))
        return list(listing.to_dict().get("items") or []) if listing is not None else []

    def list_all_pods(self) -> list[Mapping[str, Any]]:
        listing = self._call(self._client.get, self._resource("v1", "Pod"),
                             field_selector="status.phase!=Succeeded,status.phase!=Failed")
        return list(listing.to_dict().get("items") or []) if listing is not None else []

    def record_event(self, owner: Mapping[str, Any], *, type: str, reason: str, message: str, now: datetime) -> None:
        # Stamped when written: the pass's `now` is its start, up to a pass's length earlier.
        event = build_event(owner, type=type, reason=reason, message=message, now=self._clock(), instance=self._instance)
        meta = owner["metadata"]
        self._call(self._client.create, self._resource("v1", "Event"), body=event, namespace=meta["namespace"])


def _refusal(exc: ClusterError, ref: ObjectRef) -> AdmissionRefusal | None:
    """The API server's refusal of `ref` when `exc` is one (admission.py `is_refusal`), else None."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    cause = exc.__cause__
    if not isinstance(cause, DynamicApiError) or not is_refusal(code=int(cause.status or 0), body=cause.body):
        return None
    return refusal_from_answer(str(ref), code=int(cause.status), http_reason=str(cause.reason or ""), body=cause.body)


def _api_error_text(exc: Any) -> str:
    """An API error in one line: its code, reason and the Status message (never its HTTP headers, body or traceback)."""
    answer = refusal_from_answer("", code=int(exc.status or 0), http_reason=str(exc.reason or ""), body=exc.body)
    return f"{answer.code} {answer.reason}: {answer.message}" if answer.message != f"{answer.code} {answer.reason}" else answer.message


def _short(exc: BaseException) -> str:
    """A connection or discovery error in one line: its status and reason, or the error's kind and text."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"{status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _is_discovery(path: str) -> bool:
    """/api, /apis, /api/v1, /apis/<group>, /apis/<group>/<version> (and /version, /openapi): no resource named."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if not parts or parts[0] in ("version", "openapi"):
        return True
    if parts[0] == "api":
        return len(parts) <= 2
    return parts[0] == "apis" and len(parts) <= 3


def _count_requests(api_client: Any, count: Callable[[str], None], timeout_s: tuple[float, float]) -> None:
    """Count every request the client makes (discovery included) and give discovery the same timeouts."""
    call_api = api_client.call_api

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        count(urlsplit(url).path)
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = timeout_s
        return call_api(method, url, *args, **kwargs)

    api_client.call_api = counted


def build_event(owner: Mapping[str, Any], *, type: str, reason: str, message: str, now: datetime,
                instance: str) -> dict[str, Any]:
    """Build the core/v1 Event about `owner`, with first/last timestamps, count and the event time.

    `kubectl describe` and `kubectl get events --sort-by=.lastTimestamp` order by `lastTimestamp`. The
    events.k8s.io/v1 API refuses its `deprecated*Timestamp` fields on create ("needs to be unset"), so the
    operator writes core/v1 Events, as kopf does, where both the legacy timestamps and `eventTime` (with
    `reportingComponent`, `reportingInstance` and `action`, required once `eventTime` is set) are accepted.
    """
    meta = owner["metadata"]
    seconds = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}-", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "namespace": meta["namespace"],
                           "uid": meta.get("uid", "")},
        "type": type,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": seconds,
        "lastTimestamp": seconds,
        "count": 1,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "action": reason,
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": f"{API_VERSION.split('/')[0]}/operator",
        "reportingInstance": instance[:128],
    }
