"""CLI ergonomics: what-if flags without a file (held to the spec's own validation, errors naming the flag), duplicate
YAML keys refused wherever the CLI reads YAML (exit 2 naming the key and its line), and `concurrency` refused by
`plan` with the reason (the README says so too)."""

import json
from pathlib import Path

import pytest

from servingtopology.cli.main import main

FLAGS = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100_sxm", "--max-gpus", "4", "--rate", "5", "--isl", "1000",
         "--osl", "200", "--ttft-p95", "500", "--tpot-p95", "50"]
SAME_AS_FILE = ("model: meta-llama/Llama-3.1-8B-Instruct\nprecision: bf16\nengine: vllm\nhardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 4}\n"
                "workload: {arrivalRate: 5, inputTokens: 1000, outputTokens: 200}\nslo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n"
                "objective: goodput-per-gpu\n")


def _plan_json(capsys, *argv):
    assert main(["plan", *argv, "--json", "--no-simulate"]) == 0
    return json.loads(capsys.readouterr().out)


def test_flags_plan_what_a_file_with_the_same_fields_plans(tmp_path, capsys):
    spec = tmp_path / "same.yaml"
    spec.write_text(SAME_AS_FILE)
    by_flags, by_file = _plan_json(capsys, *FLAGS), _plan_json(capsys, str(spec))
    for key in ("best", "alternatives", "kv_bytes_per_token", "candidates_total"):
        assert by_flags[key] == by_file[key]


def test_a_flag_overrides_the_files_field_and_a_rate_replaces_a_concurrency(tmp_path, capsys):
    spec = tmp_path / "closed.yaml"
    spec.write_text(SAME_AS_FILE.replace("arrivalRate: 5", "concurrency: 16"))
    d = _plan_json(capsys, str(spec), "--rate", "7")
    assert any("at 7 req/s" in r for r in d["reasons"])


@pytest.mark.parametrize(("argv", "named"), [
    (["--max-gpus", "0"], "--max-gpus (hardware.maxGPUs)"),
    (["--rate", "fast"], "--rate (workload.arrivalRate)"),
    (["--gpu", "v100"], "--gpu (hardware.gpu)"),
    (["--ttft-p95", "-5"], "--ttft-p95 (slo.ttftMs)"),
    (["--layouts", "replicas,rings"], "--layouts (search.layouts"),
    (["--tpot-p99.9", "0"], "--tpot-p99.9 (slo.tpotMs)"),
    (["--ttft-p50", "soon"], "--ttft-p50 (slo.ttftMs.p50)"),
    (["--ttft-p95", "200", "--ttft-p99", "400"], "--ttft-p95 and --ttft-p99 (slo.ttftMs): give one of them"),
])
def test_a_bad_flag_exits_2_naming_the_flag_and_its_field(argv, named, capsys):
    assert main(["plan", *argv]) == 2
    assert named in capsys.readouterr().err


DUPLICATE = ("model: meta-llama/Llama-2-7b-hf\nhardware: {gpu: a100_sxm, maxGPUs: 8}\n"
             "workload: {arrivalRate: 32, inputTokens: 512, outputTokens: 128}\n"
             "slo: {ttftMs: {p95: 200}, tpotMs: {p95: 35}}\nslo: {ttftMs: {p95: 900}, tpotMs: {p95: 90}}\n")


@pytest.mark.parametrize("command", [["plan"], ["simulate"], ["sweep", "--concurrency", "1"], ["compare", "--layout", "8xTP1"]])
def test_a_duplicate_key_is_refused_naming_the_key_and_line(command, tmp_path, capsys):
    spec = tmp_path / "dup.yaml"
    spec.write_text(DUPLICATE)
    assert main([command[0], str(spec), *command[1:]]) == 2
    assert "duplicate key 'slo' at line 5 (first at line 4)" in capsys.readouterr().err


def test_a_nested_duplicate_and_the_baseline_file_are_refused_too(tmp_path, capsys):
    spec = tmp_path / "nested.yaml"
    spec.write_text(DUPLICATE.replace("slo: {ttftMs: {p95: 900}, tpotMs: {p95: 90}}\n", "").replace(
        "hardware: {gpu: a100_sxm, maxGPUs: 8}", "hardware:\n  gpu: a100_sxm\n  maxGPUs: 8\n  maxGPUs: 64"))
    assert main(["plan", str(spec)]) == 2
    assert "duplicate key 'maxGPUs' at line 5 (first at line 4)" in capsys.readouterr().err
    base = tmp_path / "observed.yaml"
    base.write_text("ttftMs: 100\nttftMs: 300\n")
    assert main(["plan", "--baseline", str(base)]) == 2
    assert "duplicate key 'ttftMs' at line 2" in capsys.readouterr().err


def test_the_emulators_traffic_profile_refuses_a_duplicate_key(tmp_path):
    import yaml

    from servingtopology.cli.emulate import _load_profile

    profile = tmp_path / "traffic.yaml"
    profile.write_text("phases:\n  - {seconds: 10, rate: 1}\nphases:\n  - {seconds: 10, rate: 9}\n")
    with pytest.raises(yaml.YAMLError, match="duplicate key 'phases' at line 3"):
        _load_profile(profile)


def test_plan_refuses_concurrency_with_the_reason_and_the_readme_does_not_offer_it(tmp_path, capsys):
    spec = tmp_path / "closed.yaml"
    spec.write_text(SAME_AS_FILE.replace("arrivalRate: 5", "concurrency: 16"))
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "workload.arrivalRate" in err and "sweep" in err
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    spec_block = readme.split("A planning spec (YAML", 1)[1].split("```", 2)[1]
    rate_line = next(line for line in spec_block.splitlines() if "arrivalRate" in line)
    assert "concurrency" not in rate_line or "not plan" in rate_line


@pytest.mark.parametrize("percentile", ["p50", "p90", "p95", "p99", "p99.9"])
def test_every_percentile_the_spec_accepts_has_a_flag_planning_what_the_file_plans(percentile, tmp_path, capsys):
    spec = tmp_path / "pct.yaml"
    spec.write_text(SAME_AS_FILE.replace("ttftMs: {p95: 500}", f"ttftMs: {{{percentile}: 500}}")
                    .replace("tpotMs: {p95: 50}", f"tpotMs: {{{percentile}: 50}}"))
    flags = [*FLAGS[:-4], f"--ttft-{percentile}", "500", f"--tpot-{percentile}", "50"]
    by_flags, by_file = _plan_json(capsys, *flags), _plan_json(capsys, str(spec))
    assert by_flags["best"] == by_file["best"]
    assert f"{percentile} TTFT" in " ".join(by_flags["reasons"])


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_two_percentiles_of_one_metric_are_refused_by_every_command_naming_both_flags(command, capsys):
    extra = ["--layout", "1xTP1"] if command == "compare" else ["--concurrency", "1"]
    assert main([command, *extra, "--tpot-p50", "20", "--tpot-p90", "30"]) == 2
    assert "--tpot-p50 and --tpot-p90 (slo.tpotMs)" in capsys.readouterr().err
