"""One key style across the CLI's --json outputs: snake_case, as the decision record's fields and the CLI contract
(shared tools/check-cli-contract: candidates_total, kv_bytes_per_token, median_ape) spell them. Maps keyed by data
(funnel reasons, validation groups, roles) and `layout_spec` (the spec's own `layout:` block, camelCase so that
it can be pasted into a spec) are not keys of ours."""

import json
import re

from servingtopology.cli.main import main

from .test_plan_infeasible_cli import SPEC as INFEASIBLE

SNAKE = re.compile(r"[a-z][a-z0-9_]*")
DATA_MAPS = {"reasons", "by_reason", "groups", "layout_spec"}
SPEC = ("model: llama-3.1-8b\nengine: vllm\nhardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 4}\n"
        "workload: {arrivalRate: 5, inputTokens: 1000, outputTokens: 100}\nslo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n"
        "simulation: {requests: 200}\n")


def _keys(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k
            if k not in DATA_MAPS:
                yield from _keys(v, f"{path}/{k}")
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v, path + "[]")


def _json(capsys, *argv, code=0):
    assert main(list(argv)) == code
    return json.loads(capsys.readouterr().out)


def test_every_json_output_uses_snake_case_keys(tmp_path, capsys):
    spec, infeasible = tmp_path / "spec.yaml", tmp_path / "infeasible.yaml"
    spec.write_text(SPEC)
    infeasible.write_text(INFEASIBLE)
    outputs = {
        "plan": _json(capsys, "plan", str(spec), "--json", "--no-simulate"),
        "plan infeasible": _json(capsys, "plan", str(infeasible), "--json", code=1),
        "simulate": _json(capsys, "simulate", str(spec), "--json"),
        "sweep": _json(capsys, "sweep", str(spec), "--json", "--concurrency", "1,4"),
    }
    for name, out in outputs.items():
        bad = [(path, k) for path, k in _keys(out) if not SNAKE.fullmatch(k)]
        assert bad == [], name
    assert "layout_spec" in outputs["plan"]["best"] and "kvCacheDtype" not in outputs["plan"]["best"]


def test_simulate_says_what_its_goodput_is_and_the_slo_figures_plan_predicts(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = _json(capsys, "simulate", str(spec), "--json")
    # goodput counts requests that met both targets over the run's whole span (first arrival to last finish)
    measured = out["requests"]
    assert abs(out["goodput_rps"] * out["duration_s"] - out["slo_attainment"] * measured) < 1.0
    assert 0.7 * 5 < out["offered_rps"] < 1.3 * 5
    assert main(["simulate", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "SLOs met at the offered" in text and "the spec's 5 req/s" in text and "drain after the last arrival" in text
