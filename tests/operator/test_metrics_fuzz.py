"""Fuzz of the metrics path: 1,200 generated Prometheus answers (sizes, depths, numbers, encodings, malformed HTTP,
truncated, chunked, slow bodies, redirects, error statuses) served byte for byte by a real server on loopback and
read by the real client (PrometheusMetrics over operator/live/prometheus_http.py). No read may raise anything but
MetricsUnavailable with a named reason, each case's reason is the one its kind calls for, and a sample that is
returned holds finite figures in range. Then 2,000 generated URLs: each is refused or read exactly as urllib.parse
and urllib3 read it. Deterministic under SEED; slow cases use 0.15 s deadlines, no assertion is on speed."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from urllib3.util import parse_url

from e2e.hostile_prometheus import Answer, HostileServer, drip_answer, json_answer, raw_answer, redirect_answer
from servingtopology.operator.live.metrics import FIGURE_MAX, MetricsUnavailable, PrometheusMetrics
from servingtopology.operator.live.prometheus_http import MAX_DEPTH, PrometheusFailure, ReadLimits
from servingtopology.operator.live.url_policy import UrlRefused, parse_prometheus_url
from servingtopology.planner.layout import Engine

SEED = 25
ANSWERS = 1200
URLS = 2000
CAP_BYTES = 64 << 10        # a smaller cap than the operator's, so size cases stay quick
SLOW_S = 0.15
M = {"namespace": "ml", "servingtopology_io_topology": "chat"}
NAMED = {f.value for f in PrometheusFailure}
SAMPLE, EMPTY = "sample", "empty"
INVALID, TOO_LARGE, TIMEOUT = PrometheusFailure.INVALID.value, PrometheusFailure.TOO_LARGE.value, PrometheusFailure.TIMEOUT.value
REDIRECT, UNAVAILABLE = PrometheusFailure.REDIRECT_REFUSED.value, PrometheusFailure.UNAVAILABLE.value

Case = tuple[str, Answer, str, float]   # kind, answer, expected outcome, query deadline


def envelope(result: object, *, extra: str = "", status: str = "success", kind: str = "vector") -> bytes:
    data = f'{{"resultType":{json.dumps(kind)},"result":{json.dumps(result)}}}'
    return f'{{"status":{json.dumps(status)},"data":{data}{extra}}}'.encode()


def one(value: str) -> list[dict[str, object]]:
    return [{"metric": {"__name__": "x", "pod": "p-0"}, "value": [1700000000.25, value]}]


def expected_for_value(text: str) -> str:
    """What the read of answers all holding `text` gives: the first query is a rate (scale 1); TTFT's (x1000) follows."""
    try:
        v = float(text)
    except ValueError:
        return EMPTY
    if not math.isfinite(v):
        return EMPTY
    return SAMPLE if 0.0 <= v * 1e3 <= FIGURE_MAX else INVALID


NUMBERS = ["0", "1", "3.5", "0.001", "42", "1e5", "999999", "2e6", "1e9", "5e9", "1e308", "-1", "-0.5", "NaN", "+Inf", "-Inf",
           "1e-300", "5e-324", "abc", "", "0x10", "  7", "1_000", "1e400", "-1e400", "٣"]


def gen_value(rng: random.Random) -> tuple[str, Answer, str]:
    text = rng.choice(NUMBERS)
    chunked = rng.random() < 0.3
    return "number", json_answer(envelope(one(text)), chunked=chunked), expected_for_value(text)


def gen_scalar(rng: random.Random) -> tuple[str, Answer, str]:
    text = rng.choice(["2", "NaN", "1e308"])
    return "scalar", json_answer(envelope([1700000000, text], kind="scalar")), expected_for_value(text)


def gen_shape(rng: random.Random) -> tuple[str, Answer, str]:
    bodies = [
        b'{"status":"success"}', b'{"status":"error","errorType":"bad_data","error":"x"}', b"[]", b"null", b'"x"', b"1",
        envelope("notalist"), envelope(one("1"), kind="matrix"), envelope(one("1"), kind="string"),
        envelope([{"metric": {}}]), envelope([{"metric": {}, "value": "1"}]), envelope([{"metric": {}, "value": [1, 2]}]),
        envelope([{"metric": {}, "value": [1]}]), envelope([{"metric": [], "value": [1, "1"]}]), envelope([1, 2]),
        envelope([{"metric": {}, "value": [1, "1" * 80]}]), envelope(one("1"), status="error"),
        b'{"status":"success","data":[]}', b'{"status":"success","data":{"result":null}}',
    ]
    return "shape", json_answer(rng.choice(bodies)), INVALID


def gen_json_numbers(rng: random.Random) -> tuple[str, Answer, str]:
    stamp = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" + "0" * rng.randint(50, 6000)])
    body = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[%s,"1"]}]}}' % stamp.encode()
    return "json-number", json_answer(body), INVALID


