"""`servingtopology-operator` / `servingtopology operator`: parses flags, loads Kubernetes credentials,
builds the runtime (cluster seam, planner, metrics) and runs kopf with peering and a liveness endpoint.

The entry point the Helm chart's Deployment runs. Does no reconciling itself (operator/entry/handlers.py and
operator/reconcile.py do); reads the environment only for kopf's and the client's own configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from servingtopology.operator.render.tenancy import TOKEN_SECRET_LABEL, TenancyPolicy, parse_grants, parse_label, parse_namespace_grant

__all__ = ["add_arguments", "tenancy_policy", "main", "run", "memory_needed_mib", "OPERATOR_RESIDENT_MIB", "PLAN_PROCESS_MIB"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG = logging.getLogger(__name__)
# What the operator's container holds besides the plans' own budgets (measured on CPython 3.11, kopf 1.45, the
# kubernetes client 31): the operator process's resident size was 101 MiB after passes over examples/ (imports 92 MiB),
# at most 137 MiB in four full e2e suites (50 resources at once included), 283 MiB with its plan processes; the
# forkserver 48 MiB (after operator/entry/plan_preload.py's warm-up) and multiprocessing's resource tracker 13 MiB; a plan
# process starts as a copy-on-write fork of the forkserver and may copy up to its 48 MiB besides its budget (the
# examples' plans grew 7-14 MiB of address space, 13-19 MiB resident).
OPERATOR_RESIDENT_MIB = 192   # 101-137 measured, allowed for the watch caches and many resources
PLAN_PROCESS_MIB = 64         # forkserver 48 + tracker 13 measured; and what one plan process may copy (48)
CGROUP_MEMORY_MAX = "/sys/fs/cgroup/memory.max"


def memory_needed_mib(*, slots: int, plan_memory_mib: int) -> int:
    """The most memory the operator may use with `slots` plans at their budget: what the container limit must cover
    (the Helm chart refuses a smaller resources.limits.memory with the same formula, templates/_helpers.tpl)."""
    return slots * (plan_memory_mib + PLAN_PROCESS_MIB) + PLAN_PROCESS_MIB + OPERATOR_RESIDENT_MIB


def _warn_when_the_limit_is_below_the_budget(slots: int, plan_memory_mib: int, path: str = CGROUP_MEMORY_MAX) -> str | None:
    """Decision `MemoryLimitBelowPlanBudget`: a WARNING at start when the container's memory limit (cgroup v2) is
    below what the plans may use, since the kernel would kill the operator, not the plan, at the limit."""
    try:
        with open(path) as f:
            raw = f.read().strip()
    except OSError:
        return None
    if not raw.isdigit() or plan_memory_mib <= 0:
        return None     # "max": no limit; or no plan budget to compare
    limit_mib, needed = int(raw) // (1 << 20), memory_needed_mib(slots=slots, plan_memory_mib=plan_memory_mib)
    if limit_mib >= needed:
        return None
    text = (f"MemoryLimitBelowPlanBudget: the container's memory limit is {limit_mib} MiB, below the {needed} MiB that "
            f"{slots} plans of {plan_memory_mib} MiB may use with the operator; lower --plan-slots or --plan-memory-mib, "
            "or raise the limit")
    LOG.warning(text)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from servingtopology.operator.cluster.plan_worker import PlanBudget

    budget = PlanBudget()   # one default per budget: the worker's, the flags' and the chart's (tests/operator/test_chart.py)
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
    parser.add_argument("--allow-prometheus-network", action="append", default=[], metavar="CIDR",
                        help="a network an allowed Prometheus name may resolve into (repeatable; the cluster's Service CIDR, "
                             "say); default: any address but loopback, link-local, unspecified, multicast and reserved ones")
    parser.add_argument("--plan-timeout-s", type=float, default=budget.wall_s,
                        help="wall-time budget of one plan; a plan over it is stopped and its resource gets PlanBudgetExceeded")
    parser.add_argument("--plan-memory-mib", type=int, default=budget.memory_mib,
                        help="memory budget of one plan (address space beyond the planner's own, in MiB); 0: no limit. The "
                             "container's memory limit must cover memory_needed_mib(): slots x (budget + 64) + 256 MiB")
    parser.add_argument("--plan-slots", type=int, default=min(2, os.cpu_count() or 1),
                        help="plans that run at once, each in its own process (default: up to 2, by CPU count)")
    parser.add_argument("--workers", type=int, default=8, help="threads running reconcile passes (a pass never waits on a plan)")
    parser.add_argument("--allow-pod-template", action="append", default=[], metavar="GRANT",
                        help="what every namespace's pod templates may ask for (repeatable): Privileged, HostPath, HostNamespaces, "
                             "Capabilities, ServiceAccount, Priority, Scheduler, RuntimeClass or All; default: none (operator/render/tenancy.py)")
    parser.add_argument("--allow-pod-template-in", action="append", default=[], metavar="KEY=VALUE:GRANT,...",
                        help="grants for the namespaces carrying the label KEY=VALUE (repeatable)")
    parser.add_argument("--metrics-token-label", default="=".join(TOKEN_SECRET_LABEL), metavar="KEY=VALUE",
                        help="the label a spec.metrics.bearerTokenSecret must carry to be read; empty: any Secret of the namespace")
    parser.add_argument("--allow-cross-namespace-metrics", action="store_true",
                        help="let spec.metrics.selector name another namespace (default: refused, MetricsSelectorRefused)")


def tenancy_policy(args: argparse.Namespace) -> TenancyPolicy:
    """The pod-template, token-Secret and selector policy the flags give; raises ValueError naming a bad flag value."""
    label = args.metrics_token_label.strip()
    return TenancyPolicy(pod_grants=frozenset(parse_grants(w for g in args.allow_pod_template for w in g.split(","))),
                         namespace_grants=tuple(parse_namespace_grant(g) for g in args.allow_pod_template_in),
                         token_secret_label=parse_label(label) if label else None,
                         cross_namespace_selector=args.allow_cross_namespace_metrics)


def _kube_api_client() -> object:
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]  # the kubernetes client is not annotated
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _runtime_metrics(registry: Any, cluster: Any, worker: Any) -> None:
    """servingtopology_api_requests_total{kind="discovery"|"api"} (the requests of the operator's client),
    servingtopology_admission_dry_runs_total{verdict="admitted"|"refused"}, and the plan
    worker's servingtopology_plans_started_total, _plans_over_budget_total, _plan_cpu_seconds_total, _plans_pending."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self) -> Any:
            family = CounterMetricFamily("servingtopology_api_requests", "Kubernetes API requests of the operator's client", labels=["kind"])
            for kind in ("discovery", "api"):
                family.add_metric([kind], float(cluster.requests.get(kind, 0)))
            yield family
            dry_runs = CounterMetricFamily("servingtopology_admission_dry_runs", "Server-side dry-runs of rendered objects before they "
                                           "are applied (once per change of an object), by verdict", labels=["verdict"])
            for verdict in ("admitted", "refused"):
                dry_runs.add_metric([verdict], float(getattr(cluster, "dry_runs", {}).get(verdict, 0)))
            yield dry_runs
            yield CounterMetricFamily("servingtopology_plans_started", "Plans started in the plan worker", value=worker.plans_started)
            yield CounterMetricFamily("servingtopology_plans_failed", "Plans over budget or whose process died", value=worker.plans_failed)
            yield CounterMetricFamily("servingtopology_plan_cpu_seconds", "CPU seconds of the plan processes", value=worker.plans_cpu_s)
            yield GaugeMetricFamily("servingtopology_plans_pending", "Plans queued or running", value=worker.pending())

    registry.register(Collector())


def run(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped (SIGTERM/SIGINT); returns the exit code."""
    from servingtopology.operator.live.url_policy import parse_network

    try:
        tenancy = tenancy_policy(args)
        networks = [parse_network(n) for n in args.allow_prometheus_network]
    except ValueError as exc:   # a chart value the policy cannot read: say which, before anything starts
        print(f"servingtopology-operator: {exc}", file=sys.stderr)
        return 2
    import kopf

    from servingtopology.operator.cluster.cluster import KubeCluster
    from servingtopology.operator.cluster.plan_worker import PlanBudget, PlanWorker
    from servingtopology.operator.entry.handlers import RETRY_CAP_S, Runtime, register
    from servingtopology.operator.entry.telemetry import new_metrics, serve_metrics
    from servingtopology.operator.live.url_policy import DEFAULT_PROMETHEUS_URLS, UrlAllowList

    kopf.configure(debug=args.log_level == "DEBUG", quiet=args.log_level in ("WARNING", "ERROR"))
    logging.getLogger().setLevel(getattr(logging, args.log_level))
    _warn_when_the_limit_is_below_the_budget(max(1, args.plan_slots), args.plan_memory_mib)
    metrics = new_metrics()
    cluster = KubeCluster(_kube_api_client(), tenancy=tenancy)
    # Stage 6 (the step-level simulator) checks the top K, as `servingtopology plan` does; in child processes.
    planner = PlanWorker(budget=PlanBudget(wall_s=args.plan_timeout_s, memory_mib=args.plan_memory_mib), slots=max(1, args.plan_slots),
                         on_plan_s=metrics.plan_seconds.observe)   # servingtopology_plan_seconds: each plan's time in its child
    _runtime_metrics(metrics.registry, cluster, planner)
    if args.metrics_port:
        serve_metrics(metrics, args.metrics_port)
    timer_interval_s = args.timer_interval_s
    runtime = Runtime(cluster=cluster, planner=planner, metrics=metrics, gpus_per_node_default=args.gpus_per_node,
                      prometheus_urls=UrlAllowList.of(args.allow_prometheus_url or DEFAULT_PROMETHEUS_URLS, networks=networks),
                      workers=max(1, args.workers), tenancy=tenancy,
                      # Liveness: every resource has a pass each timer interval, or after a failure's back-off at most.
                      stall_s=max(4 * timer_interval_s, RETRY_CAP_S + 2 * timer_interval_s))
    registry = kopf.OperatorRegistry()
    # A fresh registry has no login handlers (kopf adds them only to its default one): log in through the client.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    clusterwide = not args.namespace
    register(registry, runtime, timer_interval_s=timer_interval_s, peering_name=args.peering_name, clusterwide=clusterwide)
    from servingtopology.operator.entry.pool_handlers import register_pool

    register_pool(registry, runtime, timer_interval_s=timer_interval_s)   # ServingPools (DryRun proposals)
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
