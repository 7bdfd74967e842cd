"""Seed 000's blocker on every command: a pinned SGLang PD layout of a GLM-5-class MoE whose prefill rank cannot hold a
510,012-token prompt is refused by `plan` (with and without simulation), `simulate --trace` and `compare` alike: exit 1,
naming the role, the rank pool and the request, never planned as meeting the SLOs or simulated into tables of nan."""

import json

import pytest

from servingtopology.cli.main import main
from servingtopology.cli.spec_input import read_spec
from servingtopology.planner.layout import Role
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.spec import to_problem
from tests.planner.model_configs import CONFIGS

PROMPT, OUTPUT = 510_012, 8_192


def _spec(tmp_path, prefill_fraction):
    config = json.loads((CONFIGS / "glm-5-nvfp4.json").read_text())
    config["max_position_embeddings"] = 524_288   # the seed's 524,288-token context cap
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"modelConfig: {tmp_path / 'config.json'}\nmodelSource: zai-org/GLM-5-NVFP4\nprecision: fp4\nkvCacheDtype: fp8\n"
        "engine: {name: sglang}\nhardware: {gpu: b200_sxm, maxGPUs: 24}\n"
        f"workload: {{arrivalRate: 0.02, inputTokens: {PROMPT}, outputTokens: {OUTPUT}}}\n"
        "slo: {ttftMs: {p95: 600000}, tpotMs: {p95: 100}}\n"
        "layout:\n  kind: pd\n  engineArgs: {memoryFraction: 0.6}\n"
        f"  prefill: {{count: 3, tp: 1, dp: 4, engineArgs: {{memoryFraction: {prefill_fraction}}}}}\n  decode: {{count: 1, tp: 8}}\n")
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_time": 30.0 * i, "input_tokens": PROMPT - 2_000 * i, "output_tokens": OUTPUT}) + "\n"
                             for i in range(4)))
    return spec, trace


def _prefill_pool(spec):
    problem = to_problem(read_spec(str(spec)))
    assert problem.pinned is not None
    r = problem.pinned.roles[Role.PREFILL]
    return kv_pool_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision, parallelism=r.parallelism,
                          knobs=r.knobs)


@pytest.mark.parametrize("prefill_fraction", [
    0.6,   # the seed's memoryFraction: the prefill rank keeps no pool at all
    0.7,   # a pool of about 300k tokens per rank: short of the prompt (the seed's 328k-token pool)
])
@pytest.mark.parametrize("command", [
    ["plan", "--no-simulate", "--no-progress"],
    ["plan", "--no-progress"],
    ["simulate", "--trace"],
    ["compare"],
])
def test_a_pinned_pd_layout_whose_prefill_rank_cannot_hold_the_prompt_is_refused_by_every_command(tmp_path, capsys, command,
                                                                                                  prefill_fraction):
    spec, trace = _spec(tmp_path, prefill_fraction)
    pool = _prefill_pool(spec)
    assert pool < PROMPT
    argv = [command[0], str(spec), *command[1:]]
    if command[0] == "simulate":
        argv.append(str(trace))
    if command[0] == "compare":
        argv += ["--layout", f"{{kind: pd, prefill: {{count: 3, tp: 1, dp: 4, engineArgs: {{memoryFraction: {prefill_fraction}}}}}, "
                             "decode: {count: 1, tp: 8, engineArgs: {memoryFraction: 0.6}}}"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "layout.prefill" in text and f"{PROMPT:,}" in text
    assert (f"holds {pool:,} KV tokens" if pool else "no KV pool") in text
    assert not any(word in text.split() for word in ("inf", "nan")) and "SLOs met" not in text


def test_the_record_of_a_pd_pin_states_what_its_prefill_rank_holds(tmp_path, capsys):
    spec, _ = _spec(tmp_path, 0.9)
    pool = _prefill_pool(spec)
    assert main(["plan", str(spec), "--no-simulate", "--no-progress", "--record"]) == 0
    out = capsys.readouterr().out
    assert f"prompts of up to {min(pool, 524_288):,} on a prefill rank" in out
