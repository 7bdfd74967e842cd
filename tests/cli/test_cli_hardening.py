"""The CLI on hostile input (issue #17): no traceback, exit 2 naming the field, bounded work.

Each test names the defect it pins; every one of them failed on main before the bounds landed (a traceback
reported as exit 3, a NaN SLO read as "infeasible", an unbounded value admitted, a malformed CSV read as fine).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from servingtopology.cli.main import main
from servingtopology.spec import SpecError, parse_spec

BASE = {"model": "meta-llama/Llama-2-7b-hf", "hardware": {"gpu": "a100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
        "workload": {"arrivalRate": 4, "inputTokens": 512, "outputTokens": 128},
        "slo": {"ttftMs": {"p95": 200}, "tpotMs": {"p95": 35}}, "search": {"preset": "narrow"}}


def _spec(tmp_path: Path, spec: dict | None = None, *, raw: bytes | None = None, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(raw if raw is not None else yaml.safe_dump(spec).encode())
    return str(path)


def _with(**changes: object) -> dict:
    spec = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        node = spec
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return spec


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    return code, out, err


def _fields(spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    return dict(err.value.errors)


# ---- spec files that raised tracebacks (exit 3 "internal error") ---------------------------------------------
def test_a_spec_that_is_not_utf8_exits_2_naming_the_spec(tmp_path, capsys):
    code, _, err = _run(capsys, "plan", _spec(tmp_path, raw=b'model: "\xff\xfe"\n'), "--no-simulate")
    assert code == 2 and "spec:" in err and "not UTF-8" in err


def test_a_deeply_nested_spec_exits_2_naming_the_spec(tmp_path, capsys):
    code, _, err = _run(capsys, "plan", _spec(tmp_path, raw=b"a: " + b"[" * 5000 + b"]" * 5000), "--no-simulate")
    assert code == 2 and "nested deeper than 32" in err


def test_yaml_aliases_that_expand_to_millions_of_values_are_refused(tmp_path, capsys):
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    code, _, err = _run(capsys, "plan", _spec(tmp_path, raw="\n".join(lines).encode()), "--no-simulate")
    assert code == 2 and "aliases" in err


def test_a_negative_seed_exits_2_naming_simulation_seed(tmp_path, capsys):
    spec = _with(simulation={"seed": -1, "requests": 20}, layout={"replicas": 1})
    code, _, err = _run(capsys, "simulate", _spec(tmp_path, spec))
    assert code == 2 and "simulation.seed" in err


@pytest.mark.parametrize("raw", [b'{"num_hidden_layers": 1e400, "hidden_size": 4096}', b'{"hidden_size": "\xff"}',
                                 b'{"num_hidden_layers": NaN}', b"[" * 100_000])
def test_a_bad_model_config_exits_2_naming_model_config(tmp_path, capsys, raw):
    (tmp_path / "config.json").write_bytes(raw)
    spec = {k: v for k, v in _with(modelConfig=str(tmp_path / "config.json")).items() if k != "model"}
    code, _, err = _run(capsys, "plan", _spec(tmp_path, spec), "--no-simulate")
    assert code == 2 and "modelConfig:" in err


# ---- values that were admitted --------------------------------------------------------------------------------
@pytest.mark.parametrize("bound", [".nan", ".inf"])
def test_a_nan_or_inf_slo_bound_exits_2_naming_the_field(tmp_path, capsys, bound):
    # NaN exited 1 "infeasible" and inf planned (exit 0)
    text = yaml.safe_dump(BASE).replace("p95: 200", f"p95: {bound}").encode()
    code, _, err = _run(capsys, "plan", _spec(tmp_path, raw=text), "--no-simulate")
    assert code == 2 and "slo.ttftMs" in err


@pytest.mark.parametrize(("changes", "field"), [
    ({"layout": {"replicas": 1, "engineArgs": {"maxNumSeqs": 100_000_000}}}, "layout.engineArgs.maxNumSeqs"),  # 8 GB
    ({"layout": {"replicas": 1, "engineArgs": {"maxNumBatchedTokens": 10**12}}}, "layout.engineArgs.maxNumBatchedTokens"),
    ({"layout": {"replicas": 64, "tp": 128, "pp": 64, "dp": 64}}, "layout.tp"),
    ({"layout": {"replicas": 64, "tp": 64, "pp": 64, "dp": 64}}, "layout"),  # 16.7M GPUs were simulated
    ({"layout": {"replicas": 100_000}}, "layout.replicas"),
    ({"layout": {"kind": "pd", "prefill": {"count": 10**9}, "decode": {"count": 1}}}, "layout.prefill.count"),
    ({"simulation": {"requests": 1_000_000}}, "simulation.requests"),
    ({"simulation": {"seed": 2**70}}, "simulation.seed"),
    ({"simulation": {"warmupRequests": 10**12}}, "simulation.warmupRequests"),
    ({"search": {"preset": "narrow", "maxNumSeqs": [10**9]}}, "search.maxNumSeqs.0"),
    ({"search": {"preset": "narrow", "tp": list(range(1, 40))}}, "search.tp"),
    ({"workload": {"arrivalRate": 1e12, "inputTokens": 512, "outputTokens": 128}}, "workload.arrivalRate"),
    ({"workload": {"concurrency": 10**9, "inputTokens": 512, "outputTokens": 128}}, "workload.concurrency"),
    ({"workload": {"arrivalRate": float("inf"), "inputTokens": 512, "outputTokens": 128}}, "workload.arrivalRate"),
    ({"workload": {"arrivalRate": 4, "inputTokens": {"distribution": "empirical", "values": [-5, 0]}, "outputTokens": 128}},
     "workload.inputTokens.values.0"),
    ({"workload": {"arrivalRate": 4, "inputTokens": {"distribution": "lognormal", "mean": 500, "sigma": 1e6}, "outputTokens": 128}},
     "workload.inputTokens.sigma"),
    ({"slo": {"ttftMs": {"p95": 1e300}, "tpotMs": {"p95": 35}}}, "slo.ttftMs"),
    ({"model": "x" * 131_072}, "model"),
    ({"hardware": {"gpu": "a100_sxm", "maxGPUs": 8, "nvlinkGBps": 1e300}}, "hardware.nvlinkGBps"),
    ({"engine": {"name": "vllm", "extraArgs": ["--x"] * 1000}}, "engine.extraArgs"),
    ({"engine": {"name": "vllm", "image": "i" * 10_000}}, "engine.image"),
])
def test_every_number_has_a_maximum_and_every_string_a_length(changes, field):
    errors = _fields(_with(**changes))
    assert field in errors, errors
    assert all(len(m) < 400 for m in errors.values()), errors  # a 131,072-character input is not echoed back


@pytest.mark.parametrize(("changes", "words"), [
    # 2,000 requests of 100k output tokens at maxNumSeqs 1: 2e8 engine steps, 14 GB in the simulator
    ({"workload": {"arrivalRate": 100, "inputTokens": 1000, "outputTokens": 100_000}, "layout": {"replicas": 1, "engineArgs": {"maxNumSeqs": 1}},
      "simulation": {"requests": 2000}}, "200,000,000 engine steps"),
    # 200k requests of 101k tokens: 2e10 tokens, minutes of CPU
    ({"workload": {"arrivalRate": 100, "inputTokens": 1000, "outputTokens": 100_000}, "simulation": {"requests": 200_000}},
     "20,200,000,000 tokens"),
])
def test_a_simulation_is_held_to_a_token_and_step_budget(changes, words):
    errors = _fields(_with(**changes))
    assert words in errors["simulation.requests"], errors


def test_a_layout_over_the_gpu_budget_is_refused_naming_layout():
    errors = _fields(_with(layout={"replicas": 4, "tp": 4}))  # 16 GPUs, maxGPUs 8
    assert "over hardware.maxGPUs (8)" in errors["layout"]


def test_a_layout_whose_tp_spans_nodes_is_refused_unless_allowed(tmp_path, capsys):
    spec = _with(hardware={"gpu": "a100_sxm", "gpusPerNode": 8, "maxGPUs": 16}, layout={"replicas": 1, "tp": 16}, simulation={"requests": 20})
    code, _, err = _run(capsys, "simulate", _spec(tmp_path, spec))
    assert code == 2 and "layout.tp: TP 16 spans more than one 8-GPU node" in err
    pd = _with(hardware={"gpu": "a100_sxm", "gpusPerNode": 8, "maxGPUs": 32},
               layout={"kind": "pd", "prefill": {"count": 1, "tp": 16}, "decode": {"count": 1}}, simulation={"requests": 20})
    code, _, err = _run(capsys, "simulate", _spec(tmp_path, pd))
    assert code == 2 and "layout.prefill.tp" in err
    spec["hardware"]["allowCrossNodeTP"] = True
    code, _, err = _run(capsys, "simulate", _spec(tmp_path, spec))
    assert code == 0


def test_the_bounds_admit_the_largest_real_settings():
    spec = parse_spec(_with(hardware={"gpu": "h200_sxm", "maxGPUs": 4096}, layout={"replicas": 64, "tp": 8, "pp": 8, "engineArgs": {
        "maxNumSeqs": 65_536, "maxNumBatchedTokens": 2_097_152}}, simulation={"requests": 200_000, "seed": 2**32 - 1}))
    assert spec.layout is not None and spec.layout.gpus() == 4096


@pytest.mark.parametrize(("argv", "field"), [
    (["--concurrency", "10000000"], "--concurrency"),
    (["--concurrency", ",".join(["1"] * 200)], "--concurrency"),
    (["--concurrency", "9" * 5000], "--concurrency"),
    (["--concurrency", "64", "--requests-per-client", "1000000"], "--requests-per-client"),
])
def test_sweep_work_is_bounded_and_the_option_named(tmp_path, capsys, argv, field):
    code, _, err = _run(capsys, "sweep", _spec(tmp_path, _with(layout={"replicas": 1})), *argv)
    assert code == 2 and f"  {field}:" in err and len(err) < 600


# ---- simulate --trace ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "raw", "field"), [
    ("t.jsonl", b'{"arrival_s": 0, "input_tokens": 1e400, "output_tokens": 10}\n', "trace"),
    ("t.jsonl", b"[1, 2]\n", "trace line 1"),
    ("t.jsonl", b'{"arrival_s": 0, "input_tokens": "\xff", "output_tokens": 10}\n', "trace line 1"),
    ("t.jsonl", b'{"arrival_s": 0, "input_tokens": 1e12, "output_tokens": 10}\n', "trace"),
    ("t.csv", b"arrival_s,input_tokens,output_tokens\nnan,100,10\n", "trace"),
    ("t.csv", b"arrival_s,input_tokens,output_tokens\n0,100," + b"9" * 140_000 + b"\n", "trace line"),
])
def test_a_bad_trace_exits_2_naming_the_trace(tmp_path, capsys, name, raw, field):
    (tmp_path / name).write_bytes(raw)
    spec = _spec(tmp_path, _with(layout={"replicas": 1}, simulation={"requests": 20}))
    code, _, err = _run(capsys, "simulate", spec, "--trace", str(tmp_path / name))
    assert code == 2 and f"  {field}" in err


# ---- validate -------------------------------------------------------------------------------------------------
FIELDS = ["id", "silicon_data_source", "backend", "model_path", "system", "mode", "isl", "osl", "gemm_quant_mode", "moe_quant_mode",
          "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms"]
GOOD = {"id": "r1", "silicon_data_source": "silicon_concurrency=4", "backend": "vllm", "model_path": "meta-llama/Llama-3.1-8B-Instruct",
        "system": "h100_sxm", "mode": "agg", "isl": "1024", "osl": "256", "gemm_quant_mode": "bf16", "moe_quant_mode": "bf16",
        "batch_size": "4", "tp_size": "1", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
        "silicon_ttft_ms": "50", "silicon_tpot_ms": "10"}


def _csv(tmp_path: Path, rows: list[dict[str, str]], *, replace: tuple[bytes, bytes] | None = None) -> str:
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        w.writerows(rows)
    if replace:
        path.write_bytes(path.read_bytes().replace(*replace))
    return str(path)


@pytest.mark.parametrize(("rows", "replace", "reason"), [
    ([dict(GOOD, isl="inf")], None, "non-finite"),                      # crashed (OverflowError)
    ([dict(GOOD, silicon_tpot_ms="nan")], None, "non-finite"),
    ([dict(GOOD, silicon_data_source="x" * 131_072)], None, "over 4,096"),  # csv.Error at the field limit
    ([dict(GOOD, silicon_data_source="x" * 131_073)], None, "csv module's limit"),
    ([GOOD], (b"h100_sxm", b"h100\xff"), "not UTF-8"),                  # crashed (UnicodeDecodeError)
    ([dict(GOOD, isl="abc")], None, "bad value"),                       # exited 0 with nothing read
    ([], None, "no data rows"),
])
def test_validate_exits_2_when_no_row_can_be_read_and_names_why(tmp_path, capsys, rows, replace, reason):
    code, _, err = _run(capsys, "validate", "--measurements", _csv(tmp_path, rows, replace=replace), "--json")
    assert code == 2 and "--measurements: no row" in err and reason in err


def test_validate_counts_malformed_rows_and_reads_the_rest(tmp_path, capsys):
    rows = [GOOD, dict(GOOD, id="r2", isl="inf"), dict(GOOD, id="r3", silicon_data_source="x" * 131_073), dict(GOOD, id="r4", osl="-inf")]
    code, out, err = _run(capsys, "validate", "--measurements", _csv(tmp_path, rows), "--json")
    summary = json.loads(out)
    assert code == 0 and summary["rows"] == 4 and summary["skipped"]["count"] == 3  # rows counts the skipped ones too
    assert summary["skipped"]["by_reason"]["malformed row: a non-finite number (inf, nan)"] == 2
    assert "2 malformed rows: a non-finite number" in err and "1 malformed row: a field over the csv module's limit" in err
