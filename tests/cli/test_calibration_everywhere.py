"""A calibration is applied by every command that takes `--calibration` or refused by name, never dropped; `calibrate`
labels the release the results record; a release between covered ones is planned at the nearest covered one, and the
record says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servingtopology.cli.main import main
from servingtopology.planner.engines.caps import nearest_covered, resolve_version
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Engine
from tests.groundtruth import GROUNDTRUTH

RUN = GROUNDTRUTH / "llmservingsim_vllm_refs" / "RTX4090_Llama-3.1-8B"   # a recorded vLLM 0.19.0 run (its meta.json)
DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
SPEC = ("model: meta-llama/Llama-3.1-8B\n{engine}hardware: {{gpu: rtx_4090, maxGPUs: 1}}\n"
        "workload: {{arrivalRate: 2, inputTokens: 1000, outputTokens: 300}}\nslo: {{ttftMs: {{p95: 5000}}, tpotMs: {{p95: 100}}}}\n"
        "layout: {{kind: replicas, replicas: 1, tp: 1}}\n")


def _spec(tmp_path: Path, engine: str = "engine: vllm\n") -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(engine=engine))
    return str(path)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cal")
    out = tmp / "cal.yaml"
    assert main(["calibrate", str(RUN), "--spec", _spec(tmp), "--out", str(out), "--min-points", "1"]) == 0
    return out


def test_calibrate_labels_the_release_the_recorded_run_records_not_the_specs_default(calibration: Path,
                                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert json.loads((RUN / "meta.json").read_text())["vllm_version"] == "0.19.0"
    assert yaml.safe_load(calibration.read_text())["deployment"]["release"] == "0.19.0" != resolve_version(Engine.VLLM)


def test_calibrate_refuses_results_that_record_different_releases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for name, release in (("a.json", "0.32.0"), ("b.json", "0.33.0")):   # vllm bench serve --metadata engine_version=...
        doc = json.loads((DATA / "vllm-bench-rate2.json").read_text()) | {"engine_version": release}
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(str(tmp_path / name))
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"modelConfig: {DATA / 'tiny-llama-config.json'}\nservedModelName: tiny-llama\nmodelSource: /models/tiny-llama\n"
                    "engine: vllm\nhardware: {gpu: l40s, maxGPUs: 1}\nworkload: {arrivalRate: 2, inputTokens: 16, outputTokens: 8}\n"
                    "slo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\nlayout: {kind: replicas, replicas: 1, tp: 1}\n")
    assert main(["calibrate", *files, "--spec", str(spec), "--out", str(tmp_path / "cal.yaml"), "--min-points", "1"]) == 2
    err = capsys.readouterr().err
    assert "OtherRelease" in err and "0.32.0" in err and "0.33.0" in err and not (tmp_path / "cal.yaml").exists()


def test_simulate_replay_applies_the_calibration(calibration: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--replay", str(RUN), "--calibration", str(calibration), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    plain, calibrated = out["ttft_ms"]["mean"], out["calibrated"]["ttft_ms"]["mean"]
    assert plain["recorded"] == calibrated["recorded"] and plain["predicted"] != calibrated["predicted"]
    assert abs(calibrated["error_pct"]) < abs(plain["error_pct"]) and out["calibration"]["points_used"] == 1


def test_simulate_replay_prints_its_table(calibration: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--replay", str(RUN), "--calibration", str(calibration)]) == 0
    out = capsys.readouterr().out
    assert "(uncalibrated)" in out and "calibrated (" in out and out.count("ttft mean") == 2


@pytest.mark.parametrize("argv", [
    ["simulate", "--replay", str(RUN)],
    ["plan", "SPEC", "--no-simulate", "--no-progress"],
    ["simulate", "SPEC"],
    ["sweep", "SPEC", "--concurrency", "1,2"],
])
def test_a_missing_calibration_file_exits_2_naming_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    missing = tmp_path / "no-such-cal.yaml"
    argv = [_spec(tmp_path) if a == "SPEC" else a for a in argv]
    assert main([*argv, "--calibration", str(missing)]) == 2
    assert f"--calibration: cannot read {missing}" in capsys.readouterr().err


def test_sweep_of_named_layouts_refuses_a_calibration_by_name(tmp_path: Path, calibration: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", _spec(tmp_path), "--layout", "A=1xTP1", "--layout", "B=1xTP1·PP1", "--concurrency", "1,2"]
    assert main([*argv, "--calibration", str(calibration)]) == 2
    assert "--calibration: not with --layout" in capsys.readouterr().err


@pytest.mark.parametrize("wanted, planned", [
    ("0.19.0", "0.11.0"),   # between 0.11.0 and 0.32.0, nearer 0.11 by the kernel tables' rule
    ("0.31.2", "0.32.0"),   # nearer the newer
    ("0.32.0", None),       # covered: planned as itself
    ("0.40.0", None),       # past the newest: no data can say what it accepts
    ("0.5.0", None),        # before the oldest
])
def test_the_nearest_covered_release_is_only_for_releases_between_covered_ones(wanted: str, planned: str | None) -> None:
    assert nearest_covered(Engine.VLLM, wanted) == planned


def test_an_uncovered_release_between_covered_ones_is_planned_at_the_nearest_and_the_record_says_so(
        tmp_path: Path, calibration: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, "engine: {name: vllm, version: 0.19.0}\n")
    assert main(["plan", spec, "--no-simulate", "--no-progress", "--record", "--calibration", str(calibration)]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.19.0 planned as 0.11.0 (the nearest covered release" in out
    assert "Calibration llama-3.1-8b on rtx_4090, vllm 0.19.0" in out   # the run's calibration matches the release asked for


def test_a_release_past_the_newest_covered_is_refused_by_name() -> None:
    with pytest.raises(InvalidSpec, match=r"engine\.version: vLLM 0\.40\.0 is not covered"):
        resolve_version(Engine.VLLM, version="0.40.0")
