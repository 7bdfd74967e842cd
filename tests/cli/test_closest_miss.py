"""An infeasible plan states each miss as a figure against its limit (no "% short"), one figure per miss (the advice
that follows derives its SLO from the same figure, saying how), and an SLO under its physical floor names the floor:
weight streaming per token for TPOT, prefill compute for TTFT."""

import json
import re

from servingtopology.cli.main import main
from servingtopology.planner.perf.memory import language_model_bytes
from servingtopology.planner.search.limits import slo_floors
from servingtopology.spec import load_spec, to_problem

FLOOR = ("model: llama-3.1-8b\nhardware: {gpu: h100_sxm, maxGPUs: 8}\nworkload: {arrivalRate: 1, inputTokens: 8192, outputTokens: 100}\n"
         "slo: {ttftMs: {p95: 2}, tpotMs: {p95: 0.5}}\n")
OVERLOAD = ("model: llama-3.1-70b\nengine: vllm\nhardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 8}\n"
            "workload: {arrivalRate: 40, inputTokens: 2048, outputTokens: 256}\nslo: {ttftMs: {p95: 300}, tpotMs: {p95: 40}}\n")


def _closest(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("Closest miss: "))


def test_an_impossible_slo_names_its_physical_floor_and_each_miss_its_figure_and_limit(tmp_path, capsys):
    spec = tmp_path / "floor.yaml"
    spec.write_text(FLOOR)
    assert main(["plan", str(spec), "--no-progress"]) == 1
    out = capsys.readouterr().out
    closest = _closest(out)
    assert "short" not in closest
    ttft = re.search(r"p95 TTFT ([\d,.]+) ms against the 2 ms SLO", closest)
    tpot = re.search(r"p95 TPOT ([\d,.]+) ms against the 0.5 ms SLO", closest)
    assert ttft and tpot
    assert re.search(r"p95 TPOT ≤ 0.5 ms is under the physical floor of [\d.]+ ms on h100_sxm: streaming the [\d.]+ GB of weights", out)
    assert re.search(r"p95 TTFT ≤ 2 ms is under the physical floor of [\d.]+ ms on h100_sxm: computing a 8,192-token prompt", out)
    # the advice's SLOs come from the same figures as the closest miss, and say so
    advice = next(line for line in out.splitlines() if "passes at 1 req/s with" in line)
    assert f"(its {ttft.group(1)} ms with the 10% planning margin" in advice
    assert f"(its {tpot.group(1)} ms with the 10% planning margin" in advice
    assert main(["plan", str(spec), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert len(d["advice"]["floors"]) == 2 and d["closest_miss"] == closest.removeprefix("Closest miss: ")


def test_an_overloaded_closest_miss_leads_with_the_load_and_calls_its_ttft_queueing(tmp_path, capsys):
    spec = tmp_path / "overload.yaml"
    spec.write_text(OVERLOAD)
    assert main(["plan", str(spec), "--no-progress"]) == 1
    closest = _closest(capsys.readouterr().out)
    assert re.match(r"Closest miss: \S+ on \d+ GPUs: capacity [\d.]+ req/s against the load of 40 req/s; p95 TTFT [\d,]+ ms \(queueing", closest)
    assert "short" not in closest


def test_the_tpot_floor_is_weight_streaming_over_the_widest_instance():
    problem = to_problem(load_spec(None))                   # Llama-2-7B BF16 on A100-80GB, TP up to 8
    f = slo_floors(problem)
    m = problem.model
    streamed = m.active_params_per_token * language_model_bytes(m, problem.precision) / m.total_params
    assert f.gpus == 8 and f.tpot_floor_ms == streamed / (8 * problem.gpu.hbm_gbps * 1e9) * 1e3
    assert 0.7 < f.tpot_floor_ms < 0.9 < problem.slo.tpot_ms   # ~13 GB over 8 × 2,039 GB/s: far under 002's 35 ms
    assert f.ttft_floor_ms >= 2 * m.active_params_per_token * 512 / (8 * problem.gpu.bf16_tflops * 1e12) * 1e3
