"""The PromQL of the metrics source, as strings, for vLLM (new names, old-name fallbacks) and SGLang; and the source over a fake client."""

from __future__ import annotations

import pytest
import requests

from servingtopology.operator.live.metrics import (
    Figure,
    MetricsUnavailable,
    PrometheusMetrics,
    build_queries,
    label_selector,
    topology_matchers,
)
from servingtopology.planner.layout import Engine, Role

M = topology_matchers(namespace="ml", name="chat")
FRONT = '{namespace="ml",servingtopology_io_topology="chat",servingtopology_io_role=~"aggregated|decode"}'
EVERY = '{namespace="ml",servingtopology_io_topology="chat"}'
PREFILL = '{namespace="ml",servingtopology_io_topology="chat",servingtopology_io_role=~"prefill"}'
DECODE = '{namespace="ml",servingtopology_io_topology="chat",servingtopology_io_role=~"decode"}'
ROUTER = '{namespace="ml",servingtopology_io_role="router",servingtopology_io_topology="chat"}'


def exprs(engine: Engine, **kw) -> dict[Figure, tuple[str, ...]]:
    return {q.figure: q.exprs for q in build_queries(engine, matchers=M, window_s=120, **kw)}


VLLM = {
    Figure.REQUEST_RATE: (f"sum(rate(vllm:request_success_total{FRONT}[120s]))",
                          f"sum(rate(vllm:e2e_request_latency_seconds_count{FRONT}[120s]))"),
    Figure.PROMPT_TOKENS_RATE: (f"sum(rate(vllm:prompt_tokens_total{FRONT}[120s]))",),
    Figure.GENERATION_TOKENS_RATE: (f"sum(rate(vllm:generation_tokens_total{FRONT}[120s]))",),
    Figure.INPUT_TOKENS_MEAN: (f"sum(rate(vllm:request_prompt_tokens_sum{FRONT}[120s])) / sum(rate(vllm:request_prompt_tokens_count{FRONT}[120s]))",),
    Figure.OUTPUT_TOKENS_MEAN: (f"sum(rate(vllm:request_generation_tokens_sum{FRONT}[120s])) / "
                                f"sum(rate(vllm:request_generation_tokens_count{FRONT}[120s]))",),
    Figure.INPUT_TOKENS_P99: (f"histogram_quantile(0.99, sum by (le) (rate(vllm:request_prompt_tokens_bucket{FRONT}[120s])))",),
    Figure.OUTPUT_TOKENS_P99: (f"histogram_quantile(0.99, sum by (le) (rate(vllm:request_generation_tokens_bucket{FRONT}[120s])))",),
    Figure.PREFIX_HIT_RATE: (f"sum(rate(vllm:prefix_cache_hits_total{EVERY}[120s])) / sum(rate(vllm:prefix_cache_queries_total{EVERY}[120s]))",
                             f"sum(rate(vllm:gpu_prefix_cache_hits_total{EVERY}[120s])) / "
                             f"sum(rate(vllm:gpu_prefix_cache_queries_total{EVERY}[120s]))"),
    # PD behind vllm-router (no TTFT of its own): the prefill request's latency, then the decode engine's TTFT.
    Figure.TTFT: (f"histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{PREFILL}[120s]))) + "
                  f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{DECODE}[120s])))",
                  f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{FRONT}[120s])))"),
    # The SLO is per request: the per-request TPOT first, then the inter-token latency (0.11's old name last).
    Figure.TPOT: (f"histogram_quantile(0.95, sum by (le) (rate(vllm:request_time_per_output_token_seconds_bucket{FRONT}[120s])))",
                  f"histogram_quantile(0.95, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{FRONT}[120s])))",
                  f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket{FRONT}[120s])))"),
    Figure.E2E: (f"histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{FRONT}[120s])))",),
    Figure.RUNNING: (f"sum(vllm:num_requests_running{EVERY})",),
    Figure.WAITING: (f"sum(vllm:num_requests_waiting{EVERY})",),
    Figure.KV_USAGE: (f"max(vllm:kv_cache_usage_perc{EVERY})", f"max(vllm:gpu_cache_usage_perc{EVERY})"),
    Figure.PREEMPTIONS: (f"sum(rate(vllm:num_preemptions_total{EVERY}[120s]))",),
}

