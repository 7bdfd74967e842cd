"""`plan` on an infeasible spec: exit 1, the funnel, the closest miss and what would make it feasible (text and JSON)."""

import json

from servingtopology.cli.main import main

SPEC = ("model: llama-3.1-70b\nengine: vllm\nhardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 8}\n"
        "workload: {arrivalRate: 40, inputTokens: 2048, outputTokens: 256}\nslo: {ttftMs: {p95: 300}, tpotMs: {p95: 40}}\n")


def test_infeasible_text_names_gpus_and_load(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["plan", str(spec), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "What would make it feasible:" in out
    assert "needs ≥ " in out and " GPUs of this kind (h100_sxm; budget 8)" in out
    assert "feasible at ≤ " in out


def test_infeasible_json_carries_the_advice(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["plan", str(spec), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    advice = d["advice"]
    assert d["error"] == "infeasible" and advice["min_gpus"] > 8 and advice["budget_gpus"] == 8
    assert 0 < advice["feasible_load_rps"] < 40 and advice["closest"]["label"]
    assert any(line.startswith(f"needs ≥ {advice['min_gpus']} GPUs") for line in advice["lines"])
