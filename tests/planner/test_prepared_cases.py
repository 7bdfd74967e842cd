"""The fit's fast path gives the floats of the plain one: step coefficients from a parameter-free geometry and a fold,
geometries of many instances folded at once, benchmark rows of many groups estimated in one closed-loop pass (issue #35
item 4: a leave-one-model-out fold in at most 60 CPU s, its result unchanged)."""

import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from servingtopology.planner.fidelity.benchmark_cases import Prediction, parse_row, predict_all, prepare_cases
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import CURVES, PerfParams, StepCoefficients, concat_geometry, fold_coefficients, step_geometry
from tests.planner.model_configs import load

from .test_benchmark_cases import AGG, DISAGG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fit_perf

FITTED = PerfParams(gemm_half_tokens=15.5, fp4_eff_scale=0.69, moe_eff_scale=0.28, mem_eff=0.93, roofline_sharpness=1.4,
                    narrow_width_cols=66.0, link_eff=0.51, allreduce_latency_s=1e-6, allreduce_peer_latency_s=3.7e-7,
                    a2a_latency_s=5.3e-5, layer_overhead_s=6.7e-5, step_overhead_s=2.2e-4, sglang_overhead_scale=6.0,
                    trtllm_overhead_scale=2.6, queue_factor=3.2, result_delay_steps=4.4)
SWITCHES = [FITTED, replace(FITTED, measured_moe=1.0, measured_allreduce=1.0, measured_gemm=1.0, measured_decode_attention=1.0),
            replace(FITTED, measured_exchange=0.0)]

# (model, GPU, precision, MoE precision, engine, tables) covering dense, MoE, MLA, a sparse-attention indexer, sliding
# windows, NVLink, PCIe with and without peer-to-peer, and groups beyond one node.
INSTANCES = [
    (resolve_model("llama-3.1-70b"), "h200_sxm", Precision.FP8, None, Engine.VLLM, Engine.VLLM),
    (resolve_model("deepseek-v3"), "b200_sxm", Precision.FP8, Precision.FP4, Engine.SGLANG, Engine.SGLANG),
    (resolve_model("gpt-oss-120b"), "h100_sxm", Precision.FP8, Precision.FP4, Engine.VLLM, None),
    (resolve_model("qwen3-235b-a22b"), "h200_sxm", Precision.FP8, Precision.FP8, Engine.VLLM, Engine.VLLM),
    (load("deepseek-v3.2"), "h200_sxm", Precision.FP8, Precision.FP8, Engine.SGLANG, Engine.SGLANG),
    (resolve_model("llama-3.1-8b"), "rtx_4090", Precision.BF16, None, Engine.VLLM, Engine.VLLM),
    (resolve_model("qwen3-30b-a3b"), "rtx_pro_6000", Precision.BF16, None, Engine.VLLM, Engine.VLLM),
]
TP = np.array([1.0, 2.0, 4.0, 8.0, 8.0, 4.0])
PP = np.array([1.0, 1.0, 2.0, 1.0, 2.0, 1.0])
DP = np.array([1.0, 4.0, 1.0, 2.0, 1.0, 1.0])
EP = np.array([1.0, 8.0, 1.0, 16.0, 1.0, 4.0])


def _geometry(model, gpu, precision, moe_precision, engine, tables, p):
    return step_geometry(model, resolve_gpu(gpu), precision=precision, kv_dtype=KvDtype.AUTO, engine=engine, tp=TP, pp=PP, dp=DP,
                         moe_ep=EP, moe_precision=moe_precision, tables_for=tables, table_allreduce=p.measured_allreduce >= 0.5,
                         table_exchange=p.measured_exchange >= 0.5, table_moe=p.measured_moe >= 0.5, table_gemm=p.measured_gemm >= 0.5,
                         table_decode_attention=p.measured_decode_attention >= 0.5)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(np.broadcast_to(np.asarray(a, dtype=float), np.shape(b)), np.asarray(b, dtype=float), equal_nan=True)


