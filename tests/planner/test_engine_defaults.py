"""An engine's default for a knob left out has one home (planner.engines.defaults), held to the engine's own rule:
vLLM's server takes 8192 batched tokens and 1024 sequences on a GPU of at least 70 GiB that is not an A100 by name,
16384 and 1024 on one of at least 160 GiB since 0.28 (EngineArgs.get_batch_defaults), and `simulate --replay` of a run
that left them out reads that home. tests/conformance/test_engine_defaults.py holds the rule to each release's own code."""

from __future__ import annotations

from pathlib import Path

import pytest

from servingtopology.cli.simulate import load_replay
from servingtopology.planner.engines.defaults import max_running, token_budget, vllm_large_gpu
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, Role
from tests.cli.test_replay_input import META, replay_dir


@pytest.mark.parametrize(("gpu", "tokens", "seqs"), [
    ("h100_sxm", 8192, 1024),    # 79 GiB, not an A100: the large defaults
    ("h200_sxm", 8192, 1024),
    ("a100_sxm", 2048, 256),     # an A100-80GB has the memory but is left out by name (vLLM PR #17885)
    ("a100_40gb", 2048, 256),    # under 70 GiB
])
def test_vllm_server_batch_defaults_follow_vllms_rule_by_memory_and_name(gpu, tokens, seqs):
    g = resolve_gpu(gpu)
    assert (int(token_budget(Engine.VLLM, g)), max_running(Engine.VLLM, g)) == (tokens, seqs)
    assert vllm_large_gpu(g) == (tokens == 8192)


@pytest.mark.parametrize(("gpu", "release", "tokens"), [
    ("b200_sxm", "0.33.0", 16384),   # 178 GiB: the top tier from 0.28 on
    ("mi300x", "0.32.0", 16384),
    ("b200_sxm", "0.11.0", 8192),    # before 0.28 the 70 GiB tier was the top one
    ("b200_sxm", "0.15.1", 8192),
    ("b200_sxm", "", 16384),         # a release not recorded: the newest rule
    ("h200_sxm", "0.33.0", 8192),    # 140 GiB: under the top tier
])
def test_vllm_batch_defaults_take_the_160_gib_tier_by_release(gpu, release, tokens):
    g = resolve_gpu(gpu)
    assert (int(token_budget(Engine.VLLM, g, release=release)), max_running(Engine.VLLM, g, release=release)) == (tokens, 1024)


@pytest.mark.parametrize(("device", "alias", "gpu"), [("NVIDIA A100-SXM4-80GB", "A100", "a100_sxm"), ("NVIDIA H100 80GB HBM3", "H100", "h100_sxm")])
def test_a_replayed_run_that_left_the_batch_knobs_out_gets_them_from_the_defaults_home(tmp_path: Path, device: str, alias: str,
                                                                                       gpu: str):
    kw = {k: v for k, v in META["engine_kwargs"].items() if k not in ("max_num_seqs", "max_num_batched_tokens")}
    folder = replay_dir(tmp_path, meta={**META, "engine_kwargs": kw, "hardware": {"device_name": device}},
                        cluster={"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [{"hardware": alias, "tp_size": 1}]}]})
    rep = load_replay(folder)
    knobs = rep.layout.roles[Role.AGGREGATED].knobs
    g = resolve_gpu(gpu)
    assert rep.gpu.id == gpu
    assert (knobs.max_num_batched_tokens, knobs.max_num_seqs) == (int(token_budget(Engine.VLLM, g)), max_running(Engine.VLLM, g))


@pytest.mark.parametrize(("gpu", "chunk"), [
    ("rtx_4090", 4096),    # 23.5 GiB: SGLang's 20-35 GiB tier (A10, 4090, 5090) is 4096, not 2048
    ("l40s", 4096),        # 44.4 GiB: the 35-60 GiB tier (A100-40GB, L40) is 4096, not 8192
    ("a100_40gb", 4096),
    ("h100_sxm", 8192),
    ("h200_sxm", 8192),
    ("b200_sxm", 16384),
])
def test_sglang_chunked_prefill_default_follows_its_memory_tiers(gpu, chunk):
    g = resolve_gpu(gpu)
    assert int(token_budget(Engine.SGLANG, g)) == chunk
    assert int(token_budget(Engine.SGLANG, g, dp=2)) == max(chunk // 2, 1024)
