"""`servingtopology calibrate --prometheus URL --since 2h`: the operator's queries asked as range queries of a Prometheus
on loopback (its HTTP API, byte for byte: e2e/hostile_prometheus.py), whose history is a deployment running 1.4× slower
than the model predicts at each window's load: the fit moves the factors that way and its residual falls, quiet windows
are counted and not fitted, the file is one `plan --calibration` takes, and every failure names its option."""

from __future__ import annotations

import json
import math
import re
import ssl
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from e2e.hostile_prometheus import Answer, HostileServer, json_answer
from e2e.pki import make_serving_pki
from servingtopology.cli import calibrate_prometheus
from servingtopology.cli.calibrate_prometheus import read_history
from servingtopology.cli.main import main
from servingtopology.cli.spec_input import layout_for, read_spec
from servingtopology.operator.live.history import MAX_STEPS, fetch_history
from servingtopology.operator.live.metrics import Figure, Query, build_queries
from servingtopology.planner.layout import Engine
from servingtopology.planner.live.calibration import analytic_point
from servingtopology.planner.live.observe import MetricSample, estimate_workload
from servingtopology.spec import to_problem

SLOWER = 1.4
END_S = 1_760_000_000.0
RATES_RPS = [1.0, 2.0, 3.0, 0.01, 4.0, 2.5, 1.5, 0.0, 3.5, 2.0, 1.0, 3.0]    # per 10-minute window; 0.01 and 0: quiet


def _spec(tmp_path: Path) -> str:
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nengine: {name: vllm, version: '0.11.0'}\n"
                    "hardware: {gpu: h100_sxm, maxGPUs: 2}\nworkload: {arrivalRate: 2, inputTokens: 1000, outputTokens: 200}\n"
                    "slo: {ttftMs: {p95: 1000}, tpotMs: {p95: 50}}\nlayout: {kind: replicas, replicas: 2, tp: 1}\n")
    return str(spec)


def _deployment(spec_path: str) -> Callable[[float], dict[Figure, float]]:
    """The figures Prometheus holds for a window at `rate`: measured TTFT/TPOT SLOWER × the model's at that load (in s)."""
    spec = read_spec(spec_path)
    problem = to_problem(spec)
    layout = layout_for(spec, problem)

    def figures(rate: float) -> dict[Figure, float]:
        out = {Figure.REQUEST_RATE: rate, Figure.INPUT_TOKENS_MEAN: 1000.0, Figure.OUTPUT_TOKENS_MEAN: 200.0,
               Figure.PROMPT_TOKENS_RATE: rate * 1000, Figure.GENERATION_TOKENS_RATE: rate * 200}
        if rate <= 0:
            return out | {Figure.TTFT: math.nan, Figure.TPOT: math.nan}      # Prometheus's 0/0 without traffic
        sample = MetricSample(at_s=0.0, interval_s=600.0, request_rate_rps=rate, input_tokens_mean=1000.0, output_tokens_mean=200.0)
        workload = estimate_workload([sample], min_samples=1, min_requests=1).workload
        ttft_ms, tpot_ms = analytic_point(replace(problem, workload=workload), layout)
        return out | {Figure.TTFT: ttft_ms * SLOWER / 1e3, Figure.TPOT: tpot_ms * SLOWER / 1e3}
    return figures


class _Recorded:
    """Answers /api/v1/query_range as Prometheus does for the deployment: a matrix of one series per figure, the first
    expression of each figure only (the fallbacks answer an empty matrix), NaN as the string Prometheus writes."""

    def __init__(self, spec_path: str, rates: list[float]) -> None:
        self.figures = _deployment(spec_path)
        self.rates = rates
        self.asked: list[dict[str, str]] = []

    def __call__(self, head: bytes) -> Answer:
        target = head.split(b" ", 2)[1].decode()
        params = {k: v[0] for k, v in parse_qs(urlsplit(target).query).items()}
        self.asked.append(params)
        assert urlsplit(target).path == "/api/v1/query_range", target
        step_s = float(params["step"])
        first = {q.exprs[0]: q for q in build_queries(Engine.VLLM, matchers={"namespace": "ml"}, window_s=int(step_s), by_role=False)}
        result = []
        query = first.get(params["query"])
        if query is not None:
            values = []
            t, k = float(params["start"]), 0
            while t <= float(params["end"]) + 1e-6:
                figure = self.figures(self.rates[k % len(self.rates)]).get(query.figure)
                if figure is not None:
                    values.append([t, "NaN" if math.isnan(figure) else repr(figure)])
                t, k = t + step_s, k + 1
            result = [{"metric": {}, "values": values}]
        return json_answer(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode())