@pytest.mark.parametrize("p", SWITCHES)
def test_geometries_folded_together_give_each_instances_own_coefficients_bit_for_bit(p):
    geometries = [_geometry(*inst, p) for inst in INSTANCES]
    scale = np.concatenate([np.full(len(TP), np.nan if i % 3 else 2.6) for i in range(len(INSTANCES))])
    together = fold_coefficients(concat_geometry([(g, len(TP)) for g in geometries]), p, scale)
    for i, g in enumerate(geometries):
        alone = fold_coefficients(g, p, None if i % 3 else 2.6)
        rows = slice(i * len(TP), (i + 1) * len(TP))
        for f in fields(StepCoefficients):
            got, want = getattr(together, f.name), getattr(alone, f.name)
            if f.name in CURVES:
                shape = (len(TP), *CURVES[f.name])
                want = np.full(shape, np.nan) if want is None else np.broadcast_to(want.dense(), shape)
                assert got is None or _same(want, got.dense()[rows]), f.name
            else:
                assert _same(want, np.broadcast_to(got, (len(TP) * len(INSTANCES),))[rows]), (INSTANCES[i][0].name, f.name)


def _rows():
    rows = [{**AGG, "id": f"l{tp}{n}", "tp_size": str(tp), "moe_tp_size": str(tp), "silicon_data_source": f"x; silicon_concurrency={n}; y"}
            for tp in (2, 4, 8) for n in (1, 32, 256)]
    rows += [{**AGG, "id": f"t{n}", "backend": "trtllm", "silicon_data_source": f"x; silicon_concurrency={n}; y"} for n in (4, 64)]
    moe = {**AGG, "model_path": "deepseek-ai/DeepSeek-V3", "system": "b200_sxm", "backend": "sglang", "tp_size": "8", "moe_tp_size": "1",
           "moe_ep_size": "8"}
    rows += [{**moe, "id": f"s{dp}{n}", "attention_dp_size": str(dp), "tp_size": str(8 // dp), "silicon_data_source": f"x; silicon_concurrency={n}; y"}
             for dp in (1, 8) for n in (8, 512)]
    rows += [{**moe, "id": f"v{dp}{n}", "backend": "vllm", "attention_dp_size": str(dp), "tp_size": str(8 // dp),
              "silicon_data_source": f"x; silicon_concurrency={n}; y"} for dp in (1, 8) for n in (16, 128)]
    rows += [{**moe, "id": "ix", "silicon_data_source": "db-dump/a; silicon_concurrency=32", "backend_version": "0.4.9"}]
    rows += [{**DISAGG, "id": f"d{n}", "silicon_data_source": f"x; silicon_concurrency={n}; y"} for n in (8, 256)]
    rows += [{**DISAGG, "id": "dv", "backend": "vllm"}, {**AGG, "id": "huge", "model_path": "deepseek-ai/DeepSeek-V3", "tp_size": "1"}]
    cases = [parse_row(r) for r in rows]
    models = {"meta-llama/Llama-3.1-70B": resolve_model("llama-3.1-70b"), "deepseek-ai/DeepSeek-V3": resolve_model("deepseek-v3")}
    gpus = {g: resolve_gpu(g) for g in ("h200_sxm", "b200_sxm")}
    return cases, models, gpus


def _key(r):
    return r if isinstance(r, Prediction) else (r.kind, r.detail)


@pytest.mark.parametrize("p", SWITCHES)
def test_rows_of_many_groups_estimated_together_get_the_figures_of_their_group_alone(p):
    cases, models, gpus = _rows()
    together = predict_all(cases, models, gpus, params=p)
    assert sum(isinstance(r, Prediction) for r in together) == len(cases) - 1  # the TP1 DeepSeek-V3 row cannot hold its weights
    keys = {(c.model_path, c.system, c.backend, c.mode, c.engine_release) for c in cases}
    for key in keys:
        idx = [i for i, c in enumerate(cases) if (c.model_path, c.system, c.backend, c.mode, c.engine_release) == key]
        alone = predict_all([cases[i] for i in idx], models, gpus, params=p)
        for i, r in zip(idx, alone, strict=True):
            assert _key(together[i]) == _key(r), (cases[i].row_id, together[i], r)


def test_the_prepared_rows_price_any_parameters_as_predict_all_does():
    cases, models, gpus = _rows()
    prepared = prepare_cases(cases, models, gpus)
    for p in (*SWITCHES, PerfParams(), replace(FITTED, queue_factor=0.5, sglang_overhead_scale=1.0)):  # geometry kept per switch setting
        assert [_key(r) for r in prepared.predictions(p)] == [_key(r) for r in predict_all(cases, models, gpus, params=p)]


def _compass(fn, x0, *, step, evals, min_step=0.01):
    """Compass search as fit_perf.pattern_search ran it before it remembered points: every point asked for is evaluated."""
    x, fx = x0.copy(), fn(x0)
    used = 1
    while used < evals and step >= min_step:
        improved = False
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                y = x.copy()
                y[i] += sign * step
                fy = fn(y)
                used += 1
                if fy < fx:
                    x, fx, improved = y, fy, True
                    break
        if not improved:
            step *= 0.5
    return x, fx


def test_the_compass_search_never_evaluates_a_point_twice_and_ends_where_it_would_have():
    target, weight = np.array([0.3, -0.6, 1.2]), np.array([1.0, 3.0, 0.5])
    calls: list[bytes] = []
    asked: list[bytes] = []

    def f(x: np.ndarray) -> float:
        calls.append(x.tobytes())
        return float(np.sum((x - target) ** 2 * weight))

    def plain(x: np.ndarray) -> float:
        asked.append(x.tobytes())
        return float(np.sum((x - target) ** 2 * weight))

    x, fx = fit_perf.pattern_search(f, np.zeros(3), step=0.25, evals=150)
    x_plain, fx_plain = _compass(plain, np.zeros(3), step=0.25, evals=150)
    assert np.array_equal(x, x_plain) and fx == fx_plain
    assert len(calls) == len(set(calls)) < len(asked)  # the sweep after a move asks for the point it came from again


def test_pattern_moves_follow_a_valley_that_crosses_the_coordinates():
    """A long shallow valley along (1, 1, 1), as the engine overheads trade against the efficiencies: the compass search
    creeps one coordinate at a time; Hooke and Jeeves' pattern move steps again by each sweep's whole move."""
    axis = np.ones(3) / np.sqrt(3.0)

    def f(x: np.ndarray) -> float:
        along = float(x @ axis)
        across = x - along * axis
        return (along - 4.0) ** 2 * 0.05 + float(across @ across) * 1.0

    x0 = np.zeros(3)
    _, plain = fit_perf.pattern_search(f, x0, step=0.25, evals=60)
    x, moved = fit_perf.pattern_search(f, x0, step=0.25, evals=60, pattern_moves=True)
    assert moved < 0.1 * plain < 0.1 * f(x0)  # 0.0005 against 0.021 of 0.8
    assert moved == f(x)  # the loss returned is the point's own


def test_distinct_layout_shapes_are_the_same_whichever_way_they_are_found():
    from servingtopology.planner.perf import step

    rng = np.random.default_rng(3)
    for n in (1, 7, step.SMALL_DISTINCT, step.SMALL_DISTINCT + 1, 5000):
        tp = rng.choice([1.0, 2.0, 4.0, 8.0], n)
        pp = rng.choice([1.0, 2.0, 4.0], n)
        combos, index = step._distinct(tp, pp)
        assert combos == sorted(set(zip(tp.tolist(), pp.tolist(), strict=True)))
        assert [combos[i] for i in index.tolist()] == list(zip(tp.tolist(), pp.tolist(), strict=True))
    combos, index = step._distinct(4.0)
    assert combos == [(4.0,)] and index.shape == () and int(index) == 0
