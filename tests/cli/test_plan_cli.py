"""`servingtopology plan`: the command-line contract (JSON keys, exit codes, record, plot)."""

import json

from servingtopology.cli.main import main


def test_plan_json_has_the_contract_keys(capsys):
    assert main(["plan", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"funnel", "candidates_total", "best", "alternatives", "kv_bytes_per_token", "record"} <= set(d)
    assert all({"stage", "admitted", "rejected", "seconds"} <= set(s) for s in d["funnel"])
    assert d["kv_bytes_per_token"] == 524288
    assert "215 ms" in d["record"] and "21.5 ms" in d["record"]
    assert "--tensor-parallel-size" in " ".join(next(iter(d["best"]["engine_args"].values())))


def test_a_bad_spec_exits_2_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nengine: vllm\nhardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 0}\n"
                   "workload: {arrivalRate: 5, inputTokens: 1000, outputTokens: 200}\nslo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n")
    assert main(["plan", str(bad)]) == 2
    assert "hardware.maxGPUs" in capsys.readouterr().err


def test_an_unknown_gpu_exits_2_with_the_allowed_ids(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-3.1-8b\nhardware: {gpu: v100, maxGPUs: 4}\nworkload: {arrivalRate: 5, inputTokens: 100, outputTokens: 20}\n"
                   "slo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n")
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "hardware.gpu" in err and "h100_sxm" in err


def test_an_infeasible_spec_exits_1_and_names_the_stage(tmp_path, capsys):
    spec = tmp_path / "tight.yaml"
    spec.write_text("model: llama-3.1-405b\nhardware: {gpu: h100_sxm, maxGPUs: 4}\nworkload: {arrivalRate: 5, inputTokens: 100, outputTokens: 20}\n"
                    "slo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n")
    assert main(["plan", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "No feasible layout" in out and "3 memory and context" in out


def test_record_and_plot_files_are_written(tmp_path, capsys):
    record, plot = tmp_path / "r.md", tmp_path / "p.png"
    assert main(["plan", "--record", str(record), "--plot", str(plot), "--no-progress"]) == 0
    assert record.read_text().startswith("# Topology decision record")
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert "Funnel" in capsys.readouterr().out


def test_plan_reads_a_servingtopology_resource_from_its_spec(capsys):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "servingtopology.yaml"
    assert main(["plan", str(example), "--json", "--no-simulate"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["gpus"] >= 1


def test_simulate_without_a_layout_takes_the_layout_plan_names(capsys):
    from pathlib import Path

    # On this spec the simulated top K reorders the analytical ranking, so the two ways of choosing differ.
    example = str(Path(__file__).resolve().parents[2] / "examples" / "plan-llama70b-wide.yaml")
    assert main(["plan", example, "--json", "--no-progress"]) == 0
    planned = json.loads(capsys.readouterr().out)["best"]["label"]
    assert main(["simulate", example, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"] == planned


def test_version_prints_the_package_version(capsys):
    from servingtopology import __version__
    from servingtopology.cli.main import main

    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"servingtopology {__version__}"


def test_a_reader_closing_the_pipe_ends_plan_quietly():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "servingtopology", "plan", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_an_internal_error_exits_3_not_1(monkeypatch, capsys):
    from servingtopology.cli import main as cli_main
    from servingtopology.cli import plan as plan_cmd

    def broken(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(plan_cmd, "run", broken)
    monkeypatch.delenv("SERVINGTOPOLOGY_DEBUG", raising=False)
    assert cli_main.main(["plan"]) == cli_main.INTERNAL_ERROR == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "ZeroDivisionError" in err and "Traceback" not in err
