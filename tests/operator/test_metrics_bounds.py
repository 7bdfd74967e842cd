"""The metrics path against a hostile Prometheus, through the real client on loopback: the URL is read one way and
only the checked host is called, redirects are refused, answers are capped in size, depth and range, a dripping
server is cut at the query's deadline, and a slow tenant holds no reconcile thread. Every failure is a named
MetricsAvailable=False reason, never a traceback."""

from __future__ import annotations

import threading
import time
import tracemalloc

import pytest
from fake_cluster import FakeCluster
from test_live_reconcile import NS, CountingPlanner, live_topology, run
from test_reconcile import cond, reasons

from e2e.hostile_prometheus import HostileServer, drip_answer, endless_answer, json_answer, redirect_answer
from servingtopology.operator.live.metrics import MetricsUnavailable, PrometheusMetrics
from servingtopology.operator.live.metrics_reads import MetricsPending, MetricsReads
from servingtopology.operator.live.prometheus_http import BoundedPrometheus, PrometheusAnswerError, ReadLimits, nesting_exceeds, parse_answer
from servingtopology.operator.live.url_policy import DEFAULT_PROMETHEUS_URLS, UrlAllowList, parse_prometheus_url
from servingtopology.operator.live_replan import MetricsRequest, prometheus_source
from servingtopology.planner.layout import Engine
from servingtopology.planner.live.observe import MetricSample

DEFAULT = UrlAllowList.of(DEFAULT_PROMETHEUS_URLS)
M = {"namespace": "ml", "servingtopology_io_topology": "chat"}
FAST = ReadLimits(query_s=2.0)


def vector(value: str) -> bytes:
    return b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.5,"%s"]}]}}' % value.encode()


def fetch(url: str, *, limits: ReadLimits = FAST, read_deadline_s: float = 10.0, token: str | None = None) -> MetricSample:
    src = PrometheusMetrics(url, engine=Engine.VLLM, matchers=M, window_s=120, bearer_token=token, read_limits=limits,
                            read_deadline_s=read_deadline_s)
    return src.fetch_sample(at_s=0.0, interval_s=60.0)


def failure(url: str, **kwargs: object) -> MetricsUnavailable:
    with pytest.raises(MetricsUnavailable) as caught:
        fetch(url, **kwargs)  # type: ignore[arg-type]
    return caught.value


# --- one URL, one parser ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://evil.example\\x-kube-prometheus-prometheus.ns.svc:9090",   # the report's: urllib3 called evil.example:80
    "http://prometheus-operated.evil.example\\.svc:9090",
])
def test_the_reported_backslash_urls_are_refused_by_the_default_rules(url: str) -> None:
    verdict = DEFAULT.check(url, field="spec.metrics.prometheusUrl")
    assert verdict.url is None and verdict.reason == "PrometheusUrlRefused" and "backslash" in verdict.message


@pytest.mark.parametrize(("url", "why"), [
    ("http://prometheus-operated.ns.svc:9090\t", "whitespace"),                  # a tab urllib strips and urllib3 keeps
    ("http://prometheus-operated.ns.svc\n:9090", "whitespace"),
    ("http://prometheus-operated.ns.svc :9090", "whitespace"),
    ("http://prometheus-operated.ns%2esvc:9090", "percent"),                     # a percent-encoded host character
    ("http://prometheus-operated.ns.svc:9090/%2e%2e/admin", "percent"),          # a dot segment in disguise
    ("http://x@prometheus-operated.ns.svc:9090", "user info"),
    ("http://prometheus-operated.ns.svc:9090/../admin", "segment"),
    ("http://prometheus-operated.nś.svc:9090", "non-ASCII"),
    ("http://127.1:9090", "dotted-quad"),                                         # 127.0.0.1 to the resolver
    ("http://prometheus-operated.ns.svc:99999", "port"),
])
def test_urls_that_parsers_can_read_two_ways_are_refused_with_the_rule_they_break(url: str, why: str) -> None:
    verdict = UrlAllowList.of(["http://**", "http://prometheus-operated.*.svc:9090/**"]).check(url, field="f")
    assert verdict.url is None and verdict.reason == "PrometheusUrlRefused" and why in verdict.message


def test_the_checked_reading_is_the_one_the_client_connects_to() -> None:
    url = parse_prometheus_url("HTTP://Prometheus-Operated.Team-A.svc:9090/prom/")
    assert (url.scheme, url.host, url.port, url.path, str(url)) == (
        "http", "prometheus-operated.team-a.svc", 9090, "/prom", "http://prometheus-operated.team-a.svc:9090/prom")
    assert parse_prometheus_url("http://[::1]:9090").host == "::1"


