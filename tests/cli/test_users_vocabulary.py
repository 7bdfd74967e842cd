"""Users' own words are read as they mean them: SGLang's and Dynamo's `tp: 4, dp: 4` with DP attention (four GPUs),
labelled as the engine names it; `count` for a replicas layout; "did you mean" for a mistyped field or id; a
multi-document manifest read for its ServingTopology."""

import json
from pathlib import Path

import pytest
import yaml

from servingtopology.cli.compare import parse_layout
from servingtopology.cli.main import main
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.spec import SpecError, parse_spec, to_layout

ROOT = Path(__file__).resolve().parents[2]


def _spec(layout, *, engine="sglang", max_gpus=8, **extra):
    return {"model": "qwen3-30b-a3b", "engine": engine, "hardware": {"gpu": "h100_sxm", "maxGPUs": max_gpus},
            "workload": {"arrivalRate": 2, "inputTokens": 2000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 5000}, "tpotMs": {"p95": 100}}, "layout": layout, **extra}


def _write(tmp_path, data):
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("layout, parallelism, gpus", [
    # SGLang's TP4 with attention split four ways: four GPUs, one attention rank per GPU
    ({"kind": "replicas", "tp": 4, "dp": 4, "dpAttention": True}, Parallelism(tp=1, dp=4), 4),
    # attention split two ways over four GPUs: two GPUs per attention rank
    ({"kind": "replicas", "tp": 4, "dp": 2, "dpAttention": True}, Parallelism(tp=2, dp=2), 4),
    # without the word, dp ranks of tp GPUs each, vLLM's -tp 2 -dp 2
    ({"kind": "replicas", "tp": 2, "dp": 2}, Parallelism(tp=2, dp=2), 4),
])
def test_dp_attention_reads_tp_as_the_engines_tp_size(layout, parallelism, gpus):
    spec = parse_spec(_spec(layout))
    pinned = to_layout(spec)
    assert pinned.roles[Role.AGGREGATED].parallelism == parallelism and pinned.gpus == gpus == spec.layout.gpus()


def test_a_pd_role_takes_dp_attention_and_the_seeds_layout_fits_its_budget():
    layout = {"kind": "pd", "prefill": {"count": 3, "tp": 4, "dp": 4, "dpAttention": True}, "decode": {"count": 1, "tp": 8}}
    pinned = to_layout(parse_spec(_spec(layout, max_gpus=20)))
    assert pinned.roles[Role.PREFILL].parallelism == Parallelism(tp=1, dp=4) and pinned.gpus == 3 * 4 + 8


def test_tp_by_dp_over_the_budget_names_dp_attention_and_its_gpu_count():
    layout = {"kind": "pd", "prefill": {"count": 3, "tp": 4, "dp": 4}, "decode": {"count": 1, "tp": 8}}
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(layout, max_gpus=24))
    (field, message), = err.value.errors
    assert field == "layout" and "56 GPUs" in message and "dpAttention: true" in message and "takes 20 GPUs" in message


def test_dp_attention_needs_dp_to_divide_tp():
    with pytest.raises(SpecError) as err:
        parse_spec(_spec({"kind": "replicas", "tp": 4, "dp": 3, "dpAttention": True}))
    assert err.value.errors[0][0] == "layout.dp" and "must divide tp" in err.value.errors[0][1]


@pytest.mark.parametrize("engine, label", [
    (Engine.SGLANG, "1×TP4·DP4-attn"),   # --tp-size 4 with --attn-dp-size 4: as SGLang names it
    (Engine.VLLM, "1×TP1·DP4"),          # -tp 1 -dp 4: as vLLM names it
])
def test_a_dp_attention_layout_is_labelled_as_its_engine_names_it(engine, label):
    assert Layout.replicas(1, Parallelism(tp=1, dp=4)).label_for(engine) == label


