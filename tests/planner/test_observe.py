"""Workload estimation from metric samples: rates, length distributions, prefix share, confidence, refusals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.errors import InsufficientData
from servingtopology.planner.live.observe import (
    MetricSample,
    estimate_workload,
    length_dist,
    lognormal_from_quantile,
    observe,
    observe_slo,
)
from servingtopology.planner.workload import LengthDist, LengthKind


def recorded(n: int = 6, *, rate: float = 4.0, inp: float = 1000.0, inp_p99: float | None = 3000.0, out: float = 200.0,
             prefix: float | None = 0.3, interval_s: float = 30.0, **extra: float) -> list[MetricSample]:
    """A recorded window: n intervals as the metrics source returns them."""
    return [MetricSample(at_s=(i + 1) * interval_s, interval_s=interval_s, request_rate_rps=rate, prompt_tokens_rate=rate * inp,
                         generation_tokens_rate=rate * out, input_tokens_mean=inp, output_tokens_mean=out, input_tokens_p99=inp_p99,
                         prefix_hit_rate=prefix, **extra) for i in range(n)]


def test_a_steady_window_gives_back_its_rate_lengths_and_prefix_share():
    est = estimate_workload(recorded())
    w = est.workload
    assert w.arrival_rate_rps == pytest.approx(4.0)
    assert w.input_tokens.kind is LengthKind.LOGNORMAL
    assert w.input_tokens.expected_tokens == pytest.approx(1000.0)
    assert w.input_tokens.p99_tokens == pytest.approx(3000.0, rel=1e-6)
    assert w.output_tokens == LengthDist.fixed(200)   # no p99 for outputs: a fixed length at the mean
    assert w.prefix_share == pytest.approx(0.3)
    assert est.samples == 6 and est.requests == pytest.approx(720.0) and est.rate_cv == pytest.approx(0.0)


def test_without_length_histograms_the_means_come_from_token_rates_over_request_rates():
    # SGLang without --collect-tokens-histogram: only counters.
    samples = [MetricSample(at_s=30.0 * i, interval_s=30.0, request_rate_rps=2.0 + i % 2, prompt_tokens_rate=(2.0 + i % 2) * 4000,
                            generation_tokens_rate=(2.0 + i % 2) * 300) for i in range(4)]
    w = estimate_workload(samples).workload
    assert w.input_tokens == LengthDist.fixed(4000)
    assert w.output_tokens == LengthDist.fixed(300)
    assert w.arrival_rate_rps == pytest.approx(2.5)
    assert w.prefix_share == 0.0


def test_intervals_weigh_by_their_requests():
    busy = recorded(3, rate=9.0, inp=2000.0, inp_p99=None)
    quiet = recorded(3, rate=1.0, inp=500.0, inp_p99=None)
    w = estimate_workload(busy + quiet).workload
    assert w.input_tokens.expected_tokens == pytest.approx((9 * 2000 + 1 * 500) / 10, abs=1)
    assert w.arrival_rate_rps == pytest.approx(5.0)


# (samples, why the estimate is refused)
REFUSALS = [
    (recorded(2), "intervals"),                                         # fewer than three intervals
    (recorded(6, rate=0.1), "requests"),                                # 18 requests in three minutes
    ([MetricSample(at_s=i, interval_s=30.0) for i in range(6)], "intervals"),  # metrics empty
    ([MetricSample(at_s=i, interval_s=30.0, request_rate_rps=5.0) for i in range(6)], "length"),  # rate but no lengths
]


@pytest.mark.parametrize(("samples", "match"), REFUSALS)
def test_too_little_data_raises_insufficient_data(samples, match):
    with pytest.raises(InsufficientData, match=match):
        estimate_workload(samples)


def test_confidence_grows_with_requests_and_intervals_and_stays_within_zero_and_one():
    few = estimate_workload(recorded(3, rate=1.0)).confidence
    more_intervals = estimate_workload(recorded(6, rate=1.0)).confidence
    more_requests = estimate_workload(recorded(6, rate=20.0)).confidence
    assert 0.0 < few < more_intervals < more_requests <= 1.0


def test_a_noisy_rate_shows_in_the_coefficient_of_variation():
    samples = [MetricSample(at_s=i, interval_s=30.0, request_rate_rps=r, input_tokens_mean=100.0, output_tokens_mean=10.0)
               for i, r in enumerate([2.0, 6.0, 2.0, 6.0])]
    assert estimate_workload(samples).rate_cv == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(mean=st.floats(50, 50_000), sigma=st.floats(0.06, 2.0))
def test_a_lognormal_is_recovered_from_its_mean_and_p99(mean, sigma):
    p99 = LengthDist(LengthKind.LOGNORMAL, mean=mean, sigma=sigma).quantile(0.99)
    assert lognormal_from_quantile(mean, p99) == pytest.approx(sigma, rel=1e-6)
    assert length_dist(mean, p99).p99_tokens == pytest.approx(p99, rel=1e-6)


def test_a_p99_at_or_under_the_mean_means_a_fixed_length():
    assert length_dist(800.0, 800.0) == LengthDist.fixed(800)
    assert length_dist(800.0, 500.0) == LengthDist.fixed(800)
    assert length_dist(800.0, math.inf) == LengthDist.fixed(800)


def test_observed_latencies_are_request_weighted_and_need_three_intervals():
    samples = recorded(2, rate=9.0, ttft_ms=100.0, tpot_ms=20.0) + recorded(2, rate=1.0, ttft_ms=1100.0, tpot_ms=40.0, kv_usage=0.9)
    slo = observe_slo(samples)
    assert slo.ttft_ms == pytest.approx(200.0)
    assert slo.tpot_ms == pytest.approx(22.0)
    assert slo.e2e_ms is None and slo.kv_usage_max == pytest.approx(0.9)
    with pytest.raises(InsufficientData, match="latencies"):
        observe_slo(recorded(6))


def test_an_observation_is_stamped_with_its_last_interval():
    obs = observe(recorded(5, ttft_ms=150.0, tpot_ms=25.0))
    assert obs.at_s == pytest.approx(150.0)
    assert obs.slo.ttft_ms == pytest.approx(150.0)
    with pytest.raises(InsufficientData):
        observe([])


def test_an_empty_sample_is_recognised():
    assert MetricSample(at_s=0.0, interval_s=30.0).empty
    assert not MetricSample(at_s=0.0, interval_s=30.0, waiting=0.0).empty


def test_an_overloaded_deployment_counts_the_growing_queue_as_arrivals():
    # 3 req/s finish while the queue grows by 300 requests over five minutes: 4 req/s arrive.
    samples = [MetricSample(at_s=60.0 * i, interval_s=60.0, request_rate_rps=3.0, input_tokens_mean=1000.0, output_tokens_mean=200.0,
                            running=64.0, waiting=60.0 * i) for i in range(1, 7)]
    assert estimate_workload(samples).workload.arrival_rate_rps == pytest.approx(4.0)
    draining = [MetricSample(at_s=60.0 * i, interval_s=60.0, request_rate_rps=3.0, input_tokens_mean=1000.0, output_tokens_mean=200.0,
                             running=64.0, waiting=300.0 - 60.0 * i) for i in range(1, 6)]
    assert estimate_workload(draining).workload.arrival_rate_rps == pytest.approx(3.0)  # a shrinking queue is not subtracted