SGLANG = {
    Figure.REQUEST_RATE: (f"sum(rate(sglang:num_requests_total{FRONT}[120s]))",
                          f"sum(rate(sglang:e2e_request_latency_seconds_count{FRONT}[120s]))"),
    Figure.PROMPT_TOKENS_RATE: (f"sum(rate(sglang:prompt_tokens_total{FRONT}[120s]))",),
    Figure.GENERATION_TOKENS_RATE: (f"sum(rate(sglang:generation_tokens_total{FRONT}[120s]))",),
    Figure.INPUT_TOKENS_MEAN: (f"sum(rate(sglang:prompt_tokens_histogram_sum{FRONT}[120s])) / "
                               f"sum(rate(sglang:prompt_tokens_histogram_count{FRONT}[120s]))",),
    Figure.OUTPUT_TOKENS_MEAN: (f"sum(rate(sglang:generation_tokens_histogram_sum{FRONT}[120s])) / "
                                f"sum(rate(sglang:generation_tokens_histogram_count{FRONT}[120s]))",),
    Figure.INPUT_TOKENS_P99: (f"histogram_quantile(0.99, sum by (le) (rate(sglang:prompt_tokens_histogram_bucket{FRONT}[120s])))",),
    Figure.OUTPUT_TOKENS_P99: (f"histogram_quantile(0.99, sum by (le) (rate(sglang:generation_tokens_histogram_bucket{FRONT}[120s])))",),
    Figure.PREFIX_HIT_RATE: (f"sum(rate(sglang:cached_tokens_total{FRONT}[120s])) / sum(rate(sglang:prompt_tokens_total{FRONT}[120s]))",
                             f"avg(sglang:cache_hit_rate{EVERY})"),
    # PD behind smg over HTTP: the router's PD TTFT (its gRPC router's histogram second); else the decode (or
    # aggregated) engine's, from arrival.
    Figure.TTFT: (f"histogram_quantile(0.95, sum by (le) (rate(smg_pd_ttft_seconds_bucket{ROUTER}[120s])))",
                  f"histogram_quantile(0.95, sum by (le) (rate(smg_router_ttft_seconds_bucket{ROUTER}[120s])))",
                  f"histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{FRONT}[120s])))"),
    # Per request first; sglang:time_per_output_token_seconds does not exist (0.5.23's metrics): not asked.
    Figure.TPOT: (f"histogram_quantile(0.95, sum by (le) (rate(sglang:request_time_per_output_token_seconds_bucket{FRONT}[120s])))",
                  f"histogram_quantile(0.95, sum by (le) (rate(sglang:inter_token_latency_seconds_bucket{FRONT}[120s])))"),
    Figure.E2E: (f"histogram_quantile(0.95, sum by (le) (rate(sglang:e2e_request_latency_seconds_bucket{FRONT}[120s])))",),
    Figure.RUNNING: (f"sum(sglang:num_running_reqs{EVERY})",),
    Figure.WAITING: (f"sum(sglang:num_queue_reqs{EVERY})",),
    Figure.KV_USAGE: (f"max(sglang:token_usage{EVERY})",),
    Figure.PREEMPTIONS: (f"sum(sglang:num_retracted_reqs{EVERY})",),
}


@pytest.mark.parametrize("figure", list(Figure))
def test_vllm_queries_read_the_new_names_first_and_fall_back_to_the_old(figure):
    assert exprs(Engine.VLLM)[figure] == VLLM[figure]


@pytest.mark.parametrize("figure", list(Figure))
def test_sglang_queries_read_its_own_names(figure):
    assert exprs(Engine.SGLANG)[figure] == SGLANG[figure]


