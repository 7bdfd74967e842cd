"""Request sets (workloads, traces, recorded latencies) and the KV pool's block accounting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.sim import Sessions, from_rows, from_workload, recorded_latencies
from servingtopology.planner.sim.kvcache import KvPool
from servingtopology.planner.workload import LengthDist, Workload
from tests.groundtruth import GROUNDTRUTH

REFS = GROUNDTRUTH / "llmservingsim_vllm_refs"


def test_poisson_and_gamma_arrivals_have_the_asked_rate_and_burstiness() -> None:
    for cv in (1.0, 3.0):
        w = Workload(LengthDist.fixed(100), LengthDist.fixed(10), arrival_rate_rps=50.0, arrival_cv=cv)
        req = from_workload(w, num_requests=20000, seed=1)
        gaps = np.diff(req.arrival_s)
        assert 1.0 / gaps.mean() == pytest.approx(50.0, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
        assert not req.closed_loop


def test_sessions_resend_the_growing_conversation() -> None:
    w = Workload(LengthDist.fixed(100), LengthDist.fixed(20), concurrency=2)
    req = from_workload(w, num_requests=6, seed=0, sessions=Sessions(LengthDist.fixed(3)))
    assert list(req.prompt_tokens) == [100, 220, 340, 100, 220, 340]
    assert list(req.prefix_key[:3]) == [1, 1, 1] and req.prefix_key[3] == 2
    assert list(req.shared_tokens[:3]) == [120, 240, 360]
    assert req.closed_loop and list(req.client) == [0, 0, 0, 1, 1, 1]  # a session stays with its client


def test_trace_rows_become_relative_sorted_arrivals_with_prefix_ids() -> None:
    rows = [
        {"timestamp": 12.5, "input_tokens": 10, "output_tokens": 3, "session_id": "a"},
        {"timestamp": 10.0, "input_tokens": "20", "output_tokens": "4"},
        {"timestamp": 11.0, "input_tokens": 30, "output_tokens": 5, "session_id": "a", "prefix_tokens": 8},
    ]
    req = from_rows(rows)
    assert list(req.arrival_s) == [0.0, 1.0, 2.5]
    assert list(req.prompt_tokens) == [20, 30, 10]
    assert req.prefix_key[0] == -1 and req.prefix_key[1] == req.prefix_key[2] >= 0
    assert list(req.shared_tokens) == [0, 8, 10]


def test_a_trace_row_without_token_counts_is_rejected_with_the_field_named() -> None:
    with pytest.raises(InvalidSpec, match="input token count"):
        from_rows([{"timestamp": 1.0, "output_tokens": 3}])


@pytest.mark.skipif(not REFS.exists(), reason="ground-truth refs not present")
def test_recorded_latencies_of_the_reference_run_match_its_summary() -> None:
    rows = [json.loads(line) for line in (REFS / "RTX4090_Llama-3.1-8B" / "requests.jsonl").read_text().splitlines()]
    rec = recorded_latencies(rows)
    assert rec["ttft_ms"].mean() == pytest.approx(65456.6, abs=0.1)
    assert rec["tpot_ms"].mean() == pytest.approx(32.4, abs=0.05)
    assert rec["latency_ms"].mean() == pytest.approx(86578.3, abs=0.1)
    req = from_rows(rows)
    assert len(req) == 300 and req.arrival_s[0] == 0.0 and req.arrival_s[-1] == pytest.approx(29.12, abs=0.01)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["alloc", "free", "donate", "acquire", "release"]), st.integers(0, 5),
                              st.integers(0, 40)), max_size=60))
def test_pool_blocks_always_add_up_and_never_exceed_the_total(ops: list[tuple[str, int, int]]) -> None:
    pool = KvPool(100, page_tokens=16, caching=True)
    allocated = 0
    acquired: list[tuple[int, int]] = []
    for op, key, n in ops:
        if op == "alloc" and pool.allocate(n):
            allocated += n
        elif op == "free":
            n = min(n, allocated)
            pool.free_allocated(n)
            allocated -= n
        elif op == "donate":
            moved = pool.donate(key, upto_blocks=n, from_allocated=allocated)
            allocated -= moved
        elif op == "acquire":
            acquired.append((key, pool.acquire(key, min(n, pool.extent(key)))))
        elif op == "release" and any(k == key for k, _ in acquired):
            held = next(h for h in acquired if h[0] == key)
            acquired.remove(held)
            pool.release(*held)
        pool.check()
        assert pool.in_use <= pool.total
        assert pool.allocated == allocated


def test_eviction_takes_the_oldest_freed_blocks_first_and_keeps_prefixes() -> None:
    pool = KvPool(10, page_tokens=1, caching=True)
    assert pool.allocate(8)
    pool.donate(1, upto_blocks=4, from_allocated=4)
    pool.donate(2, upto_blocks=4, from_allocated=4)
    assert pool.extent(1) == 4 and pool.extent(2) == 4 and pool.free == 10
    assert pool.allocate(5)  # 2 empty, then 3 from key 1 (freed first)
    assert pool.extent(1) == 1 and pool.extent(2) == 4
