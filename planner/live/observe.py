"""Observed workload and SLO figures, and the estimation of the planner's Workload from metric samples.

The operator's metrics source turns Prometheus series into `MetricSample`s (one per replan interval);
`estimate_workload` and `observe_slo` turn a window of them into frozen values with a confidence. Called
by the operator's replanning glue and the drift detector. Pure: no I/O, no clock (times are arguments);
too few samples raise `InsufficientData` so the caller keeps everything as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from servingtopology.planner.errors import InsufficientData
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

__all__ = [
    "MetricSample",
    "ObservedWorkload",
    "ObservedSlo",
    "Observation",
    "lognormal_from_quantile",
    "length_dist",
    "estimate_workload",
    "observe_slo",
    "observe",
    "MIN_SAMPLES",
    "MIN_REQUESTS",
]

MIN_SAMPLES = 3       # intervals with traffic before any estimate is trusted
MIN_REQUESTS = 50     # requests over the window; below this the length means are noise
_FULL_SAMPLES = 4     # intervals at which the sample-count term of the confidence saturates
_MAX_SIGMA = 2.5      # widest lognormal accepted from a histogram quantile (beyond it buckets are too coarse)


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One interval's figures for one ServingTopology, summed over its engine pods (None = series absent).

    Rates are per second over the interval; latencies are at the percentile the source was asked for.
    """

    at_s: float
    interval_s: float
    request_rate_rps: float | None = None
    prompt_tokens_rate: float | None = None
    generation_tokens_rate: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    input_tokens_p99: float | None = None
    output_tokens_p99: float | None = None
    prefix_hit_rate: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions_per_s: float | None = None

    @property
    def requests(self) -> float:
        """Requests finished in the interval (rate × interval; 0 when the rate is absent)."""
        return max(self.request_rate_rps or 0.0, 0.0) * self.interval_s

    @property
    def empty(self) -> bool:
        """True when no figure at all came back (metrics down, or a selector that matches nothing)."""
        return all(getattr(self, f) is None for f in _FIGURES)


_FIGURES = ("request_rate_rps", "prompt_tokens_rate", "generation_tokens_rate", "input_tokens_mean", "output_tokens_mean",
            "input_tokens_p99", "output_tokens_p99", "prefix_hit_rate", "ttft_ms", "tpot_ms", "e2e_ms", "running", "waiting",
            "kv_usage", "preemptions_per_s")


@dataclass(frozen=True, slots=True)
class ObservedWorkload:
    """The workload estimated from a window, with how far to trust it.

    confidence in [0, 1]: (1 − 1/√N) for N requests (the relative standard error of a Poisson count)
    times min(1, samples/4); rate_cv is the coefficient of variation of the per-interval rates.
    """

    workload: Workload
    confidence: float
    samples: int
    requests: float
    span_s: float
    rate_cv: float


@dataclass(frozen=True, slots=True)
class ObservedSlo:
    """Observed latencies over the window (request-weighted mean of the per-interval percentiles)."""

    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    samples: int
    waiting_mean: float = 0.0
    kv_usage_max: float = 0.0


@dataclass(frozen=True, slots=True)
class Observation:
    workload: ObservedWorkload
    slo: ObservedSlo
    at_s: float


def lognormal_from_quantile(mean: float, quantile: float, *, q: float = 0.99) -> float:
    """Sigma of the lognormal with this mean whose q-quantile is `quantile` (0 when quantile ≤ mean).

    For X = exp(μ + σZ) with E[X] = m: μ = ln m − σ²/2, so ln(x_q/m) = z_q σ − σ²/2 and
    σ = z_q − √(z_q² − 2 ln(x_q/m)) (the smaller root); beyond the vertex σ is capped at z_q.
    """
    if mean <= 0 or quantile <= mean:
        return 0.0
    z = NormalDist().inv_cdf(q)
    disc = z * z - 2.0 * math.log(quantile / mean)
    sigma = z if disc <= 0 else z - math.sqrt(disc)
    return min(max(sigma, 0.0), _MAX_SIGMA)


def length_dist(mean_tokens: float, p99_tokens: float | None) -> LengthDist:
    """A length distribution from its mean and, when known, its p99 (lognormal); otherwise fixed."""
    mean_tokens = max(mean_tokens, 1.0)
    if p99_tokens is None or not math.isfinite(p99_tokens):
        return LengthDist.fixed(round(mean_tokens))
    sigma = lognormal_from_quantile(mean_tokens, p99_tokens)
    if sigma < 0.05:
        return LengthDist.fixed(round(mean_tokens))
    return LengthDist(LengthKind.LOGNORMAL, mean=mean_tokens, sigma=sigma)


def _weighted(samples: Sequence[MetricSample], attr: str) -> float | None:
    """Request-weighted mean of a figure over the samples that have it (None when none do)."""
    num = den = 0.0
    for s in samples:
        v = getattr(s, attr)
        if v is None or not math.isfinite(v):
            continue
        w = max(s.requests, 1e-9)
        num += w * v
        den += w
    return num / den if den > 0 else None


