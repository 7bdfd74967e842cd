"""A real Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC on), controller-manager, scheduler,
kwok with fake GPU nodes whose pods become Ready (pod IPs on loopback), the Prometheus Operator, and Prometheus
discovering engine pods through the API server with the configuration the Prometheus Operator makes of the chart's
PodMonitors.

Used by e2e/conftest.py (one cluster per test session). `LocalCluster.start` either finishes with every
component healthy or stops what it started and raises with the failing component's log tail. Binaries come
from e2e/build_control_plane.sh's cache; nothing is downloaded here.
"""

from __future__ import annotations

import base64
import copy
import fcntl
import gzip
import json
import random
import shutil
import signal
import ssl
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from .kubetools import PROMETHEUS_OPERATOR
from .pki import Pki, ServingPki, admin_kubeconfig, make_pki, token_kubeconfig
from .processes import Child, Supervisor, free_port, http_ok, wait_until

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_MONITOR_GRACE_S = 600   # see the controller-manager's flags in LocalCluster.start
# kwok gives pods addresses from a /16 of 127.0.0.0/8: every one of them is a loopback address on Linux, so the
# emulator serves each engine pod's /metrics at the pod's own IP and port, where Prometheus' Kubernetes discovery
# points (as it would at a real engine). Each session claims its own /16 (`claim_pod_cidr`): two sessions on one
# host with the same range would both serve their first pod at 127.x.0.1:8000, and the second gets EADDRINUSE.
POD_CIDR_SECOND_OCTETS = range(65, 255)
POD_CIDR_CLAIMS = Path(tempfile.gettempdir()) / "st-e2e-pod-cidrs"
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_ACCOUNT = "prometheus"
# The Prometheus resource the Prometheus Operator reconciles; it writes the configuration into Secret prometheus-<name>.
PROMETHEUS_RESOURCE = "e2e"
# What the Prometheus Operator's config-reloader sidecar puts in place of the $(VARIABLE)s of the generated
# configuration: the pod's name and its shard (one replica, one shard here).
RELOADER_VARIABLES = {"$(POD_NAME)": f"prometheus-{PROMETHEUS_RESOURCE}-0", "$(SHARD)": "0"}


@dataclass(frozen=True, slots=True)
class NodePool:
    """Fake GPU nodes to create: `count` nodes with `gpus_per_node` GPUs of `gpu_product` each."""

    count: int = 4
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    name_prefix: str = "gpu-node"


def claim_pod_cidr() -> tuple[str, IO[str]]:
    """A pod range `127.X.0.0/16` that no other live e2e session on this host holds, and the open lock file that
    holds it (an exclusive flock, released when the file is closed or the process dies, so a killed session
    leaves nothing to clean up). The file descriptor is not inherited by children (PEP 446)."""
    POD_CIDR_CLAIMS.mkdir(parents=True, exist_ok=True)
    octets = list(POD_CIDR_SECOND_OCTETS)
    random.shuffle(octets)
    for octet in octets:
        handle = (POD_CIDR_CLAIMS / f"127.{octet}").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return f"127.{octet}.0.0/16", handle
    raise RuntimeError(f"every pod range 127.{{65..254}}.0.0/16 is held by another e2e session ({POD_CIDR_CLAIMS})")


