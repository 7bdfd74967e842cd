"""The planning spec: defaults, conversion, and errors that name the field and the allowed values."""

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import LayoutKind
from servingtopology.spec import SpecError, load_spec, parse_spec, to_layout, to_problem

BASE = {"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
        "workload": {"arrivalRate": 5, "inputTokens": 1000, "outputTokens": 200}, "slo": {"ttftMs": {"p95": 500}, "tpotMs": {"p95": 50}}}


def _with(**changes):
    spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for path, value in changes.items():
        node = spec
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return spec


def _fields(spec):
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    return dict(err.value.errors)


def test_the_default_scenario_is_llama_2_7b_on_8_a100s_at_32_rps():
    p = to_problem(load_spec(None))
    assert p.model.name == "llama-2-7b" and p.gpu.id == "a100_sxm" and p.max_gpus == 8
    assert p.workload.arrival_rate_rps == 32 and p.workload.input_tokens.mean == 512
    assert p.slo.ttft_ms == 200 and p.slo.tpot_ms == 35 and p.slo.ttft_percentile == 95


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"hardware__maxGPUs": 0}, "hardware.maxGPUs", "greater than or equal to 1"),        # budget must be positive
    ({"precision": "fp7"}, "precision", "'bf16', 'fp8', 'fp4' or 'int4'"),               # names the allowed values
    ({"engine": "tgi"}, "engine.name", "'vllm' or 'sglang'"),
    ({"kvCacheDtype": "int8"}, "kvCacheDtype", "'auto', 'bf16' or 'fp8'"),
    ({"slo__tpotMs": {"p95": 50, "p99": 80}}, "slo.tpotMs", "exactly one percentile"),
    ({"slo__ttftMs": {"median": 50}}, "slo.ttftMs", "p50, p90"),
    ({"workload__concurrency": 8}, "workload", "exactly one of 'arrivalRate'"),          # both load kinds given
    ({"workload__inputTokens": {"distribution": "lognormal"}}, "workload.inputTokens", "needs 'mean'"),
    ({"hardware__gpuz": "x"}, "hardware.gpuz", "unknown field"),
    ({"search__preset": "huge"}, "search.preset", "'narrow', 'default' or 'wide'"),
    ({"objective": "cheapest"}, "objective", "'goodput-per-gpu' or 'min-gpus'"),
])
def test_a_bad_field_is_named_with_what_is_allowed(changes, field, words):
    errors = _fields(_with(**changes))
    assert field in errors, errors
    assert words in errors[field]


def test_unknown_gpu_and_model_are_semantic_errors_with_choices():
    with pytest.raises(InvalidSpec, match="h100_sxm"):
        to_problem(parse_spec(_with(hardware__gpu="TPUv5")))
    with pytest.raises(InvalidSpec) as err:
        to_problem(parse_spec(_with(model="acme/Unknown-13B")))
    assert err.value.field == "model" and "llama-3.1-8b" in err.value.message


def test_fp8_on_a_gpu_without_fp8_is_refused():
    with pytest.raises(InvalidSpec) as err:
        to_problem(parse_spec(_with(precision="fp8", hardware={"gpu": "a100_sxm", "maxGPUs": 8})))
    assert err.value.field == "precision" and "bf16" in err.value.message


def test_distributions_convert_to_length_distributions():
    p = to_problem(parse_spec(_with(workload={"arrivalRate": 2, "inputTokens": {"distribution": "uniform", "min": 100, "max": 300},
                                              "outputTokens": {"distribution": "lognormal", "mean": 200, "sigma": 0.4}})))
    assert p.workload.input_tokens.expected_tokens == 200
    assert p.workload.output_tokens.p99_tokens > 200


def test_a_pd_layout_block_converts_to_a_pinned_layout():
    spec = parse_spec(_with(layout={"kind": "pd", "prefill": {"count": 2, "tp": 2}, "decode": {"count": 3, "tp": 4},
                                    "engineArgs": {"maxNumSeqs": 128}}, hardware__maxGPUs=16))
    layout = to_layout(spec)
    assert layout.kind is LayoutKind.PD and layout.gpus == 2 * 2 + 3 * 4
    assert to_problem(spec).pinned == layout


