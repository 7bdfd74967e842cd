"""benchmarks/lomo_decisions.py judges every line of issue #35's "done when" that a figure can show."""

import json
import sys
from pathlib import Path

import pytest

from tests.groundtruth import GROUNDTRUTH

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import lomo_decisions


@pytest.fixture(autouse=True)
def _shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lomo_decisions, "SHARED", GROUNDTRUTH)


def _judged(capsys: pytest.CaptureFixture[str], *files: str) -> tuple[int, dict]:
    rc = lomo_decisions.main(["--json", "--files", *files])
    return rc, json.loads(capsys.readouterr().out)


def test_the_equal_gpu_and_minimax_lines_are_judged_where_minimax_is_scored(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _judged(capsys, "silicon_minimax_m25.csv")
    eq = out["overall"]["ranking"]["equal_gpu"]
    assert out["got"]["equal_gpu_order_right"] == eq["order_right"] and out["targets"]["equal_gpu_order_right"] == 0.95
    assert out["got"]["equal_gpu_tpot_ratio_error_pct"] == eq["tpot_ratio_error_pct"]
    assert out["targets"]["equal_gpu_tokens_per_gpu_margin_over_rule"] == 0.10
    family = out["breakdowns"]["family"]["MiniMax-M2.5"]
    assert out["got"]["minimax_tpot_median_ape"] == family["tpot"] and out["targets"]["minimax_tpot_median_ape"] == 7.1
    assert out["missed"] == lomo_decisions.missed_targets(out["got"], out["targets"])
    assert rc == (1 if out["missed"] else 0)


def test_a_floor_is_missed_below_it_a_ceiling_above_it_and_a_figure_not_computed_always() -> None:
    targets = {"equal_gpu_order_right": 0.95, "tpot_margin_over_rule": 0.0, "equal_gpu_tpot_ratio_error_pct": 5.0,
               "minimax_tpot_median_ape": 7.1}
    assert lomo_decisions.missed_targets({"equal_gpu_order_right": 0.90, "tpot_margin_over_rule": 0.0,
                                          "equal_gpu_tpot_ratio_error_pct": 4.47, "minimax_tpot_median_ape": 10.98},
                                         targets) == ["equal_gpu_order_right", "minimax_tpot_median_ape"]
    assert lomo_decisions.missed_targets({"equal_gpu_order_right": 0.95, "tpot_margin_over_rule": -0.001,
                                          "equal_gpu_tpot_ratio_error_pct": None, "minimax_tpot_median_ape": 7.1},
                                         targets) == ["tpot_margin_over_rule", "equal_gpu_tpot_ratio_error_pct"]


def test_without_minimax_rows_its_lines_are_not_judged(capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _judged(capsys, "silicon_qwen3_32b.csv")
    assert "minimax_ttft_median_ape" not in out["targets"] and "minimax_ttft_median_ape" not in out["got"]
    assert out["targets"]["tpot_margin_over_rule"] == 0.0


def test_a_run_exported_twice_counts_once_in_the_reported_line_and_as_often_as_it_appears_in_the_judged_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from servingtopology.planner.fidelity.benchmark_cases import parse_row
    from tests.planner.test_benchmark_cases import AGG

    a = parse_row(AGG)
    twin = dataclasses.replace(a, row_id="b", model_path="other/label")           # the same run under another label
    other = dataclasses.replace(a, row_id="c", ttft_ms=a.ttft_ms + 0.01)           # another run
    assert lomo_decisions.distinct_runs([a, twin, other, a]) == [0, 2]
    _, out = _judged(capsys, "silicon_calibration.csv")
    assert out["distinct_runs"]["rows"] < out["overall"]["predicted"]
    assert "distinct_runs" not in {k for k in out["targets"]}
