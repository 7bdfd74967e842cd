"""The measured kernel tables (planner/data/kernels, planner/engines/kernels.py) and what their generator may read.

The generator (tools/gen_kernel_tables.py) needs the network and never runs here: its member filter is tested on a
fake listing, its committed output on its provenance, and the lookups against raw parquet rows quoted below.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import tomllib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from servingtopology.planner.engines import kernels as K

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "planner" / "data" / "kernels"
PERF_MEMBER = re.compile(r"^systems/data/[^/]+/[^/]+/[^/]+/[^/]+/[^/]+_perf\.parquet$")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_kernel_tables", ROOT / "tools" / "gen_kernel_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files() -> list[tuple[str, str, str]]:
    return [(g, e, v) for g, e, v, _ in K.coverage()]


# ---------------------------------------------------------------- what the generator may read
def test_generator_reads_only_perf_parquet_files_under_systems_data() -> None:
    p = "aiconfigurator_core/"
    names = [
        p + "systems/silicon_sample.csv",                                   # held-out end-to-end rows: never
        p + "systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",     # kept
        p + "systems/data/h100_sxm/comm/nccl/2.27.3/nccl_perf.parquet",     # kept
        p + "systems/data/h100_sxm/gemm/vllm/0.24.0/gemm.yaml",             # not a perf table
        p + "systems/data/h100_sxm/gemm/vllm/0.24.0/silicon_perf.csv",      # not parquet
        p + "systems/data/h100_sxm/silicon_sample_perf.parquet",            # not under <gpu>/<op>/<engine>/<version>/
        p + "systems/silicon_sample_perf.parquet",                          # outside systems/data/
        p + "systems/h100_sxm.yaml",
        "other_pkg/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",  # another package's tree
        p + "systems/data/h100_sxm/gemm/vllm/0.24.0/../../silicon_sample.csv",
    ]
    assert _generator().perf_members(names) == [
        p + "systems/data/h100_sxm/comm/nccl/2.27.3/nccl_perf.parquet",
        p + "systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
    ]


def test_every_file_records_the_wheel_and_only_perf_parquet_sources() -> None:
    index = json.loads((DATA / "index.json").read_text())
    assert index["source"]["distribution"] == "aiconfigurator-core" and index["source"]["version"] == "0.12.0"
    assert re.fullmatch(r"[0-9a-f]{64}", index["source"]["wheel_sha256"])
    assert {f["file"] for f in index["files"]} == {p.name for p in DATA.glob("*.npz")}
    for gpu, engine, version in _files():
        src = K.provenance(gpu, engine, version)
        assert src["version"] == "0.12.0" and src["license"] == "Apache-2.0"
        assert src["wheel_sha256"] == index["source"]["wheel_sha256"]
        assert src["files_sha256"], (gpu, engine, version)
        for path, digest in src["files_sha256"].items():
            assert PERF_MEMBER.match(path) and "silicon_sample" not in path, path
            assert re.fullmatch(r"[0-9a-f]{64}", digest)


def test_tables_are_package_data_and_small() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "servingtopology.planner.data.kernels" in config["packages"]
    assert "*.npz" in config["package-data"]["servingtopology.planner.data.kernels"]
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 5 * 2**20  # 4.0 MiB with GB200, GB300 and B300 (stop 57)


def test_the_four_main_gpus_have_gemm_and_attention_for_both_engines() -> None:
    for gpu in ("h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm"):
        for engine in ("vllm", "sglang"):
            for op in (K.KernelOp.GEMM, K.KernelOp.CONTEXT_ATTENTION, K.KernelOp.GENERATION_ATTENTION, K.KernelOp.ALLREDUCE):
                assert K.resolve_release(gpu, engine, None, op) is not None, (gpu, engine, op)
        assert K.resolve_release(gpu, "nccl", None, K.KernelOp.NCCL) is not None


# ---------------------------------------------------------------- lookups against raw rows
# Rows of the wheel's parquet files (latency column, milliseconds), quoted; the grids store them to 0.05 %.
RAW_GEMM = [
    # (gpu, engine, version, gemm_dtype, m, n, k, latency_ms)
    ("h100_sxm", "vllm", "0.24.0", "bfloat16", 1, 8192, 8192, 0.051638),     # decode: weight streaming
    ("h100_sxm", "vllm", "0.24.0", "fp8_block", 1, 8192, 8192, 0.061371),
    ("h100_sxm", "vllm", "0.24.0", "fp8", 1, 8192, 8192, 0.030148),
    ("h100_sxm", "vllm", "0.24.0", "bfloat16", 8192, 8192, 8192, 1.541708),  # prefill: compute
    ("h100_sxm", "vllm", "0.24.0", "fp8", 8192, 8192, 8192, 0.836148),
    ("h100_sxm", "vllm", "0.24.0", "fp8_block", 8192, 8192, 8192, 0.911301),  # DeepGEMM, the fastest measured there
    ("h100_sxm", "vllm", "0.24.0", "bfloat16", 32768, 65536, 12288, 60.324042),
]


@pytest.mark.parametrize("gpu,engine,version,dtype,m,n,k,ms", RAW_GEMM)
def test_gemm_lookup_returns_the_raw_row_at_a_grid_point(gpu: str, engine: str, version: str, dtype: str, m: int, n: int, k: int,
                                                        ms: float) -> None:
    got = K.gemm_time_s(gpu, engine, version, dtype=dtype, m=m, n=n, k=k)
    assert got.source is not None and got.source.exact
    assert float(got.time_s) == pytest.approx(ms / 1e3, rel=1e-3)


def test_allreduce_and_attention_lookups_return_raw_rows() -> None:
    # custom_allreduce_perf.parquet, H100 vLLM 0.24.0, vLLM_custom_graph, 8 GPUs, 67,108,864 BF16 elements: 0.577395 ms
    got = K.allreduce_s("h100_sxm", "vllm", "0.24.0", gpus=8, message_bytes=2 * 67108864)
    assert float(got.time_s) == pytest.approx(0.577395e-3, rel=1e-3)
    # the eager kernel, 4 GPUs, 536,870,912 elements: 5.2446 ms
    got = K.allreduce_s("h100_sxm", "vllm", "0.24.0", gpus=4, message_bytes=2 * 536870912, graph=False)
    assert float(got.time_s) == pytest.approx(5.2446e-3, rel=1e-3)
    # context_attention_perf.parquet, A100 SGLang 0.5.10: batch 4, isl 16384, 96 heads, 1 KV head, dim 128: 125.228479 ms
    got = K.context_attention_s("a100_sxm", "sglang", "0.5.10", kv_dtype="bfloat16", head_dim=128, kv_heads=1, heads=96, batch=4,
                                isl=16384)
    assert float(got.time_s) == pytest.approx(125.228479e-3, rel=1e-3)


def test_every_measured_grid_point_reads_back_through_its_lookup() -> None:
    ref = ("h200_sxm", "vllm", "0.24.0")
    table = next(t for t in K._release(*ref).tables if t.kind == "generation_attention" and t.variant["kv_dtype"] == "bfloat16")
    idx = np.argwhere(np.isfinite(table.log_s))
    coords = [table.axes[i].values[idx[:, i]] for i in range(len(table.axes))]
    got = K.generation_attention_s(*ref, kv_dtype="bf16", head_dim=coords[0], kv_heads=coords[1], heads=coords[2], batch=coords[3],
                                   kv_len=coords[4])
    assert got.covered.all()
    np.testing.assert_allclose(np.log(got.time_s), table.log_s[tuple(idx.T)], atol=1e-9)


# ---------------------------------------------------------------- shape behaviour
@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_gemm_time_grows_with_tokens_once_compute_bound(gpu: str, engine: str) -> None:
    m = np.array([256, 512, 1024, 2048, 4096, 8192])
    t = K.gemm_time_s(gpu, engine, None, dtype="bf16", m=m, n=8192, k=8192).time_s
    assert np.isfinite(t).all()
    assert (np.diff(t) > 0).all()
    # a decode GEMM streams the same weights whatever the few tokens: within a factor 2 from m=1 to m=64
    small = K.gemm_time_s(gpu, engine, None, dtype="bf16", m=np.array([1, 64]), n=8192, k=8192).time_s
    assert small[1] / small[0] < 2.0


def test_interpolated_times_lie_between_their_neighbours() -> None:
    t = K.gemm_time_s("h100_sxm", "vllm", "0.24.0", dtype="bf16", m=np.array([2048, 2500, 3072]), n=8192, k=8192).time_s
    assert t[0] < t[1] < t[2]
    t = K.context_attention_s("h100_sxm", "vllm", "0.24.0", kv_dtype="bf16", head_dim=128, kv_heads=1, heads=8, batch=1,
                              isl=np.array([1024, 1200, 1536])).time_s
    assert t[0] < t[1] < t[2]


def test_attention_grows_with_context_and_batch() -> None:
    lens = np.array([1024, 4096, 16384])
    for engine in ("vllm", "sglang"):
        dec = K.generation_attention_s("h200_sxm", engine, None, kv_dtype="bf16", head_dim=128, kv_heads=1, heads=8, batch=64, kv_len=lens)
        assert (np.diff(dec.time_s) > 0).all(), engine
        ctx = K.context_attention_s("h200_sxm", engine, None, kv_dtype="bf16", head_dim=128, kv_heads=1, heads=8, batch=1,
                                    isl=lens)
        assert (np.diff(ctx.time_s) > 0).all(), engine
        batches = K.generation_attention_s("h200_sxm", engine, None, kv_dtype="bf16", head_dim=128, kv_heads=1, heads=8,
                                           batch=np.array([16, 64, 128]), kv_len=8192).time_s
        assert (np.diff(batches) > 0).all(), engine


def test_batches_beyond_the_grid_are_covered_only_when_split() -> None:
    def decode(batch: object, split: bool) -> K.KernelTimes:
        return K.generation_attention_s("h100_sxm", "vllm", "0.24.0", kv_dtype="bf16", head_dim=128, kv_heads=1, heads=8,
                                        batch=np.asarray(batch), kv_len=8192, split_batch=split)

    assert not decode(256, False).covered  # 256 sequences of 8,192 tokens were not measured
    split = decode([128, 256, 1024], True)
    half = float(decode(128, False).time_s)
    assert split.covered.all()
    assert split.time_s[0] == pytest.approx(half)      # measured: unchanged
    assert split.time_s[1] == pytest.approx(2 * half)  # two runs of 128
    assert split.time_s[2] == pytest.approx(8 * half)


def test_allreduce_grows_with_message_size() -> None:
    sizes = 2.0 ** np.arange(20, 30)
    for engine in ("vllm", "sglang"):
        t = K.allreduce_s("h100_sxm", engine, None, gpus=8, message_bytes=sizes).time_s
        assert (np.diff(t) > 0).all(), engine
    t = K.nccl_s("b200_sxm", op="all_reduce", gpus=8, message_bytes=sizes).time_s
    assert (np.diff(t) > 0).all()


# ---------------------------------------------------------------- coverage and releases
def test_shapes_outside_the_measured_range_are_nan_so_the_caller_keeps_the_roofline() -> None:
    got = K.gemm_time_s("h100_sxm", "vllm", None, dtype="bf16", m=np.array([1, 10**6]), n=8192, k=8192)
    assert got.covered.tolist() == [True, False]
    # a head dim never measured, three GPUs in an all-reduce: exact axes do not interpolate
    assert not K.context_attention_s("h100_sxm", "vllm", None, kv_dtype="bf16", head_dim=100, kv_heads=1, heads=8, batch=1,
                                     isl=1024).covered
    assert not K.allreduce_s("h100_sxm", "vllm", None, gpus=3, message_bytes=2**20).covered
    # a MoE configuration never measured
    assert not K.moe_s("h100_sxm", "vllm", None, dtype="bf16", hidden=1000, inter=100, topk=2, experts=8, moe_tp=1, moe_ep=1,
                       tokens=16).covered
    # a GPU without tables
    missing = K.gemm_time_s("mi300x", "vllm", None, dtype="bf16", m=1, n=8192, k=8192)
    assert missing.source is None and math.isnan(float(missing.time_s))


def test_deepseek_v3_moe_is_measured_per_release() -> None:
    got = K.moe_s("h200_sxm", "sglang", "0.5.14", dtype="fp8_block", hidden=7168, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=8,
                  tokens=np.array([1, 64, 1024, 8192]))
    assert got.covered.all() and (np.diff(got.time_s) > 0).all()


def test_mla_tables_say_whether_they_time_the_module_or_the_core() -> None:
    b = np.array([1, 16, 64])
    for engine, scope in (("vllm", "projections included"), ("sglang", "attention core")):
        got = K.mla_generation_s("h200_sxm", engine, None, kv_dtype="bf16", heads=16, batch=b, kv_len=4096, gemm_dtype="bfloat16")
        assert got.covered.all() and scope in got.note, engine
        assert (np.diff(got.time_s) > 0).all(), engine


def test_an_unmeasured_release_uses_the_nearest_measured_one_and_says_so() -> None:
    ref = K.resolve_release("h100_sxm", "vllm", "0.11.0", K.KernelOp.GEMM)
    assert ref is not None and ref.version == "0.24.0" and not ref.exact
    assert "nearest measured release to 0.11.0" in ref.describe()
    # SGLang 0.5.23 is nearer 0.5.14 than 0.5.6.post2; 0.5.1.post1 nearer 0.5.6.post2
    assert K.resolve_release("h100_sxm", "sglang", "0.5.23", K.KernelOp.GEMM).version == "0.5.14"  # type: ignore[union-attr]
    assert K.resolve_release("h100_sxm", "sglang", "0.5.1.post1", K.KernelOp.GEMM).version == "0.5.6.post2"  # type: ignore[union-attr]
    exact = K.resolve_release("h100_sxm", "sglang", "0.5.14", K.KernelOp.GEMM)
    assert exact is not None and exact.exact
    # a variant the nearest release did not measure comes from the next nearest that did (int8 weight-only GEMMs)
    got = K.gemm_time_s("h100_sxm", "sglang", "0.5.14", dtype="int8_wo", m=16, n=4096, k=4096)
    assert got.source is not None and got.source.version == "0.5.6.post2" and got.covered


def test_moe_configs_lists_what_moe_s_covers_and_nothing_else():
    configs = K.moe_configs("b200_sxm", "vllm", "0.19.0", dtype="fp8_block")
    assert (3072, 1536, 8, 256, 4, 1) in configs and (3072, 1536, 8, 256, 1, 4) in configs  # MoE TP4 and EP4 of one layer
    for config in configs[:5]:
        h, i, topk, e, tp, ep = config
        got = K.moe_s("b200_sxm", "vllm", "0.19.0", dtype="fp8_block", hidden=h, inter=i, topk=topk, experts=e, moe_tp=tp,
                      moe_ep=ep, tokens=np.array([16.0]))
        assert got.source is not None and got.source.version == "0.19.0"
    assert K.moe_configs("b200_sxm", "vllm", "0.19.0", dtype="no-such-dtype") == ()
