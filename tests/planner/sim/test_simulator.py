"""Behaviour of the simulator: determinism, time, conservation, the pool, preemption, PD transfer, prefix hits."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.memory import kv_bytes_per_token, transfer_floor_s
from servingtopology.planner.sim import RequestSet, RouterPolicy, Sessions, closed_loop, simulate
from servingtopology.planner.workload import LengthDist, LengthKind, Slo, Workload

MODEL = resolve_model("llama-3.1-8b")
GPU = resolve_gpu("h100_sxm")


@dataclass
class FixedStep:
    """A step model of constant duration that records the batches it saw."""

    step_s: float = 0.01
    per_prefill_token_s: float = 0.0
    calls: list[tuple[float, float]] = field(default_factory=list)

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float) -> float:
        self.calls.append((prefill_tokens, decode_tokens))
        return self.step_s + self.per_prefill_token_s * prefill_tokens


def _open(arrivals: list[float], prompt: int, output: int, *, key: int = -1, shared: int = 0) -> RequestSet:
    n = len(arrivals)
    return RequestSet(np.asarray(arrivals, dtype=np.float64), np.full(n, prompt, dtype=np.int64), np.full(n, output, dtype=np.int64),
                      np.full(n, key, dtype=np.int64), np.full(n, shared, dtype=np.int64), np.full(n, -1, dtype=np.int64))


def _workload(rate: float = 20.0) -> Workload:
    return Workload(LengthDist(LengthKind.LOGNORMAL, 600.0, sigma=0.8), LengthDist(LengthKind.UNIFORM, low=20, high=300),
                    arrival_rate_rps=rate)


def test_the_same_seed_gives_the_same_run_and_another_seed_a_different_one() -> None:
    layout = Layout.replicas(2, Parallelism())
    a = simulate(layout, model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_workload(), num_requests=150, seed=7)
    b = simulate(layout, model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_workload(), num_requests=150, seed=7)
    c = simulate(layout, model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_workload(), num_requests=150, seed=8)
    np.testing.assert_array_equal(a.first_token_s, b.first_token_s)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    slo = Slo(ttft_ms=500.0, tpot_ms=50.0)
    assert a.summary(slo).as_dict() == b.summary(slo).as_dict()
    assert not np.array_equal(a.finish_s, c.finish_s)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_simulated_time_never_goes_back_and_every_request_is_ordered(engine: Engine) -> None:
    knobs = EngineKnobs(max_num_seqs=32, max_num_batched_tokens=1024)
    r = simulate(Layout.replicas(1, Parallelism(), knobs), model=MODEL, gpu=GPU, engine=engine, workload=_workload(40.0),
                 num_requests=200, seed=1, pool_tokens={Role.AGGREGATED: 6000})
    t = r.timeline["t_s"]
    assert len(t) > 10 and np.all(np.diff(t) >= 0)
    done = r.finished
    assert np.all(r.arrival_s[done] <= r.scheduled_s[done])
    assert np.all(r.scheduled_s[done] < r.first_token_s[done])
    assert np.all(r.first_token_s[done] <= r.finish_s[done])


def test_every_arrived_request_finishes_or_is_reported_unfinished() -> None:
    r = simulate(Layout.replicas(1, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_workload(200.0),
                 num_requests=300, seed=3, max_time_s=2.0)
    s = r.summary()
    arrived = int((~np.isnan(r.arrival_s)).sum())
    assert s.unfinished > 0
    assert s.finished + s.unfinished == arrived == s.requests


@settings(max_examples=16, deadline=None)
@given(engine=st.sampled_from([Engine.VLLM, Engine.SGLANG]), pool=st.integers(1200, 8000), seqs=st.integers(2, 64),
       budget=st.sampled_from([256, 512, 2048]), seed=st.integers(0, 1000), dp=st.sampled_from([1, 2]), pd=st.booleans())
def test_kv_in_use_never_exceeds_the_pool_and_all_tokens_are_produced(engine: Engine, pool: int, seqs: int, budget: int,
                                                                      seed: int, dp: int, pd: bool) -> None:
    knobs = EngineKnobs(max_num_seqs=seqs, max_num_batched_tokens=budget)
    w = Workload(LengthDist(LengthKind.UNIFORM, low=50, high=900), LengthDist(LengthKind.UNIFORM, low=1, high=200),
                 arrival_rate_rps=30.0, prefix_share=0.3)
    role = RoleLayout(1, Parallelism(dp=dp), knobs)
    layout = Layout.pd(role, role) if pd else Layout.replicas(1, Parallelism(dp=dp), knobs)
    pools = {Role.AGGREGATED: pool, Role.PREFILL: pool, Role.DECODE: pool}
    r = simulate(layout, model=MODEL, gpu=GPU, engine=engine, workload=w, num_requests=60,
                 seed=seed, pool_tokens=pools, step_model=lambda role, rl: FixedStep(0.02, 1e-5))
    assert np.all(r.timeline["kv_used_frac"] <= 1.0 + 1e-12)
    assert np.all(np.diff(r.timeline["t_s"]) >= 0)
    assert r.summary().unfinished == 0
    assert np.all(r.finish_s >= r.first_token_s)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_preemption_happens_exactly_when_the_pool_runs_out(engine: Engine) -> None:
    # Two 256-token prompts in a 1024-token pool: both fit until each holds 512 tokens, after 256 decode
    # steps (step 1 is the prefill), so the step planned at 257 × 10 ms must evict one of them.
    layout = Layout.replicas(1, Parallelism(), EngineKnobs(max_num_seqs=8, max_num_batched_tokens=4096))
    fits = simulate(layout, model=MODEL, gpu=GPU, engine=engine, requests=_open([0.0, 0.0], 256, 200),
                    pool_tokens={Role.AGGREGATED: 1024}, step_model=lambda role, rl: FixedStep(0.01))
    assert int(fits.preemptions.sum()) == 0
    full = simulate(layout, model=MODEL, gpu=GPU, engine=engine, requests=_open([0.0, 0.0], 256, 400),
                    pool_tokens={Role.AGGREGATED: 1024}, step_model=lambda role, rl: FixedStep(0.01))
    assert int(full.preemptions.sum()) >= 1
    victim = int(np.argmax(full.preemptions))
    assert full.finish_s[victim] > full.finish_s[1 - victim]  # the victim recomputes after the survivor
    first = float(full.preemption_times_s.min())
    tl = full.timeline
    before = int(np.searchsorted(tl["t_s"], first + 1e-12, side="right")) - 1
    page = 16 if engine is Engine.VLLM else 1
    # at that moment the pool could not give each running sequence room for one more token
    assert tl["kv_used_frac"][before] * 1024 > 1024 - 2 * page
    assert np.all(tl["kv_used_frac"] <= 1.0)
    if engine is Engine.VLLM:
        assert first == pytest.approx(2.57)  # 1 prefill step + 256 decode steps of 10 ms


@pytest.mark.parametrize(("prompt", "waits"), [(600, True), (400, False)])
def test_vllm_admits_a_waiting_prompt_only_when_all_its_blocks_fit(prompt: int, waits: bool) -> None:
    # --scheduler-reserve-full-isl (vLLM's default): A (512-token prompt, 300 answer tokens) runs in a
    # 1,024-token pool; B arrives next. Once A's prompt is in (33 blocks of 64), 31 blocks are free: B's
    # first 256-token chunk always fits, but a 600-token prompt (38 blocks) waits for A to finish
    # instead of being admitted and preempted half-way, while a 400-token one (25 blocks) starts at once.
    layout = Layout.replicas(1, Parallelism(), EngineKnobs(max_num_seqs=8, max_num_batched_tokens=256))
    reqs = RequestSet(np.array([0.0, 0.001]), np.array([512, prompt]), np.array([300, 10]), np.full(2, -1),
                      np.zeros(2, dtype=np.int64), np.full(2, -1))
    r = simulate(layout, model=MODEL, gpu=GPU, engine=Engine.VLLM, requests=reqs,
                 pool_tokens={Role.AGGREGATED: 1024}, step_model=lambda role, rl: FixedStep(0.01))
    assert r.summary().unfinished == 0
    assert int(r.preemptions[0]) == 0
    if waits:
        assert int(r.preemptions.sum()) == 0
        assert r.scheduled_s[1] >= r.finish_s[0]
    else:
        assert r.scheduled_s[1] == pytest.approx(0.02)  # the step after A's two prompt chunks


def test_a_pd_run_ttft_includes_the_kv_transfer_floor() -> None:
    prompt = 4000
    pd = Layout.pd(RoleLayout(1, Parallelism()), RoleLayout(1, Parallelism()))
    r = simulate(pd, model=MODEL, gpu=GPU, engine=Engine.VLLM, requests=_open([0.0], prompt, 50), same_node=False,
                 step_model=lambda role, rl: FixedStep(0.01))
    agg = simulate(Layout.replicas(1, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.VLLM, requests=_open([0.0], prompt, 50),
                   step_model=lambda role, rl: FixedStep(0.01))
    floor = transfer_floor_s(prompt * float(kv_bytes_per_token(MODEL, EngineKnobs().kv_dtype, tp=1)), link_gbit=GPU.nic_gbit)
    assert floor > 0.005
    assert r.ttft_ms[0] / 1e3 >= agg.ttft_ms[0] / 1e3 + floor
    assert r.summary().finished == 1


def test_prefix_hits_shorten_prefills_as_configured() -> None:
    # One client sends two 1000-token prompts sharing their first 800 tokens: the second computes only 200.
    req = RequestSet(np.full(2, np.nan), np.full(2, 1000, dtype=np.int64), np.full(2, 5, dtype=np.int64),
                     np.zeros(2, dtype=np.int64), np.full(2, 800, dtype=np.int64), np.zeros(2, dtype=np.int64))
    model = FixedStep(0.01, 1e-5)
    r = simulate(Layout.replicas(1, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.VLLM, requests=req,
                 step_model=lambda role, rl: model)
    prefills = [p for p, _ in model.calls if p > 0]
    assert prefills == [1000, 200]
    assert list(r.cached_tokens) == [0, 800]
    assert r.ttft_ms[1] < r.ttft_ms[0]
    off = Layout.replicas(1, Parallelism(), EngineKnobs(enable_prefix_caching=False))
    r_off = simulate(off, model=MODEL, gpu=GPU, engine=Engine.VLLM, requests=req, step_model=lambda role, rl: FixedStep(0.01, 1e-5))
    assert list(r_off.cached_tokens) == [0, 0]


def test_sessions_reuse_their_growing_context() -> None:
    w = Workload(LengthDist.fixed(200), LengthDist.fixed(50), concurrency=4)
    r = simulate(Layout.replicas(1, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.SGLANG, workload=w, num_requests=40,
                 sessions=Sessions(LengthDist.fixed(4)))
    assert r.summary().cached_token_share > 0.5


def test_closed_loop_keeps_at_most_the_client_count_in_flight() -> None:
    r = simulate(Layout.replicas(1, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.VLLM,
                 requests=closed_loop(clients=3, input_tokens=100, output_tokens=20, num_requests=30))
    events = sorted([(t, 1) for t in r.arrival_s] + [(t, -1) for t in r.finish_s], key=lambda e: (e[0], e[1]))
    in_flight = np.cumsum([d for _, d in events])
    assert in_flight.max() == 3


def test_round_robin_and_least_outstanding_spread_requests_over_replicas() -> None:
    for policy in (RouterPolicy.ROUND_ROBIN, RouterPolicy.LEAST_OUTSTANDING):
        r = simulate(Layout.replicas(2, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_workload(30.0),
                     num_requests=80, router=policy)
        per_instance = np.bincount(r.timeline["instance"].astype(int))
        assert len(per_instance) == 2 and per_instance.min() > 0


def test_goodput_counts_only_requests_within_every_slo() -> None:
    r = simulate(Layout.replicas(1, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_workload(5.0), num_requests=60)
    loose, tight = Slo(ttft_ms=1e9, tpot_ms=1e9), Slo(ttft_ms=1e-3, tpot_ms=1e-3)
    s = r.summary(loose)
    assert s.goodput_rps == pytest.approx(s.request_rps)
    assert r.goodput_rps(tight) == 0.0


def test_attention_dp_ranks_never_pool_their_kv_for_one_request() -> None:
    # Each of the two ranks holds 1,000 tokens: a 1,500-token request fits the sum but no single rank.
    layout = Layout.replicas(1, Parallelism(dp=2), EngineKnobs(max_num_batched_tokens=4096))
    r = simulate(layout, model=MODEL, gpu=GPU, engine=Engine.SGLANG, requests=_open([0.0, 0.1], 1500, 10),
                 pool_tokens={Role.AGGREGATED: 1000}, step_model=lambda role, rl: FixedStep(0.01))
    assert r.summary().unfinished == 2
    ok = simulate(layout, model=MODEL, gpu=GPU, engine=Engine.SGLANG, requests=_open([0.0, 0.1], 900, 10),
                  pool_tokens={Role.AGGREGATED: 1000}, step_model=lambda role, rl: FixedStep(0.01))
    assert ok.summary().unfinished == 0


def test_a_pd_decode_instance_admits_a_transfer_only_when_its_pool_has_room() -> None:
    # The decode pool holds one 600-token request at a time: the second's KV waits until the first is done.
    pd = Layout.pd(RoleLayout(1, Parallelism()), RoleLayout(1, Parallelism()))
    r = simulate(pd, model=MODEL, gpu=GPU, engine=Engine.VLLM, requests=_open([0.0, 0.0], 600, 100),
                 pool_tokens={Role.PREFILL: 100_000, Role.DECODE: 1000}, step_model=lambda role, rl: FixedStep(0.01))
    first, second = np.argsort(r.first_token_s)
    assert r.first_token_s[second] >= r.finish_s[first]
    assert np.all(r.timeline["kv_used_frac"] <= 1.0)
