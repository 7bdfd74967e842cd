"""`simulate --replay DIR` and `validate --measurements CSV` against hostile files: every odd value is exit 2 naming the
file and the field, never exit 3, and every count they read is bounded (max_num_seqs 1e8 took 4 GB)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from servingtopology.cli.main import main

from .test_cli_hardening import FIELDS, GOOD

META: dict[str, Any] = {
    "model": "meta-llama/Llama-2-7b-hf",
    "vllm_version": "0.11.0",
    "engine_kwargs": {"model": "meta-llama/Llama-2-7b-hf", "tensor_parallel_size": 1, "max_num_seqs": 64,
                      "max_num_batched_tokens": 2048, "kv_cache_dtype": "auto"},
    "kv_cache": {"num_gpu_blocks": 4000, "block_size": 16, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True},
    "hardware": {"device_name": "NVIDIA H100 80GB HBM3"},
}
CLUSTER: dict[str, Any] = {"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [{"hardware": "H100", "tp_size": 1}]}]}


def request_rows(n: int = 8) -> list[dict[str, Any]]:
    return [{"request_id": f"r{i}", "input_toks": 200 + 10 * i, "output_toks": 20 + i, "queued_ts": 100.0 + 0.2 * i,
             "first_token_ts": 100.05 + 0.2 * i, "last_token_ts": 100.6 + 0.2 * i} for i in range(n)]


def replay_dir(root: Path, *, meta: Any = None, cluster: Any = None, rows: list[Any] | None = None, name: str = "run") -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(META if meta is None else meta))
    (folder / "config.json").write_text(json.dumps(CLUSTER if cluster is None else cluster))
    (folder / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in (request_rows() if rows is None else rows)))
    return folder


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def with_kw(**kw: Any) -> dict[str, Any]:
    return {**META, "engine_kwargs": {**META["engine_kwargs"], **kw}}


def test_the_well_formed_folder_replays(tmp_path: Path) -> None:
    code, out, err = cli("simulate", "--replay", str(replay_dir(tmp_path)), "--json")
    assert code == 0, err
    assert set(json.loads(out)) == {"ttft_ms", "tpot_ms", "latency_ms"}


# Each row: what a recorded run's file says, and the file and field the exit-2 message must name. Every one exited 3
# (an AttributeError, TypeError or ValueError in load_replay) or, for the counts, ran unbounded.
CASES = [
    ({"meta": {**META, "hardware": "H100"}}, "meta.json hardware"),
    ({"meta": {**META, "engine_kwargs": ["--max-num-seqs", "64"]}}, "meta.json engine_kwargs"),
    ({"meta": {**META, "kv_cache": 7}}, "meta.json kv_cache"),
    ({"meta": with_kw(max_num_seqs="abc")}, "meta.json engine_kwargs.max_num_seqs"),
    ({"meta": with_kw(max_num_seqs=-5)}, "meta.json engine_kwargs.max_num_seqs"),
    ({"meta": with_kw(max_num_seqs=1e8)}, "meta.json engine_kwargs.max_num_seqs"),      # took 4 GB
    ({"meta": with_kw(max_num_seqs=2.5)}, "meta.json engine_kwargs.max_num_seqs"),
    ({"meta": with_kw(tensor_parallel_size=-2)}, "meta.json engine_kwargs.tensor_parallel_size"),
    ({"meta": with_kw(pipeline_parallel_size=10**6)}, "meta.json engine_kwargs.pipeline_parallel_size"),
    ({"meta": with_kw(max_num_batched_tokens=True)}, "meta.json engine_kwargs.max_num_batched_tokens"),
    ({"meta": with_kw(enable_expert_parallel="yes")}, "meta.json engine_kwargs.enable_expert_parallel"),
    ({"meta": with_kw(model=["a"])}, "meta.json engine_kwargs.model"),
    ({"meta": {**META, "kv_cache": {**META["kv_cache"], "num_gpu_blocks": 10**12}}}, "meta.json kv_cache.num_gpu_blocks"),
    ({"meta": {**META, "kv_cache": {**META["kv_cache"], "block_size": 0}}}, "meta.json kv_cache.block_size"),
    ({"meta": {**META, "kv_cache": {**META["kv_cache"], "gpu_memory_utilization": 5}}}, "meta.json kv_cache.gpu_memory_utilization"),
    ({"meta": {**META, "hardware": {"device_name": 42}}}, "meta.json hardware.device_name"),
    ({"meta": [1, 2]}, "meta.json"),
    ({"cluster": {"nodes": [1, 2]}}, "config.json nodes[0]"),                         # nodes of scalars
    ({"cluster": {"nodes": "n"}}, "config.json nodes"),
    ({"cluster": {"nodes": [{"instances": [3]}]}}, "config.json nodes[0].instances[0]"),
    ({"rows": [{"input_toks": 10, "output_toks": 1, "queued_ts": 1.0, "first_token_ts": 1.1, "last_token_ts": 1.5}]},
     "requests.jsonl"),                                                              # one output token short of a TPOT
    ({"rows": [{**r, "output_toks": 10**9} for r in request_rows(2)]}, "requests.jsonl"),
    ({"rows": []}, "requests.jsonl"),
]


@pytest.mark.parametrize(("files", "field"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_an_odd_value_in_a_replay_file_is_exit_2_naming_the_file_and_field(tmp_path: Path, files: dict[str, Any], field: str) -> None:
    code, out, err = cli("simulate", "--replay", str(replay_dir(tmp_path, **files)), "--json")
    assert code == 2, f"exit {code}: {err[-1500:]}"
    fields = [f["field"] for f in json.loads(out.splitlines()[0])["fields"]]
    assert any(f == field or f.startswith(field) for f in fields), fields


def test_a_non_finite_number_in_meta_json_is_refused(tmp_path: Path) -> None:
    folder = replay_dir(tmp_path)
    (folder / "meta.json").write_text(json.dumps(META).replace('"max_num_seqs": 64', '"max_num_seqs": NaN'))
    code, out, _ = cli("simulate", "--replay", str(folder), "--json")
    assert code == 2 and "meta.json" in out


def _validate(tmp_path: Path, **changes: str) -> tuple[int, str, str]:
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        w.writerow(dict(GOOD, **changes))
    return cli("validate", "--measurements", str(path), "--json")


@pytest.mark.parametrize("concurrency", ["0", "100001", "1" + "0" * 50])
def test_validate_bounds_silicon_concurrency_and_names_it(tmp_path: Path, concurrency: str) -> None:
    code, _, err = _validate(tmp_path, silicon_data_source=f"silicon_concurrency={concurrency}")
    assert code == 2 and "silicon_concurrency" in err and "rows.csv" in err


def test_validate_takes_a_concurrency_within_the_bound(tmp_path: Path) -> None:
    code, out, err = _validate(tmp_path, silicon_data_source="silicon_concurrency=0064")
    assert code == 0, err
    assert json.loads(out)["predicted"] == 1


@pytest.mark.parametrize(("column", "value"), [("pp_size", "9999999"), ("tp_size", "16385"), ("batch_size", "100001"),
                                               ("attention_dp_size", "20000")])
def test_validate_bounds_parallel_and_batch_sizes_and_names_the_column(tmp_path: Path, column: str, value: str) -> None:
    code, _, err = _validate(tmp_path, **{column: value})     # pp_size 9,999,999 was predicted (a 273,960 % error)
    assert code == 2 and column in err
