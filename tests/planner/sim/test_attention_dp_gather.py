"""The tokens an attention-DP step's experts route: the engine's gather rule, one function (step.attention_dp_moe_tokens)
for the simulator, the analytic estimate and the closed-loop benchmark estimator.

SGLang (srt/layers/dp_attention.py, DpPaddingMode): a step with a prompt chunk on any rank gathers the ranks' tokens
unpadded; a decode step pads every rank to the largest unless that gathers at least twice the sum. vLLM
(v1/worker/dp_utils.py): ranks are padded to the largest only when every rank runs the step as a CUDA graph; a step over
the graph bound on any rank runs eagerly and unpadded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from servingtopology.planner.engines.defaults import cuda_graph_tokens
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, Role
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import InstancePerf, attention_dp_moe_tokens, evaluate_step_s, step_coefficients
from servingtopology.planner.sim import RequestSet, simulate

MOE = resolve_model("qwen3-30b-a3b")
DENSE = resolve_model("llama-3.1-8b")
GPU = resolve_gpu("h100_sxm")


def _rule(total: float, largest: float, ranks: int, *, sglang: bool, extend: bool, graph: float = 512.0) -> float:
    return float(attention_dp_moe_tokens(total, largest, ranks, sglang=sglang, extend=extend, graph_tokens=graph))


def test_sglang_gathers_a_step_with_a_prompt_chunk_unpadded_and_pads_a_balanced_decode_step():
    assert _rule(600.0, 512.0, 4, sglang=True, extend=True) == 600.0            # SUM_LEN: 512 + three ranks' decodes
    assert math.isnan(_rule(40.0, 12.0, 4, sglang=True, extend=False))          # 2·40 > 12·4: MAX_LEN, the padded default
    assert _rule(12.0, 9.0, 4, sglang=True, extend=False) == 12.0               # 2·12 <= 9·4: SUM_LEN
    assert math.isnan(_rule(600.0, 512.0, 1, sglang=True, extend=True))         # one rank: nothing to gather


def test_vllm_pads_the_ranks_only_inside_its_cuda_graph_bound():
    assert math.isnan(_rule(900.0, 512.0, 4, sglang=False, extend=True))        # every rank inside 512: padded
    assert _rule(2300.0, 2048.0, 4, sglang=False, extend=True) == 2300.0        # a 2,048-token chunk runs eagerly
    assert _rule(1100.0, 300.0, 4, sglang=False, extend=False, graph=256.0) == 1100.0


def test_vllm_graph_bound_is_twice_the_sequence_cap_within_512_and_the_token_budget():
    assert float(cuda_graph_tokens(Engine.VLLM, 256, 8192)) == 512.0
    assert float(cuda_graph_tokens(Engine.VLLM, 64, 8192)) == 128.0
    assert float(cuda_graph_tokens(Engine.VLLM, 1024, 256)) == 256.0
    assert list(cuda_graph_tokens(Engine.VLLM, np.array([32.0, 1024.0]), np.array([8192.0, 8192.0]))) == [64.0, 512.0]


def test_a_gathered_step_is_the_same_float_in_the_simulator_and_the_vectorised_estimate_and_cheaper_than_padded():
    perf = InstancePerf(MOE, GPU, Precision.BF16, KvDtype.AUTO, Engine.SGLANG, Parallelism(tp=1, dp=4, ep=True))
    assert perf.gathers_experts
    c = step_coefficients(MOE, GPU, precision=Precision.BF16, kv_dtype=KvDtype.AUTO, engine=Engine.SGLANG, tp=1, pp=1, dp=4, moe_ep=4)
    batch = {"prefill_tokens": 512.0, "prefill_pairs": 512.0 * 256.0, "decode_tokens": 0.0, "decode_context_tokens": 0.0}
    sim = perf.step_time_s(**batch, moe_tokens=512.0)
    vec = float(evaluate_step_s(c, **{k: np.array([v]) for k, v in batch.items()}, moe_tokens=np.array([512.0]))[0])
    assert sim == pytest.approx(vec, rel=1e-12)
    assert sim < perf.step_time_s(**batch)  # the padded default routes 4 × 512 tokens
    assert not InstancePerf(DENSE, GPU, Precision.BF16, KvDtype.AUTO, Engine.SGLANG, Parallelism(tp=1, dp=4)).gathers_experts


@dataclass
class Recorder:
    """A constant step of a MoE attention-DP instance that records the gathered tokens of every step (None: padded)."""

    gathers_experts: bool = True
    seen: list[tuple[float, float | None]] = field(default_factory=list)

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float, decode_context_tokens: float,
                    moe_tokens: float | None = None) -> float:
        self.seen.append((prefill_tokens + decode_tokens, moe_tokens))
        return 0.01


def _one_prompt(prompt: int, output: int = 4) -> RequestSet:
    one = np.ones(1, dtype=np.int64)
    return RequestSet(np.zeros(1), one * prompt, one * output, -one, 0 * one, -one)


@pytest.mark.parametrize(("engine", "chunk"), [(Engine.SGLANG, 2048 // 4), (Engine.VLLM, 2048)])
def test_the_simulator_prices_a_lone_prompt_chunk_with_only_its_own_tokens_at_the_experts(engine, chunk):
    # One long prompt: one rank prefills chunk after chunk while three idle. SGLang gathers the sum (the chunk); vLLM's
    # 2,048-token chunk is over its graph bound (2 × 64 sequences), so it runs eagerly and unpadded too.
    rec = Recorder()
    layout = Layout.replicas(1, Parallelism(tp=1, dp=4, ep=True), EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048))
    simulate(layout, model=MOE, gpu=GPU, engine=engine, requests=_one_prompt(8192), pool_tokens={Role.AGGREGATED: 100_000},
             step_model=lambda role, rl: rec)
    prefill = [(t, m) for t, m in rec.seen if t == chunk]
    assert prefill and all(m == float(chunk) for _, m in prefill)


def test_vllm_decode_steps_inside_the_graph_bound_stay_padded():
    # Four short prompts, one a rank: the decodes (one token a rank) are inside the bound, so no gathered count is passed.
    rec = Recorder()
    n = 4
    reqs = RequestSet(np.zeros(n), np.full(n, 64, dtype=np.int64), np.full(n, 8, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                      np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
    layout = Layout.replicas(1, Parallelism(tp=1, dp=4, ep=True), EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048))
    simulate(layout, model=MOE, gpu=GPU, engine=Engine.VLLM, requests=reqs, pool_tokens={Role.AGGREGATED: 100_000},
             step_model=lambda role, rl: rec)
    decodes = [m for t, m in rec.seen if t == 1.0]
    assert decodes and all(m is None for m in decodes)
