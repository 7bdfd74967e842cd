"""The project's processes on top of a cluster: the operator installed with the Helm chart (and run, as the chart's
ServiceAccount, from the command the chart renders) and the engine emulator feeding Prometheus (which runs the
real engine instead for the pods of namespaces a scenario names, see `Emulator.set_real_engine`).

Used by e2e/conftest.py. The operator runs as a local process rather than an in-cluster pod because kwok's pods
run nothing; it still authenticates with the chart's ServiceAccount token, so the chart's RBAC is what is
tested. Must not start anything it cannot stop through the cluster's Supervisor.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster
from .kubetools import REPO_ROOT, tool
from .processes import Child, free_port, http_ok, wait_until

CHART = REPO_ROOT / "charts" / "servingtopology"
OPERATOR_NAMESPACE = "servingtopology-system"
RELEASE = "st"
PRIORITY_ABOVE_RANDOM = 1 << 30   # operator/entry/main.py draws a replica's random peering priority below this


def _venv_script(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@dataclass
class Operator:
    """The operator, installed by Helm and run from the chart's own command line as the chart's ServiceAccount."""

    cluster: LocalCluster
    timer_interval_s: int = 5
    argv: list[str] = field(default_factory=list)
    kubeconfig: Path | None = None
    child: Child | None = None
    liveness_port: int = 0
    starts: int = 0

    def install(self) -> None:
        """`helm install` the chart (operator replicas 0: kwok pods run nothing), then prepare the local command."""
        helm = str(tool("helm"))
        subprocess.run(
            [helm, "upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
             f"--kubeconfig={self.cluster.kubeconfig}", "--set", "replicaCount=0",
             # The cluster's Prometheus Operator serves monitoring.coreos.com/v1 PodMonitor, so the chart renders its
             # PodMonitors; the harness scrapes every 2 s (the scenarios' seconds, not a cluster's 15 s).
             "--set", "podMonitors.interval=2s",
             # The cluster's Prometheus (and the fault scenarios' stand-ins for it) listen on loopback, outside the chart's
             # default allow-list of in-cluster Services: allow any loopback port (https: the TLS scenario's Prometheus).
             "--set-json", 'operator.prometheusUrlAllowList=["http://127.0.0.1:*","https://127.0.0.1:*"]',
             # Secrets a resource names for its Prometheus (the TLS scenario's client certificate and key, opted in by label).
             "--set", "rbac.readSecrets=true",
             "--set", f"operator.timerIntervalSeconds={self.timer_interval_s}", "--set", "operator.logLevel=DEBUG",
             "--create-namespace"],
            check=True, capture_output=True, text=True, timeout=180,
        )
        if self.cluster.with_prometheus:   # the Prometheus Operator turns the chart's two PodMonitors into jobs
            self.cluster.sync_prometheus_config(pod_monitors=2)
        deployment = json.loads(self.cluster.kubectl("get", "deployments", "-n", OPERATOR_NAMESPACE, "-l",
                                                     f"app.kubernetes.io/instance={RELEASE}", "-o", "json").stdout)["items"][0]
        pod_spec = deployment["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        self.kubeconfig = self.cluster.service_account_kubeconfig(namespace=OPERATOR_NAMESPACE, name=pod_spec["serviceAccountName"])
        command = [_venv_script(container["command"][0]), *container["command"][1:]]
        self.liveness_port = free_port()
        replaced = {"--liveness-port": str(self.liveness_port), "--metrics-port": str(free_port())}
        args = [re.sub(r"^(--[a-z-]+)=.*$", lambda m: f"{m.group(1)}={replaced[m.group(1)]}", a)
                if a.split("=", 1)[0] in replaced else a for a in container["args"]]
        self.argv = [*command, *args]

    def start(self) -> Child:
        """Starts the chart's command line and waits for /healthz.

        Each start adds `--priority` above every earlier start's (and above the random one the chart's replicas
        take): kopf pauses an operator while a live peering record of the same or higher priority exists, and a
        SIGKILLed process leaves its record alive for 60 s, so a replacement with a random priority would sit
        paused for up to a minute half of the time. A replacement pod that outranks its dead predecessor starts
        handling at once, which keeps the restart scenarios' timing independent of a coin toss."""
        assert self.kubeconfig is not None, "install() first"
        self.starts += 1
        argv = [*self.argv, f"--priority={PRIORITY_ABOVE_RANDOM + self.starts}"]
        self.child = self.cluster.supervisor.start("operator", argv, env={"KUBECONFIG": str(self.kubeconfig)})
        child = self.child
        wait_until(lambda: _alive_and(child, lambda: http_ok(f"http://127.0.0.1:{self.liveness_port}/healthz")),
                   timeout_s=90, what="operator /healthz", on_timeout=child.log_tail)
        return child

    def restart_with_timer(self, timer_interval_s: float) -> Child:
        """SIGKILL the operator and start it again with `--timer-interval-s` (the chart's 30 s, say, where a scenario
        must tell a change handler's work from the timer's; the harness's 5 s would hide it)."""
        self.kill()
        self.argv = [f"--timer-interval-s={timer_interval_s:g}" if a.startswith("--timer-interval-s=") else a for a in self.argv]
        self.timer_interval_s = int(timer_interval_s)
        return self.start()

    def kill(self) -> None:
        """SIGKILL, as a crashed or evicted operator."""
        if self.child is not None:
            self.cluster.supervisor.kill(self.child)
            self.child = None

    def log_tail(self, chars: int = 4000) -> str:
        path = self.cluster.supervisor.log_dir / "operator.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _alive_and(child: Child, probe: Any) -> bool:
    child.raise_if_dead()
    return bool(probe())


@dataclass
class Emulator:
    """`servingtopology emulate` in cluster mode, serving each engine pod's /metrics at the pod's IP and port."""

    cluster: LocalCluster
    child: Child | None = None

    @property
    def profile_path(self) -> Path:
        return self.cluster.work_dir / "traffic.yaml"

    @property
    def status_path(self) -> Path:
        return self.cluster.work_dir / "emulator-status.json"

    @property
    def real_engines_path(self) -> Path:
        return self.cluster.work_dir / "real-engines.yaml"

    def set_real_engine(self, rule: dict[str, Any]) -> None:
        """Adds a rule: the pods of its namespace run the real engine (servingtopology/emulator/real_engine.py)."""
        rules = yaml.safe_load(self.real_engines_path.read_text()) if self.real_engines_path.exists() else {"rules": []}
        rules["rules"].append(rule)
        tmp = self.real_engines_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(rules))
        tmp.replace(self.real_engines_path)

    def set_profile(self, profile: dict[str, Any]) -> None:
        """Replaces the scripted traffic; the emulator restarts it from its first phase."""
        tmp = self.profile_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(profile))
        tmp.replace(self.profile_path)

    def start(self) -> Child:
        if not self.profile_path.exists():
            self.set_profile({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 200}]})
        self.child = self.cluster.supervisor.start("emulator", [
            _venv_script("servingtopology"), "emulate", f"--kubeconfig={self.cluster.kubeconfig}",
            f"--profile={self.profile_path}", "--at-pod-address", f"--status={self.status_path}",
            f"--real-engines={self.real_engines_path}", "--interval-s=1",
        ])
        child = self.child
        wait_until(lambda: _alive_and(child, self.status_path.exists), timeout_s=60, what="emulator status file",
                   on_timeout=child.log_tail)
        return child

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (OSError, json.JSONDecodeError):
            return {"instances": {}, "errors": {}}
