"""SGLang divides --chunked-prefill-size by --attn-dp-size (sglang 0.5.23 srt/arg_groups/parallel_hook.py:331): each
attention-DP rank of the simulator prefills the per-rank chunk; vLLM gives each DP rank the whole token budget."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from servingtopology.planner.engines.caps import chunk_tokens_per_rank
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import RequestSet, simulate

MOE = resolve_model("qwen3-30b-a3b")
GPU = resolve_gpu("h100_sxm")


@dataclass
class Recorder:
    """A constant step that records the prefill tokens of every step."""

    prefill: list[float] = field(default_factory=list)

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float, decode_context_tokens: float) -> float:
        self.prefill.append(prefill_tokens)
        return 0.01


def _one_long_prompt(prompt: int) -> RequestSet:
    one = np.ones(1, dtype=np.int64)
    return RequestSet(np.zeros(1), one * prompt, one * 4, -one, 0 * one, -one)


@pytest.mark.parametrize(("engine", "per_step"), [
    (Engine.SGLANG, 2048 // 4),   # the planned 2,048-token chunk runs as 512 per rank at attention DP 4
    (Engine.VLLM, 2048),          # vLLM: --max-num-batched-tokens per DP rank
])
def test_a_rank_prefills_its_engines_per_rank_chunk(engine, per_step):
    rec = Recorder()
    layout = Layout.replicas(1, Parallelism(tp=1, dp=4, ep=True), EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048))
    simulate(layout, model=MOE, gpu=GPU, engine=engine, requests=_one_long_prompt(8192), pool_tokens={Role.AGGREGATED: 100_000},
             step_model=lambda role, rl: rec)
    assert max(rec.prefill) == per_step


def test_the_per_rank_chunk_is_the_server_chunk_over_attention_dp_for_sglang_only():
    assert chunk_tokens_per_rank(Engine.SGLANG, 2048, 8) == 256
    assert chunk_tokens_per_rank(Engine.SGLANG, 2048, 1) == 2048
    assert chunk_tokens_per_rank(Engine.VLLM, 2048, 8) == 2048
    assert list(chunk_tokens_per_rank(Engine.SGLANG, np.array([2048.0, 8192.0]), np.array([4, 2]))) == [512, 4096]
