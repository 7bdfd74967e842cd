"""A role's figures without the rate (analytic.Unloaded), computed once for a bisection, give the estimates' own floats."""

from __future__ import annotations

import numpy as np
import pytest

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.analytic import (
    aggregated_unloaded,
    decode_unloaded,
    estimate_aggregated,
    estimate_decode,
    estimate_prefill,
    load_shape,
    prefill_unloaded,
    role_coefficients,
)
from servingtopology.planner.workload import LengthDist, Workload

ROWS = {"tp": np.array([1.0, 2.0, 4.0, 8.0, 8.0]), "pp": np.array([1.0, 1.0, 2.0, 1.0, 1.0]), "dp": np.array([1.0, 1.0, 1.0, 1.0, 4.0]),
        "count": np.array([4.0, 2.0, 1.0, 1.0, 1.0]), "mns": np.array([64.0, 128.0, 256.0, 256.0, 512.0]),
        "mnbt": np.array([2048.0, 4096.0, 8192.0, 8192.0, 16384.0]), "pool": np.array([2e5, 4e5, 8e5, 1.6e6, 1.6e6])}


@pytest.mark.parametrize(("model", "engine"), [("meta-llama/Llama-3.1-70B", Engine.VLLM), ("Qwen/Qwen3-30B-A3B", Engine.SGLANG)])
def test_every_estimate_gives_the_same_floats_with_its_unloaded_part_passed_in(model: str, engine: Engine) -> None:
    m, gpu = resolve_model(model), resolve_gpu("h100_sxm")
    shape = load_shape(Workload(LengthDist.fixed(3000), LengthDist.fixed(400), arrival_rate_rps=10.0), ttft_percentile=95.0,
                       tpot_percentile=95.0)
    r = ROWS
    co = role_coefficients(m, gpu, precision=Precision.BF16, engine=engine, kv=KvDtype.AUTO, tp=r["tp"], pp=r["pp"], dp=r["dp"])
    agg = aggregated_unloaded(co, engine=engine, shape=shape, dp=r["dp"], max_num_seqs=r["mns"], max_num_batched_tokens=r["mnbt"],
                              pool_tokens=r["pool"])
    pre = prefill_unloaded(co, engine=engine, shape=shape, dp=r["dp"], max_num_batched_tokens=r["mnbt"])
    dec = decode_unloaded(co, shape=shape, max_num_seqs=r["mns"], pool_tokens=r["pool"])
    kw = {"precision": Precision.BF16, "engine": engine, "kv": KvDtype.AUTO, "shape": shape, "tp": r["tp"], "pp": r["pp"], "dp": r["dp"],
          "count": r["count"], "coefficients": co}
    for rate in (0.1, 3.0, 40.0, 400.0):
        rates = np.full(5, rate)
        pairs = [(estimate_aggregated(m, gpu, rate_rps=rates, max_num_seqs=r["mns"], max_num_batched_tokens=r["mnbt"], pool_tokens=r["pool"],
                                      unloaded=u, **kw)) for u in (None, agg)]
        pairs += [estimate_prefill(m, gpu, rate_rps=rates, max_num_batched_tokens=r["mnbt"], unloaded=u, **kw) for u in (None, pre)]
        pairs += [estimate_decode(m, gpu, rate_rps=rates, max_num_seqs=r["mns"], pool_tokens=r["pool"], unloaded=u, **kw) for u in (None, dec)]
        for own, given in zip(pairs[::2], pairs[1::2], strict=True):
            for field in ("ttft_s", "tpot_s", "tpot_mean_s", "capacity_rps", "utilisation"):
                a, b = np.asarray(getattr(own, field)), np.asarray(getattr(given, field))
                assert np.isfinite(a).all()
                assert a.tobytes() == b.tobytes(), (field, rate)


def test_a_small_row_set_is_folded_once_per_model_gpu_and_parameters_and_a_large_one_every_time() -> None:
    from dataclasses import replace

    from servingtopology.planner.perf.step import perf_params, pinned_params

    m, gpu = resolve_model("meta-llama/Llama-3.1-70B"), resolve_gpu("h100_sxm")
    kw = {"precision": Precision.BF16, "engine": Engine.VLLM, "kv": KvDtype.AUTO}
    one = role_coefficients(m, gpu, tp=np.array([4.0]), pp=np.array([1.0]), dp=np.array([1.0]), **kw)
    assert role_coefficients(m, gpu, tp=np.array([4.0]), pp=np.array([1.0]), dp=np.array([1.0]), **kw) is one
    other = role_coefficients(m, gpu, tp=np.array([8.0]), pp=np.array([1.0]), dp=np.array([1.0]), **kw)
    assert other is not one and other.tp_fixed_s != one.tp_fixed_s
    with pinned_params(replace(perf_params(), step_overhead_s=perf_params().step_overhead_s * 2.0 + 1e-3)):   # other parameters: folded anew
        slower = role_coefficients(m, gpu, tp=np.array([4.0]), pp=np.array([1.0]), dp=np.array([1.0]), **kw)
        assert slower is not one and float(np.max(slower.step_fixed_s)) > float(np.max(one.step_fixed_s))
    many = np.full(1000, 4.0)
    ones = np.ones(1000)
    assert role_coefficients(m, gpu, tp=many, pp=ones, dp=ones, **kw) is not role_coefficients(m, gpu, tp=many, pp=ones, dp=ones, **kw)
