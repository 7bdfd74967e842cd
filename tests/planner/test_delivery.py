"""A plan's TTFT is a client's: the engine's, the front end and the first token's delivery (perf.step.delivery_s:
`result_delay_steps` mean steps, on PD also `pd_admission_steps` decode steps), counted alike by the analytical estimate,
the simulator's figures and `validate`'s estimator. What is set beside the engine's own TTFT metric (status.observed,
the live calibration) is the engine's part: Prediction.engine_ttft_ms, one figure on both."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from servingtopology.operator.replan import observed_status
from servingtopology.planner.figure_text import ms_text
from servingtopology.planner.layout import Layout, LayoutKind
from servingtopology.planner.live.calibration import analytic_point
from servingtopology.planner.live.observe import MetricSample, observe
from servingtopology.planner.perf.predict import predict_figures
from servingtopology.planner.perf.step import delivery_s, delivery_steps, perf_params, pinned_params
from servingtopology.planner.search.decide import predict_layout
from servingtopology.planner.sim.stage import stage6_figures
from servingtopology.spec import parse_spec, to_problem

SPEC = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
        "workload": {"arrivalRate": 4, "inputTokens": 1000, "outputTokens": 200},
        "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 60}}}
REPLICAS = {"kind": "replicas", "replicas": 2, "tp": 1}
PD = {"kind": "pd", "prefill": {"count": 1, "tp": 1}, "decode": {"count": 1, "tp": 1}}


def _problem(layout: dict[str, object]):
    return to_problem(parse_spec({**SPEC, "layout": layout}))


def _without_delivery():
    return pinned_params(replace(perf_params(), result_delay_steps=0.0, pd_admission_steps=0.0))


def test_the_delivery_is_so_many_mean_steps_and_more_on_pd():
    p = perf_params()
    assert float(delivery_steps()) == pytest.approx(p.result_delay_steps)
    assert float(delivery_steps(disaggregated=True)) == pytest.approx(p.result_delay_steps + p.pd_admission_steps)
    assert float(delivery_steps(recv_interval=3.0)) == pytest.approx(1.0 + p.result_delay_steps)   # SGLang's intake: half of it
    assert float(delivery_s(0.02)) == pytest.approx(0.02 * p.result_delay_steps)
    assert p.result_delay_steps > 1.0 and p.pd_admission_steps > 1.0      # the shipped fit: a few steps, more than the overlap's one


@pytest.mark.parametrize("layout", [REPLICAS, PD], ids=["replicas", "pd"])
def test_the_analytical_ttft_adds_the_delivery_at_the_mean_step(layout):
    problem = _problem(layout)
    lay, rate = problem.pinned, [float(problem.workload.arrival_rate_rps or 0.0)]
    assert lay is not None
    with_it = predict_figures(problem, [lay], rate)
    with _without_delivery():
        without = predict_figures(problem, [lay], rate)
    pd = lay.kind is LayoutKind.PD
    added = float(with_it.ttft_s[0] - without.ttft_s[0])
    assert added == pytest.approx(float(delivery_s(with_it.tpot_mean_s[0], disaggregated=pd)), rel=1e-9)
    assert added > 0 and float(with_it.tpot_s[0]) == float(without.tpot_s[0])   # TPOT does not move


@pytest.mark.parametrize("layout", [REPLICAS, PD], ids=["replicas", "pd"])
def test_the_simulated_ttft_adds_the_same_delivery_and_the_prediction_carries_it(layout):
    problem = _problem(layout)
    lay = problem.pinned
    assert lay is not None

    def run(p, l):
        return stage6_figures(p, l, num_requests=120)
    sim = run(problem, lay)
    with _without_delivery():
        engine = run(problem, lay)
    pd = lay.kind is LayoutKind.PD
    assert sim.ttft_s - engine.ttft_s == pytest.approx(float(delivery_s(sim.tpot_mean_s, disaggregated=pd)), rel=1e-9)
    cand = predict_layout(problem, lay, simulate=run)
    assert cand.prediction.source == "simulated"
    assert cand.prediction.delivery_ms == pytest.approx(float(delivery_s(sim.tpot_mean_s, disaggregated=pd)) * 1e3, rel=1e-9)
    assert cand.prediction.engine_ttft_ms == pytest.approx(engine.ttft_s * 1e3, rel=1e-9)


def test_the_live_comparisons_set_the_engine_metric_beside_the_engines_part():
    problem = _problem(REPLICAS)
    lay = problem.pinned
    assert isinstance(lay, Layout)
    cand = predict_layout(problem, lay)
    ttft_ms, tpot_ms = analytic_point(problem, lay)
    # the calibration's point and the status's figure are one: the client's TTFT less the delivery
    assert ttft_ms == pytest.approx(cand.prediction.engine_ttft_ms, rel=1e-12) and tpot_ms == pytest.approx(cand.prediction.tpot_ms)
    assert cand.prediction.ttft_ms - ttft_ms == pytest.approx(cand.prediction.delivery_ms) and cand.prediction.delivery_ms > 0
    sample = MetricSample(at_s=0.0, interval_s=60.0, request_rate_rps=4.0, input_tokens_mean=1000.0, output_tokens_mean=200.0,
                          ttft_ms=0.8 * ttft_ms, tpot_ms=tpot_ms)
    status = observed_status(observe([sample], min_samples=1, min_requests=1), at="now", raw=cand)
    assert status.predictedTtftMs == round(cand.prediction.engine_ttft_ms, 1)
    # the error is of the figures shown (to 1e-4, as status rounds it)
    assert status.ttftError is not None and math.isclose(status.ttftError, round(0.8 * ttft_ms, 1) / status.predictedTtftMs - 1.0, abs_tol=5e-5)


@pytest.mark.parametrize("layout", [REPLICAS, PD], ids=["replicas", "pd"])
def test_the_decision_says_what_its_ttft_is_made_of(layout):
    from servingtopology.planner.perf.predict import front_end_s
    from servingtopology.planner.search.decide import decide

    problem = _problem(layout)
    d = decide(problem)
    p = d.best.prediction
    pd = d.best.layout.kind is LayoutKind.PD
    assert p.front_end_ms == pytest.approx(front_end_s(problem, disaggregated=pd) * 1e3)
    parts = [r for r in d.reasons if r.startswith("p95 TTFT ")]
    assert len(parts) == 1, d.reasons
    engine = p.ttft_ms - p.front_end_ms - p.delivery_ms
    assert engine > 0 and p.delivery_ms > 0 and p.front_end_ms > 0
    said = parts[0]
    assert f"{float(delivery_steps(disaggregated=pd)):.1f} mean {'decode ' if pd else ''}steps" in said
    assert ("admission to the decode batch" in said) == pd
    # the sentence's figures are the prediction's: the parts add up to the TTFT it states
    assert said.startswith(f"p95 TTFT {ms_text(p.ttft_ms)} ms = the engine's {ms_text(engine)} ms + the front end's "
                           f"{ms_text(p.front_end_ms)} ms + ") and f" {ms_text(p.delivery_ms)} ms (" in said


def test_plan_prints_the_ttft_parts_its_json_reasons_give(tmp_path, capsys):
    import json

    import yaml

    from servingtopology.cli.main import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "layout": REPLICAS}))
    assert main(["plan", str(spec), "--no-progress", "--json"]) == 0
    reasons = [r for r in json.loads(capsys.readouterr().out)["reasons"] if r.startswith("p95 TTFT ")]
    assert main(["plan", str(spec), "--no-progress"]) == 0
    printed = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("p95 TTFT ")]
    assert len(reasons) == 1 and printed == reasons
