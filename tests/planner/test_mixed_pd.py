"""Prefill on one GPU kind and decode on another: the link's refusals, the figures, and the simulator running it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.perf.mixed_pd import mixed_figures, mixed_refusal
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import GpuKind, PoolObjective
from servingtopology.planner.sim.stage import simulate_mixed
from servingtopology.spec import parse_spec, to_problem

H100, A100 = resolve_gpu("h100_sxm"), resolve_gpu("a100_sxm")


def _problem(model: str, *, rate: float, prompt: int, ttft_ms: float = 1000, gpu: str = "h100_sxm"):  # type: ignore[no-untyped-def]
    return to_problem(parse_spec({"model": model, "hardware": {"gpu": gpu, "maxGPUs": 16},
                                  "workload": {"arrivalRate": rate, "inputTokens": prompt, "outputTokens": 256},
                                  "slo": {"ttftMs": {"p95": ttft_ms}, "tpotMs": {"p95": 60}}}))


def _pd(p_tp: int, d_tp: int, n_p: int = 1, n_d: int = 1) -> Layout:
    knobs = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)
    return Layout.pd(RoleLayout(n_p, Parallelism(tp=p_tp), knobs), RoleLayout(n_d, Parallelism(tp=d_tp), knobs))


def test_a_slow_link_is_refused_by_the_transfer_floor_and_a_fast_one_is_not() -> None:
    problem = _problem("meta-llama/Llama-3.1-70B", rate=1.0, prompt=4096)
    layout = _pd(4, 4)
    slow = mixed_refusal(problem, layout, prefill_gpu=H100, decode_gpu=A100, link_gbit=10.0)
    assert slow is not None and slow.rule == "transfer-floor" and "10 Gb/s" in slow.reason
    assert mixed_refusal(problem, layout, prefill_gpu=H100, decode_gpu=A100, link_gbit=400.0) is None


def test_a_kind_without_a_nic_cannot_hand_kv_to_another() -> None:
    problem = _problem("meta-llama/Llama-3.1-8B-Instruct", rate=1.0, prompt=1024)
    refused = mixed_refusal(problem, _pd(1, 1), prefill_gpu=H100, decode_gpu=A100, link_gbit=0.0)
    assert refused is not None and refused.rule == "no-nic"


def test_the_link_bounds_the_capacity_of_a_mixed_layout() -> None:
    problem = _problem("meta-llama/Llama-3.1-8B-Instruct", rate=1.0, prompt=4096)
    fast = mixed_figures(problem, [_pd(1, 1, 1, 4)], [1.0], prefill_gpu=H100, decode_gpu=A100, link_gbit=400.0)
    slow = mixed_figures(problem, [_pd(1, 1, 1, 4)], [1.0], prefill_gpu=H100, decode_gpu=A100, link_gbit=25.0)
    assert float(slow.link_rps[0]) < float(fast.link_rps[0])
    assert float(slow.capacity_rps[0]) <= float(slow.link_rps[0]) + 1e-9
    assert float(slow.ttft_s[0]) > float(fast.ttft_s[0])


def test_the_simulator_runs_decode_on_the_slower_kind_slower() -> None:
    problem = _problem("meta-llama/Llama-3.1-8B-Instruct", rate=4.0, prompt=1024)
    layout = _pd(1, 1)
    on_a100 = simulate_mixed(problem, layout, prefill_gpu=H100, decode_gpu=A100, link_gbit=400.0, num_requests=120, seed=1).summary()
    on_h100 = simulate_mixed(problem, layout, prefill_gpu=H100, decode_gpu=H100, link_gbit=400.0, num_requests=120, seed=1).summary()
    assert on_a100.finished == on_h100.finished == 120
    assert on_a100.tpot_ms.p50 > on_h100.tpot_ms.p50 * 1.2   # A100 HBM 2.0 TB/s against H100's 3.35


def test_a_member_whose_model_fits_no_kind_is_named() -> None:
    problem = _problem("meta-llama/Llama-3.1-405B", rate=1.0, prompt=1024, gpu="l40s")
    kinds = (GpuKind("l40s", resolve_gpu("l40s"), 2, 1.0, 100.0),)
    with pytest.raises(InvalidSpec) as err:
        build_pool(kinds, [MemberRequest("big", problem, 2)], objective=PoolObjective.MIN_COST)
    assert err.value.field == "members[0]" and "fits no GPU kind" in err.value.message


def test_pool_options_offer_mixed_kind_pd_with_each_role_on_its_kind() -> None:
    problem = _problem("meta-llama/Llama-3.1-8B-Instruct", rate=8.0, prompt=2048)
    kinds = (GpuKind("h100", H100, 4, 3.0, 400.0), GpuKind("a100", A100, 4, 1.6, 200.0))
    pool, found = build_pool(kinds, [MemberRequest("m", problem, 8)], objective=PoolObjective.MIN_COST)
    mixed = [o for o in pool.members[0].options if o.group == "h100→a100"]
    assert mixed and all(o.role_kinds == {"prefill": "h100", "decode": "a100"} for o in mixed)
    assert all(o.layout is not None and o.layout.roles[Role.PREFILL].gpus == o.gpus["h100"]
               and o.layout.roles[Role.DECODE].gpus == o.gpus["a100"] for o in mixed)
    assert not found["m"].refusals
    no_nic = (replace(kinds[0], nic_gbit=0.0), kinds[1])
    pool, found = build_pool(no_nic, [MemberRequest("m", problem, 8)], objective=PoolObjective.MIN_COST)
    assert not [o for o in pool.members[0].options if "→" in o.group]
    assert {r.rule for _, r in found["m"].refusals} == {"no-nic"}
