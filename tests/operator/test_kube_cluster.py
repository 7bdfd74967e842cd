"""KubeCluster against a loopback HTTP API server (real kubernetes client, real sockets): the LeaderWorkerSet
lookup is cached (a missing CRD made every Auto pass rediscover every API group, ~25 requests), every request has a
timeout (a hung API server fails the pass instead of holding its thread), connection errors are ClusterError, and
Events are stamped when written."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client

from servingtopology.operator.cluster.cluster import AdmissionRefused, ClusterError, KubeCluster, ObjectRef, SecretNotOptedIn
from servingtopology.operator.render.tenancy import TenancyPolicy

CORE = [("pods", "Pod"), ("configmaps", "ConfigMap"), ("events", "Event"), ("nodes", "Node"), ("services", "Service"),
        ("serviceaccounts", "ServiceAccount"), ("secrets", "Secret"), ("namespaces", "Namespace")]
GROUPS = {"apps/v1": [("deployments", "Deployment")],
          "rbac.authorization.k8s.io/v1": [("roles", "Role"), ("rolebindings", "RoleBinding")],
          "servingtopology.io/v1alpha1": [("servingtopologies", "ServingTopology")]}


def _resources(gv: str, kinds: list[tuple[str, str]]) -> dict[str, Any]:
    return {"kind": "APIResourceList", "groupVersion": gv, "resources": [
        {"name": n, "singularName": n[:-1], "namespaced": k not in ("Node", "Namespace"), "kind": k,
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]} for n, k in kinds]}


class FakeApi(BaseHTTPRequestHandler):
    hang = False
    paths: ClassVar[list[str]] = []
    bodies: ClassVar[list[dict[str, Any]]] = []
    patches: ClassVar[list[tuple[str, str, str, Any]]] = []      # (path, query, content type, body)
    refusals: ClassVar[dict[str, dict[str, Any]]] = {}           # object name -> the Status a PATCH of it is answered with
    annotations: ClassVar[dict[str, str]] = {}                   # the ServingTopology's annotations, for JSON patch tests

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        type(self).paths.append(path)
        if type(self).hang and "/namespaces/" in path:
            time.sleep(30)      # far past any bound the test allows: only the client's own timeout can end the wait
            return
        if path == "/version":
            return self._send({"major": "1", "minor": "34", "gitVersion": "v1.34.0"})
        if path == "/api":
            return self._send({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            return self._send({"kind": "APIGroupList", "groups": [
                {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                 "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}} for gv in GROUPS]})
        if path == "/api/v1":
            return self._send(_resources("v1", CORE))
        for gv, kinds in GROUPS.items():
            if path == f"/apis/{gv}":
                return self._send(_resources(gv, kinds))
        if path == "/apis/apps/v1/namespaces/default/deployments":
            return self._send({"kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": {}, "items": [
                {"metadata": {"name": "llama-8b-s1-aggregated", "namespace": "default", "generation": 2,
                              "ownerReferences": [{"kind": "ServingTopology", "name": "llama-8b", "uid": "u-1"}]},
                 "spec": {"replicas": 2}, "status": {"readyReplicas": 2, "observedGeneration": 2}}]})
        secrets = {"tagged": {"servingtopology.io/metrics-token": "true"}, "plain": {"app": "db"}}
        if path.startswith("/api/v1/namespaces/default/secrets/") and path.rsplit("/", 1)[1] in secrets:
            name = path.rsplit("/", 1)[1]
            return self._send({"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name, "namespace": "default",
                               "labels": secrets[name]}, "data": {"token": "c2VjcmV0"}})
        if path == "/api/v1/namespaces/default":
            return self._send({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "default", "labels": {"team": "a"}}})
        if "/namespaces/default/" in path and path.count("/") == (6 if path.startswith("/apis/") else 5):   # a collection
            return self._send({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
        return self._send({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}, 404)

    def do_PATCH(self) -> None:
        path, _, query = self.path.partition("?")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).patches.append((path, query, self.headers["Content-Type"], body))
        name = path.rsplit("/", 1)[1]
        if name in type(self).refusals:
            return self._send(type(self).refusals[name], int(type(self).refusals[name]["code"]))
        if self.headers["Content-Type"] == "application/json-patch+json":
            test = body[0]
            if type(self).annotations.get(test["path"].rsplit("/", 1)[1].replace("~1", "/")) != test["value"]:
                return self._send({"kind": "Status", "status": "Failure", "code": 422, "reason": "Invalid",
                                   "message": f"the server rejected our request due to an error in our request: testing value {test['path']} failed"}, 422)
        self._send({"apiVersion": "v1", "kind": "Thing", "metadata": {"name": name, "namespace": "default", "resourceVersion": "7"}})

    def do_POST(self) -> None:
        type(self).paths.append(self.path)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        self._send({**body, "metadata": {**body["metadata"], "name": "e-1", "resourceVersion": "1"}}, 201)


@pytest.fixture()
def api() -> Iterator[str]:
    FakeApi.hang, FakeApi.paths, FakeApi.bodies, FakeApi.patches, FakeApi.refusals, FakeApi.annotations = False, [], [], [], {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def kube(host: str, **kw: Any) -> KubeCluster:
    config = client.Configuration()
    config.host = host
    return KubeCluster(client.ApiClient(config), **kw)


def discovery_requests() -> int:
    return sum(1 for p in FakeApi.paths if p in ("/api", "/apis", "/version") or (p.count("/") <= 3 and "/namespaces" not in p))


def test_a_missing_leader_worker_set_is_looked_up_once_per_ttl_not_every_pass(api: str) -> None:
    cluster = kube(api)
    assert cluster.has_leader_worker_set() is False
    after_first = discovery_requests()
    for _ in range(20):
        assert cluster.has_leader_worker_set() is False
    assert discovery_requests() == after_first
    assert cluster.requests["discovery"] == after_first


def test_concurrent_passes_look_it_up_once(api: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    cluster = kube(api)
    cluster.read(ObjectRef("v1", "ConfigMap", "default", "x"))      # the client's own start-up discovery
    before = discovery_requests()
    with ThreadPoolExecutor(8) as pool:
        assert not any(pool.map(lambda _: cluster.has_leader_worker_set(), range(8)))
    one_lookup = discovery_requests() - before
    cluster._lws = None
    cluster.has_leader_worker_set()
    assert one_lookup == discovery_requests() - before - one_lookup


def test_the_lookup_is_repeated_after_the_ttl(api: str) -> None:
    now = [0.0]
    cluster = kube(api, discovery_ttl_s=60, monotonic=lambda: now[0])
    cluster.has_leader_worker_set()
    first = discovery_requests()
    now[0] = 61
    cluster.has_leader_worker_set()
    assert discovery_requests() > first


def test_a_hung_api_server_fails_the_request_within_its_timeout(api: str) -> None:
    cluster = kube(api, timeout_s=(1.0, 1.0))
    cluster.has_leader_worker_set()       # discovery answers; requests under /namespaces/ hang
    FakeApi.hang = True
    started = time.monotonic()
    with pytest.raises(ClusterError):
        cluster.read(ObjectRef("v1", "ConfigMap", "default", "x"))
    # 1 s read timeout a try; the client's tries take ~4 s on an idle machine. The bound leaves room for a loaded
    # one (it was 4.5 s, 0.45 s above the idle figure) and stays a third of the server's 30 s hang.
    assert time.monotonic() - started < 10.0


def test_a_refused_connection_is_a_cluster_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]      # closed once the block ends: nothing listens there
    cluster = kube(f"http://127.0.0.1:{port}", timeout_s=(1.0, 1.0))
    with pytest.raises(ClusterError):
        cluster.list_pods("default", "a=b")


def test_an_event_is_stamped_when_it_is_written_not_when_the_pass_started(api: str) -> None:
    written = datetime(2026, 1, 1, 0, 0, 40, tzinfo=UTC)
    cluster = kube(api, clock=lambda: written)
    owner = {"metadata": {"name": "llama", "namespace": "default", "uid": "u"}}
    cluster.record_event(owner, type="Normal", reason="PlanProposed", message="m", now=datetime(2026, 1, 1, tzinfo=UTC))
    event = FakeApi.bodies[-1]
    assert event["lastTimestamp"] == event["firstTimestamp"] == "2026-01-01T00:00:40Z"
    assert event["eventTime"].startswith("2026-01-01T00:00:40")


def test_the_owned_objects_come_whole_from_one_list_per_kind(api: str) -> None:
    cluster = kube(api)
    cluster.has_leader_worker_set()
    FakeApi.paths.clear()
    owned = cluster.owned_objects("default", "llama-8b")
    ref = ObjectRef("apps/v1", "Deployment", "default", "llama-8b-s1-aggregated")
    assert list(owned) == [ref] and cluster.list_owned("default", "llama-8b") == [ref]
    got = owned[ref]
    assert got["apiVersion"] == "apps/v1" and got["kind"] == "Deployment"
    assert got["metadata"]["ownerReferences"][0]["uid"] == "u-1" and got["status"]["readyReplicas"] == 2
    lists = [p for p in FakeApi.paths if "/namespaces/default/" in p]
    plurals = {"services", "serviceaccounts", "deployments", "roles", "rolebindings"}
    assert lists and {p.rsplit("/", 1)[1] for p in lists} <= plurals, lists     # collections only: no GET of one object


def test_a_token_secret_without_the_opt_in_label_is_not_read_unless_the_policy_allows_any(api: str) -> None:
    cluster = kube(api)
    assert cluster.read_secret("default", "tagged", "token") == "secret"
    with pytest.raises(SecretNotOptedIn, match=r"servingtopology\.io/metrics-token=true"):
        cluster.read_secret("default", "plain", "token")
    assert kube(api, tenancy=TenancyPolicy(token_secret_label=None)).read_secret("default", "plain", "token") == "secret"
    assert issubclass(SecretNotOptedIn, ClusterError)     # the metrics reader reports it as metrics down, naming the label


def test_a_namespace_s_labels_are_read_for_the_pod_template_policy(api: str) -> None:
    assert kube(api).namespace_labels("default") == {"team": "a"}
    assert kube(api).namespace_labels("absent") is None


def test_an_approval_is_removed_only_while_it_still_holds_the_value_the_pass_read(api: str) -> None:
    ref = ObjectRef("servingtopology.io/v1alpha1", "ServingTopology", "default", "llama")
    FakeApi.annotations = {"servingtopology.io/approve": "p2"}
    assert kube(api).remove_annotation(ref, "servingtopology.io/approve", value="p2") is True
    path, _, content_type, body = FakeApi.patches[-1]
    assert path.endswith("/servingtopologies/llama") and content_type == "application/json-patch+json"
    assert body == [{"op": "test", "path": "/metadata/annotations/servingtopology.io~1approve", "value": "p2"},
                    {"op": "remove", "path": "/metadata/annotations/servingtopology.io~1approve"}]
    FakeApi.annotations = {"servingtopology.io/approve": "p3"}          # rewritten since the pass read it
    assert kube(api).remove_annotation(ref, "servingtopology.io/approve", value="p2") is False


def _deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas}}


INVALID = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
           "message": 'Deployment.apps "bad" is invalid: spec.template.spec.containers[0].env[0].name: Invalid value: "A=B"'}


def test_an_object_is_dry_run_once_per_change_and_a_refusal_again_only_after_its_back_off(api: str) -> None:
    now = [0.0]
    cluster = kube(api, monotonic=lambda: now[0])
    FakeApi.refusals = {"bad": INVALID}
    refusal = cluster.admit(_deployment("bad"))
    assert refusal is not None and str(refusal) == f"Deployment/bad: Invalid (422): {INVALID['message']}"
    path, query, content_type, _ = FakeApi.patches[-1]
    assert path == "/apis/apps/v1/namespaces/default/deployments/bad" and "dryRun=All" in query
    assert content_type == "application/apply-patch+yaml"
    assert cluster.admit(_deployment("good")) is None
    for _ in range(10):                               # every pass of the next minute: no request
        assert cluster.admit(_deployment("bad")) == refusal and cluster.admit(_deployment("good")) is None
    assert len(FakeApi.patches) == 2 and cluster.dry_runs == {"refused": 1, "admitted": 1}
    assert cluster.admit(_deployment("bad", replicas=2)) == refusal   # changed: checked at once
    now[0] = 60.0
    cluster.admit(_deployment("bad"))                 # the back-off is over: checked again
    assert len(FakeApi.patches) == 4


def test_an_apply_the_server_refuses_is_an_admission_refusal_not_the_raw_exception(api: str) -> None:
    cluster = kube(api)
    FakeApi.refusals = {"bad": INVALID}
    with pytest.raises(AdmissionRefused) as refused:
        cluster.apply(_deployment("bad"))
    assert refused.value.refusal.reason == "Invalid" and "HTTP response" not in str(refused.value)
    FakeApi.patches.clear()
    assert cluster.admit(_deployment("bad")) == refused.value.refusal and not FakeApi.patches   # remembered


def test_a_server_error_in_a_dry_run_is_transient_and_says_only_its_code_and_message(api: str) -> None:
    cluster = kube(api)
    FakeApi.refusals = {"x": {"kind": "Status", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd is down"}}
    with pytest.raises(ClusterError) as failed:
        cluster.admit(_deployment("x"))
    assert not isinstance(failed.value, AdmissionRefused)
    assert str(failed.value) == "500 InternalError: etcd is down"          # no headers, body or traceback
    with pytest.raises(ClusterError):
        cluster.admit(_deployment("x"))                                  # not remembered: tried again next pass


# What the API server (v1.35.4, the e2e control plane) answers a server-side apply whose object its typed schema cannot
# hold (here: two environment variables of one name in a sidecar, a list keyed by name): a 500 with no Status reason, the
# same every time for the same object.
TYPED_PATCH = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 500,
               "message": "failed to create typed patch object (default/dup; apps/v1, Kind=Deployment): "
                          '.spec.template.spec.containers[name="sidecar"].env: duplicate entries for key [name="A"]'}


def test_an_object_the_typed_schema_cannot_hold_is_a_refusal_remembered_not_an_outage_retried_every_pass(api: str) -> None:
    cluster = kube(api)
    FakeApi.refusals = {"dup": TYPED_PATCH}
    refusal = cluster.admit(_deployment("dup"))
    assert refusal is not None and (refusal.code, refusal.reason) == (500, "Internal Server Error")
    assert str(refusal) == f"Deployment/dup: Internal Server Error (500): {TYPED_PATCH['message']}"
    FakeApi.patches.clear()
    assert cluster.admit(_deployment("dup")) == refusal and not FakeApi.patches      # remembered: no dry-run every pass
    with pytest.raises(AdmissionRefused):
        cluster.apply(_deployment("dup"))