def test_calibrate_fits_the_history_the_operator_reads_and_plan_takes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    recorded = _Recorded(spec, RATES_RPS)
    out = tmp_path / "cal.yaml"
    with HostileServer(answer_for=recorded) as prom:
        code = main(["calibrate", "--prometheus", prom.url, "--since", "2h", "--step", "10m", "--selector", "namespace=ml",
                     "--spec", spec, "--out", str(out), "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    result = json.loads(printed.out)
    cal = yaml.safe_load(out.read_text())
    # 12 windows of 10 min, two of them quiet (0.01 req/s is 6 requests; 0 has no latency): 10 points.
    assert (result["windows"], result["quiet_windows"], result["window_s"]) == (12, 2, 600)
    assert cal["fit"]["points_used"] == 10 and len(cal["points"]) == 10
    assert all(p["source"] == prom.url for p in cal["points"]) and cal["sources"][0]["path"] == prom.url
    assert sorted({round(p["load"], 2) for p in cal["points"]}) == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    # The operator's own PromQL, at the spec's p95, with one window's rate: each range query is one of build_queries'.
    mine = {e for q in build_queries(Engine.VLLM, matchers={"namespace": "ml"}, window_s=600, by_role=False) for e in q.exprs}
    assert {a["query"] for a in recorded.asked} == mine and {a["step"] for a in recorded.asked} == {"600"}
    # A deployment 1.4× slower than modelled: the factors slow the model, and it fits the history better.
    assert any(f > 1.05 for f in cal["factors"].values()), cal["factors"]
    assert all(0.5 <= f <= 2.0 for f in cal["factors"].values())
    for metric in ("ttft", "tpot"):
        assert cal["fit"]["residual_after"][metric] < cal["fit"]["residual_before"][metric], cal["fit"]
    assert "spec's default" not in result["release_from"] and "0.11.0" in result["release_from"]
    # plan takes the file (the same deployment), and predicts the running layout as the history measured it.
    assert main(["plan", spec, "--calibration", str(out), "--no-simulate"]) == 0
    text = capsys.readouterr().out
    uncalibrated = re.search(r"^ +uncalibrated +2×TP1 +([0-9.]+) \[", text, re.M)
    calibrated = re.search(r"^ +calibrated +2×TP1 +([0-9.]+) \[", text, re.M)
    assert uncalibrated and calibrated, text
    assert float(calibrated[1]) == pytest.approx(SLOWER * float(uncalibrated[1]), rel=0.03)


@pytest.mark.parametrize(("args", "option", "why"), [
    (["--prometheus", "http://prom.example\\x.svc:9090"], "--prometheus", "backslash"),
    (["--prometheus", "http://127.0.0.1:1"], "--prometheus", "MetricsUnavailable"),                     # nothing listens
    (["--prometheus", "http://127.0.0.1:1", "--since", "3d"], "--since", "90s, 10m or 1h"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "2h", "--step", "30s"], "--step", "from 60 s"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "24h", "--step", "1m"], "--step", "at most 48"),
    (["--prometheus", "http://127.0.0.1:1", "--prometheus-ca", "/dev/null"], "--prometheus-ca", "https"),
    (["--prometheus", "http://127.0.0.1:1", "--topology", "chat"], "--topology", "NAMESPACE/NAME"),
    (["--prometheus", "http://127.0.0.1:1", "--selector", "bad label=x"], "--selector", "LABEL=VALUE"),
    (["--prometheus", "https://127.0.0.1:1", "--prometheus-cert", "/dev/null"], "--prometheus-key", "together"),
    (["--prometheus", "https://127.0.0.1:1", "--prometheus-cert", "/dev/null", "--prometheus-key", "/dev/null"], "--prometheus-ca",
     "give the CA"),
    ([], "RESULTS", "--prometheus"),
])
def test_each_bad_option_exits_2_naming_it_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                                              option: str, why: str) -> None:
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", *args, "--spec", _spec(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert option in err and why in err, err
    assert not out.exists()


