"""`servingtopology validate` reads the silicon schema and prints the summary contract."""

import csv
import json
from importlib import resources

from servingtopology.cli.main import main

from .test_benchmark_cases import AGG, DISAGG


def _write(path, rows):
    keys = sorted({k for r in rows for k in r})
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def test_validate_json_prints_the_contract_keys(tmp_path, capsys):
    rows = [AGG, {**AGG, "id": "b", "tp_size": "8", "moe_tp_size": "8", "silicon_tpot_ms": "9"}, {**AGG, "id": "c", "system": "tpu"}]
    _write(tmp_path / "m.csv", rows)
    assert main(["validate", "--measurements", str(tmp_path / "m.csv"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"] == 3
    assert d["skipped"]["by_reason"] == {"unknown GPU": 1}
    for k in ("ttft", "tpot"):
        assert set(d[k]) == {"median_ape", "mape", "within_20pct"}
    assert d["ranking"]["groups"] == 1


def test_validate_resolves_models_from_a_model_dir_and_filters_backends(tmp_path, capsys):
    cfg = tmp_path / "models" / "deepseek-ai" / "DeepSeek-V3"
    cfg.mkdir(parents=True)
    cfg.joinpath("config.json").write_text(
        resources.files("servingtopology.planner").joinpath("data/models/deepseek-ai_DeepSeek-V3.json").read_text())
    _write(tmp_path / "m.csv", [AGG, DISAGG])
    code = main(["validate", "--measurements", str(tmp_path / "m.csv"), "--model-dir", str(tmp_path / "models"),
                 "--backend", "sglang"])
    out = capsys.readouterr().out
    assert code == 0
    assert "sglang/disagg/b200_sxm" in out and "vllm/agg" not in out


def test_validate_rejects_an_unknown_backend(tmp_path, capsys):
    _write(tmp_path / "m.csv", [AGG])
    assert main(["validate", "--measurements", str(tmp_path / "m.csv"), "--backend", "tgi"]) == 2
    assert "--backend" in capsys.readouterr().err


def test_validate_json_reports_the_baseline_pairwise_order_and_the_figures_without_the_harness(tmp_path, capsys):
    inferencex = "db-dump/2026-04-27; config_id=1; silicon_concurrency=32; measured=2026-03-23T00:00:00.000Z; vllm/vllm-openai:v0.11"
    rows = [{**AGG, "silicon_data_source": inferencex},
            {**AGG, "id": "b", "silicon_data_source": inferencex, "tp_size": "8", "moe_tp_size": "8", "silicon_tpot_ms": "9"}]
    _write(tmp_path / "m.csv", rows)
    assert main(["validate", "--measurements", str(tmp_path / "m.csv"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["harness_knowledge"] is True
    assert {"baseline_top1", "baseline_top1_first_listed", "pairs", "pairwise_ordering"} <= set(d["ranking"])
    assert d["ranking"]["baseline_top1"] == 1.0  # TP8 has the lowest TPOT (most GPUs wins), TP4 the most tokens/s per GPU
    assert set(d["without_harness"]) == {"ttft", "tpot", "ranking"}
    # Leave-one-model-out figures are recorded by fit_perf.py --lomo for the calibration file, not for this one.
    assert d["leave_one_model_out"] is None
    # The InferenceX harness drew lengths from [0.8 L, L]: without that knowledge the rows are predicted at L, slower.
    assert main(["validate", "--measurements", str(tmp_path / "m.csv"), "--json", "--no-harness"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["harness_knowledge"] is False and "without_harness" not in bare
    assert bare["ttft"] == d["without_harness"]["ttft"] and bare["ttft"] != d["ttft"]


def test_validate_json_carries_the_recorded_leave_one_model_out_figures_for_the_calibration_file(tmp_path, capsys):
    _write(tmp_path / "silicon_calibration.csv", [AGG])
    assert main(["validate", "--measurements", str(tmp_path / "silicon_calibration.csv"), "--json"]) == 0
    lomo = json.loads(capsys.readouterr().out)["leave_one_model_out"]
    assert lomo["recorded_by"].startswith("benchmarks/fit_perf.py") and "--lomo" in lomo["recorded_by"]
    assert {"ttft", "tpot", "ranking"} <= set(lomo["vllm_sglang"]) and len(lomo["folds"]) >= 2


def test_validate_json_scores_the_rows_held_out_now_with_each_familys_own_fold(tmp_path, capsys):
    from servingtopology.planner.perf.step import fit_record

    fold = next(f for f in fit_record()["leave_one_model_out"]["folds"] if "meta-llama/Llama-3.1-70B" in f["models"])
    other = {**AGG, "id": "q", "model_path": "Qwen/Qwen3-32B-not-fitted", "tp_size": "2", "moe_tp_size": "2"}
    _write(tmp_path / "m.csv", [AGG, {**AGG, "id": "b", "tp_size": "8", "moe_tp_size": "8", "silicon_tpot_ms": "9"}, other])
    assert main(["validate", "--measurements", str(tmp_path / "m.csv"), "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["held_out"]
    assert {"ttft", "tpot", "e2e", "ranking"} <= set(h) and "decision_quality" in h["ranking"]
    # The two Llama-3.1-70B rows by the fold fitted without Llama-3.1-70B; the unknown model is skipped, never fitted.
    assert h["parameters"] == {"fold without " + ", ".join(sorted(fold["models"])): 2,
                               "shipped parameters (the fit never saw this model)": 1}
    assert h["predicted"] == 2