def test_no_request_and_no_token_reach_the_host_urllib3_read_from_an_allowed_url() -> None:
    # urllib.parse reads host `127.0.0.1\x.svc`, port 9090 (allowed by the rule); urllib3 reads 127.0.0.1:80.
    url, allow = "http://127.0.0.1\\x.svc:9090", UrlAllowList.of(["http://127.0.0.1*:9090"])
    try:
        listener = HostileServer(json_answer(vector("1")), port=80).__enter__()
    except OSError as exc:
        pytest.skip(f"cannot listen on 127.0.0.1:80 here ({exc})")
    try:
        obj, cluster, planner = live_topology(), FakeCluster(), CountingPlanner()
        obj["spec"]["metrics"] |= {"prometheusUrl": url, "bearerTokenSecret": {"name": "prom"}}
        cluster.secrets[(NS, "prom")] = {"token": "s3cret-token"}
        for minute in range(3):
            run(obj, cluster, planner, prometheus_source, minute, allow=allow)   # type: ignore[arg-type]
    finally:
        listener.__exit__()
    assert listener.heads == [], "a request reached a host the allow-list never allowed"
    available = cond(obj, "MetricsAvailable")
    assert (available["status"], available["reason"]) == ("False", "PrometheusUrlRefused")


def test_the_token_goes_to_the_checked_host_in_the_one_request_it_makes() -> None:
    with HostileServer(json_answer(vector("2"))) as prom:
        fetch(prom.url, token="s3cret")
    assert prom.heads and all(b"Authorization: Bearer s3cret\r\n" in h for h in prom.heads)
    assert all(f"Host: 127.0.0.1:{prom.url.rsplit(':', 1)[1]}\r\n".encode() in h for h in prom.heads)


# --- redirects -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_its_target_never_called(status: int) -> None:
    with HostileServer(json_answer(vector("1"))) as other, HostileServer(redirect_answer(f"{other.url}/api/v1/query?query=up", status=status)) as prom:
        caught = failure(prom.url, token="s3cret")
    assert caught.reason == "PrometheusRedirectRefused" and f"HTTP {status}" in str(caught)
    assert other.heads == [] and other.url not in str(caught)


# --- size, depth, numbers --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content_length", [True, False])
def test_a_huge_answer_is_refused_past_the_cap_without_being_read_whole(content_length: bool) -> None:
    total = 64 << 20     # the report's 400 MB, scaled down; the default 1 MiB cap applies
    with HostileServer(endless_answer(total_bytes=total, content_length=content_length)) as prom:
        tracemalloc.start()
        try:
            caught = failure(prom.url, limits=ReadLimits(query_s=10.0))
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        time.sleep(0.2)
    assert caught.reason == "PrometheusAnswerTooLarge"
    assert peak_bytes < 8 << 20, f"the read held {peak_bytes / 2**20:.1f} MiB"
    assert prom.sent_bytes < total // 2, "the client read on past the cap"


def test_a_body_nested_deeper_than_the_cap_is_invalid_without_recursion() -> None:
    deep = b'{"status":"success","data":{"resultType":"vector","result":[' + b"[" * 200_000 + b"]" * 200_000 + b"]}}"
    with HostileServer(json_answer(deep)) as prom:
        caught = failure(prom.url)
    assert caught.reason == "PrometheusAnswerInvalid" and "nested" in str(caught)


def test_the_nesting_scan_counts_brackets_outside_strings_only() -> None:
    assert not nesting_exceeds(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "b": [1, [2]]}', 3)
    assert nesting_exceeds(b"[[[[]]]]", 3) and not nesting_exceeds(b"[[[]]]", 3)
    assert nesting_exceeds(b"[[", 32) and nesting_exceeds(b"][", 32)
    assert not nesting_exceeds(b'["\\"[", "\\\\"]', 1)                  # escaped quote, escaped backslash


@pytest.mark.parametrize(("value", "reason"), [
    ("1e308", "PrometheusAnswerInvalid"),     # finite, but TTFT ms = 1e311 s: inf (the report's NaN downstream)
    ("-5", "PrometheusAnswerInvalid"),        # no figure is negative
])
def test_a_figure_outside_its_range_is_refused_by_name(value: str, reason: str) -> None:
    with HostileServer(json_answer(vector(value))) as prom:
        caught = failure(prom.url)
    assert caught.reason == reason and "outside" in str(caught)


