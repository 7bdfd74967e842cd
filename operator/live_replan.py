"""Live metrics for the reconcile: builds the topology's metrics source from its spec (Prometheus URL, bearer
token Secret, label selector, SLO percentiles, replan interval) and runs one replan interval when it is due.

Called by the reconcile (operator/reconcile.py) once per pass; the decisions are the planner's loop's
(planner/live/loop.py `step`, worded by operator/replan.py `replan`), the PromQL operator/live/metrics.py's. The only
I/O here is reading the token Secret, spec.metrics.tls's Secret or ConfigMap keys, and the fetch through the source;
a Secret that cannot be read counts as metrics being down, never as a failed pass (PEM text that is not there is
PrometheusTLSConfigInvalid, naming the field).

The URL is read once (operator/live/url_policy.py): the reading the allow-list checked is the one the client connects
to. In the operator the source reads in operator/live/metrics_reads.py's pool, so a pass never waits on a slow server;
a read still running (MetricsPending) leaves this interval to a later pass. Every failed read ends in
MetricsAvailable=False with its named reason (PrometheusTimeout, PrometheusAnswerTooLarge, ...); a hostile answer
is news at once, not held back by the MetricsGrace of a fleet that is still starting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from servingtopology.operator.api.resource import ConditionType, PemSource, SecretPem, TopologySpec
from servingtopology.operator.cluster.cluster import Cluster, ClusterError, SecretNotOptedIn
from servingtopology.operator.live.metrics import QUERY_TIMEOUT_S, MetricsSource, MetricsUnavailable, PrometheusMetrics, topology_matchers
from servingtopology.operator.live.metrics_reads import MetricsPending, MetricsReads
from servingtopology.operator.live.prometheus_http import PrometheusFailure
from servingtopology.operator.live.prometheus_tls import CA_FIELD, CERT_FIELD, KEY_FIELD, TlsMaterial
from servingtopology.operator.live.url_policy import URL_REFUSED, AddressPolicy, PrometheusUrl, UrlAllowList, UrlRefused, UrlVerdict, parse_prometheus_url
from servingtopology.operator.plan_status import timestamp
from servingtopology.operator.replan import (
    ConditionNote,
    EventNote,
    Planner,
    Predictor,
    ReplanMemory,
    ReplanOutcome,
    ReplanPolicy,
    Verdict,
    metrics_grace,
    replan,
)
from servingtopology.planner.layout import Engine, Layout
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import predict_layout

__all__ = ["MetricsRequest", "MetricsFactory", "prometheus_source", "pooled_prometheus", "metrics_request", "run_live_replan",
           "QUERY_TIMEOUT_S"]


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
    owner: str = ""                      # `namespace/name` of the resource: one read at a time per owner
    target: PrometheusUrl | None = None  # the reading of `url` the allow-list checked (None: read `url` the same way)
    addresses: AddressPolicy = field(default_factory=AddressPolicy)   # where the checked name may resolve to
    tls: TlsMaterial | None = None       # spec.metrics.tls's PEM text, read from its Secret or ConfigMap


MetricsFactory = Callable[[MetricsRequest], MetricsSource]


def prometheus_source(request: MetricsRequest) -> MetricsSource:
    """A source over the bounded client, connecting to the checked reading of the URL, reading in the caller's thread."""
    return PrometheusMetrics(request.target or request.url, engine=request.engine, matchers=request.matchers,
                             window_s=request.window_s, bearer_token=request.bearer_token, ttft_quantile=request.ttft_quantile,
                             tpot_quantile=request.tpot_quantile, addresses=request.addresses, tls=request.tls)


def pooled_prometheus() -> MetricsReads:
    """The operator's factory: prometheus_source, read in a bounded pool (operator/live/metrics_reads.py)."""
    return MetricsReads(prometheus_source)


def metrics_request(spec: TopologySpec, *, namespace: str, name: str, policy: ReplanPolicy, token: str | None,
                    problem: Problem, target: PrometheusUrl | None = None, addresses: AddressPolicy | None = None,
                    tls: TlsMaterial | None = None) -> MetricsRequest:
    """The request for spec.metrics (the caller checked it is set)."""
    assert spec.metrics is not None
    return MetricsRequest(url=spec.metrics.prometheusUrl, engine=spec.engine.name,
                          matchers=topology_matchers(namespace=namespace, name=name, extra=spec.metrics.selector),
                          window_s=max(1, int(policy.interval_s)), bearer_token=token,
                          ttft_quantile=problem.slo.ttft_percentile / 100.0, tpot_quantile=problem.slo.tpot_percentile / 100.0,
                          owner=f"{namespace}/{name}", target=target, addresses=addresses or AddressPolicy(), tls=tls)


def _checked(url: str, allow: UrlAllowList | None) -> UrlVerdict:
    """The allow-list's verdict; without one, any URL read one way."""
    field = "spec.metrics.prometheusUrl"
    if allow is not None:
        return allow.check(url, field=field)
    try:
        return UrlVerdict(parse_prometheus_url(url))
    except UrlRefused as why:
        return UrlVerdict(None, URL_REFUSED, f"{field} {url!r} is refused: {why}; no request was made")


def _token(cluster: Cluster, spec: TopologySpec, namespace: str) -> tuple[str | None, str | None]:
    """(token, why it is missing); no Secret configured gives (None, None)."""
    assert spec.metrics is not None
    ref = spec.metrics.bearerTokenSecret
    if ref is None:
        return None, None
    try:
        token = cluster.read_secret(namespace, ref.name, ref.key)
    except SecretNotOptedIn:
        raise
    except ClusterError as exc:
        return None, f"cannot read Secret {namespace}/{ref.name}: {exc}"
    if token is None:
        return None, f"Secret {namespace}/{ref.name} has no key {ref.key!r} (spec.metrics.bearerTokenSecret)"
    return token.strip(), None