def test_a_history_without_traffic_names_since_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    out = tmp_path / "cal.yaml"
    with HostileServer(answer_for=_Recorded(spec, [0.0, 0.01])) as prom:
        assert main(["calibrate", "--prometheus", prom.url, "--since", "1h", "--step", "10m", "--selector", "namespace=ml",
                     "--spec", spec, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "0 windows of 600 s" in err and "6 windows had any series, 6 too quiet" in err
    assert "TooFewPoints" in err and "--since" in err and "too quiet" in err
    assert not out.exists()


def test_a_hostile_answer_is_refused_by_the_clients_bounds_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    huge = json_answer(b'{"status":"success","data":{"resultType":"matrix","result":[' + b" " * (2 << 20) + b"]}}")
    with HostileServer(huge) as prom:
        assert main(["calibrate", "--prometheus", prom.url, "--since", "1h", "--spec", spec, "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--prometheus" in err and "PrometheusAnswerTooLarge" in err


class _Fallback:
    """A release that exports the old metric name only before a given step: the newer name fills the rest."""

    def range_query(self, query: str, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        if query == "new":
            return [{"metric": {}, "values": [[start_s + step_s, "0.2"], [start_s + 2 * step_s, "NaN"]]}]
        return [{"metric": {}, "values": [[start_s + 2 * step_s, "0.3"], [start_s + step_s, "0.9"]]}]


def test_each_step_keeps_the_first_expression_with_a_finite_value() -> None:
    query = Query(Figure.TTFT, ("new", "old"), 1e3)
    samples = fetch_history(_Fallback(), [query], start_s=0.0, end_s=180.0, step_s=60.0)
    assert [(s.at_s, s.ttft_ms, s.interval_s) for s in samples] == [(60.0, 200.0, 60.0), (120.0, 300.0, 60.0)]
    with pytest.raises(ValueError, match=f"at most {MAX_STEPS}"):
        fetch_history(_Fallback(), [query], start_s=0.0, end_s=60.0 * (MAX_STEPS + 1), step_s=60.0)


def test_with_topology_the_operators_matchers_and_roles_are_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = read_spec(_spec(tmp_path))
    problem = to_problem(spec)
    asked: list[str] = []

    class Client:
        def range_query(self, query: str, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
            asked.append(query)
            return []

        def close(self) -> None:
            pass

    monkeypatch.setattr(calibrate_prometheus, "LibraryPrometheus", lambda *a, **k: Client())
    history = read_history("http://127.0.0.1:9", problem=problem, layout=layout_for(spec, problem), since="1h",
                           topology="ml/chat", now_s=END_S)
    assert history.points == () and history.windows == 0
    assert asked and all('namespace="ml"' in q and 'servingtopology_io_topology="chat"' in q for q in asked)
    assert any('servingtopology_io_role=~"aggregated|decode"' in q for q in asked)


RECORDED = Path(__file__).resolve().parents[1] / "data" / "prometheus_history" / "emulated-vllm-1xtp1.json"


def test_calibrate_fits_answers_recorded_from_the_real_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Recorded by e2e/test_prometheus_tls.py: the real Prometheus's answers to calibrate's range queries after four minutes
    # of the emulator's 2 req/s on a pinned 1×TP1 (the namespace written as NAMESPACE).
    recorded = json.loads(RECORDED.read_text())
    asked: list[str] = []

    def replay(head: bytes) -> Answer:
        query = parse_qs(urlsplit(head.split(b" ", 2)[1].decode()).query)["query"][0]
        asked.append(query)
        return json_answer(json.dumps(recorded["answers"][query]).encode())

    spec = tmp_path / "spec.yaml"
    spec.write_text(recorded["spec"])
    out = tmp_path / "cal.yaml"
    with HostileServer(answer_for=replay) as prom:
        code = main(["calibrate", "--prometheus", prom.url, "--since", "4m", "--step", "1m", "--topology", "NAMESPACE/trusted",
                     "--spec", str(spec), "--out", str(out), "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    result = json.loads(printed.out)
    assert set(asked) == set(recorded["answers"])          # the operator's queries, every one of them, nothing else
    assert result["fit"]["points_used"] == recorded["points_used"] and result["windows"] == recorded["windows"]
    assert all(1.0 < p["load"] < 3.0 and p["input_tokens"] > 0 and p["ttft_ms"] > 0 for p in result["points"])
    assert result["factors"] == pytest.approx(recorded["factors"], rel=1e-6)


def test_an_https_prometheus_asking_for_a_client_certificate_is_read_with_the_one_given(tmp_path: Path,
                                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pki = make_serving_pki(tmp_path / "pki")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server_crt, pki.server_key)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(pki.ca_crt)
    spec = _spec(tmp_path)
    out = tmp_path / "cal.yaml"
    args = ["--since", "2h", "--step", "10m", "--selector", "namespace=ml", "--spec", spec, "--out", str(out)]
    with HostileServer(answer_for=_Recorded(spec, RATES_RPS), tls=server) as prom:
        assert main(["calibrate", "--prometheus", prom.url, *args]) == 2      # the system's CAs: untrusted
        assert "PrometheusCertificateUntrusted" in capsys.readouterr().err and not prom.heads
        assert main(["calibrate", "--prometheus", prom.url, "--prometheus-ca", str(pki.ca_crt), *args]) == 2
        assert "PrometheusTLSFailed" in capsys.readouterr().err and not prom.heads and not out.exists()
        assert main(["calibrate", "--prometheus", prom.url, "--prometheus-ca", str(pki.ca_crt), "--prometheus-cert", str(pki.client_crt),
                     "--prometheus-key", str(pki.client_key), *args]) == 0
    assert yaml.safe_load(out.read_text())["fit"]["points_used"] == 10
