"""No `inf`, `nan`, `Infinity` or absurd ratio reaches a user: a layout that carries nothing within the SLOs, one whose
simulation finishes nothing and a load of 0.02 req/s are told in words and in figures with the digits they need, in the
tables, the summary, the record and `--json` (which must parse as strict JSON)."""

import json
import re

import pytest

from servingtopology.cli import plan as plan_cli
from servingtopology.cli import simulate as simulate_cli
from servingtopology.cli.main import main
from servingtopology.planner.figure_text import against_pinned_text, per_gpu_text, rps_text, share_text
from servingtopology.planner.search.decide import SimFigures

# 1×TP1 of Llama-3.1-8B streams its weights in about 5 ms a token on an H100 and steps in about 8 ms: a 6 ms TPOT SLO is
# missed even idle, so the pin carries nothing, while TP4 and PD layouts carry the load.
NOTHING = ("model: llama-3.1-8b\nengine: vllm\nhardware: {gpu: h100_sxm, maxGPUs: 8}\n"
           "workload: {arrivalRate: 0.02, inputTokens: 2000, outputTokens: 200}\nslo: {ttftMs: {p95: 1000}, tpotMs: {p95: 6}}\n")
PIN = "layout: {kind: replicas, replicas: 1, tp: 1}\n"
NOT_A_FIGURE = re.compile(r"\b(inf|nan|Infinity|NaN)\b|\d{5,}(\.\d+)?×|\b0\.0+ req/s|\b0\.00 (req/s )?per GPU|\d{4,}%")


def _clean(text):
    bad = NOT_A_FIGURE.search(text)
    assert bad is None, f"{bad.group(0)!r} in: …{text[max(bad.start() - 160, 0):bad.end() + 80]}…"


def _strict_json(text):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _spec(tmp_path, body):
    spec = tmp_path / "spec.yaml"
    spec.write_text(body)
    return str(spec)


@pytest.mark.parametrize("flags", [["--no-simulate", "--record"], ["--record"]])
def test_a_pin_that_carries_nothing_says_why_in_words(tmp_path, capsys, flags):
    assert main(["plan", _spec(tmp_path, NOTHING + PIN), "--no-progress", *flags]) == 0
    out = capsys.readouterr().out
    _clean(out)
    assert "it carries nothing within the SLOs" in out and "even idle" in out and "p95 TPOT" in out
    assert "where the pinned layout carries none" in out
    assert "1×TP1 misses the SLOs" in out and "1×TP1 meets" not in out   # never "meets … 7.4 ≤ 6 ms"
    assert "missed even at the lightest load" in out


def test_the_json_of_a_pin_that_carries_nothing_is_strict_json_without_non_figures(tmp_path, capsys):
    assert main(["plan", _spec(tmp_path, NOTHING + PIN), "--no-progress", "--no-simulate", "--json"]) == 0
    d = _strict_json(capsys.readouterr().out)
    assert d["best"]["prediction"]["slo_capacity_rps"] == 0
    _clean("\n".join(d["reasons"]) + d["record"])


def test_a_layout_whose_simulation_finishes_nothing_reads_unbounded_and_its_json_null(tmp_path, capsys, monkeypatch):
    # Stage 6 states a run that finished nothing as infinitely late (planner.sim.stage.stage6_figures).
    never = SimFigures(ttft_s=float("inf"), tpot_s=float("inf"), tpot_mean_s=float("inf"))
    monkeypatch.setattr(plan_cli, "simulator_for", lambda spec: lambda problem, layout: never)
    spec = _spec(tmp_path, NOTHING.replace("tpotMs: {p95: 6}", "tpotMs: {p95: 50}") + PIN)
    assert main(["plan", spec, "--no-progress", "--record"]) == 0
    out = capsys.readouterr().out
    _clean(out)
    assert "unbounded" in out
    assert main(["plan", spec, "--no-progress", "--json"]) == 0
    d = _strict_json(capsys.readouterr().out)
    assert d["best"]["prediction"]["ttft_ms"] is None and d["best"]["prediction"]["source"] == "simulated"


def test_compare_beside_a_layout_that_carries_nothing_names_no_ratio_against_zero(tmp_path, capsys):
    spec = _spec(tmp_path, NOTHING)
    assert main(["compare", spec, "--layout", "A=1xTP1", "--layout", "B=1xTP4"]) == 0
    out = capsys.readouterr().out
    _clean(out)
    assert main(["compare", spec, "--layout", "A=1xTP1", "--layout", "B=1xTP4", "--json"]) == 0
    rows = {r["name"]: r for r in _strict_json(capsys.readouterr().out)["layouts"]}
    assert rows["A"]["slo_capacity_rps"] == 0 and rows["B"]["slo_capacity_rps"] > 0


def test_simulate_with_no_finished_request_says_so_instead_of_a_table_of_nan(capsys):
    row = {k: None for k in ("mean", "p50", "p90", "p95", "p99")}
    out = {"layout": "3P(TP1·DP4)·1D(TP8)", "gpus": 20, "finished": 0, "requests": 4, "unfinished": 4, "preemptions": 0, "wall_s": 0.01,
           **{k: row for k in ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "queue_ms")}, "throughput_tok_s": 0.0,
           "throughput_tok_s_per_gpu": 0.0, "request_rps": 0.0, "duration_s": 0.0, "kv_utilisation_mean": 0.0}
    assert simulate_cli._print_summary(out) is False
    text = capsys.readouterr().out
    _clean(text)
    assert "no measured request finished" in text


@pytest.mark.parametrize(("text", "expected"), [
    # a 0.02 req/s load is not "0.0"; a layout carrying 0.13 req/s is not "0.1"
    (rps_text(0.02), "0.02"), (rps_text(0.13), "0.13"), (rps_text(14.04), "14.0"), (rps_text(0.0), "0"),
    (rps_text(float("inf")), "unbounded"),
    # per GPU: two decimals, two significant digits below 0.1
    (per_gpu_text(0.0081), "0.0081"), (per_gpu_text(1.9), "1.90"),
    # a share past 10× is a multiple, never 57159 %
    (share_text(571.59, "its SLO"), "572× its SLO"), (share_text(0.06, "its SLO"), "6% of its SLO"),
    (share_text(float("inf"), "its SLO"), "unbounded against its SLO"),
    # no ratio against nothing, nor a 13-digit one against next to nothing
    (against_pinned_text(1.9, 0.0), "where the pinned layout carries none"),
    (against_pinned_text(1.9, 1e-12), "where the pinned layout carries next to none (under 0.0001)"),
    (against_pinned_text(0.52, 0.08), "6.5× the pinned layout's 0.08"),
])
def test_figures_read_with_the_digits_they_need(text, expected):
    assert text == expected
