"""`python -m e2e.up`: the whole e2e stack for a demo or for debugging, until Ctrl-C.

Starts the local control plane (building it first if needed), Prometheus, the operator from the Helm chart
and the engine emulator, prints how to reach them, and stops everything on Ctrl-C or SIGTERM. Applies the
given ServingTopology files, if any, once everything is up.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .cluster import LocalCluster
from .kubetools import control_plane_dir, tool
from .stack import Emulator, Operator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.up", description=__doc__)
    parser.add_argument("files", nargs="*", type=Path, help="manifests to kubectl apply once the stack is up")
    parser.add_argument("--no-operator", action="store_true", help="start the cluster, Prometheus and emulator only")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalCluster(binaries=control_plane_dir(build=True)) as cluster:
        if not args.no_operator:
            operator = Operator(cluster)
            operator.install()
            operator.start()
        Emulator(cluster).start()
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
