"""benchmarks/lomo_decisions.py judges refitted folds' CPU seconds (issue #35 item 4) where it is given them."""

import json
import sys
from pathlib import Path

import pytest

from tests.groundtruth import GROUNDTRUTH

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import lomo_decisions


def _record(tmp_path: Path, cpu: list[float]) -> Path:
    """The shipped fit's own folds as a fit_perf.py output whose folds took `cpu` CPU seconds each."""
    shipped = lomo_decisions.fit_record()
    folds = [dict(f, cpu_s=c) for f, c in zip(shipped["leave_one_model_out"]["folds"], cpu, strict=True)]
    path = tmp_path / "folds.json"
    path.write_text(json.dumps({"params": shipped["params"], "leave_one_model_out": {"folds": folds}}))
    return path


@pytest.fixture(autouse=True)
def _shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lomo_decisions, "SHARED", GROUNDTRUTH)


def _judged(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    lomo_decisions.main(["--json", "--files", "silicon_calibration.csv", "--folds", str(path)])
    return json.loads(capsys.readouterr().out)


def test_the_slowest_fold_and_all_folds_are_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = len(lomo_decisions.fit_record()["leave_one_model_out"]["folds"])
    fast = _judged(_record(tmp_path, [40.0] * n), capsys)
    assert fast["got"]["fold_cpu_s_max"] == 40.0 and fast["got"]["folds_cpu_s_total"] == 40.0 * n
    assert fast["targets"]["fold_cpu_s_max"] == 60.0 and fast["targets"]["folds_cpu_s_total"] == 900.0
    assert "fold_cpu_s_max" not in fast["missed"] and "folds_cpu_s_total" not in fast["missed"]
    slow = _judged(_record(tmp_path, [40.0] * (n - 1) + [61.0]), capsys)
    assert "fold_cpu_s_max" in slow["missed"] and "folds_cpu_s_total" not in slow["missed"]


def test_without_refitted_folds_no_cpu_is_judged(capsys: pytest.CaptureFixture[str]) -> None:
    lomo_decisions.main(["--json", "--files", "silicon_calibration.csv"])
    out = json.loads(capsys.readouterr().out)
    assert "fold_cpu_s_max" not in out["targets"] and "fold_cpu_s_max" not in out["got"]
