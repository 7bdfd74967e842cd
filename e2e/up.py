"""`python -m e2e.up`: the whole e2e stack for a demo or for debugging, until Ctrl-C.

Starts the local control plane (building it first if needed), Prometheus (on a fixed port, 19090 unless
--prometheus-port says otherwise, so a ServingTopology's spec.metrics.prometheusUrl can name it), the operator
from the Helm chart and the engine emulator (with the --traffic profile, if given), prints how to reach them, and
stops everything on Ctrl-C or SIGTERM. Applies the given files, if any, once everything is up.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

import yaml

from servingtopology.emulator.traffic import TrafficProfile, TrafficProfileError

from .cluster import LocalCluster
from .kubetools import control_plane_dir, tool
from .stack import Emulator, Operator

DEMO_PROMETHEUS_PORT = 19090   # examples/demo-replan.yaml's spec.metrics.prometheusUrl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.up", description=__doc__)
    parser.add_argument("files", nargs="*", type=Path, help="manifests to kubectl apply once the stack is up")
    parser.add_argument("--no-operator", action="store_true", help="start the cluster, Prometheus and emulator only")
    parser.add_argument("--traffic", type=Path, help="the emulator's traffic profile to start with (e.g. e2e/demo-traffic.yaml)")
    parser.add_argument("--prometheus-port", type=int, default=DEMO_PROMETHEUS_PORT,
                        help=f"Prometheus' port on 127.0.0.1 (default {DEMO_PROMETHEUS_PORT}; 0: any free port)")
    args = parser.parse_args(argv)
    profile = None
    if args.traffic:
        profile = yaml.safe_load(args.traffic.read_text())
        try:
            TrafficProfile.from_mapping(profile)
        except TrafficProfileError as exc:
            parser.error(f"--traffic {args.traffic}: {exc}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = LocalCluster(binaries=control_plane_dir(build=True))
    cluster.prometheus_port = args.prometheus_port
    with cluster:
        if not args.no_operator:
            operator = Operator(cluster)
            operator.install()
            operator.start()
        emulator = Emulator(cluster)
        if profile is not None:
            emulator.set_profile(profile)
        emulator.start()
        for path in args.files:
            cluster.kubectl("apply", "-f", str(path))
        print(f"export KUBECONFIG={cluster.kubeconfig}\n"
              f"kubectl: {tool('kubectl')}\n"
              f"Prometheus: {cluster.prometheus_url}\n"
              f"traffic profile (edit to change the load): {cluster.work_dir / 'traffic.yaml'}\n"
              f"logs: {cluster.supervisor.log_dir}\n"
              "Ctrl-C stops everything.", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
