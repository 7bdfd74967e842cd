"""`servingtopology validate` reads the silicon schema and prints the summary contract."""

import csv
import json
from importlib import resources

from servingtopology.cli.main import main

from .test_calibration import AGG, DISAGG


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
