"""A real node beside the kwok GPU nodes: Debian's containerd (1.6, runc) and the kubelet built with the control plane
(e2e/build_control_plane.sh), CPU only. Both run in a network namespace the harness makes, so the pods' bridge, their
addresses (NODE_SUBNET) and the one DNAT rule exist only there; e2e/netns_forward.py relays the API server into it
(for the kubelet at 127.0.0.1 and for pods at the kubernetes Service's address). The node is tainted, so only pods
that tolerate REAL_NODE_TAINT run on it. Used by the real-node scenarios (e2e/test_real_node.py); `stop` leaves no
process, mount, namespace or Node object behind. The API server cannot reach the kubelet (the node's address is
inside the namespace), so pod logs are read from the node's log folder, not with `kubectl logs`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster
from .kubetools import BUILD_SCRIPT, REPO_ROOT
from .processes import Child, wait_until

NODE_SUBNET = "10.88.0.0/24"
NODE_IP = "10.88.0.1"  # the bridge's address in the namespace, and the node's InternalIP
BRIDGE = "stnode0"
# The kubernetes Service's ClusterIP: the first address of the API server's --service-cluster-ip-range (10.0.0.0/24);
# the serving certificate names it (e2e/pki.py), so in-cluster clients verify the API server through the relay.
KUBERNETES_SERVICE_IP = "10.0.0.1"
REAL_NODE_TAINT = {"key": "servingtopology.io/real-node", "value": "true", "effect": "NoSchedule"}
PAUSE_IMAGE = "localhost/servingtopology/pause:1"
PODMAN = REPO_ROOT / "tools" / "image" / "podman.sh"


def _run(*argv: str | Path, stdin: bytes | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], input=stdin, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))}: rc {done.returncode}\n{done.stderr.decode()[-2000:]}")
    return done.stdout.decode()


def pause_image_archive(pause_binary: Path, target: Path) -> Path:
    """An OCI image archive of one layer holding `/pause` (the pod sandbox's process), named PAUSE_IMAGE."""
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w") as layer:
        info = tarfile.TarInfo("pause")
        info.size, info.mode = pause_binary.stat().st_size, 0o755
        layer.addfile(info, pause_binary.open("rb"))
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_desc = blob(layer_buffer.getvalue(), "application/vnd.oci.image.layer.v1.tar")
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
              "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
    config_desc = blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    manifest_desc["annotations"] = {"io.containerd.image.name": PAUSE_IMAGE,
                                    "org.opencontainers.image.ref.name": PAUSE_IMAGE}
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
             "index.json": json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode(),
             **{f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in blobs.items()}}
    with tarfile.open(target, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return target


@dataclass(frozen=True, slots=True)
class ContainerProcess:
    """A container's first process as the host's kernel sees it."""

    pid: int
    uid: int
    gid: int
    capabilities_effective: int
    no_new_privs: bool
    seccomp_filtered: bool   # Seccomp: 2 in /proc/PID/status (a filter, RuntimeDefault's)
    root_read_only: bool


class RealNode:
    """One real node named `name` in `cluster`, its files under the cluster's work folder."""

    def __init__(self, cluster: LocalCluster, *, name: str = "real-node-0") -> None:
        self.cluster = cluster
        self.name = name
        self.dir = cluster.work_dir / f"node-{name}"
        self.netns = f"st-e2e-{uuid.uuid4().hex[:8]}"
        self.netns_path = Path("/run/netns") / self.netns
        self.socket = self.dir / "containerd.sock"
        self.pod_logs = self.dir / "pod-logs"
        self._children: list[Child] = []
        self._pod_netns_inodes: set[int] = set()

    # --- start ---------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Brings the node up until it is Ready, or stops what it started and raises with the failing part's log."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        binaries = Path(subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True,
                                       timeout=3600).stdout.strip().splitlines()[-1])
        for d in ("containerd-root", "containerd-state", "cni-conf", "cni-data", "kubelet", "pod-logs", "pki", "opt"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self._network()
        self._containerd()
        self.import_archive(pause_image_archive(binaries / "pause", self.dir / "pause.oci.tar"))
        self._credentials()
        relay = self.cluster.supervisor.start(f"{self.name}-relay", [
            sys.executable, "-m", "e2e.netns_forward", str(self.netns_path), str(self.cluster.apiserver_port),
            f"127.0.0.1:{self.cluster.apiserver_port}", f"{NODE_IP}:{self.cluster.apiserver_port}"], cwd=REPO_ROOT)
        self._children.append(relay)
        wait_until(lambda: "relaying" in relay.log_tail(), timeout_s=30, what="the API server relay",
                   on_timeout=relay.log_tail)
        kubelet = self.cluster.supervisor.start(f"{self.name}-kubelet", [
            "nsenter", f"--net={self.netns_path}", str(binaries / "kubelet"), f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}", f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'pki'}", f"--hostname-override={self.name}", f"--node-ip={NODE_IP}", "--v=1"])
        self._children.append(kubelet)
        wait_until(self._ready, timeout_s=120, what=f"node {self.name} Ready", on_timeout=kubelet.log_tail)

    def _network(self) -> None:
        """The namespace, its loopback, the pods' bridge with the node's address, and the kubernetes Service's DNAT."""
        _run("ip", "netns", "add", self.netns)
        for argv in (("link", "set", "lo", "up"), ("link", "add", BRIDGE, "type", "bridge"),
                     ("addr", "add", f"{NODE_IP}/24", "dev", BRIDGE), ("link", "set", BRIDGE, "up")):
            _run("ip", "-n", self.netns, *argv)
        _run("ip", "netns", "exec", self.netns, "iptables", "-t", "nat", "-A", "PREROUTING", "-d",
             f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination",
             f"{NODE_IP}:{self.cluster.apiserver_port}")
        conflist = {"cniVersion": "1.0.0", "name": "st-e2e-node", "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "isDefaultGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": NODE_SUBNET, "gateway": NODE_IP}]],
                      "dataDir": str(self.dir / "cni-data")}}]}
        (self.dir / "cni-conf" / "10-st-e2e-node.conflist").write_text(json.dumps(conflist))

    def _containerd(self) -> None:
        # disable_apparmor and restrict_oom_score_adj: without them runc fails here ("can't get final child's PID
        # from pipe"); cgroupfs, as the kubelet (no systemd on these machines).
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        config = f"""version = 2
root = "{self.dir / 'containerd-root'}"
state = "{self.dir / 'containerd-state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.dir / 'containerd.ttrpc.sock'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.dir / 'opt'}"
{cri}
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.dir / 'cni-conf'}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
"""
        (self.dir / "containerd.toml").write_text(config)
        containerd = self.cluster.supervisor.start(f"{self.name}-containerd", [
            "nsenter", f"--net={self.netns_path}", "containerd", f"--config={self.dir / 'containerd.toml'}"])
        self._children.append(containerd)
        wait_until(lambda: self.socket.exists() and containerd.alive(), timeout_s=30, what="containerd's socket",
                   on_timeout=containerd.log_tail)

    def _credentials(self) -> None:
        """The kubelet's client certificate (system:node:<name> in system:nodes, bound to the system:node role) and
        its configuration."""
        pki = self.cluster.pki
        key, csr, crt = self.dir / "pki" / "client.key", self.dir / "pki" / "client.csr", self.dir / "pki" / "client.crt"
        _run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", f"/O=system:nodes/CN=system:node:{self.name}")
        _run("openssl", "x509", "-req", "-in", csr, "-CA", pki.ca_crt, "-CAkey", pki.ca_key, "-CAcreateserial",
             "-days", "2", "-out", crt)
        self.cluster.kubectl_apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-system-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]})
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "node", "clusters": [
            {"name": "e2e", "cluster": {"server": f"https://127.0.0.1:{self.cluster.apiserver_port}",
                                        "certificate-authority": str(pki.ca_crt)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "e2e", "user": "node"}}]}
        (self.dir / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        # failCgroupV1 (1.35 refuses cgroup v1 otherwise), cgroupfs without QoS cgroups or allocatable enforcement:
        # these machines mix cgroup v1 and v2 and run no systemd. Eviction thresholds low: the disk is shared.
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failSwapOn": False, "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.pod_logs), "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki.ca_crt)}},
            "authorization": {"mode": "AlwaysAllow"},
            "registerWithTaints": [REAL_NODE_TAINT], "resolvConf": "",
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99}
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config))

    def _ready(self) -> bool:
        for child in self._children:
            child.raise_if_dead()
        done = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # --- images and logs -----------------------------------------------------------------------------------------
    def import_archive(self, archive: Path) -> None:
        _run("ctr", "--address", self.socket, "--namespace", "k8s.io", "images", "import", archive)

    def load_image(self, image: str) -> None:
        """Copies `image` from the project's podman store (tools/image/podman.sh) into the node's containerd."""
        archive = self.dir / "image.oci.tar"
        _run(PODMAN, "save", "--quiet", "--format", "oci-archive", "--output", archive, image)
        self.import_archive(archive)
        archive.unlink()

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's log lines (message part) as the node keeps them, all restarts in order."""
        lines = []
        for path in sorted(self.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            lines += [line.split(" ", 3)[3] for line in path.read_text().splitlines() if line.count(" ") >= 3]
        return "\n".join(lines)

    def container_process(self, container_id: str) -> ContainerProcess:
        """What the runtime made of a running container's first process, read from the host's /proc: its ids,
        capabilities, no_new_privs and seccomp mode, and whether its root file system is mounted read-only.
        `container_id` as a pod's status gives it (`containerd://<id>`)."""
        wanted = container_id.split("://", 1)[-1]
        rows = _run("ctr", "--address", self.socket, "-n", "k8s.io", "tasks", "ls").splitlines()[1:]
        pid = next(int(row.split()[1]) for row in rows if row.split()[0] == wanted)
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        # mountinfo: ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS ...; the root's options as the process sees them.
        root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")
        return ContainerProcess(
            pid=pid, uid=int(fields["Uid"].split()[0]), gid=int(fields["Gid"].split()[0]),
            capabilities_effective=int(fields["CapEff"].strip(), 16), no_new_privs=fields["NoNewPrivs"].strip() == "1",
            seccomp_filtered=fields["Seccomp"].strip() == "2", root_read_only="ro" in root[5].split(","))

    # --- stop ----------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """The Node object, the kubelet, every container (their shims were started by this containerd), containerd,
        the relay, then the node's mounts, namespace and image store."""
        self.cluster.kubectl("delete", "node", self.name, "--wait=false", check=False)
        for child in [c for c in self._children if "kubelet" in c.name]:
            self.cluster.supervisor.stop(child, grace_s=5)
        pod_netns = self._pod_netns_inodes
        if self.socket.exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                # TASK PID STATUS rows; the pods' network namespaces (containerd's /run/netns/cni-*, which only the
                # kubelet's StopPodSandbox would remove) are known by the namespace inode of a task's process.
                for row in _run("ctr", "--address", self.socket, "-n", "k8s.io", "tasks", "ls").splitlines()[1:]:
                    task, pid = row.split()[:2]
                    with contextlib.suppress(OSError):
                        pod_netns.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
                    with contextlib.suppress(RuntimeError):
                        _run("ctr", "--address", self.socket, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task)
        for netns in Path("/run/netns").glob("cni-*"):
            with contextlib.suppress(OSError):
                if netns.stat().st_ino in pod_netns:
                    subprocess.run(["ip", "netns", "del", netns.name], capture_output=True, timeout=30)
        for pid in self.shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        for child in reversed(self._children):
            self.cluster.supervisor.stop(child, grace_s=5)
        self._children.clear()
        for mount in self._mounts():
            subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
        if self.netns_path.exists():
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=30)
        # The images' layers (~650 MB with the operator's) go; the configuration and the pods' logs stay.
        for folder in ("containerd-root", "containerd-state", "kubelet", "opt"):
            if not self._mounts():
                shutil.rmtree(self.dir / folder, ignore_errors=True)

    def pod_netns_left(self) -> list[str]:
        """The pods' network namespaces that `stop` found and could not remove."""
        left = []
        for netns in Path("/run/netns").glob("cni-*"):
            with contextlib.suppress(OSError):
                if netns.stat().st_ino in self._pod_netns_inodes:
                    left.append(netns.name)
        return left

    def shims(self) -> list[int]:
        """containerd-shim-runc-v2 processes started for this node's containerd (their -address is its socket)."""
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                    if argv[0].endswith(b"containerd-shim-runc-v2") and str(self.socket).encode() in argv:
                        found.append(int(proc.name))
        return found

    def _mounts(self) -> list[str]:
        """Mount points under the node's folder, deepest first."""
        prefix = str(self.dir) + "/"
        points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return sorted({p for p in points if p.startswith(prefix)}, key=len, reverse=True)


def wait_for_pod_phase(cluster: LocalCluster, namespace: str, pod: str, phases: set[str], *,
                       timeout_s: float) -> dict[str, Any]:
    """The pod once its phase is one of `phases`."""
    seen: dict[str, Any] = {}

    def reached() -> bool:
        done = cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
        if done.returncode == 0:
            seen.update(json.loads(done.stdout))
        return seen.get("status", {}).get("phase") in phases

    wait_until(reached, timeout_s=timeout_s, what=f"pod {namespace}/{pod} in {sorted(phases)}",
               on_timeout=lambda: json.dumps(seen.get("status", {}))[-2000:])
    return seen
