"""The operator as users run it: `helm install` of the chart with the image `make image` builds, its pod on the real
node (e2e/node.py) under the chart's securityContext, enforced by runc, with the token the chart's projected volume
mounts. It plans and reconciles a ServingTopology whose engine pods run on the kwok GPU nodes; deleted (SIGTERM) in
the middle of a transition, its replacement carries on from status with the same floor; two replicas keep one
active reconciler (kopf peering), fail over when it dies, and `helm upgrade` to a rebuilt image rolls them without
a second transition. The three tests share one install and one ServingTopology and run in this file's order.

The session's local operator (e2e/stack.py) watches every namespace, so it is stopped while this module runs and
started again after it; the chart installed here watches only the module's namespace. The operator pods' logs are
read from the node's log folder (the API server cannot reach the kubelet, so `kubectl logs` cannot), kept open so a
deleted pod's log outlives the kubelet's clean-up, and written to the cluster's log folder when a test fails.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .invariants import TopologyWatch
from .kubetools import REPO_ROOT, tool
from .node import KUBERNETES_SERVICE_IP, PODMAN, REAL_NODE_TAINT, RealNode
from .objects import gpus_of, pod_ready, topology
from .processes import wait_until
from .stack import CHART, Operator
from .test_faults import _memory, _patch_spec, _running, _settled, _wait_for_a_running_transition

# The real node's network namespace, containerd and kubelet, and the project's podman store: one worker runs these
# modules, one after another (e2e/conftest.py).
pytestmark = pytest.mark.xdist_group("real-node")

RELEASE = "stpod"
DEPLOYMENT = f"{RELEASE}-servingtopology"
LOW_RPS, HIGH_RPS = 5, 40
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


class PodLogs:
    """Every operator pod's container log in a namespace as the node writes it (CRI format), each file kept open from
    the first `scan` that finds it: the kubelet removes a deleted pod's folder, an open file stays readable."""

    def __init__(self, node: RealNode, namespace: str) -> None:
        self.node, self.namespace = node, namespace
        self._files: dict[Path, IO[str]] = {}
        self._text: dict[Path, str] = {}

    def scan(self) -> None:
        for path in sorted(self.node.pod_logs.glob(f"{self.namespace}_*/operator/*.log")):
            if path not in self._files:
                self._files[path] = path.open(errors="replace")
                self._text[path] = ""

    def by_pod(self) -> dict[str, str]:
        """Pod name -> its log's messages (all restarts, in order)."""
        self.scan()
        out: dict[str, str] = {}
        for path, handle in self._files.items():
            self._text[path] += handle.read()
            pod = path.parent.parent.name.split("_")[1]
            messages = [line.split(" ", 3)[3] for line in self._text[path].splitlines() if line.count(" ") >= 3]
            out[pod] = out.get(pod, "") + "\n".join(messages) + "\n"
        return out

    def save(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for pod, text in self.by_pod().items():
            written.append(folder / f"{pod}.log")
            written[-1].write_text(text)
        return written

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


@dataclass
class PodOperator:
    """The chart installed as release RELEASE in its own namespace, its pods on the real node, watching `watched`."""

    cluster: LocalCluster
    node: RealNode
    namespace: str
    watched: str
    image: str
    logs: PodLogs = field(init=False)

    def __post_init__(self) -> None:
        self.logs = PodLogs(self.node, self.namespace)

    def helm(self, *, replicas: int, image: str | None = None) -> None:
        """`helm upgrade --install` of the chart with the built image, scheduled only onto the real node."""
        repository, tag = (image or self.image).rsplit(":", 1)
        values = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "replicaCount": replicas,
            "nodeSelector": {"kubernetes.io/hostname": self.node.name},
            "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "operator": {"namespaces": [self.watched], "timerIntervalSeconds": 5, "logLevel": "DEBUG"},
            # The cluster's PodMonitors are the session release's; this one adds none to the harness's Prometheus.
            "podMonitors": {"enabled": False}, "grafanaDashboard": {"enabled": False},
        }
        values_file = self.cluster.work_dir / f"{RELEASE}-values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        done = subprocess.run(
            [str(tool("helm")), "upgrade", "--install", RELEASE, str(CHART), "--namespace", self.namespace,
             f"--kubeconfig={self.cluster.kubeconfig}", "-f", str(values_file)],
            capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr[-3000:]

    def pods(self) -> list[dict[str, Any]]:
        done = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", f"app.kubernetes.io/instance={RELEASE}",
                                    "-o", "json")
        return [p for p in json.loads(done.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]

    def wait_rolled_out(self, replicas: int, *, timeout_s: int = 180) -> list[dict[str, Any]]:
        """The Deployment's pods once it is rolled out: `replicas` pods of its newest template, every one Ready (the
        chart's readiness probe) and none terminating."""
        def rolled_out() -> bool:
            self.logs.scan()
            done = self.cluster.kubectl("rollout", "status", f"deployment/{DEPLOYMENT}", "-n", self.namespace,
                                        "--timeout=1s", check=False)
            pods = self.pods()
            return done.returncode == 0 and len(pods) == replicas and all(pod_ready(p) for p in pods)

        wait_until(rolled_out, timeout_s=timeout_s, interval_s=1, what=f"deployment {DEPLOYMENT} rolled out",
                   on_timeout=self.log_tails)
        return self.pods()

    def peers(self) -> dict[str, int]:
        """Live operator pod -> its kopf peering priority, from the KopfPeering in the watched namespace (a peer's
        identity is `<user>@<pod name>/<start time>/<random>`)."""
        done = self.cluster.kubectl("get", "kopfpeering", VALUES["operator"]["peeringName"], "-n", self.watched,
                                    "-o", "json", check=False)
        status = json.loads(done.stdout).get("status") or {} if done.returncode == 0 else {}
        live = {p["metadata"]["name"] for p in self.pods()}
        out = {}
        for identity, info in status.items():
            pod = identity.split("@", 1)[-1].split("/", 1)[0]
            if pod in live and info.get("lifetime", 1) > 0:
                out[pod] = int(info["priority"])
        return out

    def log_tails(self, chars: int = 3000) -> str:
        return "\n".join(f"===== operator pod {pod} =====\n{text[-chars:]}" for pod, text in self.logs.by_pod().items())


@pytest.fixture(scope="module")
def pod_operator(cluster: LocalCluster, operator: Operator) -> Iterator[PodOperator]:
    built = subprocess.run(["bash", str(REPO_ROOT / "tools" / "image" / "build.sh")], capture_output=True, text=True,
                           timeout=1800, cwd=REPO_ROOT)
    assert built.returncode == 0, built.stderr[-3000:]
    image = built.stdout.strip().splitlines()[-1]   # the tag of these sources (src-<digest>)
    node = RealNode(cluster)
    node.start()
    operator.kill()   # the session's operator watches every namespace, this module's included
    suffix = uuid.uuid4().hex[:6]
    namespace, watched = f"e2e-oppod-{suffix}", f"e2e-{suffix}"
    for name in (namespace, watched):
        cluster.kubectl("create", "namespace", name)
    pod_op = PodOperator(cluster, node, namespace, watched, image)
    try:
        node.load_image(image)
        yield pod_op
    finally:
        pod_op.logs.scan()
        pod_op.logs.close()
        # The release's cluster-scoped objects (its ClusterRole and binding) go too; its pods stop on the node.
        subprocess.run([str(tool("helm")), "uninstall", RELEASE, "--namespace", namespace,
                        f"--kubeconfig={cluster.kubeconfig}"], capture_output=True, timeout=180, check=False)
        node.stop()
        for name in (namespace, watched):
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        operator.start()
    assert not node.shims() and not node.netns_path.exists()


@pytest.fixture(autouse=True)
def _keep_operator_pod_logs(request: pytest.FixtureRequest, pod_operator: PodOperator) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        folder = pod_operator.cluster.supervisor.log_dir / "operator-pods" / request.node.name
        written = pod_operator.logs.save(folder)
        # A section of the failed call's report: pytest prints it with the failure, after this teardown has run.
        report.sections.append(("operator pod logs", f"every operator pod's whole log kept in {folder}: "
                                f"{[p.name for p in written]}\n{pod_operator.log_tails(6000)}"))


def _transitions_topology(name: str, namespace: str) -> dict[str, Any]:
    # As e2e/test_faults.py's: 5 ↔ 40 req/s is 1×TP1 ↔ 4×TP1, drift never starts a transition (replanInterval 10m).
    return topology(name, namespace, prometheus_url=None, arrival_rate=LOW_RPS, max_gpus=8, max_surge_gpus=2,
                    allowed_layouts=["replicas"], replan_interval="10m", cooldown="10m")


@pytest.mark.e2e_seconds(64)
def test_helm_installs_the_operator_onto_the_real_node_where_it_plans_and_reconciles_a_topology(
        pod_operator: PodOperator, cluster: LocalCluster, kube: Kube) -> None:
    started = time.monotonic()
    pod_operator.helm(replicas=1)
    (pod,) = pod_operator.wait_rolled_out(1)
    ready_s = time.monotonic() - started
    node = pod_operator.node
    assert pod["spec"]["nodeName"] == node.name, pod["spec"].get("nodeName")
    # The chart's own securityContext, enforced by runc: read from the container's process on the host.
    process = node.container_process(pod["status"]["containerStatuses"][0]["containerID"])
    assert process.uid == process.gid == 65532, process
    assert process.root_read_only and process.no_new_privs and process.capabilities_effective == 0, process
    assert process.seccomp_filtered, process
    # Its in-cluster configuration: the token of the chart's projected volume (there is no other mount of it).
    token_mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"]
                    if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"]
    assert [m["name"] for m in token_mounts] == ["kube-api-access"], token_mounts
    assert pod["spec"]["automountServiceAccountToken"] is False

    name, namespace = "podop", pod_operator.watched
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_transitions_topology(name, namespace)))
    wait_until(lambda: _settled(kube, namespace, name), timeout_s=180, what="the topology planned and Ready",
               on_timeout=pod_operator.log_tails)
    settled_s = time.monotonic() - started
    status = kube.topology(namespace, name)["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["reason"] == "WorkloadsReady", conditions["Ready"]
    engines = [p for p in kube.items("pods", namespace, selector=f"app.kubernetes.io/instance={name}")
               if any(c["name"] == "engine" for c in p["spec"]["containers"])]
    assert engines and all(pod_ready(p) and p["spec"]["nodeName"].startswith("gpu-node-") for p in engines), engines
    assert sum(gpus_of(p) for p in engines) == status["plan"]["gpus"] > 0
    log = pod_operator.logs.by_pod()[pod["metadata"]["name"]]
    assert "Client is configured in cluster with service account." in log, log[-3000:]
    assert f"https://{KUBERNETES_SERVICE_IP}:443" in log, log[-3000:]   # through the kubernetes Service
    assert f"{namespace}/{name}: create pass" in log, log[-3000:]
    print(f"\noperator pod Ready {ready_s:.1f} s after helm install; {status['plan']['layout']} Ready "
          f"{settled_s - ready_s:.1f} s after the apply")


def _passes(log: str, where: str) -> list[str]:
    """The reconcile passes a log shows for the resource `where` (namespace/name): one DEBUG line each."""
    return [line for line in log.splitlines() if f"] {where}: " in line and " pass reads version " in line]


@pytest.mark.e2e_seconds(16)
def test_the_operator_pod_deleted_mid_transition_is_replaced_and_the_replacement_carries_on_from_status(
        pod_operator: PodOperator, cluster: LocalCluster, kube: Kube) -> None:
    name, namespace = "podop", pod_operator.watched
    (old,) = pod_operator.wait_rolled_out(1)
    wait_until(lambda: _settled(kube, namespace, name), timeout_s=180, what="the topology settled",
               on_timeout=pod_operator.log_tails)
    with TopologyWatch(cluster.kubeconfig, namespace, name) as watch:
        watch.mark_change()
        _patch_spec(cluster, namespace, name, {"workload": {"arrivalRate": HIGH_RPS}})
        state = _wait_for_a_running_transition(watch, "a transition to the new arrival rate")
        floor_rps = watch.read()["status"]["replan"]["transitionFloorRps"]
        pod_operator.logs.scan()
        deleted = time.monotonic()
        # The kubelet sends SIGTERM (the chart's default grace period), as on a drain, an eviction or a rollout.
        cluster.kubectl("delete", "pod", old["metadata"]["name"], "-n", pod_operator.namespace, "--wait=false")
        wait_until(lambda: old["metadata"]["name"] not in {p["metadata"]["name"] for p in pod_operator.pods()},
                   timeout_s=60, what="the old pod terminating")
        (new,) = pod_operator.wait_rolled_out(1)
        replaced_s = time.monotonic() - deleted
        wait_until(lambda: _settled(kube, namespace, name), timeout_s=180, what="the transition completed",
                   on_timeout=pod_operator.log_tails)
        settled_s = time.monotonic() - deleted
    report = watch.check()
    # The old pod's log is whole once the kubelet has confirmed its container stopped and the pod object is gone.
    wait_until(lambda: "NotFound" in pod_operator.cluster.kubectl(
                   "get", "pod", old["metadata"]["name"], "-n", pod_operator.namespace, check=False).stderr,
               timeout_s=120, what="the old operator pod gone", on_timeout=pod_operator.log_tails)
    logs = pod_operator.logs.by_pod()
    old_log, new_log = logs[old["metadata"]["name"]], logs[new["metadata"]["name"]]
    # The old pod stopped on the signal and finished its tasks (kopf's graceful stop), its peering record removed.
    assert "Signal SIGTERM is received. Operator is stopping." in old_log, old_log[-3000:]
    assert "Root tasks are stopped: finishing normally" in old_log, old_log[-3000:]
    # One transition for the one change, the one the old pod declared (a replacement starting again from scratch
    # would show a second startedS), and its floor held at every sample, including while no operator ran.
    assert report.started_per_change.get(1) == [state.started_s], report.started_per_change
    assert report.floor_rps == floor_rps > 0, (report.floor_rps, floor_rps)
    # The replacement ran the passes that finished it.
    where = f"{namespace}/{name}"
    assert _passes(new_log, where), new_log[-3000:]
    status = kube.topology(namespace, name)["status"]
    assert status["plan"]["layout"] == "4×TP1" and status["plan"]["generation"] == 2, status["plan"]
    print(f"\ndeleted at {state.from_set}→{state.to_set} {state.phase.value}; replacement Ready {replaced_s:.1f} s later; "
          f"settled {settled_s:.1f} s after the delete; {report.line()}")


def _peering_settled(pod_operator: PodOperator, replicas: int) -> str:
    """Waits until `replicas` live pods are in the peering and each has acted on it as kopf does: the highest priority
    resumed (or never paused), every other one paused. Returns the active pod."""
    def settled() -> bool:
        peers = pod_operator.peers()
        if len(peers) != replicas:
            return False
        top = max(peers, key=peers.__getitem__)
        logs = pod_operator.logs.by_pod()
        return all(_paused(logs.get(pod, "")) == (pod != top) for pod in peers)

    wait_until(settled, timeout_s=90, what=f"{replicas} operator replicas peered, one active",
               on_timeout=lambda: f"{pod_operator.peers()}\n{pod_operator.log_tails()}")
    peers = pod_operator.peers()
    return max(peers, key=peers.__getitem__)


def _paused(log: str) -> bool:
    """Whether kopf's last word on peering in this log left the operator paused. kopf starts paused and says nothing
    until it resumes, so a replica that has never resumed is paused (a peer of higher priority was there first)."""
    pausing, resuming = log.rfind("Pausing operations in favour of"), log.rfind("Resuming operations after the pause")
    return resuming < 0 or pausing > resuming


def _rebuilt(image: str, work_dir: Path) -> str:
    """`image` rebuilt with one more layer (a label naming the rebuild): a new image id under a new tag."""
    tag = f"{image.rsplit(':', 1)[0]}:e2e-rebuild-{uuid.uuid4().hex[:8]}"
    context = work_dir / "rebuild"
    context.mkdir(exist_ok=True)
    (context / "Containerfile").write_text(f"FROM {image}\nLABEL io.servingtopology.e2e-rebuild=\"{tag}\"\n")
    done = subprocess.run([str(PODMAN), "build", "--quiet", "-t", tag, str(context)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return tag


def _handled_by(pod_operator: PodOperator, kube: Kube, where: str, change: dict[str, Any]) -> list[str]:
    """Applies a spec change that needs no transition and returns the operator pods whose logs show a pass for it."""
    namespace, name = where.split("/")
    before = {pod: len(_passes(log, where)) for pod, log in pod_operator.logs.by_pod().items()}
    _patch_spec(pod_operator.cluster, namespace, name, change)
    generation = kube.topology(namespace, name)["metadata"]["generation"]
    wait_until(lambda: kube.topology(namespace, name)["status"].get("observedGeneration") == generation,
               timeout_s=120, what=f"{where} generation {generation} handled", on_timeout=pod_operator.log_tails)
    wait_until(lambda: _settled(kube, namespace, name), timeout_s=120, what=f"{where} settled after the change",
               on_timeout=pod_operator.log_tails)
    after = pod_operator.logs.by_pod()
    return sorted(pod for pod, log in after.items() if len(_passes(log, where)) > before.get(pod, 0))


@pytest.mark.e2e_seconds(114)
def test_two_replicas_keep_one_reconciler_fail_over_and_roll_to_a_rebuilt_image_without_a_transition(
        pod_operator: PodOperator, cluster: LocalCluster, kube: Kube) -> None:
    name, namespace = "podop", pod_operator.watched
    where = f"{namespace}/{name}"
    wait_until(lambda: _settled(kube, namespace, name), timeout_s=180, what="the topology settled",
               on_timeout=pod_operator.log_tails)
    history = kube.topology(namespace, name)["status"]["history"]
    engines = {p["metadata"]["uid"] for p in kube.items("pods", namespace, selector=f"app.kubernetes.io/instance={name}")}

    pod_operator.helm(replicas=2)
    pod_operator.wait_rolled_out(2)
    active = _peering_settled(pod_operator, 2)
    (standby,) = set(pod_operator.peers()) - {active}
    # kopf peering: the lower priority pauses; only the higher one handles a change.
    assert _handled_by(pod_operator, kube, where, {"policy": {"cooldown": "11m"}}) == [active], pod_operator.peers()

    # The active one dies (SIGTERM, its peering record removed): of the replica left and the Deployment's replacement
    # for the dead one, exactly one handles the next change, the one of higher priority.
    failed_over = time.monotonic()
    cluster.kubectl("delete", "pod", active, "-n", pod_operator.namespace, "--wait=false")
    wait_until(lambda: active not in {p["metadata"]["name"] for p in pod_operator.pods()}, timeout_s=60,
               what="the active replica terminating")
    pod_operator.wait_rolled_out(2)
    successor = _peering_settled(pod_operator, 2)
    assert _handled_by(pod_operator, kube, where, {"policy": {"cooldown": "12m"}}) == [successor], pod_operator.peers()
    failed_over_s = time.monotonic() - failed_over

    # helm upgrade to a rebuilt image rolls both replicas; the workloads and the plan are left as they are.
    rebuilt = _rebuilt(pod_operator.image, cluster.work_dir)
    try:
        pod_operator.node.load_image(rebuilt)
        rolled = time.monotonic()
        pod_operator.helm(replicas=2, image=rebuilt)
        pods = pod_operator.wait_rolled_out(2)
        assert {p["spec"]["containers"][0]["image"] for p in pods} == {rebuilt}
        newest = _peering_settled(pod_operator, 2)
        wait_until(lambda: _passes(pod_operator.logs.by_pod()[newest], where),
                   timeout_s=120, what="the new active replica's first pass", on_timeout=pod_operator.log_tails)
        wait_until(lambda: _settled(kube, namespace, name), timeout_s=120, what="settled after the upgrade",
                   on_timeout=pod_operator.log_tails)
        rolled_s = time.monotonic() - rolled
    finally:
        subprocess.run([str(PODMAN), "rmi", rebuilt], capture_output=True, timeout=120, check=False)
    status = kube.topology(namespace, name)["status"]
    assert status["history"] == history, (history, status["history"])
    assert not _running(_memory(kube.topology(namespace, name)).transition), status["replan"]
    assert {p["metadata"]["uid"] for p in kube.items("pods", namespace, selector=f"app.kubernetes.io/instance={name}")
            } == engines, "an engine pod was replaced"
    print(f"\ntwo replicas: {active} active, {standby} paused; after its delete {successor} handled the next change "
          f"{failed_over_s:.1f} s after the delete; helm upgrade to {rebuilt} rolled out and settled in {rolled_s:.1f} s, "
          f"history unchanged ({len(history)} entries), the engine pods untouched")