def test_percentiles_follow_the_slo_and_the_role_filter_can_be_dropped():
    q = exprs(Engine.VLLM, ttft_quantile=0.99, tpot_quantile=0.9, by_role=False)
    assert q[Figure.TTFT] == (f"histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{EVERY}[120s])))",)
    assert q[Figure.TPOT][0].startswith("histogram_quantile(0.9, ")


def test_label_values_are_escaped_and_extra_matchers_join_the_selector():
    sel = label_selector(topology_matchers(namespace="ml", name="chat", extra={"cluster": 'a"b'}), roles=(Role.PREFILL,))
    assert sel == '{cluster="a\\"b",namespace="ml",servingtopology_io_topology="chat",servingtopology_io_role=~"prefill"}'


def test_a_window_under_one_second_is_refused():
    with pytest.raises(ValueError, match="window"):
        build_queries(Engine.VLLM, matchers=M, window_s=0)


class FakeProm:
    """Answers instant queries from a table of {expression: value}; anything else is an empty vector."""

    def __init__(self, table: dict[str, float | str], error: Exception | None = None) -> None:
        self.table, self.error, self.asked = table, error, []

    def custom_query(self, query, params=None):
        self.asked.append(query)
        if self.error is not None:
            raise self.error
        if query not in self.table:
            return []
        return [{"metric": {}, "value": [1700000000.0, str(self.table[query])]}]


def source(table, error=None, engine=Engine.VLLM):
    fake = FakeProm(table, error)
    seen = {}

    def factory(url, token):
        seen.update(url=str(url), token=token)
        return fake

    src = PrometheusMetrics("http://prom:9090", engine=engine, matchers=M, window_s=120, bearer_token="s3cret", client_factory=factory)
    return src, fake, seen


def test_the_source_converts_seconds_to_ms_uses_fallbacks_and_leaves_absent_series_as_none():
    table = {VLLM[Figure.REQUEST_RATE][0]: 4.0, VLLM[Figure.TTFT][1]: 0.25, VLLM[Figure.TPOT][2]: 0.03,  # an old vLLM: TPOT by its old name
             VLLM[Figure.KV_USAGE][0]: "NaN", VLLM[Figure.KV_USAGE][1]: 0.5}
    src, fake, seen = source(table)
    s = src.fetch_sample(at_s=600.0, interval_s=60.0)
    assert seen == {"url": "http://prom:9090", "token": "s3cret"}
    assert s.request_rate_rps == 4.0 and s.ttft_ms == pytest.approx(250.0) and s.tpot_ms == pytest.approx(30.0)
    assert s.kv_usage == 0.5           # NaN from the new name counts as absent
    assert s.input_tokens_mean is None and s.at_s == 600.0 and s.interval_s == 60.0
    assert VLLM[Figure.REQUEST_RATE][1] not in fake.asked  # a fallback is only asked when the first name is empty


def test_an_empty_prometheus_gives_an_empty_sample_and_a_dead_one_raises():
    src, _, _ = source({})
    assert src.fetch_sample(at_s=0.0, interval_s=60.0).empty
    src, _, _ = source({}, error=requests.ConnectionError("refused"))
    with pytest.raises(MetricsUnavailable, match="ConnectionError"):
        src.fetch_sample(at_s=0.0, interval_s=60.0)


def test_the_router_ttft_metric_is_the_one_the_covered_smg_release_exports() -> None:
    from servingtopology.operator.live.metrics import SMG_PD_TTFT, SMG_TTFT
    from servingtopology.planner.engines.caps import available_versions, load_caps

    names = {m.name for m in load_caps("smg", available_versions("smg")[-1]).metrics}
    assert SMG_PD_TTFT in names and SMG_TTFT in names
    # vllm-router exports request durations, no TTFT: vLLM's PD TTFT is composed from the roles' metrics.
    assert not [n for n in (m.name for m in load_caps("vllm-router", "0.1.17").metrics) if "ttft" in n or "first_token" in n]
    assert {m.name for m in load_caps("vllm-router", "0.1.17").metrics} >= {"vllm_router_pd_request_duration_seconds"}