@pytest.mark.parametrize("body", [
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[NaN,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1e999,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[-Infinity,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1' + b"0" * 5000 + b',"1"]}]}}',
])
def test_non_finite_json_numbers_are_invalid(body: bytes) -> None:
    with pytest.raises(PrometheusAnswerError) as caught:
        parse_answer(body)
    assert caught.value.reason == "PrometheusAnswerInvalid"


def test_prometheus_nan_and_inf_strings_are_no_data_not_a_failure() -> None:
    with HostileServer(json_answer(vector("NaN"))) as prom:
        assert fetch(prom.url).empty
    with HostileServer(json_answer(vector("+Inf"))) as prom:
        assert fetch(prom.url).empty


def test_a_good_answer_chunked_or_not_is_read() -> None:
    for chunked in (False, True):
        with HostileServer(json_answer(vector("3.5"), chunked=chunked)) as prom:
            sample = fetch(prom.url)
        assert sample.request_rate_rps == 3.5 and sample.ttft_ms == 3500.0


def test_a_truncated_body_is_invalid() -> None:
    with HostileServer(json_answer(vector("1")[:40], length=200)) as prom:
        caught = failure(prom.url)
    assert caught.reason == "PrometheusAnswerInvalid" and "truncated" in str(caught)


# --- deadlines -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_too", [False, True])
def test_a_server_dripping_a_byte_at_a_time_is_cut_at_the_query_deadline(head_too: bool) -> None:
    # Each byte comes well inside any per-read timeout: only a total deadline ends this read.
    with HostileServer(drip_answer(every_s=0.05, head_too=head_too)) as prom:
        started = time.monotonic()
        caught = failure(prom.url, limits=ReadLimits(query_s=0.5))
        took_s = time.monotonic() - started
    assert caught.reason == "PrometheusTimeout"
    assert took_s < 8.0, f"the read took {took_s:.1f} s against a 0.5 s deadline"


def test_every_query_of_a_read_shares_one_deadline() -> None:
    # Every query answers a little slowly but within its own deadline; the read as a whole must still end.
    with HostileServer(drip_answer(every_s=0.05)) as prom:
        prom.answer = None
        prom.answer_for = lambda head: json_answer(vector("NaN"))   # empty figures: every expression is asked
        src = PrometheusMetrics(prom.url, engine=Engine.VLLM, matchers=M, window_s=120, read_limits=FAST, read_deadline_s=0.0)
        with pytest.raises(MetricsUnavailable) as caught:
            src.fetch_sample(at_s=0.0, interval_s=60.0)
    assert caught.value.reason == "PrometheusTimeout"


def test_a_dripping_tenant_holds_no_reconcile_thread_and_one_read_at_most() -> None:
    # Ten resources on a dripping server and one healthy one share 2 readers: every pass returns within its
    # wait, each dripping resource has at most one read at a time, and the healthy read is answered in turn.
    limits = ReadLimits(query_s=0.4)
    started: list[str] = []

    def source(request: MetricsRequest) -> PrometheusMetrics:
        started.append(request.owner)
        return PrometheusMetrics(request.url, engine=Engine.VLLM, matchers=M, window_s=120, read_limits=limits, read_deadline_s=0.8)

    reads = MetricsReads(source, readers=2, wait_s=0.05)
    with HostileServer(drip_answer(every_s=0.05)) as slow, HostileServer(json_answer(vector("2"))) as good:
        def request(owner: str, url: str) -> MetricsRequest:
            return MetricsRequest(url=url, engine=Engine.VLLM, owner=owner)

        healthy: MetricSample | None = None
        deadline = time.monotonic() + 30.0
        passes = 0
        while healthy is None and time.monotonic() < deadline:
            for i in range(10):
                t0 = time.monotonic()
                with pytest.raises((MetricsPending, MetricsUnavailable)):
                    reads(request(f"ns/slow-{i}", slow.url)).fetch_sample(at_s=0.0, interval_s=60.0)
                assert time.monotonic() - t0 < 2.0, "a pass waited on a slow read"
            try:
                healthy = reads(request("ns/good", good.url)).fetch_sample(at_s=0.0, interval_s=60.0)
            except MetricsPending:
                passes += 1
        reads.close()
    assert healthy is not None and healthy.request_rate_rps == 2.0
    in_flight_max = max(started.count(f"ns/slow-{i}") for i in range(10))
    assert in_flight_max <= passes + 2, "a resource started a read per pass instead of one at a time"


