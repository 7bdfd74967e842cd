"""`plan` prints engine command lines a person can paste: the pods' own command, shell-quoted, accepted by the
release's parser (rebuilt from the recorded parser data, planner/data/engine_caps, by the emulator's strict reader)."""

import json
import shlex

import pytest

from servingtopology.cli.main import main
from servingtopology.emulator.command_parser import parse_engine_command
from servingtopology.planner.layout import Role

BASE = ("hardware: {{gpu: h100_sxm, gpusPerNode: {per_node}, maxGPUs: 16}}\n"
        "workload: {{arrivalRate: 2, inputTokens: 1000, outputTokens: 100}}\nslo: {{ttftMs: {{p95: 100000}}, tpotMs: {{p95: 10000}}}}\n")
PD = "layout: {kind: pd, prefill: {count: 1, tp: 2}, decode: {count: 2, tp: 2}}\n"
REPLICAS = "layout: {kind: replicas, replicas: 2, tp: 4}\n"
WIDE = "layout: {kind: replicas, replicas: 1, tp: 8, pp: 2}\n"

# (engine line, model line, layout, GPUs per node, the program's words, how the model is passed)
CASES = [
    ("engine: vllm", "model: llama-3.1-8b", REPLICAS, 8, ["vllm", "serve"], "meta-llama/Llama-3.1-8B-Instruct"),  # catalog id -> its HF id
    ("engine: vllm", "model: meta-llama/Llama-3.1-8B-Instruct", PD, 8, ["vllm", "serve"], "meta-llama/Llama-3.1-8B-Instruct"),
    ("engine: sglang", "model: meta-llama/Llama-3.1-8B-Instruct", REPLICAS, 8, ["python3", "-m", "sglang.launch_server"],
     "meta-llama/Llama-3.1-8B-Instruct"),
    ("engine: sglang", "model: meta-llama/Llama-3.1-8B-Instruct", PD, 8, ["python3", "-m", "sglang.launch_server"],
     "meta-llama/Llama-3.1-8B-Instruct"),
    ("engine: vllm", "model: meta-llama/Llama-3.1-70B", WIDE, 8, ["vllm", "serve"], "meta-llama/Llama-3.1-70B"),  # spans 2 nodes
]


def _plan_json(tmp_path, text, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert main(["plan", str(spec), "--json", "--no-simulate"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("engine", "model", "layout", "per_node", "program", "loads"), CASES)
def test_printed_commands_parse_with_the_engines_recorded_parser(tmp_path, capsys, engine, model, layout, per_node, program, loads):
    d = _plan_json(tmp_path, f"{model}\n{engine}\n{layout}" + BASE.format(per_node=per_node), capsys)
    best = d["best"]
    commands = best["engine_commands"]
    assert set(commands) == set(best["engine_args"])
    for role, c in commands.items():
        argv = shlex.split(c["command"])
        assert argv[:len(program)] == program
        if program[0] == "vllm":
            assert argv[2] == loads                                # `vllm serve MODEL …`
        else:
            assert argv[argv.index("--model-path") + 1] == loads
        cfg = parse_engine_command(argv)  # the newest covered release, as planned
        assert cfg.model == loads and cfg.role is Role(role)
        layout_role = best["layout_spec"].get(role, best["layout_spec"])
        assert cfg.tp == layout_role["tp"]
        assert cfg.pp == layout_role.get("pp", 1)
        # the plan's own arguments are all there, in order, as one contiguous run
        plan_args = best["engine_args"][role]
        assert any(argv[i:i + len(plan_args)] == plan_args for i in range(len(argv)))
        if c["nodes"] > 1:
            assert len(c["worker_commands"]) == c["nodes"] - 1
            for node, line in enumerate(c["worker_commands"], start=1):
                argv = shlex.split(line)
                assert parse_engine_command(argv).nodes == c["nodes"] == cfg.nodes
                assert argv[argv.index("--node-rank") + 1] == str(node) and "$(" not in line


def test_pd_kv_transfer_config_is_one_shell_word(tmp_path, capsys):
    d = _plan_json(tmp_path, "model: meta-llama/Llama-3.1-8B-Instruct\nengine: vllm\n" + PD + BASE.format(per_node=8), capsys)
    for role, c in d["best"]["engine_commands"].items():
        argv = shlex.split(c["command"])
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        assert "'{" in c["command"]                                  # quoted for the shell, not bare braces


def test_the_text_output_prints_the_same_lines(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nengine: sglang\n" + PD + BASE.format(per_node=8))
    assert main(["plan", str(spec), "--json", "--no-simulate"]) == 0
    commands = json.loads(capsys.readouterr().out)["best"]["engine_commands"]
    assert main(["plan", str(spec), "--no-simulate", "--no-progress"]) == 0
    text = capsys.readouterr().out
    for c in commands.values():
        assert f"    {c['command']}\n" in text
    assert "sglang --tp-size" not in text and "python3 -m sglang.launch_server --model-path" in text


def test_extra_args_come_last_as_in_the_pods(tmp_path, capsys):
    d = _plan_json(tmp_path, "model: meta-llama/Llama-3.1-8B-Instruct\nengine: {name: vllm, extraArgs: ['--max-model-len', '16384']}\n"
                   + REPLICAS + BASE.format(per_node=8), capsys)
    argv = shlex.split(d["best"]["engine_commands"]["aggregated"]["command"])
    assert argv[-2:] == ["--max-model-len", "16384"]
    assert parse_engine_command(argv).tp == 4
