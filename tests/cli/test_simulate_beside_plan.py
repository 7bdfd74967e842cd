"""`simulate SPEC` never sets its p95s beside `plan`'s unexplained: it runs the spec's full count while `plan` simulates at
most 600 requests (or plans analytically past the analytical capacity), so it states plan's own figures for the layout,
labelled by source and run length, and claims "the figures plan predicts" only where they are the same run. Its rates
keep their digits (0.02 req/s, never 0.0) and its table's cells never run together."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from servingtopology.cli import simulate as simulate_cli
from servingtopology.cli.main import main

SPEC = ("model: meta-llama/Llama-3.1-8B-Instruct\nprecision: bf16\nengine: {{name: vllm}}\nhardware: {{gpu: h100_sxm, maxGPUs: 2}}\n"
        "workload: {{arrivalRate: {rate}, inputTokens: 512, outputTokens: 64}}\nslo: {{ttftMs: {{p95: 300}}, tpotMs: {{p95: 40}}}}\n"
        "simulation: {{requests: {requests}, seed: 2}}\nlayout: {{kind: replicas, count: 1, tp: 1}}\n")


def _spec(tmp_path: Path, *, rate: float, requests: int) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(rate=rate, requests=requests))
    return str(path)


def _plan(spec: str, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["plan", spec, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)["best"]["prediction"]


@pytest.mark.parametrize("rate, requests, source, same_run", [
    (8, 800, "simulated", False),   # plan simulates 600 of the spec's 800: a shorter run, its own p95
    (8, 300, "simulated", True),    # the same 300 requests, seed and warm-up: the same run
    (400, 300, "analytical", False),  # past the analytical capacity plan does not simulate the pin
])
def test_simulate_states_plans_own_figures_for_the_layout(tmp_path, capsys, rate, requests, source, same_run):
    spec = _spec(tmp_path, rate=rate, requests=requests)
    planned = _plan(spec, capsys)
    assert main(["simulate", spec, "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    said = out["plan"]
    assert said["source"] == planned["source"] == source and said["same_run"] is same_run
    assert said["ttft_ms"] == pytest.approx(planned["ttft_ms"], abs=1e-3) and said["tpot_ms"] == pytest.approx(planned["tpot_ms"], abs=1e-3)
    assert said["meets_slo"] is planned["meets_slo"]
    if same_run:
        assert out["at_slo"]["ttft_ms"] == pytest.approx(planned["ttft_ms"], abs=1e-3)
    assert main(["simulate", spec, "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("SLOs "))
    if same_run:
        assert line.endswith("the simulated figures `plan` predicts and ranks by"), line
    else:
        assert "the simulated figures `plan` predicts" not in line and "`plan` states p95 TTFT " in line and f"its {source} figures" in line


def test_a_small_rate_keeps_its_digits(tmp_path, capsys):
    assert main(["simulate", _spec(tmp_path, rate=0.02, requests=100), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "at the offered 0.02" in out and "0.0 req/s" not in out and "on 1 GPU:" in out


def test_the_table_cells_never_run_together():
    stats = {"mean": 18479395.0, "p50": 19028995.9, "p90": 32320931.2, "p95": 34831698.8, "p99": 36481923.5}
    out = {"layout": "3P1D", "gpus": 20, "finished": 4, "requests": 4, "unfinished": 0, "preemptions": 0, "wall_s": 1.0,
           **{k: stats for k in ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "queue_ms")},
           "throughput_tok_s": 1.0, "throughput_tok_s_per_gpu": 0.05, "request_rps": 0.004, "duration_s": 132291.1,
           "kv_utilisation_mean": 0.3}
    text = io.StringIO()
    with redirect_stdout(text):
        simulate_cli._print_summary(out)
    row = next(x for x in text.getvalue().splitlines() if x.startswith("latency"))
    assert row.split()[1:] == ["18,479,395.0", "19,028,995.9", "32,320,931.2", "34,831,698.8", "36,481,923.5"], row
    assert "0.004 req/s finished" in text.getvalue()
