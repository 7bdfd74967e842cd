"""benchmarks/sim_vs_estimator.py: the simulator runs each row's benchmark as its harness ran it, and the script judges
the two estimators' TPOT and TTFT agreement."""

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from servingtopology.planner.fidelity.benchmark_cases import INFERENCEX, UNSTATED, parse_row
from tests.groundtruth import GROUNDTRUTH
from tests.planner.test_benchmark_cases import AGG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sim_vs_estimator


def test_an_inferencex_row_is_simulated_with_its_clients_requests_and_drawn_lengths():
    case = dataclasses.replace(parse_row(AGG), harness=INFERENCEX, isl=1000, osl=500)
    req = sim_vs_estimator.harness_requests(case, np.random.default_rng(3))
    assert len(req.prompt_tokens) == 32 * 10 and req.closed_loop and req.num_clients == 32
    assert req.prompt_tokens.min() >= 800 and req.prompt_tokens.max() <= 1000 and len(set(req.prompt_tokens.tolist())) > 50
    assert req.output_tokens.min() >= 400 and req.output_tokens.max() <= 500
    fixed = sim_vs_estimator.harness_requests(dataclasses.replace(case, harness=UNSTATED), np.random.default_rng(3))
    assert set(fixed.prompt_tokens.tolist()) == {1000} and set(fixed.output_tokens.tolist()) == {500}


def test_the_tpot_and_ttft_agreement_is_judged(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sim_vs_estimator, "SHARED", GROUNDTRUTH)
    rc = sim_vs_estimator.main(["--max-rows", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["configurations"] == 3 and out["overall"]["rows"] >= 3
    met = (out["overall"]["tpot_sim_vs_est"] <= out["target_tpot_sim_vs_est_pct"]
           and out["overall"]["ttft_sim_vs_est"] <= out["target_ttft_sim_vs_est_pct"])
    assert rc == (0 if met else 1) and out["met"] == (rc == 0)
