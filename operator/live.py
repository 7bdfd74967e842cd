"""Live metrics for the reconcile: builds the topology's metrics source from its spec (Prometheus URL, bearer
token Secret, label selector, SLO percentiles, replan interval) and runs one replan interval when it is due.

Called by the reconcile (operator/reconcile.py) once per pass; the decisions are operator/replan.py's, the
PromQL operator/metrics.py's. The only I/O here is reading the token Secret and the fetch through the source;
a Secret that cannot be read counts as metrics being down, never as a failed pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from ..planner.decide import predict_layout
from ..planner.layout import Engine, Layout
from ..planner.problem import Problem
from .api import ConditionType, TopologySpec
from .cluster import Cluster, ClusterError
from .metrics import MetricsSource, MetricsUnavailable, PrometheusMetrics, topology_matchers
from .plan_status import timestamp
from .replan import (
    ConditionNote,
    EventNote,
    Planner,
    Predictor,
    ReplanMemory,
    ReplanOutcome,
    ReplanPolicy,
    Verdict,
    fetch_sample,
    metrics_grace,
    replan,
)
from .url_policy import UrlAllowList

__all__ = ["MetricsRequest", "MetricsFactory", "prometheus_source", "metrics_request", "run_live_replan", "QUERY_TIMEOUT_S"]

# One query may take this long; a sample stops at the first failure, so an unreachable Prometheus costs a
# pass about this much (the client's own default is no timeout and three retries with back-off).
QUERY_TIMEOUT_S = 10


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """What a metrics source needs for one ServingTopology (quantiles as fractions, the window in seconds)."""

    url: str
    engine: Engine
    matchers: Mapping[str, str] = field(default_factory=dict)
    window_s: int = 300
    bearer_token: str | None = None
    ttft_quantile: float = 0.95
    tpot_quantile: float = 0.95


MetricsFactory = Callable[[MetricsRequest], MetricsSource]


def _client(url: str, headers: dict[str, str]) -> Any:
    retry = Retry(total=1, backoff_factor=0.5, status_forcelist=(502, 503, 504))
    return PrometheusConnect(url=url, headers=headers or None, retry=retry, timeout=QUERY_TIMEOUT_S)


def prometheus_source(request: MetricsRequest) -> MetricsSource:
    """The production factory: PromQL over prometheus-api-client, with a timeout and a single retry."""
    return PrometheusMetrics(request.url, engine=request.engine, matchers=request.matchers, window_s=request.window_s,
                             bearer_token=request.bearer_token, ttft_quantile=request.ttft_quantile,
                             tpot_quantile=request.tpot_quantile, client_factory=_client)


def metrics_request(spec: TopologySpec, *, namespace: str, name: str, policy: ReplanPolicy, token: str | None,
                    problem: Problem) -> MetricsRequest:
    """The request for spec.metrics (the caller checked it is set)."""
    assert spec.metrics is not None
    return MetricsRequest(url=spec.metrics.prometheusUrl, engine=spec.engine.name,
                          matchers=topology_matchers(namespace=namespace, name=name, extra=spec.metrics.selector),
                          window_s=max(1, int(policy.interval_s)), bearer_token=token,
                          ttft_quantile=problem.slo.ttft_percentile / 100.0, tpot_quantile=problem.slo.tpot_percentile / 100.0)


def _token(cluster: Cluster, spec: TopologySpec, namespace: str) -> tuple[str | None, str | None]:
    """(token, why it is missing); no Secret configured gives (None, None)."""
    assert spec.metrics is not None
    ref = spec.metrics.bearerTokenSecret
    if ref is None:
        return None, None
    try:
        token = cluster.read_secret(namespace, ref.name, ref.key)
    except ClusterError as exc:
        return None, f"cannot read Secret {namespace}/{ref.name}: {exc}"
    if token is None:
        return None, f"Secret {namespace}/{ref.name} has no key {ref.key!r} (spec.metrics.bearerTokenSecret)"
    return token.strip(), None


def run_live_replan(*, spec: TopologySpec, problem: Problem, current: Layout | None, memory: ReplanMemory, policy: ReplanPolicy,
                    now: datetime, cluster: Cluster, namespace: str, name: str, factory: MetricsFactory, planner: Planner,
                    predict: Predictor = predict_layout, ready_since: datetime | None = None,
                    allow: UrlAllowList | None = None, observe_only: str | None = None) -> ReplanOutcome | None:
    """One replan interval when spec.metrics is set and the interval is due; None otherwise (nothing to write).

    `ready_since`: when the Ready condition last turned True (None: not Ready), for the MetricsGrace rule.
    `allow`: the Prometheus URLs the operator may call (None: any); a URL outside it is MetricsAvailable=False,
    reason PrometheusUrlNotAllowed, with no Secret read and no request."""
    if spec.metrics is None:
        return None
    now_s = now.timestamp()
    if not memory.due(now_s, policy.interval_s):
        return None
    refused = allow.refusal(spec.metrics.prometheusUrl, field="spec.metrics.prometheusUrl") if allow is not None else None
    if refused is not None:   # before the token Secret is read: no credential goes to a URL the operator may not call
        events = () if memory.metrics_available is False else (EventNote("Warning", "PrometheusUrlNotAllowed", refused),)
        return ReplanOutcome(Verdict.KEEP, replace(memory, metrics_available=False, last_fetch_s=now_s),
                             (ConditionNote(ConditionType.METRICS_AVAILABLE, False, "PrometheusUrlNotAllowed", refused),), events,
                             message=refused)
    token, error = _token(cluster, spec, namespace)
    sample = None
    if error is None:
        try:
            source = factory(metrics_request(spec, namespace=namespace, name=name, policy=policy, token=token, problem=problem))
            sample, error = fetch_sample(source, at_s=now_s, interval_s=policy.interval_s)
        except (MetricsUnavailable, ValueError, OSError) as exc:   # a URL the client refuses, a DNS failure at connect
            sample, error = None, f"Prometheus at {spec.metrics.prometheusUrl}: {type(exc).__name__}: {exc}"
    grace = metrics_grace(memory, ready_since_s=ready_since.timestamp() if ready_since is not None else None, now_s=now_s,
                          interval_s=policy.interval_s)
    return replan(problem=problem, current=current, memory=memory, sample=sample, metrics_error=error, policy=policy,
                  now_s=now_s, planner=planner, predict=predict, at=timestamp(now), grace=grace, observe_only=observe_only)