def test_plan_labels_the_sglang_layout_as_the_command_it_prints(tmp_path, capsys):
    path = _write(tmp_path, _spec({"kind": "replicas", "tp": 4, "dp": 4, "dpAttention": True}))
    assert main(["plan", path, "--no-simulate", "--no-progress", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["label"] == "1×TP4·DP4-attn" and best["gpus"] == 4
    (command,) = [c for c in json.dumps(best["engine_commands"]).split('"') if "sglang.launch_server" in c]
    assert "--tp-size 4" in command and "--attn-dp-size 4" in command


def test_compare_reads_the_sglang_label_back():
    _, mapping = parse_layout("1xTP4·DP4-attn", field="--layout[0]")
    assert mapping == {"kind": "replicas", "replicas": 1, "tp": 4, "pp": 1, "dp": 4, "dpAttention": True}


def test_count_is_read_as_replicas_in_a_replicas_layout():
    assert parse_spec(_spec({"kind": "replicas", "count": 3, "tp": 2})).layout.replicas == 3


@pytest.mark.parametrize("layout, needle", [
    ({"kind": "replicas", "count": 1, "replicas": 2}, "given twice"),
    ({"kind": "pd", "count": 1, "prefill": {"count": 1}, "decode": {"count": 1}}, "prefill.count and decode.count"),
])
def test_count_that_clashes_is_refused_by_name(layout, needle):
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(layout))
    assert err.value.errors[0][0] == "layout.count" and needle in err.value.errors[0][1]


@pytest.mark.parametrize("patch, field, suggestion", [
    ({"hardware": {"gpu": "h100_sxm", "maxGPUs": 8, "gpuPerNode": 8}}, "hardware.gpuPerNode", "gpusPerNode"),
    ({"workload": {"arrivalRate": 2, "inputTokens": 20, "outputTokens": 20, "prefixshare": 0.1}}, "workload.prefixshare", "prefixShare"),
    ({"layout": {"kind": "pd", "prefill": {"count": 1, "tpp": 2}, "decode": {"count": 1}}}, "layout.prefill.tpp", "tp"),
])
def test_an_unknown_field_names_the_nearest_field_of_its_section(patch, field, suggestion):
    with pytest.raises(SpecError) as err:
        parse_spec({**_spec(None), **patch})
    assert (field, f"did you mean {suggestion!r}?") in [(f, m[m.find("did"):m.find("?") + 1]) for f, m in err.value.errors]


@pytest.mark.parametrize("resolve, name, suggestion", [
    (resolve_model, "llama-3.1-8", "llama-3.1-8b"),
    (resolve_gpu, "h100sxm", "h100_sxm"),
])
def test_an_unknown_catalog_id_names_the_nearest_one(resolve, name, suggestion):
    with pytest.raises(InvalidSpec, match=f"did you mean '{suggestion}'"):
        resolve(name)


def test_plan_reads_a_multi_document_manifest_for_its_serving_topology(capsys):
    assert main(["plan", str(ROOT / "examples/gated-llama-hf-cache.yaml"), "--no-simulate", "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["gpus"] >= 1


def test_a_multi_document_file_without_a_spec_names_the_kinds_it_holds(tmp_path, capsys):
    path = tmp_path / "objects.yaml"
    path.write_text("kind: Secret\nmetadata: {name: a}\n---\nkind: PersistentVolumeClaim\nmetadata: {name: b}\n")
    assert main(["plan", str(path), "--no-progress"]) == 2
    assert "Secret, PersistentVolumeClaim" in capsys.readouterr().err


def _context_spec(tmp_path, *, engine="vllm", input_tokens=3000, **extra):
    return _write(tmp_path, {"model": "llama-3.1-8b", "engine": engine, "hardware": {"gpu": "h100_sxm", "maxGPUs": 8},
                             "workload": {"arrivalRate": 2, "inputTokens": input_tokens, "outputTokens": 200},
                             "slo": {"ttftMs": {"p95": 5000}, "tpotMs": {"p95": 100}}, **extra})


@pytest.mark.parametrize("engine, flag", [("vllm", "--max-model-len 4096"), ("sglang", "--context-length 4096")])
def test_context_length_is_passed_to_the_engine_as_its_flag(tmp_path, capsys, engine, flag):
    assert main(["plan", _context_spec(tmp_path, engine=engine, contextLength=4096), "--no-simulate", "--no-progress"]) == 0
    assert capsys.readouterr().out.count(flag) == 1


@pytest.mark.parametrize("extra, field, needle", [
    # the context set is shorter than the requests: refused, naming what set it
    ({"contextLength": 4096}, "workload.inputTokens", "told to serve 4,096 tokens (contextLength)"),
    # SGLang's own flag in extraArgs is read by the check, not only passed on
    ({"engine": {"name": "sglang", "extraArgs": ["--context-length", "4096"]}}, "workload.inputTokens", "(engine.extraArgs)"),
    ({"engine": {"name": "vllm", "extraArgs": ["--max-model-len=4k"]}}, "workload.inputTokens", "told to serve 4,000 tokens"),
    # over the model's own context: the engines refuse it
    ({"contextLength": 400_000, "input_tokens": 300}, "contextLength", "over the model's context of 131,072"),
    # two values for one setting
    ({"contextLength": 8192, "engine": {"name": "vllm", "extraArgs": ["--max-model-len", "4096"]}, "input_tokens": 300},
     "engine.extraArgs", "disagree"),
])
def test_a_context_the_requests_or_the_model_cannot_keep_is_refused_by_name(tmp_path, capsys, extra, field, needle):
    extra = dict(extra)
    spec = _context_spec(tmp_path, input_tokens=extra.pop("input_tokens", 6000), **extra)
    assert main(["plan", spec, "--no-simulate", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{field}: " in err and needle in err


def test_context_length_given_in_extra_args_is_not_passed_twice(tmp_path, capsys):
    spec = _context_spec(tmp_path, contextLength=4096, engine={"name": "vllm", "extraArgs": ["--max-model-len", "4096"]})
    assert main(["plan", spec, "--no-simulate", "--no-progress"]) == 0
    assert capsys.readouterr().out.count("--max-model-len") == 1


def test_the_operators_pods_run_the_context_length(tmp_path, capsys):
    resource = yaml.safe_load((ROOT / "examples/vllm-replicas.yaml").read_text())
    resource["spec"]["contextLength"] = 4096
    path = tmp_path / "cr.yaml"
    path.write_text(yaml.safe_dump(resource))
    assert main(["plan", str(path), "--no-simulate", "--no-progress", "--manifests", str(tmp_path / "out")]) == 0
    args = [c.get("args", []) for f in sorted((tmp_path / "out").glob("*.yaml")) for obj in [yaml.safe_load(f.read_text())]
            if obj["kind"] == "Deployment" for c in obj["spec"]["template"]["spec"]["containers"]]
    assert any(a[i:i + 2] == ["--max-model-len", "4096"] for a in args for i in range(len(a)))
