"""Predictors of measured points for planner.perf.deployment_fit: what the model says of each point under given factors.

A point measured by a closed-loop client (N concurrent clients, `load_kind` "concurrency") is predicted by the
closed-loop estimator of planner.fidelity.benchmark_cases (the one `servingtopology validate` scores); a point at a request rate
("rate") by the simulator on Poisson arrivals at that rate, or on the recorded requests when the caller has them (a
recorded run folder). TTFT measured at the client (a benchmark client: vLLM's `vllm bench serve`, guidellm) includes
the request's overhead off the engine's step loop (perf.request_overhead_s) and the steps before the first token
reaches it (perf.delivery_s, predict.delivery_ms); the simulator's TTFT is the engine's, so both are added there; a recorded engine
run (requests.jsonl timestamps) is compared without them. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from servingtopology.planner.fidelity.benchmark_cases import UNSTATED, BenchmarkCase, Harness, Topology, predict_cases
from servingtopology.planner.hardware import Gpu
from servingtopology.planner.layout import Engine, Layout, LayoutKind, Role
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.deployment_fit import Point, Predictor, with_factors
from servingtopology.planner.perf.predict import delivery_ms
from servingtopology.planner.perf.step import request_overhead_s
from servingtopology.planner.sim import RequestSet, simulate

__all__ = ["PointFn", "closed_loop_fn", "simulated_fn", "poisson_requests", "predictor", "point_fn"]

PointFn = Callable[[], tuple[float, float]]
MAX_SIMULATED_REQUESTS = 600


def closed_loop_fn(point: Point, *, model: ModelArch, gpu: Gpu, engine: Engine, layout: Layout, release: str = "") -> PointFn:
    """Mean TTFT and TPOT of `point.load` clients on one replica's share of them (aggregated layouts)."""
    if layout.kind is LayoutKind.PD:
        raise ValueError("closed-loop points of a PD layout are not supported; give request-rate points")
    role = layout.roles[Role.AGGREGATED]
    par = role.parallelism
    clients = max(round(point.load / max(role.count, 1)), 1)
    topo = Topology(tp=par.tp, pp=par.pp, dp=par.dp, moe_ep=par.moe_ep)
    per_client = max(point.requests / max(point.load, 1.0), 1.0)
    case = BenchmarkCase(row_id=point.row, backend=engine.value, mode="agg", system=gpu.id, model_path=model.name,
                           isl=max(round(point.input_tokens), 1), osl=max(round(point.output_tokens), 1),
                           concurrency=clients, precision=layout.precision, moe_precision=layout.precision, agg=topo, prefill=None,
                           decode=None, ttft_ms=point.ttft_ms, tpot_ms=point.tpot_ms,
                           harness=Harness(UNSTATED.name, requests_per_client=per_client), engine_release=release)

    def fn() -> tuple[float, float]:
        p = predict_cases([case], model, gpu)[0]
        return p.ttft_ms, p.tpot_ms
    return fn


def poisson_requests(point: Point, *, seed: int = 0) -> RequestSet:
    """min(point.requests, MAX_SIMULATED_REQUESTS) requests of the point's mean lengths, Poisson arrivals at its rate."""
    n = int(min(max(point.requests, 1), MAX_SIMULATED_REQUESTS))
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / max(point.load, 1e-9), n))
    arrival -= arrival[0]
    ones = np.ones(n, dtype=np.int64)
    return RequestSet(arrival, ones * max(round(point.input_tokens), 1), ones * max(round(point.output_tokens), 1),
                      np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))


def simulated_fn(requests: RequestSet, *, model: ModelArch, gpu: Gpu, engine: Engine, layout: Layout, client_side: bool,
                 pool_tokens: Mapping[Role, int] | None = None, measured: Sequence[int] | None = None) -> PointFn:
    """Mean TTFT and TPOT of the simulated `requests` (of the requests indexed by `measured`, when given)."""
    idx = None if measured is None else np.asarray(measured, dtype=np.int64)

    def fn() -> tuple[float, float]:
        res = simulate(layout, model=model, gpu=gpu, engine=engine, requests=requests, precision=layout.precision,
                       pool_tokens=pool_tokens)
        ttft, tpot = res.ttft_ms, res.tpot_ms
        if idx is not None:
            ttft, tpot = ttft[idx], tpot[idx]
        extra, mean_tpot = 0.0, float(np.nanmean(tpot))
        if client_side:
            pd = layout.kind is LayoutKind.PD
            extra = float(np.mean(request_overhead_s(engine, requests.prompt_tokens if idx is None else requests.prompt_tokens[idx],
                                                     disaggregated=pd))) * 1e3
            extra += delivery_ms(layout, mean_tpot / 1e3)
        return float(np.nanmean(ttft)) + extra, mean_tpot
    return fn


def point_fn(point: Point, *, model: ModelArch, gpu: Gpu, engine: Engine, layout: Layout, release: str = "") -> PointFn:
    """The predictor of a benchmark client's point: closed loop for concurrency points, simulated Poisson for rates."""
    if point.load_kind == "concurrency":
        return closed_loop_fn(point, model=model, gpu=gpu, engine=engine, layout=layout, release=release)
    return simulated_fn(poisson_requests(point), model=model, gpu=gpu, engine=engine, layout=layout, client_side=True)


def predictor(fns: Sequence[PointFn]) -> Predictor:
    """deployment_fit's predictor: every point's figures with the factors applied."""
    def predict(factors: Mapping[str, float]) -> Any:
        with with_factors(factors):
            return np.array([fn() for fn in fns], dtype=float)
    return predict

