"""Hypothesis properties of the memory model and the planner."""

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine
from servingtopology.planner.perf.memory import kv_bytes_per_token, kv_pool_tokens, weight_bytes_per_gpu
from servingtopology.planner.search.decide import decide

from .strategies import gpus, knobs, kv_dtypes, models, parallelisms, problems

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(model=models, gpu=gpus, par=parallelisms, kn=knobs, engine=st.sampled_from(list(Engine)))
@settings(max_examples=200, deadline=None)
def test_per_rank_memory_never_exceeds_hbm(model, gpu, par, kn, engine):
    pool = kv_pool_tokens(model, gpu, engine=engine, precision=Precision.BF16, parallelism=par, knobs=kn)
    used = weight_bytes_per_gpu(model, Precision.BF16, tp=par.tp, pp=par.pp, dp=par.dp) + pool * kv_bytes_per_token(model, kn.kv_dtype, tp=par.tp, pp=par.pp)
    if pool > 0:
        assert used <= gpu.memory_bytes * kn.memory_fraction


@given(model=models, kv=kv_dtypes, tp=st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_tp_beyond_the_kv_heads_never_lowers_per_rank_kv_bytes(model, kv, tp):
    here = kv_bytes_per_token(model, kv, tp=tp)
    doubled = kv_bytes_per_token(model, kv, tp=2 * tp)
    if tp >= model.num_kv_heads:
        assert doubled == here
    else:
        assert doubled <= here


@given(problem=problems())
@FAST
def test_the_gpu_budget_is_never_exceeded(problem):
    try:
        d = decide(problem)
    except Infeasible:
        return
    for c in (d.best, *d.alternatives, *d.evaluated):
        assert c.layout.gpus <= problem.max_gpus


@given(problem=problems(max_gpus=st.sampled_from([2, 4, 8])), extra=st.sampled_from([1, 2, 4, 8]))
@FAST
def test_raising_the_budget_never_makes_the_best_feasible_plan_worse(problem, extra):
    try:
        small = decide(problem)
    except Infeasible:
        return
    large = decide(dataclasses.replace(problem, max_gpus=problem.max_gpus + extra))
    assert large.best.prediction.goodput_per_gpu >= small.best.prediction.goodput_per_gpu * (1 - 1e-9) or (
        large.best.prediction.meets_slo and not small.best.prediction.meets_slo)


@given(problem=problems())
@FAST
def test_decide_is_idempotent(problem):
    try:
        a = decide(problem)
    except Infeasible as e:
        try:
            decide(problem)
        except Infeasible as again:
            assert again.stage == e.stage and again.closest_miss == e.closest_miss
        return
    b = decide(problem)
    assert a.best == b.best and a.alternatives == b.alternatives