def _mean_length(samples: Sequence[MetricSample], *, mean_attr: str, rate_attr: str) -> float | None:
    """Mean length per request: the histograms' mean, else the token rate over the request rate."""
    direct = _weighted(samples, mean_attr)
    if direct is not None:
        return direct
    tokens = sum((getattr(s, rate_attr) or 0.0) * s.interval_s for s in samples if getattr(s, rate_attr) is not None)
    reqs = sum(s.requests for s in samples if getattr(s, rate_attr) is not None)
    return tokens / reqs if reqs > 0 and tokens > 0 else None


def _backlog_growth_rps(samples: Sequence[MetricSample]) -> float:
    """Requests/s piling up in the engines (running + waiting, first to last sample), never negative.

    Counters count finished requests; an overloaded deployment finishes fewer than arrive, and the queue
    gauges hold the difference. Arrivals ≈ completions + growth of what is in flight.
    """
    held = [(s.at_s, (s.running or 0.0) + (s.waiting or 0.0)) for s in samples if s.running is not None or s.waiting is not None]
    if len(held) < 2 or held[-1][0] <= held[0][0]:
        return 0.0
    return max(0.0, (held[-1][1] - held[0][1]) / (held[-1][0] - held[0][0]))


def estimate_workload(samples: Sequence[MetricSample], *, min_samples: int = MIN_SAMPLES, min_requests: float = MIN_REQUESTS,
                      arrival_cv: float = 1.0) -> ObservedWorkload:
    """Estimate the open-loop workload (rate, length distributions, prefix share) from a window of samples.

    Only samples with a request rate count; the arrival rate adds the backlog's growth to the completion
    rate (see _backlog_growth_rps). Raises InsufficientData when fewer than `min_samples` of
    them remain, when they hold fewer than `min_requests` requests, or when no length is measurable.
    """
    usable = [s for s in samples if s.request_rate_rps is not None and math.isfinite(s.request_rate_rps)]
    if len(usable) < min_samples:
        raise InsufficientData(f"{len(usable)} metric intervals with a request rate; at least {min_samples} are needed")
    requests = sum(s.requests for s in usable)
    if requests < min_requests:
        raise InsufficientData(f"{requests:.0f} requests observed over the window; at least {min_requests:.0f} are needed")
    span_s = sum(s.interval_s for s in usable)
    rate = requests / span_s + _backlog_growth_rps(usable)
    rates = [s.request_rate_rps or 0.0 for s in usable]
    mean_rate = sum(rates) / len(rates)
    sd = math.sqrt(sum((r - mean_rate) ** 2 for r in rates) / len(rates))
    inp = _mean_length(usable, mean_attr="input_tokens_mean", rate_attr="prompt_tokens_rate")
    out = _mean_length(usable, mean_attr="output_tokens_mean", rate_attr="generation_tokens_rate")
    if inp is None or out is None:
        raise InsufficientData("no prompt or output length series (request-length histograms or token counters) in the window")
    prefix = _weighted(usable, "prefix_hit_rate")
    workload = Workload(
        input_tokens=length_dist(inp, _weighted(usable, "input_tokens_p99")),
        output_tokens=length_dist(out, _weighted(usable, "output_tokens_p99")),
        arrival_rate_rps=rate,
        prefix_share=min(max(prefix or 0.0, 0.0), 1.0),
        arrival_cv=arrival_cv,
    )
    confidence = (1.0 - 1.0 / math.sqrt(requests)) * min(1.0, len(usable) / _FULL_SAMPLES)
    return ObservedWorkload(workload=workload, confidence=confidence, samples=len(usable), requests=requests, span_s=span_s,
                            rate_cv=sd / mean_rate if mean_rate > 0 else 0.0)


def observe_slo(samples: Sequence[MetricSample], *, min_samples: int = MIN_SAMPLES) -> ObservedSlo:
    """Observed TTFT/TPOT/e2e over the window; raises InsufficientData when no latency series has enough samples."""
    with_latency = [s for s in samples if s.ttft_ms is not None or s.tpot_ms is not None]
    if len(with_latency) < min_samples:
        raise InsufficientData(f"{len(with_latency)} metric intervals with latencies; at least {min_samples} are needed")
    waits = [s.waiting for s in samples if s.waiting is not None]
    kv = [s.kv_usage for s in samples if s.kv_usage is not None]
    return ObservedSlo(ttft_ms=_weighted(with_latency, "ttft_ms"), tpot_ms=_weighted(with_latency, "tpot_ms"),
                       e2e_ms=_weighted(with_latency, "e2e_ms"), samples=len(with_latency),
                       waiting_mean=sum(waits) / len(waits) if waits else 0.0, kv_usage_max=max(kv) if kv else 0.0)


def observe(samples: Sequence[MetricSample], *, min_samples: int = MIN_SAMPLES, min_requests: float = MIN_REQUESTS) -> Observation:
    """Workload and SLO figures of a window, stamped with its last sample's time."""
    if not samples:
        raise InsufficientData("no metric samples yet")
    return Observation(workload=estimate_workload(samples, min_samples=min_samples, min_requests=min_requests),
                       slo=observe_slo(samples, min_samples=min_samples), at_s=max(s.at_s for s in samples))
