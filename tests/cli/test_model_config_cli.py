"""Models outside the catalog reach `validate` and `simulate --replay` through their config.json."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from servingtopology.cli.simulate import load_replay
from servingtopology.cli.validate import evaluate, load_measurements
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.fidelity.benchmark_cases import Prediction
from tests.groundtruth import GROUNDTRUTH

CONFIGS = Path(__file__).resolve().parents[1] / "planner" / "data" / "model_configs"
REF = GROUNDTRUTH / "llmservingsim_vllm_refs" / "RTX4090_Llama-3.1-8B"
FIELDS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
          "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
          "silicon_ttft_ms", "silicon_tpot_ms"]
# (model id, config file, system, precision, gemm quant, moe quant, tp, attention dp, moe ep): held-out families in the
# schema's own vocabulary, e.g. Kimi-K2.5's int4_wo experts and GLM-5's NVFP4 on B200. Measured figures are placeholders:
# these rows test which rows are predicted, not how well.
ROWS = [
    ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5", "h200_sxm", "fp8", "fp8_block", "fp8_block", 4, 1, 4),
    ("Qwen/Qwen3.5-397B-A17B", "qwen3.5-397b-a17b", "h200_sxm", "bf16", "bf16", "bf16", 8, 1, 8),
    ("zai-org/GLM-5", "glm-5-nvfp4", "b200_sxm", "fp4", "nvfp4", "nvfp4", 8, 1, 8),
    ("moonshotai/Kimi-K2.5", "kimi-k2.5", "h200_sxm", "int4", "bf16", "int4_wo", 8, 1, 8),
    ("moonshotai/Kimi-K2.5", "kimi-k2.5", "b200_sxm", "int4", "fp8", "int4_wo", 1, 8, 8),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b", "h100_sxm", "bf16", "bf16", "bf16", 4, 1, 1),
    ("deepseek-ai/DeepSeek-V3.2", "deepseek-v3.2", "h200_sxm", "fp8", "fp8", "fp8_block", 8, 1, 8),
]


def _model_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for model_id, cfg, *_ in ROWS:
        (root / model_id).mkdir(parents=True, exist_ok=True)
        shutil.copy(CONFIGS / f"{cfg}.json", root / model_id / "config.json")
    return root


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for i, (model_id, _, system, prec, gemm, moe, tp, dp, ep) in enumerate(ROWS):
            for backend in ("vllm", "sglang"):
                for conc in (4, 64):
                    w.writerow({"id": f"r{i}-{backend}-{conc}", "silicon_data_source": f"silicon_concurrency={conc}", "backend": backend,
                                "model_path": model_id, "system": system, "precision": prec, "mode": "agg", "isl": 1024, "osl": 1024,
                                "gemm_quant_mode": gemm, "moe_quant_mode": moe, "batch_size": conc, "tp_size": tp, "pp_size": 1,
                                "attention_dp_size": dp, "moe_tp_size": 1, "moe_ep_size": ep, "silicon_ttft_ms": 500, "silicon_tpot_ms": 20})
    return path


def test_validate_predicts_every_row_of_models_given_by_their_config_json(tmp_path):
    m = load_measurements(_csv(tmp_path), model_dir=_model_dir(tmp_path))
    results, summary = evaluate(m)
    skipped = [str(r) for r in results if not isinstance(r, Prediction)]
    assert skipped == [] and summary["skipped"]["count"] == 0 and len(results) == 4 * len(ROWS)


def test_validate_without_the_config_names_the_missing_input(tmp_path):
    m = load_measurements(_csv(tmp_path), model_dir=tmp_path / "empty")
    results, _ = evaluate(m)
    reasons = {str(r) for r in results if not isinstance(r, Prediction)}
    assert any("MiniMax-M2.5" in r and "config.json" in r for r in reasons)


@pytest.mark.skipif(not REF.is_dir(), reason="shared ground truth not present")
def test_replay_takes_the_model_from_the_run_folder_when_its_id_is_not_in_the_catalog(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(REF, run)
    meta = json.loads((run / "meta.json").read_text())
    meta["model"] = meta["engine_kwargs"]["model"] = "acme/Private-Llama-8B"
    (run / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InvalidSpec, match="--model-config"):
        load_replay(run)
    shutil.copy(CONFIGS / "llama-3.1-8b-instruct.json", run / "model_config.json")
    rep = load_replay(run)
    assert rep.model.name == "acme/Private-Llama-8B" and rep.model.total_params / 1e9 == pytest.approx(8.03, rel=0.01)


@pytest.mark.skipif(not REF.is_dir(), reason="shared ground truth not present")
def test_replay_reads_a_hugging_face_config_json_in_place_of_the_cluster_file(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(REF, run)
    meta = json.loads((run / "meta.json").read_text())
    meta["model"] = meta["engine_kwargs"]["model"] = "Qwen/Qwen3-Next-80B-A3B-Instruct"
    (run / "meta.json").write_text(json.dumps(meta))
    shutil.copy(CONFIGS / "qwen3-next-80b-a3b.json", run / "config.json")
    rep = load_replay(run)
    assert rep.model.num_state_layers == 36


def test_plan_of_a_hybrid_model_from_its_config_json_records_what_was_assumed(tmp_path, capsys):
    from servingtopology.cli.main import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"modelConfig: {CONFIGS / 'qwen3-next-80b-a3b.json'}\nmodelSource: Qwen/Qwen3-Next-80B-A3B-Instruct\n"
                    "hardware: {gpu: h200_sxm, gpusPerNode: 8, maxGPUs: 8}\n"
                    "workload: {arrivalRate: 4, inputTokens: 2000, outputTokens: 200}\nslo: {ttftMs: {p95: 2000}, tpotMs: {p95: 60}}\n"
                    "search: {preset: narrow}\n")
    assert main(["plan", str(spec), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["record"]
    assert "36 layers keep a fixed gated_delta_net state per sequence" in record and "Assumed:" in record


def test_a_modelopt_checkpoints_hf_quant_config_json_sets_its_format(tmp_path):
    from servingtopology.planner.hardware import Precision
    from servingtopology.planner.model.catalog import from_hf_config
    from servingtopology.spec import read_model_config

    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())  # a BF16 config, as NVIDIA's FP4 repositories ship it
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                                "exclude_modules": ["lm_head"]}}))
    m = from_hf_config(read_model_config(tmp_path / "config.json"))
    assert m.checkpoint is not None and m.checkpoint.precision is Precision.FP4 and m.checkpoint_precision is Precision.FP4
