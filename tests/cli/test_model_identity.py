"""A model given by its config.json alone gets a real name and weights to load: modelSource and servedModelName, or a
checkpoint folder, or the config's Hugging Face _name_or_path; otherwise exit 2 naming modelSource, never `--model-path .`.
The CLI's printed commands, its record and the operator's pods use one rule (spec.model_identity)."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from servingtopology.cli.main import main
from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.pass_context import blueprint_for
from servingtopology.planner.layout import Layout, Parallelism
from servingtopology.spec import model_identity, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "planner" / "data" / "models" / "meta-llama_Llama-3.1-8B-Instruct.json"
REST = ("engine: sglang\nhardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 8}\n"
        "workload: {arrivalRate: 1, inputTokens: 1000, outputTokens: 100}\nslo: {ttftMs: {p95: 6000}, tpotMs: {p95: 100}}\n"
        "layout: {kind: replicas, replicas: 1, tp: 1}\n")


def _plan(tmp_path, monkeypatch, capsys, head: str, config: dict | None = None, where: str = "config.json"):
    cfg = json.loads(CONFIG.read_text()) | (config or {})
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(json.dumps(cfg))
    (tmp_path / "spec.yaml").write_text(head + REST)
    monkeypatch.chdir(tmp_path)
    code = main(["plan", "spec.yaml", "--json", "--no-simulate"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


def _argv(plan: dict) -> list[str]:
    return shlex.split(plan["best"]["engine_commands"]["aggregated"]["command"])


def test_a_config_json_alone_in_the_working_folder_is_refused_naming_model_source(tmp_path, monkeypatch, capsys):
    code, _, err = _plan(tmp_path, monkeypatch, capsys, "modelConfig: config.json\n")
    assert code == 2 and "modelSource" in err and "--model-path ." not in err


def test_a_checkpoint_folder_is_what_the_engine_loads_and_serves(tmp_path, monkeypatch, capsys):
    code, plan, _ = _plan(tmp_path, monkeypatch, capsys, "modelConfig: llama8b/config.json\n", where="llama8b/config.json")
    argv = _argv(plan)
    assert code == 0 and argv[argv.index("--model-path") + 1] == "llama8b" and argv[argv.index("--served-model-name") + 1] == "llama8b"
    assert "Topology decision record: llama8b" in plan["record"]


def test_the_configs_hugging_face_name_stands_in_when_no_folder_names_the_weights(tmp_path, monkeypatch, capsys):
    code, plan, _ = _plan(tmp_path, monkeypatch, capsys, "modelConfig: config.json\n",
                          config={"_name_or_path": "acme/llama-8b-tuned"})
    argv = _argv(plan)
    assert code == 0 and argv[argv.index("--model-path") + 1] == "acme/llama-8b-tuned"


def test_model_source_and_served_name_are_rendered_alike_by_the_cli_and_the_operator(tmp_path, monkeypatch, capsys):
    head = "modelConfig: config.json\nmodelSource: /models/llama-8b\nservedModelName: llama-8b-chat\n"
    code, plan, _ = _plan(tmp_path, monkeypatch, capsys, head)
    argv = _argv(plan)
    assert code == 0 and argv[argv.index("--model-path") + 1] == "/models/llama-8b"
    assert argv[argv.index("--served-model-name") + 1] == "llama-8b-chat"
    assert "Topology decision record: llama-8b-chat" in plan["record"]
    obj = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    spec = dict(obj["spec"])
    del spec["model"]
    spec |= {"modelConfigMap": {"name": "arch"}, "modelSource": "/models/llama-8b", "servedModelName": "llama-8b-chat"}
    bp = blueprint_for(parse_topology_spec(spec), Layout.replicas(1, Parallelism()), name="x", namespace="ns", uid="u", gpus_per_node=8)
    assert (bp.model, bp.served_model_name) == ("/models/llama-8b", "llama-8b-chat")


@pytest.mark.parametrize(("model", "source"), [
    ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),            # a catalog id loads (and serves) its Hugging Face id
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
])
def test_a_named_model_loads_and_serves_its_hugging_face_id(model, source):
    spec = parse_spec(yaml.safe_load(f"model: {model}\n" + REST))
    assert model_identity(spec).source == source and model_identity(spec).served_name == source
