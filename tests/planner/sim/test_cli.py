"""`servingtopology simulate` (spec, trace, replay) and `servingtopology sweep`: their JSON contracts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servingtopology.cli.main import main
from tests.groundtruth import GROUNDTRUTH

REFS = GROUNDTRUTH / "llmservingsim_vllm_refs"

SPEC = """
model: meta-llama/Llama-3.1-8B
engine: {engine}
hardware: {{gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 8}}
workload: {{arrivalRate: 8, inputTokens: 800, outputTokens: 64}}
slo: {{ttftMs: {{p95: 500}}, tpotMs: {{p95: 40}}}}
layout: {layout}
simulation: {{requests: 60, seed: 3, warmupRequests: 10}}
"""


def _spec(tmp_path: Path, *, engine: str = "vllm", layout: str = "{kind: replicas, replicas: 2, tp: 1}") -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(engine=engine, layout=layout))
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("engine", "layout"), [
    ("vllm", "{kind: replicas, replicas: 2, tp: 1}"),                       # two replicas behind the router
    ("sglang", "{kind: pd, prefill: {count: 1, tp: 1}, decode: {count: 1, tp: 2}}"),  # PD with a TP2 decode
])
def test_simulate_json_reports_requests_latency_percentiles_throughput_goodput_and_wall_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str, layout: str) -> None:
    out = _json(capsys, ["simulate", str(_spec(tmp_path, engine=engine, layout=layout)), "--json"])
    assert out["requests"] == 50 and out["unfinished"] == 0
    for key in ("ttft_ms", "tpot_ms"):
        figures = out[key]
        assert isinstance(figures, dict) and set(figures) >= {"mean", "p50", "p90", "p95", "p99"}
        assert 0 < figures["p50"] <= figures["p99"]
    assert isinstance(out["throughput_tok_s"], float) and out["throughput_tok_s"] > 0
    assert isinstance(out["goodput_rps"], float) and out["goodput_rps"] >= 0
    assert isinstance(out["wall_s"], float)


def test_simulate_replays_a_trace_file_in_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0.0,100,10\n0.2,300,20\n0.4,50,5\n")
    out = _json(capsys, ["simulate", str(_spec(tmp_path)), "--trace", str(trace), "--json"])
    assert out["requests"] == 3 and out["finished"] == 3


def test_a_bad_spec_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _spec(tmp_path, layout="{kind: replicas, replicas: 0}")
    assert main(["simulate", str(path), "--json"]) == 2
    assert "layout.replicas" in capsys.readouterr().err


@pytest.mark.skipif(not REFS.exists(), reason="ground-truth refs not present")
@pytest.mark.parametrize("run", ["RTX4090_Llama-3.1-8B", "RTXPRO6000_Llama-3.1-8B"])
def test_replay_json_compares_predicted_and_recorded_means_and_percentiles(capsys: pytest.CaptureFixture[str], run: str) -> None:
    out = _json(capsys, ["simulate", "--replay", str(REFS / run), "--json"])
    assert set(out) == {"ttft_ms", "tpot_ms", "latency_ms"}
    for metric in out.values():
        assert isinstance(metric, dict) and set(metric) == {"mean", "p50", "p90", "p99"}
        for cell in metric.values():
            assert set(cell) == {"predicted", "recorded", "error_pct"}
            assert cell["error_pct"] == pytest.approx((cell["predicted"] - cell["recorded"]) / cell["recorded"] * 100, abs=0.02)
    assert out["ttft_ms"]["mean"]["recorded"] == pytest.approx({"RTX4090_Llama-3.1-8B": 65456.6, "RTXPRO6000_Llama-3.1-8B": 7097.2}[run], abs=0.1)


def test_sweep_gives_one_point_per_concurrency_with_more_throughput_and_slower_users_as_it_grows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "envelope.png"
    out = _json(capsys, ["sweep", str(_spec(tmp_path)), "--concurrency", "1,8,64", "--requests-per-client", "2", "--json",
                         "--plot", str(plot)])
    points = out["points"]
    assert isinstance(points, list) and [p["concurrency"] for p in points] == [1, 8, 64]
    tput = [p["throughput_tok_s_per_gpu"] for p in points]
    per_user = [p["tokens_per_s_per_user"] for p in points]
    assert tput[0] < tput[1] < tput[2]
    assert per_user[0] >= per_user[1] >= per_user[2]
    assert all(set(p["ttft_ms"]) == {"p50", "p95", "p99"} and set(p["itl_ms"]) == {"p50", "p99"} for p in points)  # p95: the SLOs' percentile
    assert plot.stat().st_size > 1000


def test_sweep_rejects_a_malformed_concurrency_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(_spec(tmp_path)), "--concurrency", "1,x"]) == 2
    assert "--concurrency" in capsys.readouterr().err