def gen_depth(rng: random.Random) -> tuple[str, Answer, str]:
    depth = rng.choice([1, 5, 20, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 50, 1000, 20_000])
    filler = "[" * depth + "]" * depth
    body = envelope(one("2"), extra=f',"x":{filler}')
    # The envelope is one level deep: `x` at `depth` opens depth + 1 brackets at once.
    return "depth", json_answer(body), SAMPLE if depth + 1 <= MAX_DEPTH else INVALID


def gen_open_brackets(rng: random.Random) -> tuple[str, Answer, str]:
    body = b'{"status":"success","data":{"resultType":"vector","result":' + b"[" * rng.randint(1, 100_000)
    return "unbalanced", json_answer(body), INVALID if len(body) <= CAP_BYTES else TOO_LARGE


def gen_size(rng: random.Random) -> tuple[str, Answer, str]:
    size = rng.choice([1 << 10, 32 << 10, CAP_BYTES - 100, CAP_BYTES + 1, 100 << 10, 400 << 10])
    core = envelope(one("2"))
    body = core + b" " * max(0, size - len(core))
    mode = rng.choice(["length", "chunked", "close"])
    if mode == "close":
        answer = raw_answer(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
    else:
        answer = json_answer(body, chunked=mode == "chunked")
    return f"size-{mode}", answer, SAMPLE if len(body) <= CAP_BYTES else TOO_LARGE


def gen_declared_size(rng: random.Random) -> tuple[str, Answer, str]:
    return "declared-size", json_answer(envelope(one("1")), length=rng.choice([CAP_BYTES + 1, 400 << 20, 10**14])), TOO_LARGE


def gen_encoding(rng: random.Random) -> tuple[str, Answer, str]:
    text = '{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"é✓"},"value":[1,"2"]}]}}'   # raw, unescaped
    choice = rng.randrange(6)
    if choice == 0:
        return "utf-16", json_answer(text.encode("utf-16")), INVALID
    if choice == 1:
        return "latin-1", json_answer(text.encode("latin-1", errors="replace").replace(b"?", b"\xe9")), INVALID
    if choice == 2:
        return "utf-8-bom", json_answer(b"\xef\xbb\xbf" + text.encode()), INVALID
    if choice == 3:
        return "gzip", json_answer(gzip.compress(text.encode()), extra_headers="Content-Encoding: gzip\r\n"), INVALID
    if choice == 4:
        return "invalid-utf8", json_answer(text.encode()[:40] + b"\xff\xfe" + text.encode()[40:]), INVALID
    return "utf-8", json_answer(text.encode()), SAMPLE


def gen_truncated(rng: random.Random) -> tuple[str, Answer, str]:
    body = envelope(one("2"))
    cut = rng.randint(0, len(body) - 1)
    if rng.random() < 0.5:
        return "truncated-length", json_answer(body[:cut], length=len(body)), INVALID
    coded = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return "truncated-chunked", raw_answer(head + coded[: rng.randint(0, len(coded) - 6)]), INVALID


def gen_http(rng: random.Random) -> tuple[str, Answer, str]:
    raw = rng.choice([
        b"", b"garbage\r\n\r\n", b"HTTP/2 200\r\n\r\n{}", b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno-colon\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n{}", b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{}", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json",
    ])
    return "http-malformed", raw_answer(raw), INVALID


def gen_big_headers(rng: random.Random) -> tuple[str, Answer, str]:
    headers = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(rng.randint(40, 200)))
    return "headers-large", raw_answer(f"HTTP/1.1 200 OK\r\n{headers}\r\n".encode() + envelope(one("1"))), TOO_LARGE


def gen_status(rng: random.Random) -> tuple[str, Answer, str]:
    status = rng.choice([400, 401, 403, 404, 422, 429, 500, 502, 503, 504, 204, 201])
    return f"status-{status // 100}xx", json_answer(b'{"status":"error","error":"secret body"}', status=status), UNAVAILABLE


def gen_redirect(rng: random.Random) -> tuple[str, Answer, str]:
    status = rng.choice([300, 301, 302, 303, 304, 307, 308])
    target = rng.choice(["http://169.254.169.254/latest", "http://127.0.0.1:1/x", "/api/v1/query?query=up", "https://evil.example/"])
    return "redirect", redirect_answer(target, status=status), REDIRECT


def gen_slow(rng: random.Random) -> tuple[str, Answer, str]:
    head_too = rng.random() < 0.3
    return "slow", drip_answer(every_s=rng.choice([0.02, 0.05]), head_too=head_too), TIMEOUT


