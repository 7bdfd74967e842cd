"""`servingtopology-operator` / `servingtopology operator`: parses flags, loads Kubernetes credentials,
builds the runtime (cluster seam, planner, metrics) and runs kopf with peering and a liveness endpoint.

The entry point the Helm chart's Deployment runs. Does no reconciling itself (operator/handlers.py and
operator/reconcile.py do); reads the environment only for kopf's and the client's own configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys
from collections.abc import Sequence

__all__ = ["add_arguments", "main", "run"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch this namespace (repeatable; glob patterns allowed); default: all namespaces")
    parser.add_argument("--liveness-port", type=int, default=8080, help="port of /healthz (kopf liveness endpoint)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="port of the operator's own /metrics; 0 disables it")
    parser.add_argument("--peering-name", default="servingtopology", help="kopf peering object shared by the replicas")
    parser.add_argument("--standalone", action="store_true", help="run without peering (a single replica, or tests)")
    parser.add_argument("--priority", type=int, default=None,
                        help="kopf peering priority; default: random, so that of several replicas exactly one handles "
                             "(kopf pauses an operator that sees a peer of the same or higher priority)")
    parser.add_argument("--timer-interval-s", type=float, default=30.0,
                        help="seconds between level-based re-reconciles of every ServingTopology")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node when a spec does not say")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, type=str.upper)
    parser.add_argument("--allow-prometheus-url", action="append", default=[], metavar="GLOB",
                        help="a Prometheus URL rule spec.metrics.prometheusUrl may match (repeatable; `*` within the host or "
                             "a path segment, `**` anything); default: the in-cluster Prometheus Operator Services")


def _kube_api_client() -> object:
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def run(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped (SIGTERM/SIGINT); returns the exit code."""
    import kopf

    from ..planner.decide import decide
    from ..planner.problem import Decision, Problem
    from ..planner.sim.stage import stage6_figures
    from .cluster import KubeCluster
    from .handlers import Runtime, register
    from .telemetry import new_metrics, serve_metrics
    from .url_policy import DEFAULT_PROMETHEUS_URLS, UrlAllowList

    kopf.configure(debug=args.log_level == "DEBUG", quiet=args.log_level in ("WARNING", "ERROR"))
    logging.getLogger().setLevel(getattr(logging, args.log_level))
    metrics = new_metrics()
    if args.metrics_port:
        serve_metrics(metrics, args.metrics_port)

    def plan(problem: Problem) -> Decision:
        # Stage 6: the step-level simulator checks the top K, as `servingtopology plan` does.
        return decide(problem, simulate=stage6_figures)

    runtime = Runtime(cluster=KubeCluster(_kube_api_client()), planner=metrics.timed(plan), metrics=metrics,
                      gpus_per_node_default=args.gpus_per_node,
                      prometheus_urls=UrlAllowList.of(args.allow_prometheus_url or DEFAULT_PROMETHEUS_URLS))
    registry = kopf.OperatorRegistry()
    # A fresh registry has no login handlers (kopf adds them only to its default one): log in through the client.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    clusterwide = not args.namespace
    register(registry, runtime, timer_interval_s=args.timer_interval_s, peering_name=args.peering_name, clusterwide=clusterwide)
    asyncio.run(kopf.operator(
        registry=registry,
        clusterwide=clusterwide,
        namespaces=args.namespace,
        standalone=args.standalone,
        peering_name=args.peering_name,
        priority=args.priority if args.priority is not None else secrets.randbelow(1 << 30),
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz",
    ))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servingtopology-operator", description="Run the ServingTopology operator.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
