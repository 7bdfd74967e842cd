"""Problem.factors: a deployment's calibration carried by the Problem (the operator's spec.calibration), applied
by `decide` and `predict_layout` themselves, with the uncalibrated figures beside; and the factors held per thread, so one
operator thread predicting calibrated never moves another thread's predictions."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import yaml

from servingtopology.planner.perf.deployment_fit import with_factors
from servingtopology.planner.perf.step import perf_params
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import decide, predict_layout
from servingtopology.spec import PlanSpec, to_problem

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
# A CPU engine's calibration of the tiny Llama (the bounded factors `calibrate` fits on tests/data/calibration's files).
FACTORS = (("overhead", 2.0), ("prompt_overhead", 2.0), ("request_overhead", 2.0), ("weights", 1.65))


def _problem() -> Problem:
    spec = PlanSpec.model_validate(yaml.safe_load(
        f"modelConfig: {DATA / 'tiny-llama-config.json'}\nservedModelName: tiny-llama\nmodelSource: /models/tiny-llama\n"
        "engine: {name: vllm, version: '0.32.0'}\nhardware: {gpu: h100_sxm, maxGPUs: 2}\n"
        "workload: {arrivalRate: 4, inputTokens: 16, outputTokens: 8}\nslo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n"))
    return to_problem(spec)


def test_decide_applies_the_problems_factors_and_predicts_the_chosen_layout_uncalibrated_beside() -> None:
    plain = _problem()
    calibrated = decide(dataclasses.replace(plain, factors=FACTORS))
    with with_factors(dict(FACTORS)):
        by_hand = decide(plain)
    assert calibrated.best.prediction == by_hand.best.prediction and calibrated.best.layout == by_hand.best.layout
    uncalibrated = decide(plain)
    assert uncalibrated.uncalibrated is None and by_hand.uncalibrated is None
    assert calibrated.uncalibrated is not None and calibrated.uncalibrated.layout == calibrated.best.layout
    # One GPU serves 4 req/s of the tiny model either way: the same layout, and its uncalibrated figures are the plain plan's.
    assert uncalibrated.best.layout == calibrated.best.layout
    assert calibrated.uncalibrated.prediction == uncalibrated.best.prediction
    assert calibrated.best.prediction.ttft_ms > calibrated.uncalibrated.prediction.ttft_ms * 1.5   # overheads doubled
    assert calibrated.best.prediction.tpot_ms > calibrated.uncalibrated.prediction.tpot_ms


def test_predict_layout_applies_the_factors_once_also_inside_decide() -> None:
    plain = _problem()
    layout = decide(plain).best.layout
    with with_factors(dict(FACTORS)):
        by_hand = predict_layout(plain, layout)
    assert predict_layout(dataclasses.replace(plain, factors=FACTORS), layout) == by_hand
    pinned = dataclasses.replace(plain, pinned=layout, factors=FACTORS)
    assert decide(pinned).best.prediction == by_hand.prediction


def test_factors_applied_in_one_thread_leave_another_threads_predictions_alone() -> None:
    plain = _problem()
    layout = decide(plain).best.layout
    before = predict_layout(plain, layout)
    inside, release = threading.Event(), threading.Event()
    seen: list[float] = []

    def calibrated_thread() -> None:
        with with_factors(dict(FACTORS)) as params:
            seen.append(params.ttft_overhead_s)
            inside.set()
            release.wait(30)

    t = threading.Thread(target=calibrated_thread)
    t.start()
    try:
        assert inside.wait(30)
        # While the other thread holds the calibration, this one predicts with the fitted model.
        assert predict_layout(plain, layout) == before
        assert perf_params().ttft_overhead_s * 2.0 == seen[0]
    finally:
        release.set()
        t.join(30)