GENERATORS: list[tuple[float, Callable[[random.Random], tuple[str, Answer, str]]]] = [
    (18, gen_value), (3, gen_scalar), (12, gen_shape), (6, gen_json_numbers), (10, gen_depth), (4, gen_open_brackets),
    (9, gen_size), (3, gen_declared_size), (8, gen_encoding), (8, gen_truncated), (8, gen_http), (2, gen_big_headers),
    (6, gen_status), (6, gen_redirect), (2.5, gen_slow),
]


def generate(rng: random.Random, n: int) -> list[Case]:
    weights = [w for w, _ in GENERATORS]
    out: list[Case] = []
    for _ in range(n):
        gen = rng.choices([g for _, g in GENERATORS], weights)[0]
        kind, answer, expected = gen(rng)
        out.append((kind, answer, expected, SLOW_S if kind == "slow" else 30.0))   # generous: a loaded machine is no timeout
    return out


def outcome(base_url: str, index: int, deadline_s: float) -> str:
    src = PrometheusMetrics(f"{base_url}/case/{index}", engine=Engine.VLLM, matchers=M, window_s=120, bearer_token="t0ken",
                            read_limits=ReadLimits(answer_bytes=CAP_BYTES, query_s=deadline_s), read_deadline_s=60.0)
    try:
        sample = src.fetch_sample(at_s=0.0, interval_s=60.0)
    except MetricsUnavailable as exc:
        assert exc.reason in NAMED, exc.reason
        assert "secret body" not in str(exc)
        return exc.reason
    for name in ("request_rate_rps", "ttft_ms", "tpot_ms", "kv_usage", "input_tokens_mean"):
        value = getattr(sample, name)
        assert value is None or (math.isfinite(value) and 0.0 <= value <= FIGURE_MAX), (name, value)
    return EMPTY if sample.empty else SAMPLE


def test_a_thousand_generated_answers_each_end_in_their_named_outcome() -> None:
    cases = generate(random.Random(SEED), ANSWERS)
    by_path = re.compile(rb"GET /case/(\d+)/api/v1/query")

    def answer_for(head: bytes) -> Answer:
        found = by_path.match(head)
        assert found is not None, head[:80]
        return cases[int(found.group(1))][1]

    with HostileServer(answer_for=answer_for) as server, ThreadPoolExecutor(max_workers=6) as pool:
        got = list(pool.map(lambda i: outcome(server.url, i, cases[i][3]), range(len(cases))))
    wrong = [(i, cases[i][0], cases[i][2], g) for i, g in enumerate(got) if g != cases[i][2]]
    tally = Counter((c[0], g) for c, g in zip(cases, got, strict=True))
    print(f"\n{len(cases)} answers: " + ", ".join(f"{k}->{g} {n}" for (k, g), n in sorted(tally.items())))
    assert not wrong, wrong[:10]
    assert len(cases) >= 1000
    assert {SAMPLE, EMPTY, INVALID, TOO_LARGE, TIMEOUT, REDIRECT, UNAVAILABLE} <= set(got)


# --- URLs -------------------------------------------------------------------------------------------------------------

PIECES = ["http://", "https://", "HTTP://", "ftp://", "prometheus-operated", ".", "ns", ".svc", ":9090", ":", "9090", "/", "\\",
          "@", "%2e", "%40", "[", "]", "::1", "127.0.0.1", "127.1", "0x7f", "#", "?", " ", "\t", "\n", "\x00", "é", "..", "-",
          "evil.example", "user:pw", ";", "=", "_", "*", "~", "'", "%", "65536", "0"]


def random_url(rng: random.Random) -> str:
    if rng.random() < 0.5:     # a plausible URL with one or two insertions
        url = list(f"http://prometheus-operated.ns{rng.randint(0, 9)}.svc:9090/prom")
        for _ in range(rng.randint(1, 2)):
            url.insert(rng.randint(0, len(url)), rng.choice(PIECES))
        return "".join(url)
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 9)))


def test_every_generated_url_is_refused_or_read_as_both_parsers_read_it() -> None:
    rng = random.Random(SEED)
    read = 0
    for _ in range(URLS):
        text = random_url(rng)
        try:
            url = parse_prometheus_url(text)
        except UrlRefused:
            continue
        read += 1
        split, other = urlsplit(text), parse_url(text)
        default = {"http": 80, "https": 443}[url.scheme]
        assert (split.hostname, split.port or default) == (url.host, url.port), text
        assert ((other.host or "").strip("[]").lower(), other.port or default) == (url.host, url.port), text
        assert "\\" not in text and "@" not in text and "%" not in text and not re.search(r"[\s\x00-\x1f\x7f-\uffff]", text)
    assert read > 100, "too few URLs were read: the generator proves little"


@pytest.mark.parametrize("text", ["http://prometheus-operated.ns.svc:9090", "https://[2001:db8::1]:8443/p", "http://10.0.0.1"])
def test_plain_urls_are_read(text: str) -> None:
    assert str(parse_prometheus_url(text)).startswith(text.split("://")[0])