class _Answer:
    """A tiny HTTP server on loopback that answers every request with one fixed status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        import http.server
        import threading

        answer = (status, body)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(answer[0])
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer[1])

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("status", "body", "why"), [
    (200, b'{"status": "success"}', "HTTP 200 without a Prometheus result"),          # 200 without data: was a KeyError
    (200, b'{"status": "success", "data": null}', "HTTP 200 without a Prometheus result"),
    (200, b"<html>login</html>", "HTTP 200 with a body that is not Prometheus JSON"),
    (401, b"secret-token-echoed-back internal page", "HTTP 401"),   # non-200 bodies were copied into status
])
def test_a_prometheus_that_answers_garbage_is_unavailable_and_its_body_is_never_repeated(status, body, why):
    server = _Answer(status, body)
    try:
        src = PrometheusMetrics(server.url, engine=Engine.VLLM, matchers=M, window_s=120)
        with pytest.raises(MetricsUnavailable) as caught:
            src.fetch_sample(at_s=0.0, interval_s=60.0)
    finally:
        server.close()
    message = str(caught.value)
    assert why in message
    assert "secret-token" not in message and "login" not in message


def _names(expr: str) -> set[str]:
    import re

    return set(re.findall(r"((?:vllm|sglang|smg)[:_][a-zA-Z0-9_:]+?)(?=[{\[)])", expr))


def _exported(name: str, caps_names: set[str]) -> bool:
    """A series name as Prometheus scrapes it is a declared metric, or a histogram's or counter's series of one."""
    return name in caps_names or any(name.endswith(suf) and name[: -len(suf)] in caps_names for suf in ("_bucket", "_sum", "_count", "_total"))


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_every_metric_the_operator_queries_is_one_a_covered_release_exports(engine):
    """The PromQL's names against the capability data generated from the released packages (planner/data/engine_caps):
    each name some covered release of the engine (or of its PD routers) exports, and the first expression of every
    figure one the newest covered release exports."""
    from servingtopology.planner.engines.caps import available_versions, load_caps

    kinds = {"vllm": ("vllm", "vllm-router"), "sglang": ("sglang", "smg", "sglang-router")}[engine.value]
    by_release = {(k, v): {m.name for m in load_caps(k, v).metrics} for k in kinds for v in available_versions(k)}
    every = set().union(*by_release.values())
    newest = by_release[(engine.value, available_versions(engine.value)[-1])]
    routers = set().union(*(n for (k, _), n in by_release.items() if k != engine.value))
    for q in build_queries(engine, matchers=M, window_s=120):
        names = {n for e in q.exprs for n in _names(e)}
        assert names, q
        missing = sorted(n for n in names if not _exported(n, every))
        assert not missing, (q.figure, missing)
        first = _names(q.exprs[0])
        assert all(_exported(n, newest | routers) for n in first), (q.figure, first)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_every_metric_the_operator_queries_is_a_name_of_the_shared_vocabulary(engine):
    """The PromQL spells no metric name of its own: each series it reads is one of planner/engines/metric_names.py's (a
    histogram's `_bucket`, `_sum` or `_count` series of one), the vocabulary the emulator's exposition reads too and
    tests/planner/test_metric_names.py holds to every covered release."""
    from servingtopology.planner.engines.metric_names import HISTOGRAM_SUFFIXES, vocabulary

    names = set(vocabulary(engine))
    for by_role in (True, False):
        for q in build_queries(engine, matchers=M, window_s=120, by_role=by_role):
            for series in {n for e in q.exprs for n in _names(e)}:
                base = next((series.removesuffix(s) for s in HISTOGRAM_SUFFIXES if series.endswith(s)), series)
                assert series in names or base in names, (q.figure, series)