def test_a_slow_read_ends_in_a_named_condition_on_a_later_pass() -> None:
    obj, cluster, planner = live_topology(), FakeCluster(), CountingPlanner()
    limits = ReadLimits(query_s=0.3)
    with HostileServer(drip_answer(every_s=0.05)) as prom:
        obj["spec"]["metrics"]["prometheusUrl"] = prom.url

        def source(request: MetricsRequest) -> PrometheusMetrics:
            return PrometheusMetrics(request.target or request.url, engine=request.engine, matchers=request.matchers,
                                     window_s=request.window_s, read_limits=limits, read_deadline_s=0.6)

        reads = MetricsReads(source, readers=1, wait_s=0.01)
        run(obj, cluster, planner, reads, 0)    # type: ignore[arg-type]
        run(obj, cluster, planner, reads, 1)    # type: ignore[arg-type]
        conditions = {c["type"]: c for c in obj["status"].get("conditions", [])}
        assert conditions.get("MetricsAvailable", {}).get("reason") != "PrometheusTimeout"   # the pass did not wait
        finished = threading.Event()
        for _ in range(200):
            if reads.in_flight() == 0:
                finished.set()
                break
            time.sleep(0.05)
        assert finished.is_set()
        run(obj, cluster, planner, reads, 2)    # type: ignore[arg-type]
        reads.close()
    available = cond(obj, "MetricsAvailable")
    assert (available["status"], available["reason"]) == ("False", "PrometheusTimeout")
    assert "PrometheusTimeout" in reasons(cluster)


def test_a_bearer_token_with_a_line_break_is_refused_before_any_request() -> None:
    with HostileServer(json_answer(vector("1"))) as prom, pytest.raises(PrometheusAnswerError):
        BoundedPrometheus(parse_prometheus_url(prom.url), bearer_token="abc\r\nX-Evil: 1")
    assert prom.heads == []


class _GatedSource:
    """An inner factory whose reads wait for `gate` and answer the URL's last digit as the request rate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started: list[str] = []
        self.url = ""

    def __call__(self, request: MetricsRequest) -> _GatedSource:
        self.started.append(request.url)
        self.url = request.url
        return self

    def fetch_sample(self, *, at_s: float, interval_s: float) -> MetricSample:
        assert self.gate.wait(10.0)
        return MetricSample(at_s=at_s, interval_s=interval_s, request_rate_rps=float(self.url[-1]))


def _answer(reads: MetricsReads, request: MetricsRequest) -> MetricSample:
    """Passes until the read answers (each pass returns at once or within the short wait)."""
    for _ in range(1000):
        try:
            return reads(request).fetch_sample(at_s=0.0, interval_s=60.0)
        except MetricsPending:
            time.sleep(0.01)
    raise AssertionError("no answer")


def test_a_finished_read_answers_only_the_request_it_was_started_for() -> None:
    inner, now = _GatedSource(), [0.0]
    reads = MetricsReads(inner, readers=2, wait_s=0.01, keep_s=60.0, clock=lambda: now[0])
    first = MetricsRequest(url="http://a:1", engine=Engine.VLLM, owner="ns/a")
    edited = MetricsRequest(url="http://a:2", engine=Engine.VLLM, owner="ns/a")
    for _ in range(3):     # OneReadPerResource: passes while the read runs start nothing
        with pytest.raises(MetricsPending):
            reads(first).fetch_sample(at_s=0.0, interval_s=60.0)
    assert inner.started == ["http://a:1"]
    inner.gate.set()
    while reads.in_flight():
        time.sleep(0.01)
    # The spec now names another URL: the finished answer to the first request is dropped, a new read answers.
    assert _answer(reads, edited).request_rate_rps == 2.0 and inner.started == ["http://a:1", "http://a:2"]
    # FreshAnswer: an answer nobody took within keep_s is dropped too.
    with pytest.raises(MetricsPending):
        inner.gate.clear()
        reads(first).fetch_sample(at_s=0.0, interval_s=60.0)
    inner.gate.set()
    while reads.in_flight():
        time.sleep(0.01)
    now[0] = 61.0
    assert _answer(reads, first).request_rate_rps == 1.0 and inner.started == ["http://a:1", "http://a:2", "http://a:1", "http://a:1"]
    reads.close()