def test_a_pd_layout_without_roles_is_refused():
    errors = _fields(_with(layout={"kind": "pd"}))
    assert "needs both 'prefill' and 'decode'" in errors["layout"]


def test_a_model_config_path_is_read(tmp_path):
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 16,'
                   ' "num_key_value_heads": 4, "intermediate_size": 8192, "vocab_size": 32000, "max_position_embeddings": 8192}')
    spec = {k: v for k, v in BASE.items() if k != "model"} | {"modelConfig": str(cfg)}
    assert to_problem(parse_spec(spec)).model.num_layers == 16


def test_a_missing_model_config_file_is_an_invalid_spec(tmp_path):
    spec = {k: v for k, v in BASE.items() if k != "model"} | {"modelConfig": str(tmp_path / "nope.json")}
    with pytest.raises(InvalidSpec) as err:
        to_problem(parse_spec(spec))
    assert err.value.field == "modelConfig"


def test_a_spec_without_precision_serves_the_checkpoint_as_stored():
    from pathlib import Path

    from servingtopology.planner.hardware import Precision
    cfg = str(Path(__file__).parent / "data" / "model_configs" / "gpt-oss-20b.json")
    spec = {**{k: v for k, v in BASE.items() if k != "model"}, "modelConfig": cfg}
    assert to_problem(parse_spec(spec)).precision is Precision.FP4  # MXFP4 experts: no BF16 copy is ever loaded
    assert to_problem(parse_spec({**spec, "precision": "bf16"})).precision is Precision.BF16  # an explicit choice stands


def test_a_pinned_layout_takes_the_checkpoints_precision_when_the_spec_names_none():
    from pathlib import Path

    from servingtopology.planner.hardware import Precision
    cfg = str(Path(__file__).parent / "data" / "model_configs" / "gpt-oss-20b.json")
    spec = parse_spec({**{k: v for k, v in BASE.items() if k != "model"}, "modelConfig": cfg, "layout": {"tp": 1}})
    pinned = to_layout(spec)  # built without the model, as the operator builds its pin
    assert pinned.precision is Precision.BF16
    assert to_problem(spec, pinned=pinned).pinned.precision is Precision.FP4


GEMMA3 = str(__import__("pathlib").Path(__file__).parent / "data" / "model_configs" / "gemma-3-27b.json")


def _vlm(engine, *extra):
    spec = {k: v for k, v in BASE.items() if k != "model"} | {"modelConfig": GEMMA3}
    return to_problem(parse_spec(spec | {"engine": {**engine, "extraArgs": list(extra)}}))


def test_a_multimodal_models_towers_are_counted_unless_the_engine_is_started_without_them():
    # vLLM builds Gemma-3's SigLIP tower (423 M weights) unless --language-model-only is among the user's engine flags
    # (which the operator appends to the command line); the record says which was decided.
    loaded = _vlm({"name": "vllm"})
    assert loaded.model.tower_params > 400e6
    text_only = _vlm({"name": "vllm"}, "--language-model-only")
    assert text_only.model.tower_params == 0 and text_only.model.total_params == loaded.model.total_params
    assert any("--language-model-only: vllm 0.33.0 skips the 0.42 B" in a for a in text_only.model.assumptions)
    # the last flag wins, as on the engine's command line
    assert _vlm({"name": "vllm"}, "--language-model-only", "--no-language-model-only").model.tower_params == loaded.model.tower_params


@pytest.mark.parametrize(("engine", "words"), [
    ({"name": "vllm", "version": "0.11.0"}, "not a flag of vllm 0.11.0"),  # the release's parser has no such flag
    ({"name": "sglang"}, "what sglang skips with it is not settled"),       # SGLang's flag: towers kept, the plan errs high
])
def test_a_language_only_flag_the_release_does_not_honour_keeps_the_towers_counted_and_says_why(engine, words):
    p = _vlm(engine, "--language-model-only")
    assert p.model.tower_params > 400e6
    assert any(words in a for a in p.model.assumptions)
