"""The verdict says what it rests on: a pinned layout that misses its SLOs says so on `plan`'s summary line, and where
the simulated run at the load and the analytical SLO capacity disagree (met above the capacity, missed below it) `plan`,
its record and `compare` name the simulation as the verdict's basis and the capacity as the analytical model's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servingtopology.cli.main import main
from servingtopology.cli.spec_input import read_spec
from servingtopology.planner.problem import Prediction
from servingtopology.planner.search.verdict import basis_text
from servingtopology.spec import to_problem

SPEC = ("model: meta-llama/Llama-3.1-8B-Instruct\nprecision: bf16\nengine: {{name: vllm}}\nhardware: {{gpu: h100_sxm, maxGPUs: 8}}\n"
        "workload: {{arrivalRate: {rate}, inputTokens: 1024, outputTokens: 256}}\nslo: {{ttftMs: {{p95: 500}}, tpotMs: {{p95: 20}}}}\n"
        "simulation: {{requests: 300}}\n{layout}")


def _spec(tmp_path: Path, rate: float, layout: str = "") -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(rate=rate, layout=layout))
    return str(path)


def _prediction(*, meets: bool, capacity_rps: float, source: str) -> Prediction:
    return Prediction(ttft_ms=100.0, tpot_ms=10.0, throughput_tok_s=1.0, capacity_rps=capacity_rps, goodput_rps=0.0,
                      goodput_per_gpu=capacity_rps, tokens_per_s_per_user=50.0, kv_pool_tokens=1, max_request_tokens=1,
                      meets_slo=meets, source=source)


@pytest.mark.parametrize("meets, capacity_rps, source, said", [
    (True, 8.0, "simulated", "meets the SLOs at 10 req/s, above the analytical SLO capacity of 8.0"),   # met past the cap
    (False, 12.0, "simulated", "misses the SLOs at 10 req/s, below the analytical SLO capacity of 12.0"),  # missed under it
    (True, 12.0, "simulated", ""),      # met under the capacity: the two agree
    (False, 8.0, "simulated", ""),      # missed past it: agree
    (True, 8.0, "analytical", ""),      # one model: nothing to reconcile
    (False, 0.0, "simulated", ""),      # carries nothing: the record says why elsewhere
])
def test_the_basis_is_named_only_where_the_simulation_and_the_analytical_capacity_disagree(tmp_path, meets, capacity_rps,
                                                                                           source, said):
    problem = to_problem(read_spec(_spec(tmp_path, 10)))
    text = basis_text(problem, _prediction(meets=meets, capacity_rps=capacity_rps, source=source))
    assert (said in text and "rests on the simulation" in text) if said else text == ""


def test_a_pinned_layout_over_its_capacity_says_it_misses_on_plans_summary_line(tmp_path, capsys):
    spec = _spec(tmp_path, 30, "layout: {kind: replicas, count: 1, tp: 1}\n")
    assert main(["plan", spec, "--no-simulate", "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Pinned: "))
    assert line.startswith("Pinned: 1×TP1 misses the SLOs at 30 req/s: p95 TTFT "), line


@pytest.mark.parametrize("rate, layout, said", [
    (10, "1xTP1", "1×TP1 meets p95 TTFT "),                             # met, and under its capacity: no basis
    (30, "1xTP1", "1×TP1 misses the SLOs at 30 req/s: "),               # missed, over it
    (40, "2xTP1", "above the analytical SLO capacity of 37.5 req/s"),   # the simulated run meets it past the capacity (to 41.6)
])
def test_plan_its_record_and_compare_state_one_verdict_sentence(tmp_path, capsys, rate, layout, said):
    # plan's summary worded the verdict itself ('1×TP1 on 1 GPU: misses the SLOs: p95 TTFT …' beside the record's '1×TP1
    # misses the SLOs at …'), with the basis on a line of its own: two formatters of one fact.
    count = layout.split("x")[0]
    pinned = _spec(tmp_path, rate, f"layout: {{kind: replicas, count: {count}, tp: 1}}\n")
    assert main(["plan", pinned, "--no-progress", "--record"]) == 0
    out = capsys.readouterr().out
    summary = next(x for x in out.splitlines() if x.startswith("Pinned: "))[len("Pinned: "):]
    rationale = out[out.index("**Rationale:**"):].splitlines()[1]
    assert main(["plan", pinned, "--no-progress", "--json"]) == 0
    reasons = json.loads(capsys.readouterr().out)["reasons"]
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["compare", _spec(bare, rate), "--layout", layout, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["layouts"][0]
    assert main(["compare", _spec(bare, rate), "--layout", layout]) == 0
    compared = capsys.readouterr().out.splitlines()
    assert said in summary
    assert rationale == f"  - {summary}" and reasons[0] == summary == row["slo_verdict"]
    assert any(line.startswith(f"{summary}; ") for line in compared), compared


def test_compare_above_the_slo_capacity_names_what_its_met_verdict_rests_on(tmp_path, capsys):
    # A few percent past 2×TP1's analytical SLO capacity at p95 TPOT 20 ms (37.5 req/s under the measured-terms fit with padded GEMMs; the
    # TPOT SLO binds below the throughput the analytical model carries, where compare still simulates) its simulated run
    # still meets the SLOs: the verdict rests on the run, and says so.
    spec = _spec(tmp_path, 30)
    assert main(["compare", spec, "--layout", "2xTP1", "--json"]) == 0
    capacity = json.loads(capsys.readouterr().out)["layouts"][0]["slo_capacity_rps"]
    rate = str(math.ceil(capacity * 1.02))
    assert main(["compare", spec, "--rate", rate, "--layout", "2xTP1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["layouts"][0]
    assert row["meets_slo"] and row["source"] == "simulated" and row["slo_capacity_rps"] == capacity < float(rate)
    assert row["slo_capacity_source"] == "analytical"
    assert "above the analytical SLO capacity" in row["verdict_basis"] and "rests on the simulation" in row["verdict_basis"]
    assert main(["compare", spec, "--rate", rate, "--layout", "2xTP1"]) == 0
    out = capsys.readouterr().out
    assert "2×TP1 meets p95 TTFT " in out and f"at {rate} req/s (simulated: its run meets the SLOs at {rate} req/s, above the analytical" in out
    assert "the analytical model); most req/s per GPU within the SLOs; KV pool per rank" in out


def test_a_simulated_pin_that_misses_under_its_analytical_capacity_says_so_on_plan_and_in_its_record(tmp_path, capsys):
    from tests.cli.test_pinned_seed000 import _spec as seed_spec

    # Seed 000's PD pin whose prefill ranks hold the prompt: its run queues to a p95 first token of 365 s at 0.02 req/s (with
    # NVFP4 experts at their measured fixed cost, planner/data/moe_latency.json), past a 300 s TTFT SLO that the analytical
    # model meets up to 0.035 req/s.
    spec, _ = seed_spec(tmp_path, 0.9)
    spec.write_text(spec.read_text().replace("ttftMs: {p95: 600000}", "ttftMs: {p95: 300000}"))
    assert main(["plan", str(spec), "--no-progress", "--record"]) == 0
    out = capsys.readouterr().out
    summary = out[out.index("Pinned: "):]
    assert "misses the SLOs at 0.02 req/s: " in summary.splitlines()[0]
    assert "it carries up to 0.035 req/s within the SLOs on 20 GPUs by the analytical model" in summary
    assert "below the analytical SLO capacity of 0.035 req/s; the verdict rests on the simulation" in summary
    record = out[out.index("# Topology decision record"):]
    assert "misses the SLOs at 0.02 req/s" in record and "below the analytical SLO capacity" in record



@pytest.mark.parametrize("alt_per_gpu, best_per_gpu, said", [
    (0.0013, 0.0089, "0.0013 req/s per GPU within the SLOs against 0.0089"),   # read '0.00 ... against 0.01'
    (0.0087, 0.0089, "(0.0087 against 0.0089)"),                                 # a tie: read '(0.01 against 0.01)'
    (3.1, 6.2, "3.10 req/s per GPU within the SLOs against 6.20"),             # two decimals as before
])
def test_why_an_alternative_lost_keeps_a_small_per_gpu_rates_digits(tmp_path, alt_per_gpu, best_per_gpu, said):
    from dataclasses import replace

    from servingtopology.planner.hardware import Precision
    from servingtopology.planner.layout import Layout, Parallelism
    from servingtopology.planner.problem import Candidate
    from servingtopology.planner.search.decide import _why_not, predict_layout

    problem = to_problem(read_spec(_spec(tmp_path, 10)))
    one, two = (Layout.replicas(n, Parallelism(tp=1), precision=Precision.BF16) for n in (1, 2))
    base = predict_layout(problem, one).prediction

    def cand(layout, per_gpu):
        return Candidate(layout, replace(base, goodput_per_gpu=per_gpu), score=per_gpu)
    assert said in _why_not(problem, cand(one, best_per_gpu), cand(two, alt_per_gpu))


def test_the_advice_states_a_small_saturating_rate_with_its_digits():
    from servingtopology.planner.errors import ClosestLayout, InfeasibleAdvice

    advice = InfeasibleAdvice(load_rps=0.02, slo_ttft_ms=600_000, slo_tpot_ms=100, ttft_percentile=95, tpot_percentile=95, budget_gpus=24,
                              gpu="b200_sxm", closest=ClosestLayout("3P(TP4·DP4-attn)·1D(TP8)", 20, 1e6, 9.0, 0.013), min_gpus=None,
                              searched_gpus=24, min_gpus_layout=None, feasible_load_rps=None, feasible_load_layout=None,
                              needed_ttft_ms=None, needed_tpot_ms=None)
    text = " ".join(advice.lines())
    assert "saturates at 0.013 req/s, below the load of 0.02 req/s" in text, text   # read 'saturates at 0.0 req/s'


@pytest.mark.parametrize("capacity_rps", [
    0.00004,    # read 'saturates at 4e-05 req/s' (its own rule), where every other surface reads 'under 0.0001'
    0.013,      # two significant digits below 1
    1234.56,    # read '1234.6' without the thousands separator every table prints
])
def test_the_advice_states_a_saturating_rate_as_every_surface_does(capacity_rps):
    from servingtopology.planner.errors import ClosestLayout, InfeasibleAdvice
    from servingtopology.planner.figure_text import rps_text

    advice = InfeasibleAdvice(load_rps=5000, slo_ttft_ms=600_000, slo_tpot_ms=100, ttft_percentile=95, tpot_percentile=95, budget_gpus=24,
                              gpu="b200_sxm", closest=ClosestLayout("1×TP8", 8, 1e6, 9.0, capacity_rps), min_gpus=None,
                              searched_gpus=24, min_gpus_layout=None, feasible_load_rps=None, feasible_load_layout=None,
                              needed_ttft_ms=None, needed_tpot_ms=None)
    text = " ".join(advice.lines())
    assert f"saturates at {rps_text(capacity_rps)} req/s, below the load" in text, text