def _pem(cluster: Cluster, namespace: str, source: PemSource | SecretPem, field: str) -> str:
    """The PEM text `source` names; TlsUnreadable naming `field` and the object when it is not there."""
    secret = source.secret
    config_map = source.configMap if isinstance(source, PemSource) else None
    try:
        if secret is not None:
            text = cluster.read_secret(namespace, secret.name, secret.key)
            where = f"Secret {namespace}/{secret.name} key {secret.key!r}"
        else:
            assert config_map is not None
            text = cluster.read_config_map(namespace, config_map.name, config_map.key)
            where = f"ConfigMap {namespace}/{config_map.name} key {config_map.key!r}"
    except SecretNotOptedIn:
        raise
    except ClusterError as exc:
        raise TlsUnreadable(f"{field}: cannot be read: {exc}") from None
    if text is None:
        raise TlsUnreadable(f"{field}: {where} is not there (no such object or key)")
    return text


class TlsUnreadable(Exception):
    """spec.metrics.tls names PEM text that is not there (PrometheusTLSConfigInvalid, naming the field)."""


def _tls(cluster: Cluster, spec: TopologySpec, namespace: str) -> TlsMaterial | None:
    """spec.metrics.tls's PEM text (None when it is not set); TlsUnreadable or SecretNotOptedIn otherwise."""
    assert spec.metrics is not None
    tls = spec.metrics.tls
    if tls is None:
        return None
    return TlsMaterial(ca_pem=_pem(cluster, namespace, tls.ca, CA_FIELD),
                       cert_pem=_pem(cluster, namespace, tls.cert, CERT_FIELD) if tls.cert is not None else None,
                       key_pem=_pem(cluster, namespace, tls.key, KEY_FIELD) if tls.key is not None else None)


def run_live_replan(*, spec: TopologySpec, problem: Problem, current: Layout | None, memory: ReplanMemory, policy: ReplanPolicy,
                    now: datetime, cluster: Cluster, namespace: str, name: str, factory: MetricsFactory, planner: Planner,
                    predict: Predictor = predict_layout, ready_since: datetime | None = None,
                    allow: UrlAllowList | None = None, observe_only: str | None = None) -> ReplanOutcome | None:
    """One replan interval when spec.metrics is set and the interval is due; None otherwise (nothing to write).

    `ready_since`: when the Ready condition last turned True (None: not Ready), for the MetricsGrace rule.
    `allow`: the Prometheus URLs the operator may call (None: any read one way); a URL outside it is
    MetricsAvailable=False, reason PrometheusUrlNotAllowed (PrometheusUrlRefused: not read one way), with no Secret read
    and no request. None as well while the resource's read still runs (MetricsPending): nothing to write yet."""
    if spec.metrics is None:
        return None
    now_s = now.timestamp()
    if not memory.due(now_s, policy.interval_s):
        return None
    verdict = _checked(spec.metrics.prometheusUrl, allow)
    if verdict.url is None:   # before the token Secret is read: no credential goes to a URL the operator may not call
        events = () if memory.metrics_available is False else (EventNote("Warning", verdict.reason, verdict.message),)
        return ReplanOutcome(Verdict.KEEP, replace(memory, metrics_available=False, last_fetch_s=now_s),
                             (ConditionNote(ConditionType.METRICS_AVAILABLE, False, verdict.reason, verdict.message),), events,
                             message=verdict.message)
    sample, reason = None, PrometheusFailure.UNAVAILABLE.value
    tls: TlsMaterial | None = None
    try:
        token, error = _token(cluster, spec, namespace)
        if error is None:
            tls = _tls(cluster, spec, namespace)
    except SecretNotOptedIn as exc:   # the Secret lacks the opt-in label (operator/render/tenancy.py): named at once, no grace
        token, error, reason = None, str(exc), SecretNotOptedIn.reason
    except TlsUnreadable as exc:
        token, error, reason = None, f"the TLS configuration is invalid: {exc}", PrometheusFailure.TLS_CONFIG_INVALID.value
    if error is None:
        request = metrics_request(spec, namespace=namespace, name=name, policy=policy, token=token, problem=problem, target=verdict.url,
                                  addresses=allow.addresses if allow is not None else None, tls=tls)
        try:
            sample = factory(request).fetch_sample(at_s=now_s, interval_s=policy.interval_s)
        except MetricsPending:
            return None
        except MetricsUnavailable as exc:
            error, reason = str(exc), getattr(exc, "reason", reason)
        except (ValueError, OSError) as exc:   # a source that raised past its own handling
            error = f"Prometheus at {verdict.url}: {type(exc).__name__}: {exc}"
    grace = metrics_grace(memory, ready_since_s=ready_since.timestamp() if ready_since is not None else None, now_s=now_s,
                          interval_s=policy.interval_s)
    if reason != PrometheusFailure.UNAVAILABLE.value:
        grace = None    # a hostile or broken answer is news at once: no fleet start-up explains it
    return replan(problem=problem, current=current, memory=memory, sample=sample, metrics_error=error, policy=policy,
                  now_s=now_s, planner=planner, predict=predict, at=timestamp(now), grace=grace, observe_only=observe_only,
                  metrics_reason=reason)