class LocalCluster:
    """Starts, holds and stops every process of the local cluster; a context manager."""

    def __init__(self, *, binaries: Path | None, work_dir: Path | None = None, node_pool: NodePool | None = None,
                 with_prometheus: bool = True, external_kubeconfig: Path | None = None,
                 pod_ready_delay_ms: int = 1500) -> None:
        """`external_kubeconfig` names a running cluster with kwok installed (kind): only nodes and Prometheus start."""
        if binaries is None and external_kubeconfig is None:
            raise ValueError("either binaries (local control plane) or external_kubeconfig is needed")
        self.binaries = binaries
        self.external_kubeconfig = external_kubeconfig
        self.pod_ready_delay_ms = pod_ready_delay_ms
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="st-e2e-"))
        self.node_pool = node_pool or NodePool()
        self.with_prometheus = with_prometheus
        self.supervisor = Supervisor(self.work_dir / "logs")
        self.pki: Pki | None = None
        self.apiserver_port = 0
        self.prometheus_port = 0
        self.kubeconfig = external_kubeconfig or self.work_dir / "admin.kubeconfig"
        self.prometheus_dir = self.work_dir / "prometheus"
        self.prometheus: Child | None = None
        self.prometheus_operator: Child | None = None
        self.apiserver: Child | None = None
        self._apiserver_argv: list[str] = []
        self.pod_cidr = ""
        self._pod_cidr_claim: IO[str] | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server_url(self) -> str:
        if self.external_kubeconfig is not None:
            return str(self._external_cluster()["server"])
        return f"https://127.0.0.1:{self.apiserver_port}"

    def _external_cluster(self) -> dict[str, Any]:
        config = yaml.safe_load(self.kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        return dict(next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"])

    def _ca_file(self) -> Path:
        if self.pki is not None:
            return self.pki.ca_crt
        cluster = self._external_cluster()
        if "certificate-authority" in cluster:
            return Path(cluster["certificate-authority"])
        path = self.work_dir / "external-ca.crt"
        path.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        return path

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def start(self) -> None:
        """Starts every component in order, waiting for each to be healthy."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops every process; keeps the work folder (logs) for post-mortems."""
        self.supervisor.stop_all()
        if self._pod_cidr_claim is not None:
            self._pod_cidr_claim.close()
            self._pod_cidr_claim = None

    def _start(self) -> None:
        if self.external_kubeconfig is not None:
            self.create_gpu_nodes(self.node_pool)
            wait_until(lambda: self._ready_node_count() >= self.node_pool.count, timeout_s=120,
                       what=f"{self.node_pool.count} fake GPU nodes Ready (is kwok installed in the cluster?)")
            if self.with_prometheus:
                self.start_prometheus_operator()
                self.start_prometheus()
            return
        assert self.binaries is not None
        self.pki = make_pki(self.work_dir / "pki")
        etcd_port, etcd_peer_port = free_port(), free_port()
        etcd = self.supervisor.start("etcd", [
            str(self.binaries / "etcd"), "--name=e2e", f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}", f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}", f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
            f"--initial-cluster=e2e=http://127.0.0.1:{etcd_peer_port}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=2147483648",
        ])
        wait_until(lambda: http_ok(f"http://127.0.0.1:{etcd_port}/health"), timeout_s=60, what="etcd /health",
                   on_timeout=etcd.log_tail)

        self.apiserver_port = free_port()
        self._apiserver_argv = [
            str(self.binaries / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={self.pki.server_crt}", f"--tls-private-key-file={self.pki.server_key}",
            f"--client-ca-file={self.pki.ca_crt}",
            f"--service-account-issuer=https://127.0.0.1:{self.apiserver_port}",
            f"--service-account-key-file={self.pki.sa_pub}", f"--service-account-signing-key-file={self.pki.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC", "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount", "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0", "--enable-priority-and-fairness=false", "--profiling=false",
            "--endpoint-reconciler-type=none", "-v=1",
        ]
        self.start_apiserver()
        admin_kubeconfig(self.kubeconfig, server_url=self.server_url, pki=self.pki)

        cm = self.supervisor.start("kube-controller-manager", [
            str(self.binaries / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--controllers=*,-nodeipam,-csrsigning,-csrapproving,-bootstrapsigner,-tokencleaner",
            f"--service-account-private-key-file={self.pki.sa_key}", f"--root-ca-file={self.pki.ca_crt}",
            "--secure-port=0", "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
            "--concurrent-gc-syncs=20", "-v=1",
            # A fake node whose lease renewal lags past the grace period (the default 50 s; kwok renews from a
            # process that shares two cores with two clusters under load) is marked Unknown, and the node-lifecycle
            # controller sets every pod on it Ready=False. A kubelet would report them Ready again on its next status
            # sync; kwok's pod stages never do (kubernetes-sigs/kwok#1464), so those pods would stay unready for
            # good while `kubectl get pods` still shows their containers 1/1. No scenario here takes a node away.
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
        ])
        scheduler = self.supervisor.start("kube-scheduler", [
            str(self.binaries / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--secure-port=0", "-v=1",
        ])
        self.pod_cidr, self._pod_cidr_claim = claim_pod_cidr()
        kwok = self.supervisor.start("kwok", [
            str(self.binaries / "kwok"), f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake", f"--cidr={self.pod_cidr}",
            "--node-ip=10.0.0.1", f"--config={self._kwok_stages()}", "--server-address=127.0.0.1:0",
            "--node-lease-duration-seconds=40",
        ])
        self._wait_for_default_service_account(children=(cm, scheduler, kwok))
        self.create_gpu_nodes(self.node_pool)
        wait_until(lambda: self._ready_node_count() >= self.node_pool.count, timeout_s=90,
                   what=f"{self.node_pool.count} fake GPU nodes Ready", on_timeout=kwok.log_tail)
        if self.with_prometheus:
            self.start_prometheus_operator()
            self.start_prometheus()

    # ---- the API server (restartable on the same etcd, port and certificates) ------------------------

    def start_apiserver(self) -> Child:
        """Starts kube-apiserver with the command line of the first start and waits for /readyz."""
        assert self._apiserver_argv, "the local control plane only"
        self.apiserver = self.supervisor.start("kube-apiserver", self._apiserver_argv)
        child = self.apiserver
        wait_until(lambda: child.raise_if_dead() or self._apiserver_ready(), timeout_s=120, what="kube-apiserver /readyz",
                   on_timeout=child.log_tail)
        return child

    def stop_apiserver(self, *, sig: int = signal.SIGKILL) -> None:
        """Stops kube-apiserver (SIGKILL by default, as a crash; SIGTERM drains it); etcd and the port stay."""
        if self.apiserver is not None:
            self.supervisor.stop(self.apiserver, grace_s=0.0 if sig == signal.SIGKILL else 30.0, sig=sig)
            self.apiserver = None

    def _kwok_stages(self) -> Path:
        """kwok's stages, with engine pods taking `pod_ready_delay_ms` to become Ready (as weights load), so a
        rollout has an observable middle."""
        assert self.binaries is not None
        docs = [d for d in yaml.safe_load_all((self.binaries / "kwok-stages.yaml").read_text()) if d]
        for doc in docs:
            if doc["metadata"]["name"] == "pod-ready" and self.pod_ready_delay_ms:
                doc["spec"]["delay"] = {"durationMilliseconds": self.pod_ready_delay_ms,
                                        "jitterDurationMilliseconds": self.pod_ready_delay_ms * 2}
        path = self.work_dir / "kwok-stages.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    # ---- probes ----------------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        context.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return context

    def _apiserver_ready(self) -> bool:
        return http_ok(f"{self.server_url}/readyz", context=self._ssl_context())

    def _wait_for_default_service_account(self, children: tuple[Child, ...]) -> None:
        def ready() -> bool:
            for child in children:
                child.raise_if_dead()
            return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

        wait_until(ready, timeout_s=90, what="controller-manager (default ServiceAccount)",
                   on_timeout=lambda: "\n".join(c.log_tail(1500) for c in children))

    def _ready_node_count(self) -> int:
        """Nodes that are Ready and schedulable (the node-lifecycle controller has lifted the not-ready taint)."""
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        return sum(
            1 for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
            and not any(t["key"].startswith("node.kubernetes.io/") for t in n.get("spec", {}).get("taints", []))
        )

    # ---- nodes and tools -------------------------------------------------------------------------------

    def create_gpu_nodes(self, pool: NodePool) -> None:
        """Creates `pool.count` kwok-managed nodes advertising `pool.gpus_per_node` GPUs each."""
        resources = {"cpu": "128", "memory": "1Ti", "ephemeral-storage": "2Ti", "pods": "110", GPU_RESOURCE: str(pool.gpus_per_node)}
        for i in range(pool.count):
            node: dict[str, Any] = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": f"{pool.name_prefix}-{i}",
                    "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": f"{pool.name_prefix}-{i}", "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", "type": "kwok", GPU_PRODUCT_LABEL: pool.gpu_product,
                        "nvidia.com/gpu.count": str(pool.gpus_per_node),
                    },
                },
                # The taint GPU nodes usually carry, so specs written for real clusters schedule here unchanged.
                "spec": {"taints": [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]},
                "status": {"capacity": resources, "allocatable": resources},
            }
            self.kubectl_apply(node)
            # Creating a Node may drop status; set capacity through the status subresource as well.
            self.kubectl("patch", "node", node["metadata"]["name"], "--subresource=status", "--type=merge",
                         "-p", json.dumps({"status": {"capacity": resources, "allocatable": resources}}))

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster (as admin unless `kubeconfig` is given)."""
        from .kubetools import tool

        done = subprocess.run(
            [str(tool("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input_text, capture_output=True, text=True, timeout=120,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def kubectl_apply(self, *objects: dict[str, Any], kubeconfig: Path | None = None) -> None:
        """Applies objects with server-side apply as the e2e field manager."""
        text = yaml.safe_dump_all(objects, sort_keys=False)
        self.kubectl("apply", "--server-side", "--field-manager=e2e", "--force-conflicts", "-f", "-",
                     input_text=text, kubeconfig=kubeconfig)

    def service_account_kubeconfig(self, *, namespace: str, name: str, duration: str = "6h") -> Path:
        """Writes a kubeconfig that authenticates as ServiceAccount `namespace/name` (so its RBAC is what counts)."""
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        return token_kubeconfig(self.work_dir / f"sa-{namespace}-{name}.kubeconfig", server_url=self.server_url,
                                ca_crt=self._ca_file(), token=token, user_name=f"{namespace}-{name}")

    # ---- Prometheus ------------------------------------------------------------------------------------

    def prometheus_credentials(self) -> Path:
        """A token file for a `prometheus` ServiceAccount with the read access kube-prometheus-stack grants its
        Prometheus (pods, services, endpoints, nodes), so discovery runs under RBAC as it does in a cluster."""
        token_path = self.prometheus_dir / "token"
        if token_path.exists():
            return token_path
        rules = [{"apiGroups": [""], "resources": ["pods", "services", "endpoints", "nodes", "nodes/metrics"],
                  "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}]
        meta = {"name": f"e2e-{PROMETHEUS_ACCOUNT}"}
        self.kubectl_apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROMETHEUS_NAMESPACE}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": PROMETHEUS_ACCOUNT, "namespace": PROMETHEUS_NAMESPACE}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": meta["name"]},
             "subjects": [{"kind": "ServiceAccount", "name": PROMETHEUS_ACCOUNT, "namespace": PROMETHEUS_NAMESPACE}]},
        )
        token = self.kubectl("create", "token", PROMETHEUS_ACCOUNT, "-n", PROMETHEUS_NAMESPACE, "--duration=12h").stdout.strip()
        token_path.parent.mkdir(parents=True, exist_ok=True)
        token_path.write_text(token)
        token_path.chmod(0o600)
        return token_path

    def start_prometheus_operator(self) -> Child:
        """The Prometheus Operator (built by e2e/build_control_plane.sh from the Go module proxy): its CRDs (printed by
        its own `crds` command), a Prometheus resource that selects every PodMonitor in every namespace, and the operator
        process, which writes that Prometheus' configuration into Secret prometheus-e2e as it would for its StatefulSet
        (replicas 0: the local Prometheus process runs the configuration, `sync_prometheus_config`)."""
        found = self.binaries / PROMETHEUS_OPERATOR if self.binaries else shutil.which("prometheus-operator")
        if found is None or not Path(found).is_file():
            raise FileNotFoundError("no Prometheus Operator: run e2e/build_control_plane.sh (it builds one)")
        binary = str(found)
        crds = subprocess.run([binary, "crds"], check=True, capture_output=True, text=True, timeout=60).stdout
        self.kubectl("apply", "--server-side", "--field-manager=e2e", "--force-conflicts", "-f", "-", input_text=crds)
        self.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd/podmonitors.monitoring.coreos.com",
                     "crd/prometheuses.monitoring.coreos.com")
        self.prometheus_credentials()   # the namespace and the ServiceAccount the Prometheus resource names
        self.kubectl_apply({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": PROMETHEUS_RESOURCE, "namespace": PROMETHEUS_NAMESPACE},
            "spec": {"replicas": 0, "serviceAccountName": PROMETHEUS_ACCOUNT, "podMonitorSelector": {},
                     "podMonitorNamespaceSelector": {}, "scrapeInterval": "2s", "scrapeTimeout": "1s", "evaluationInterval": "2s"},
        })
        self.prometheus_operator = self.supervisor.start("prometheus-operator", [
            binary, f"--web.listen-address=127.0.0.1:{free_port()}", "--log-level=info",
            f"--prometheus-instance-namespaces={PROMETHEUS_NAMESPACE}",
        ], env={"KUBECONFIG": str(self.kubeconfig)})
        child = self.prometheus_operator
        wait_until(lambda: child.raise_if_dead() or self.generated_prometheus_config() is not None, timeout_s=120,
                   what="the Prometheus Operator's configuration Secret", on_timeout=child.log_tail)
        return child

    def generated_prometheus_config(self) -> dict[str, Any] | None:
        """The configuration the Prometheus Operator generated (Secret prometheus-e2e, prometheus.yaml.gz); None before."""
        done = self.kubectl("get", "secret", f"prometheus-{PROMETHEUS_RESOURCE}", "-n", PROMETHEUS_NAMESPACE, "-o",
                            "jsonpath={.data.prometheus\\.yaml\\.gz}", check=False)
        if done.returncode != 0 or not done.stdout.strip():
            return None
        return dict(yaml.safe_load(gzip.decompress(base64.b64decode(done.stdout.strip())).decode()))

    def _local_prometheus_config(self, generated: dict[str, Any]) -> dict[str, Any]:
        """What the Prometheus Operator's pod would run, for a Prometheus on this host: the config-reloader's variables
        filled in, and the API server, its CA and the `prometheus` ServiceAccount's token added to each Kubernetes
        discovery (in a pod they come from the pod's own service-account mount). Nothing else is changed."""
        text = yaml.safe_dump(generated, sort_keys=False)
        for variable, value in RELOADER_VARIABLES.items():
            text = text.replace(variable, value)
        config = dict(yaml.safe_load(text))
        sd_access = {"api_server": self.server_url, "tls_config": {"ca_file": str(self._ca_file())},
                     "authorization": {"type": "Bearer", "credentials_file": str(self.prometheus_credentials())}}
        for job in config.get("scrape_configs") or []:
            for sd in job.get("kubernetes_sd_configs", []):
                for key, value in sd_access.items():
                    sd.setdefault(key, copy.deepcopy(value))
        return config

    def sync_prometheus_config(self, *, pod_monitors: int = 0, timeout_s: float = 120) -> list[str]:
        """The config-reloader's part: wait until the generated configuration has a job for each of `pod_monitors`
        PodMonitor endpoints, write it for the local Prometheus and have it reload; returns the job names."""
        configs: list[dict[str, Any]] = []

        def generated() -> bool:
            config = self.generated_prometheus_config()
            jobs = [j for j in (config or {}).get("scrape_configs") or [] if j["job_name"].startswith("podMonitor/")]
            configs[:] = [config] if config is not None and len(jobs) >= pod_monitors else []
            return bool(configs)

        wait_until(generated, timeout_s=timeout_s, what=f"{pod_monitors} PodMonitor jobs in the Prometheus Operator's configuration",
                   on_timeout=lambda: self.prometheus_operator.log_tail() if self.prometheus_operator else "")
        config = self._local_prometheus_config(configs[0])
        path = self.prometheus_dir / "prometheus.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        if self.prometheus is not None and self.prometheus.alive():
            request = urllib.request.Request(f"{self.prometheus_url}/-/reload", method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200, response.status
        return [j["job_name"] for j in config.get("scrape_configs") or []]

    def start_prometheus(self) -> Child:
        """Starts Prometheus on loopback with the configuration the Prometheus Operator generated (the PodMonitors'
        jobs once the chart is installed: `sync_prometheus_config`): pods found through the API server
        (`kubernetes_sd_configs`), scraped every 2 s (the chart's podMonitors.interval in the harness)."""
        # Built with Kubernetes discovery by e2e/build_control_plane.sh (Debian's Prometheus has none).
        prometheus_bin = str(self.binaries / "prometheus") if self.binaries else shutil.which("prometheus")
        if prometheus_bin is None:
            raise FileNotFoundError("no prometheus: run e2e/build_control_plane.sh (it builds one with Kubernetes discovery)")
        folder = self.prometheus_dir
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "prometheus.yml").exists():
            self.sync_prometheus_config()
        self.prometheus_port = self.prometheus_port or free_port()
        self.prometheus = self.supervisor.start("prometheus", [
            prometheus_bin, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.prometheus_port}", "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=2h", "--log.level=warn",
        ])
        child = self.prometheus
        wait_until(lambda: http_ok(f"{self.prometheus_url}/-/ready"), timeout_s=60, what="Prometheus /-/ready",
                   on_timeout=child.log_tail)
        return child

    def start_tls_prometheus(self, pki: ServingPki, *, name: str, client_certificates: bool = False) -> tuple[Child, str]:
        """A second Prometheus with this cluster's configuration (the same PodMonitor jobs, scraping the same pods) that
        serves its API over https only: `--web.config.file` with a tls_server_config holding `pki`'s serving certificate
        for 127.0.0.1 (and, with `client_certificates`, client_auth_type RequireAndVerifyClientCert against `pki`'s CA).
        Returns the process and its https URL; stop it with `supervisor.stop`."""
        prometheus_bin = str(self.binaries / "prometheus") if self.binaries else shutil.which("prometheus")
        if prometheus_bin is None:
            raise FileNotFoundError("no prometheus: run e2e/build_control_plane.sh (it builds one with Kubernetes discovery)")
        folder = self.work_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        web = folder / "web.yml"
        tls: dict[str, str] = {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key)}
        if client_certificates:
            tls |= {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca_crt)}
        web.write_text(yaml.safe_dump({"tls_server_config": tls}))
        port = free_port()
        child = self.supervisor.start(name, [
            prometheus_bin, f"--config.file={self.prometheus_dir / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={web}", "--storage.tsdb.retention.time=2h",
            "--log.level=warn",
        ])
        url = f"https://127.0.0.1:{port}"
        trusting = ssl.create_default_context(cafile=str(pki.ca_crt))
        trusting.load_cert_chain(pki.client_crt, pki.client_key)
        wait_until(lambda: child.raise_if_dead() or http_ok(f"{url}/-/ready", context=trusting), timeout_s=60,
                   what=f"{name} /-/ready over https", on_timeout=child.log_tail)
        return child, url

    def stop_prometheus(self) -> None:
        """Stops Prometheus (the port stays reserved for a restart)."""
        if self.prometheus is not None:
            self.supervisor.stop(self.prometheus)
            self.prometheus = None

