"""The closed-loop estimator: Little's law, monotone load, caps that queue clients, PD pools."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.closed_loop import aggregated, disaggregated
from servingtopology.planner.perf.step import PerfParams, step_time_s

MODEL = resolve_model("llama-3.1-70b")
GPU = resolve_gpu("h200_sxm")
PARAMS = PerfParams(bench_requests_per_client=1e9)  # no start-up wave: the steady state alone


def _step(tp=1):
    def step(*, prefill_tokens, prefill_pairs, decode_tokens, decode_context_tokens):
        return step_time_s(MODEL, GPU, precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=tp, pp=1, dp=1,
                           prefill_tokens=prefill_tokens, prefill_pairs=prefill_pairs, decode_tokens=decode_tokens,
                           decode_context_tokens=decode_context_tokens, params=PARAMS)
    return step


def _agg(clients, *, isl=1024, osl=256, cap=1024.0, mixed=True, params=PARAMS):
    return aggregated(_step(), clients_per_rank=np.asarray(clients, dtype=float), isl=isl, osl=osl, token_budget=8192,
                      max_running=cap, mixed_batches=mixed, params=params)


def test_one_client_decodes_at_batch_one_speed():
    r = _agg([1.0])
    one = float(_step()(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=1.0, decode_context_tokens=1024 + 128))
    assert float(r.tpot_s[0]) == pytest.approx(one, rel=0.15)


def test_throughput_satisfies_littles_law():
    r = _agg([4.0, 32.0, 128.0])
    cycle = r.ttft_s + 255 * r.tpot_s
    assert np.allclose(r.throughput_rps * cycle, [4.0, 32.0, 128.0], rtol=0.05)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 512), extra=st.integers(1, 512), mixed=st.booleans())
def test_more_clients_never_lower_ttft_or_tpot(n, extra, mixed):
    r = _agg([float(n), float(n + extra)], mixed=mixed)
    assert r.tpot_s[1] >= r.tpot_s[0] * (1 - 1e-6)
    assert r.ttft_s[1] >= r.ttft_s[0] * (1 - 1e-6)


def test_a_sequence_cap_queues_clients_and_raises_ttft():
    free, capped = _agg([64.0], cap=1024.0), _agg([64.0], cap=8.0)
    assert bool(capped.saturated[0])
    assert float(capped.ttft_s[0]) > 3 * float(free.ttft_s[0])
    assert float(capped.tpot_s[0]) < float(free.tpot_s[0])


def test_the_start_up_wave_adds_to_ttft_for_short_benchmarks():
    short = _agg([64.0], params=PerfParams(bench_requests_per_client=2.0))
    assert float(short.ttft_s[0]) > float(_agg([64.0]).ttft_s[0])


def test_more_decode_ranks_lower_tpot_in_pd():
    def run(decode_ranks):
        return disaggregated(_step(), _step(), clients=np.array([256.0]), prefill_ranks=2.0, decode_ranks=decode_ranks, isl=1024,
                             osl=512, prefill_budget=8192, decode_max_running=1024, transfer_s=0.01, params=PARAMS)
    one, four = run(1.0), run(4.0)
    assert float(four.tpot_s[0]) < float(one.tpot_s[0])
    assert float(four.throughput_rps[0]) > float(one.throughput_rps[0])


def test_too_few_prefill_ranks_queue_prompts_in_pd():
    def run(prefill_ranks):
        return disaggregated(_step(), _step(), clients=np.array([512.0]), prefill_ranks=prefill_ranks, decode_ranks=4.0, isl=8192,
                             osl=256, prefill_budget=8192, decode_max_running=1024, transfer_s=0.01, params=PARAMS)
    assert float(run(1.0).ttft_s[0]) > 2 * float(run(8.0).ttft_s[0])


def test_a_scheduler_that_takes_requests_every_n_steps_delays_the_first_token_by_half_of_them():
    every, thirty = _agg([32.0]), aggregated(_step(), clients_per_rank=np.array([32.0]), isl=1024, osl=256, token_budget=8192,
                                             max_running=1024.0, mixed_batches=True, recv_interval=30.0, params=PARAMS)
    extra = float(thirty.ttft_s[0] - every.ttft_s[0])
    # 29/2 more steps of waiting, at the (slightly lighter) step time of the slower loop
    assert extra == pytest.approx(14.5 * float(thirty.tpot_s[0]), rel=0.15)
    assert float(thirty.throughput_rps[0]) < float(every.throughput_rps[0])


@pytest.mark.parametrize("mixed", [True, False])
def test_prompts_arriving_together_are_prefilled_together(mixed):
    # Llama-3.1-8B, 448 clients with 1,000-token prompts and 100-token answers, prompts that do not collide by
    # chance (arrival_burst ≈ 0): about 4 prompts arrive per step, 4,000 tokens against an 8,192-token budget. The
    # engine batches them into one prefill step, so nobody queues for admission. The old estimator called a
    # state where every step carried a prefill saturated, capped the running batch near osl (≈ 100) and queued
    # the other ~350 clients (TTFT of seconds).
    model = resolve_model("llama-3.1-8b")
    params = replace(PARAMS, arrival_burst=1e-3)

    def step(**kw):
        return step_time_s(model, GPU, precision=Precision.FP8, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM, tp=1, pp=1, dp=1,
                           params=params, **kw)
    r = aggregated(step, clients_per_rank=np.array([448.0]), isl=1000, osl=100, token_budget=8192, max_running=1024.0,
                   mixed_batches=mixed, params=params)
    assert not bool(r.saturated[0])
    assert float(r.running_per_rank[0]) > 0.9 * 448
    assert float(r.ttft_s[0]) < 5 * float(r.tpot_s[0])


def test_prompt_tokens_beyond_the_budget_queue_clients_in_mixed_batches():
    r = aggregated(_step(), clients_per_rank=np.array([2048.0]), isl=8192, osl=16, token_budget=8192, max_running=4096.0,
                   mixed_batches=True, params=PARAMS)
    assert bool(r.saturated[0])
    assert float(r.running_per_rank[0]) < 2048.0


def test_a_long_prefill_step_lengthens_the_wait_of_a_new_request_beyond_half_a_mean_step():
    # The inspection paradox: a request arriving at a random time more likely lands in a long (prefill) step.
    one = aggregated(_step(), clients_per_rank=np.array([16.0]), isl=8192, osl=256, token_budget=8192, max_running=1024.0,
                     mixed_batches=True, params=replace(PARAMS, ttft_overhead_s=0.0, result_delay_steps=0.0, queue_factor=1e-9))
    t_p = float(_step()(prefill_tokens=8192.0, prefill_pairs=8192.0 * 4096, decode_tokens=0.0, decode_context_tokens=0.0))
    wait = float(one.ttft_s[0]) - t_p  # TTFT less the request's own prefill step
    # One step in 16 is a ~1 s prefill among ~25 ms decodes: the mean step (the TPOT) is ~85 ms, but a random
    # arrival waits E[S²]/(2·E[S]) ≈ 0.4 s, several mean steps (half a mean step before).
    assert wait > 2.0 * float(one.tpot_s[0])


def test_a_prefill_on_any_attention_dp_rank_stalls_every_rank():
    # Ranks step in lockstep: with r ranks a step carries some rank's prefill chunk 1 − (1 − f)^r of the time, so each
    # rank's decodes run at prefill-step speed more often than its own chunks alone would make them.
    seen = []

    def step(*, prefill_tokens, prefill_pairs, decode_tokens, decode_context_tokens, moe_tokens=None):
        seen.append(moe_tokens)
        return _step()(prefill_tokens=prefill_tokens, prefill_pairs=prefill_pairs, decode_tokens=decode_tokens,
                       decode_context_tokens=decode_context_tokens)

    def run(ranks):
        return aggregated(step, clients_per_rank=np.array([16.0]), isl=1024, osl=256, token_budget=8192, max_running=1024.0,
                          mixed_batches=True, ranks=ranks, params=PARAMS)

    one, four = run(1.0), run(4.0)
    assert float(four.tpot_s[0]) > 1.05 * float(one.tpot_s[0])
    assert any(m is not None for m in seen)  # the chunk's step routes the chunk beside the other ranks' own decodes

