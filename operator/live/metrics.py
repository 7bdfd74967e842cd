"""Live engine metrics from Prometheus: the PromQL (built here and only here) and a `MetricsSource` over it.

`build_queries` spells every figure the replanning needs for vLLM (new names first, the pre-0.12 names as
fallbacks) and SGLang, after shared/reference/engines.md §1.4, §2.3 and §6. TTFT is the client's: under PD
it comes from the router's own histogram where the router exports one (smg), else it is composed from the
roles' metrics the way the router chains them (vLLM: prefill latency + decode TTFT; SGLang: decode TTFT); `PrometheusMetrics.fetch_sample`
runs them through operator/live/prometheus_http.py (bounded reads of the one checked URL) and returns one
`planner.live.observe.MetricSample`. The URL, bearer token and window come from the caller (the spec and its Secret);
every failure raises MetricsUnavailable with a named `reason` (operator/live/prometheus_http.py's PrometheusFailure).

Rules it names:
- NaNIsNoData: Prometheus answers the string "NaN" for 0/0 (no traffic) and "+Inf" for a quantile in the top bucket;
  such a figure is absent (the next expression is asked), as an empty vector is.
- FigureRange: a finite figure outside [0, FIGURE_MAX] after its unit conversion (1e308 s is inf ms) is no
  measurement: the whole read is refused (PrometheusAnswerInvalid) rather than fed to the observation.
- ReadDeadline: one read (every query of a sample) ends within READ_DEADLINE_S, each query within QUERY_TIMEOUT_S.
"""

from __future__ import annotations

import enum
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from servingtopology.operator.live.prometheus_http import BoundedPrometheus, PrometheusAnswerError, PrometheusFailure, ReadLimits
from servingtopology.operator.live.prometheus_tls import TlsConfigInvalid, TlsMaterial, client_context
from servingtopology.operator.live.url_policy import AddressPolicy, PrometheusUrl, UrlRefused, parse_prometheus_url
from servingtopology.planner.engines.metric_names import RouterMetric as R
from servingtopology.planner.engines.metric_names import SglangMetric as S
from servingtopology.planner.engines.metric_names import VllmMetric as V
from servingtopology.planner.layout import Engine, Role
from servingtopology.planner.live.observe import MetricSample

__all__ = [
    "Figure", "Query", "MetricsSource", "MetricsUnavailable", "PrometheusMetrics", "build_queries", "label_selector",
    "topology_matchers", "TOPOLOGY_SERIES_LABEL", "ROLE_SERIES_LABEL", "unavailable_reason", "QUERY_TIMEOUT_S", "READ_DEADLINE_S",
    "FIGURE_MAX", "figure_value",
]

# Pod labels as Prometheus sees them after the usual `labelmap` of Kubernetes service discovery
# (servingtopology.io/topology → servingtopology_io_topology), which the chart's PodMonitors and the e2e Prometheus give.
TOPOLOGY_SERIES_LABEL = "servingtopology_io_topology"
ROLE_SERIES_LABEL = "servingtopology_io_role"
# Requests, lengths and latencies are counted where a request is whole: aggregated engines, or PD decode
# (a PD prefill engine sees every request too, with max_tokens=1; counting it would double the rate).
FRONT_ROLES = (Role.AGGREGATED, Role.DECODE)
ROUTER_COMPONENT = "router"
# The PD routers' own client-side TTFT histograms, where the router exports one (planner/data/engine_caps: smg 1.13.0;
# vllm-router 0.1.17 exports request durations only). The operator routes smg over HTTP, whose PD histogram is
# smg_pd_ttft_seconds; smg_router_ttft_seconds is its gRPC router's ("help: gRPC only"), read second.
SMG_PD_TTFT = R.SMG_PD_TTFT
SMG_TTFT = R.SMG_TTFT


