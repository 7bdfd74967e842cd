"""The unseen public configs (tests/planner/test_unseen_configs.py) through the commands a user runs on them:
`validate` predicts every row of a CSV in the benchmark schema, `plan` and `simulate` price Llama-4 from its config.json."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from servingtopology.cli.main import main
from servingtopology.cli.validate import evaluate, load_measurements
from servingtopology.planner.fidelity.benchmark_cases import Prediction

CONFIGS = Path(__file__).resolve().parents[1] / "planner" / "data" / "model_configs"
FIELDS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
          "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
          "silicon_ttft_ms", "silicon_tpot_ms"]
# (model id, config file, system, precision, gemm quant, moe quant, tp, moe ep). Measured figures are placeholders: the
# rows test which rows are predicted, not how well (no benchmark rows of these models are used).
ROWS = [
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama-4-scout", "h200_sxm", "bf16", "bf16", "bf16", 4, 1),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "llama-4-maverick", "h200_sxm", "bf16", "bf16", "bf16", 8, 8),
    ("google/gemma-3-27b-it", "gemma-3-27b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("google/gemma-2-9b", "gemma-2-9b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("tiiuae/Falcon-H1-0.5B", "falcon-h1-0.5b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("poolside/Laguna-XS.2-FP8", "laguna-xs.2-fp8", "h200_sxm", "fp8", "fp8_block", "fp8_block", 1, 1),
    ("zai-org/GLM-4.7", "glm-4.7", "h200_sxm", "bf16", "bf16", "bf16", 8, 8),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b", "h100_sxm", "bf16", "bf16", "bf16", 8, 1),
    ("stepfun-ai/Step-3.7-Flash", "step-3.7-flash", "h200_sxm", "bf16", "bf16", "bf16", 4, 4),
    ("databricks/dbrx-instruct", "dbrx-instruct-mlx-4bit", "h200_sxm", "bf16", "bf16", "bf16", 4, 1),  # refused on old main
    ("bigcode/starcoder2-15b", "starcoder2-15b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-v4-flash", "h200_sxm", "bf16", "bf16", "bf16", 8, 8),
    ("LGAI-EXAONE/EXAONE-4.0-32B-FP8", "exaone-4.0-32b-fp8", "h100_sxm", "fp8", "fp8_block", "fp8_block", 2, 1),
    ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    # Session 15: layer kinds and MoE layouts the reader had not met (tests/planner/test_new_layer_kinds.py).
    ("moonshotai/Kimi-Linear-48B-A3B-Instruct", "kimi-linear-48b-a3b", "h200_sxm", "bf16", "bf16", "bf16", 2, 1),
    ("LiquidAI/LFM2-1.2B", "lfm2-1.2b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("ibm-granite/granite-4.0-h-tiny", "granite-4.0-h-tiny", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("HuggingFaceTB/SmolLM3-3B", "smollm3-3b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("baidu/ERNIE-4.5-21B-A3B-PT", "ernie-4.5-21b-a3b", "h100_sxm", "bf16", "bf16", "bf16", 1, 1),
    ("tencent/Hunyuan-A13B-Instruct", "hunyuan-a13b", "h200_sxm", "bf16", "bf16", "bf16", 2, 1),
]
NEW_CONFIGS = ["kimi-linear-48b-a3b", "lfm2-1.2b", "granite-4.0-h-tiny", "smollm3-3b", "ernie-4.5-21b-a3b", "hunyuan-a13b"]


def _csv_and_models(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "models"
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for i, (model_id, cfg, system, prec, gemm, moe, tp, ep) in enumerate(ROWS):
            (root / model_id).mkdir(parents=True, exist_ok=True)
            shutil.copy(CONFIGS / f"{cfg}.json", root / model_id / "config.json")
            for backend in ("vllm", "sglang"):
                w.writerow({"id": f"r{i}-{backend}", "silicon_data_source": "silicon_concurrency=16", "backend": backend,
                            "model_path": model_id, "system": system, "precision": prec, "mode": "agg", "isl": 1024, "osl": 256,
                            "gemm_quant_mode": gemm, "moe_quant_mode": moe, "batch_size": 16, "tp_size": tp, "pp_size": 1,
                            "attention_dp_size": 1, "moe_tp_size": 1, "moe_ep_size": ep, "silicon_ttft_ms": 500, "silicon_tpot_ms": 20})
    return path, root


def _spec(tmp_path: Path, cfg: str) -> Path:
    """A plan spec for one stored config: 8 H200s, 2 req/s of 2000/200-token requests, the narrow search."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"modelConfig: {CONFIGS / (cfg + '.json')}\nmodelSource: /models/{cfg}\nhardware: {{gpu: h200_sxm, gpusPerNode: 8, maxGPUs: 8}}\n"
                    "workload: {arrivalRate: 2, inputTokens: 2000, outputTokens: 200}\nslo: {ttftMs: {p95: 3000}, tpotMs: {p95: 100}}\n"
                    "search: {preset: narrow, topK: 1}\n")
    return spec


def test_validate_predicts_every_row_of_the_unseen_families(tmp_path):
    rows, models = _csv_and_models(tmp_path)
    results, summary = evaluate(load_measurements(rows, model_dir=models))
    skipped = [str(r) for r in results if not isinstance(r, Prediction)]
    assert skipped == [] and summary["skipped"]["count"] == 0 and len(results) == 2 * len(ROWS)


def test_plan_and_simulate_price_llama4_by_its_global_layers(tmp_path, capsys):
    """Old main planned Llama-4-Scout with 0 KV bytes per token ('48 of 48 layers attend to a 8192-token window')."""
    spec = _spec(tmp_path, "llama-4-scout")
    assert main(["plan", str(spec), "--json", "--no-simulate", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 12 * 2 * 8 * 128 * 2  # vLLM FullAttentionSpec on the 12 no-RoPE layers
    assert "36 of 48 layers attend to a 8192-token window" in out["record"]
    assert main(["simulate", str(spec), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["finished"] > 0 and sim["unfinished"] == 0


@pytest.mark.parametrize("cfg", NEW_CONFIGS)
def test_plan_simulate_and_validate_take_each_new_config(tmp_path, capsys, cfg):
    """Each session-15 config through `plan` (its simulation stage off) and `simulate`, with exit code 0; `validate`
    takes their rows in the test below."""
    spec = _spec(tmp_path, cfg)
    assert main(["plan", str(spec), "--json", "--no-simulate", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] > 0
    assert main(["simulate", str(spec), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["finished"] > 0 and sim["unfinished"] == 0


def test_validate_exits_0_on_the_unseen_families(tmp_path, capsys):
    rows, models = _csv_and_models(tmp_path)
    assert main(["validate", "--measurements", str(rows), "--model-dir", str(models), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"]["count"] == 0