class Figure(enum.StrEnum):
    """One figure of a MetricSample; the value is the sample's field name."""

    REQUEST_RATE = "request_rate_rps"
    PROMPT_TOKENS_RATE = "prompt_tokens_rate"
    GENERATION_TOKENS_RATE = "generation_tokens_rate"
    INPUT_TOKENS_MEAN = "input_tokens_mean"
    OUTPUT_TOKENS_MEAN = "output_tokens_mean"
    INPUT_TOKENS_P99 = "input_tokens_p99"
    OUTPUT_TOKENS_P99 = "output_tokens_p99"
    PREFIX_HIT_RATE = "prefix_hit_rate"
    TTFT = "ttft_ms"
    TPOT = "tpot_ms"
    E2E = "e2e_ms"
    RUNNING = "running"
    WAITING = "waiting"
    KV_USAGE = "kv_usage"
    PREEMPTIONS = "preemptions_per_s"  # vLLM: preemptions/s; SGLang: requests retracted now (its gauge)


@dataclass(frozen=True, slots=True)
class Query:
    """PromQL for one figure: the first expression that returns a finite value wins; `scale` converts units."""

    figure: Figure
    exprs: tuple[str, ...]
    scale: float = 1.0


class MetricsUnavailable(Exception):
    """No sample this interval (keep everything, read again next interval); `reason` names why for the condition:
    MetricsUnavailable for an unreachable or erroring Prometheus, else a PrometheusFailure such as PrometheusTimeout."""

    def __init__(self, message: str, reason: str = PrometheusFailure.UNAVAILABLE.value) -> None:
        super().__init__(message)
        self.reason = reason


class MetricsSource(Protocol):
    def fetch_sample(self, *, at_s: float, interval_s: float) -> MetricSample:
        """One interval's figures; raise MetricsUnavailable when Prometheus cannot answer."""
        ...


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_selector(matchers: Mapping[str, str], *, roles: Sequence[Role] = ()) -> str:
    """`{k="v",...}` with the values escaped, plus a regex matcher on the role label when roles are given."""
    parts = [f'{k}="{_escape(v)}"' for k, v in sorted(matchers.items())]
    if roles:
        parts.append(f'{ROLE_SERIES_LABEL}=~"{"|".join(r.value for r in roles)}"')
    return "{" + ",".join(parts) + "}"


def topology_matchers(*, namespace: str, name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The matchers of one ServingTopology's engine series; `extra` is spec.metrics.selector."""
    return {"namespace": namespace, TOPOLOGY_SERIES_LABEL: name, **(extra or {})}


def _q(quantile: float, metric: str, sel: str, w: str) -> str:
    return f"histogram_quantile({quantile:g}, sum by (le) (rate({metric}_bucket{sel}[{w}])))"


def _ratio(num: str, den: str, sel: str, w: str) -> str:
    return f"sum(rate({num}{sel}[{w}])) / sum(rate({den}{sel}[{w}]))"


def _rate(metric: str, sel: str, w: str) -> str:
    return f"sum(rate({metric}{sel}[{w}]))"


def _vllm_pd_ttft(matchers: Mapping[str, str], w: str, q: float) -> str:
    """Client TTFT of a vLLM PD layout behind vllm-router (which exports no TTFT): the router sends the request to
    a prefill engine (max_tokens=1) and, when it returns, to a decode engine, so a client waits for the prefill
    request's whole latency and then the decode engine's TTFT (it pulls the KV first). The sum of the two
    quantiles bounds the quantile of the sum from above. Empty (so the next expression answers) without prefill
    engines, as in a replicas layout."""
    prefill = label_selector(matchers, roles=(Role.PREFILL,))
    decode = label_selector(matchers, roles=(Role.DECODE,))
    return f"{_q(q, V.E2E_LATENCY, prefill, w)} + {_q(q, V.TTFT, decode, w)}"


def _router(matchers: Mapping[str, str]) -> str:
    return label_selector({**matchers, ROLE_SERIES_LABEL: ROUTER_COMPONENT})


def _vllm(front: str, every: str, w: str, ttft_q: float, tpot_q: float, matchers: Mapping[str, str] | None) -> tuple[Query, ...]:
    pd_ttft = (_vllm_pd_ttft(matchers, w, ttft_q),) if matchers is not None else ()
    return (
        Query(Figure.REQUEST_RATE, (_rate(V.REQUEST_SUCCESS, front, w), _rate(f"{V.E2E_LATENCY}_count", front, w))),
        Query(Figure.PROMPT_TOKENS_RATE, (_rate(V.PROMPT_TOKENS, front, w),)),
        Query(Figure.GENERATION_TOKENS_RATE, (_rate(V.GENERATION_TOKENS, front, w),)),
        Query(Figure.INPUT_TOKENS_MEAN, (_ratio(f"{V.PROMPT_LENGTH}_sum", f"{V.PROMPT_LENGTH}_count", front, w),)),
        Query(Figure.OUTPUT_TOKENS_MEAN, (_ratio(f"{V.GENERATION_LENGTH}_sum", f"{V.GENERATION_LENGTH}_count", front, w),)),
        Query(Figure.INPUT_TOKENS_P99, (_q(0.99, V.PROMPT_LENGTH, front, w),)),
        Query(Figure.OUTPUT_TOKENS_P99, (_q(0.99, V.GENERATION_LENGTH, front, w),)),
        # Token-based since 0.9.2; the older gpu_ names (removed in 0.12) counted blocks, still a fair ratio.
        Query(Figure.PREFIX_HIT_RATE, (_ratio(V.PREFIX_CACHE_HITS, V.PREFIX_CACHE_QUERIES, every, w),
                                       _ratio(V.GPU_PREFIX_CACHE_HITS, V.GPU_PREFIX_CACHE_QUERIES, every, w))),
        Query(Figure.TTFT, (*pd_ttft, _q(ttft_q, V.TTFT, front, w)), 1e3),
        # The SLO is per request: the per-request TPOT histogram first; the inter-token latency (0.11 named it
        # time_per_output_token_seconds) where a release exports no per-request one.
        Query(Figure.TPOT, (_q(tpot_q, V.REQUEST_TPOT, front, w),
                            _q(tpot_q, V.INTER_TOKEN_LATENCY, front, w),
                            _q(tpot_q, V.TIME_PER_OUTPUT_TOKEN, front, w)), 1e3),
        Query(Figure.E2E, (_q(ttft_q, V.E2E_LATENCY, front, w),), 1e3),
        Query(Figure.RUNNING, (f"sum({V.REQUESTS_RUNNING}{every})",)),
        Query(Figure.WAITING, (f"sum({V.REQUESTS_WAITING}{every})",)),
        Query(Figure.KV_USAGE, (f"max({V.KV_CACHE_USAGE}{every})", f"max({V.GPU_CACHE_USAGE}{every})")),
        Query(Figure.PREEMPTIONS, (_rate(V.PREEMPTIONS, every, w),)),
    )


def _sglang(front: str, every: str, w: str, ttft_q: float, tpot_q: float, matchers: Mapping[str, str] | None) -> tuple[Query, ...]:
    router_ttft = ((_q(ttft_q, SMG_PD_TTFT, _router(matchers), w), _q(ttft_q, SMG_TTFT, _router(matchers), w))
                   if matchers is not None else ())
    return (
        Query(Figure.REQUEST_RATE, (_rate(S.REQUESTS, front, w), _rate(f"{S.E2E_LATENCY}_count", front, w))),
        Query(Figure.PROMPT_TOKENS_RATE, (_rate(S.PROMPT_TOKENS, front, w),)),
        Query(Figure.GENERATION_TOKENS_RATE, (_rate(S.GENERATION_TOKENS, front, w),)),
        # The length histograms exist only with --collect-tokens-histogram; the estimator then falls back
        # to the token rates over the request rate.
        Query(Figure.INPUT_TOKENS_MEAN, (_ratio(f"{S.PROMPT_LENGTH}_sum", f"{S.PROMPT_LENGTH}_count", front, w),)),
        Query(Figure.OUTPUT_TOKENS_MEAN, (_ratio(f"{S.GENERATION_LENGTH}_sum", f"{S.GENERATION_LENGTH}_count", front, w),)),
        Query(Figure.INPUT_TOKENS_P99, (_q(0.99, S.PROMPT_LENGTH, front, w),)),
        Query(Figure.OUTPUT_TOKENS_P99, (_q(0.99, S.GENERATION_LENGTH, front, w),)),
        Query(Figure.PREFIX_HIT_RATE, (_ratio(S.CACHED_TOKENS, S.PROMPT_TOKENS, front, w),
                                       f"avg({S.CACHE_HIT_RATE}{every})")),
        # PD behind smg: the router's own TTFT; otherwise the decode engine's, which counts from the request's arrival
        # (the router sends it to prefill and decode at once), or the aggregated engine's.
        Query(Figure.TTFT, (*router_ttft, _q(ttft_q, S.TTFT, front, w)), 1e3),
        # Per request first (the SLO's unit), then the inter-token latency.
        Query(Figure.TPOT, (_q(tpot_q, S.REQUEST_TPOT, front, w),
                            _q(tpot_q, S.INTER_TOKEN_LATENCY, front, w)), 1e3),
        Query(Figure.E2E, (_q(ttft_q, S.E2E_LATENCY, front, w),), 1e3),
        Query(Figure.RUNNING, (f"sum({S.RUNNING_REQS}{every})",)),
        Query(Figure.WAITING, (f"sum({S.QUEUE_REQS}{every})",)),
        Query(Figure.KV_USAGE, (f"max({S.TOKEN_USAGE}{every})",)),
        Query(Figure.PREEMPTIONS, (f"sum({S.RETRACTED_REQS}{every})",)),
    )


def build_queries(engine: Engine, *, matchers: Mapping[str, str], window_s: int, ttft_quantile: float = 0.95,
                  tpot_quantile: float = 0.95, by_role: bool = True) -> tuple[Query, ...]:
    """Every query of one sample. Rates and quantiles are over `window_s`; with `by_role`, request figures
    read only aggregated and decode engines (see FRONT_ROLES), and TTFT is the PD client's first (the router's own
    histogram, or the roles' metrics composed); gauges read every engine."""
    if window_s < 1:
        raise ValueError("the rate window must be at least 1 s")
    w = f"{int(window_s)}s"
    every = label_selector(matchers)
    front = label_selector(matchers, roles=FRONT_ROLES) if by_role else every
    build = _vllm if engine is Engine.VLLM else _sglang
    return build(front, every, w, ttft_quantile, tpot_quantile, matchers if by_role else None)


QUERY_TIMEOUT_S = 10.0     # one query: connect, send, headers and body together
READ_DEADLINE_S = 30.0     # every query of one sample together (ReadDeadline)
FIGURE_MAX = 1e9           # FigureRange: 1e9 ms is 11 days, 1e9 tokens or requests/s beyond any engine


def _value(result: Any, query: Query) -> float | None:
    """The first sample of an instant-vector answer scaled to the figure's unit (see figure_value)."""
    if not isinstance(result, list) or not result:
        return None
    try:
        return figure_value(result[0]["value"][1], query)
    except (KeyError, IndexError, TypeError):
        return None


def figure_value(text: Any, query: Query) -> float | None:
    """One answered value (Prometheus's string) scaled to the figure's unit; None when not a finite number
    (NaNIsNoData); MetricsUnavailable (PrometheusAnswerInvalid) outside FigureRange. Instant and range reads alike."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    scaled = v * query.scale
    if not 0.0 <= scaled <= FIGURE_MAX:   # an overflowing product is inf, which fails this too
        raise MetricsUnavailable(f"Prometheus answered {query.figure.value} = {scaled:.3g}, outside [0, {FIGURE_MAX:g}]",
                                 PrometheusFailure.INVALID.value)
    return scaled


class _Client(Protocol):
    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


ClientFactory = Callable[[PrometheusUrl, "str | None"], _Client]


class PrometheusMetrics:
    """A MetricsSource over the Prometheus HTTP API (operator/live/prometheus_http.py); one read per fetch_sample."""

    def __init__(self, url: str | PrometheusUrl, *, engine: Engine, matchers: Mapping[str, str], window_s: int,
                 bearer_token: str | None = None, ttft_quantile: float = 0.95, tpot_quantile: float = 0.95, by_role: bool = True,
                 client_factory: ClientFactory | None = None, read_deadline_s: float = READ_DEADLINE_S,
                 read_limits: ReadLimits | None = None, clock: Callable[[], float] = time.monotonic,
                 addresses: AddressPolicy | None = None, tls: TlsMaterial | None = None) -> None:
        """`url`: the allow-list's reading (a string is read by the same parser, url_policy.parse_prometheus_url);
        `read_limits`: each query's bounds (default: operator/live/prometheus_http.py's, with QUERY_TIMEOUT_S); `tls`:
        spec.metrics.tls's PEM text (None: an https URL is verified against the system's CAs). MetricsUnavailable
        PrometheusTLSConfigInvalid, naming the field, when it cannot be loaded or the URL is not https."""
        self.queries = build_queries(engine, matchers=matchers, window_s=window_s, ttft_quantile=ttft_quantile,
                                     tpot_quantile=tpot_quantile, by_role=by_role)
        try:
            self.url = url if isinstance(url, PrometheusUrl) else parse_prometheus_url(url)
        except UrlRefused as why:
            raise MetricsUnavailable(f"the Prometheus URL is refused: {why}", "PrometheusUrlRefused") from None
        self.read_deadline_s, self.clock = read_deadline_s, clock
        self.read_limits = read_limits or ReadLimits(query_s=QUERY_TIMEOUT_S)
        self._token = bearer_token or None
        self._factory = client_factory or self._bounded
        self.addresses = addresses or AddressPolicy()
        self._tls = None
        if tls is not None:
            if self.url.scheme != "https":
                raise MetricsUnavailable("spec.metrics.tls: needs an https:// prometheusUrl (TLS is not used for http)",
                                         PrometheusFailure.TLS_CONFIG_INVALID.value)
            try:
                self._tls = client_context(tls)
            except TlsConfigInvalid as exc:
                raise MetricsUnavailable(f"the TLS configuration is invalid: {exc}", PrometheusFailure.TLS_CONFIG_INVALID.value) from None

    def _bounded(self, url: PrometheusUrl, token: str | None) -> _Client:
        return BoundedPrometheus(url, bearer_token=token, limits=self.read_limits, tls=self._tls,
                                 deadline_s=self.clock() + self.read_deadline_s, clock=self.clock, addresses=self.addresses)

    def fetch_sample(self, *, at_s: float, interval_s: float) -> MetricSample:
        deadline_s = self.clock() + self.read_deadline_s
        try:
            client = self._factory(self.url, self._token)
        except PrometheusAnswerError as exc:
            raise MetricsUnavailable(f"Prometheus query failed: {exc}", exc.reason.value) from None
        values: dict[str, float | None] = {}
        for q in self.queries:
            values[q.figure.value] = None
            for expr in q.exprs:
                if self.clock() > deadline_s:
                    raise MetricsUnavailable(f"Prometheus query failed: the read took over {self.read_deadline_s:g} s",
                                             PrometheusFailure.TIMEOUT.value)
                try:
                    v = _value(client.custom_query(expr), q)
                except PrometheusAnswerError as exc:
                    raise MetricsUnavailable(f"Prometheus query failed: {exc}", exc.reason.value) from None
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    raise MetricsUnavailable(f"Prometheus query failed: {unavailable_reason(exc)}") from exc
                if v is not None:
                    values[q.figure.value] = v
                    break
        return MetricSample(at_s=at_s, interval_s=interval_s, **values)


def unavailable_reason(exc: BaseException) -> str:
    """Say why a query of a client other than operator/live/prometheus_http.py failed, without repeating the server.

    (The bounded client's own errors are PrometheusAnswerError, already worded without the body.) A Prometheus URL
    comes from the resource's author; its response bodies may be anything (an SSRF target's page, a token echoed
    back), so conditions and Events get the status code or the error's kind only:
    - a non-200 answer: "HTTP Status Code 503 (b'...')" → "HTTP 503";
    - a 200 whose JSON has no `data.result` (KeyError/TypeError inside the client) or is not JSON (ValueError);
    - a connection error or timeout (an OSError): its kind and message, which the client wrote, not the server.
    """
    code = re.match(r"HTTP Status Code (\d+)", str(exc))
    if code:
        return f"HTTP {code.group(1)}"
    if isinstance(exc, (KeyError, TypeError)):
        return "HTTP 200 without a Prometheus result (no data.result)"
    if isinstance(exc, ValueError):
        return "HTTP 200 with a body that is not Prometheus JSON"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
