"""The planner's two estimators on the same benchmark rows: the simulator (stage 6) against the closed-loop benchmark
estimator (`validate`, the fit) and both against the measurement, on the families no fit saw.

Every aggregated vLLM row of MiniMax-M2.5 (silicon_minimax_m25.csv) and Qwen3-32B (silicon_qwen3_32b.csv) is predicted
by `planner.fidelity.benchmark_cases` with the shipped parameters (held out: the fit read neither file) and simulated
with the same parameters, the row's launch flags (`benchmark_cases.simulator_knobs`) and its harness's requests: N
closed-loop clients sending `requests_per_client` requests each, lengths drawn as the harness draws them (InferenceX:
uniform integers in [int(0.8·L), L], input and output apart; otherwise L). Rows of one configuration are simulated once.

Printed, by layout kind and client bucket: the median |simulated / estimated − 1| of TPOT and TTFT, and each against the
measurement. The simulator's TTFT is a client's, as a plan counts it: the engine's plus the front end
(`perf.request_overhead_s`) and the first token's delivery (`perf.delivery_s`: `result_delay_steps` mean steps, the run's
mean TPOT the step), the terms the estimator counts too; printed beside it is the engine's alone (without the delivery),
the figure the engine's own TTFT metric is compared with.
Judged: the TPOT agreement (median at most 5 %), the two must price the same steps alike, and the TTFT agreement
(median at most 15 %), a plan's TTFT and `validate`'s must count the same terms. Exits 1 past either.

    .venv/bin/python benchmarks/sim_vs_estimator.py [--max-rows N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lomo_decisions import SHARED, client_bucket

from servingtopology.cli.validate import load_measurements
from servingtopology.planner.fidelity.benchmark_cases import BenchmarkCase, Prediction, predict_all, simulator_knobs
from servingtopology.planner.fidelity.scores import layout_kind
from servingtopology.planner.layout import Engine, Layout, Parallelism
from servingtopology.planner.perf.step import delivery_s, perf_params, request_overhead_s
from servingtopology.planner.sim import RequestSet, simulate

FILES = ("silicon_minimax_m25.csv", "silicon_qwen3_32b.csv")
TPOT_AGREEMENT_PCT = 5.0
TTFT_AGREEMENT_PCT = 15.0   # a client's TTFT as both count it (11.2 % when the plans began to count the delivery, stop 55)


def harness_requests(case: BenchmarkCase, rng: np.random.Generator) -> RequestSet:
    """The row's benchmark as the simulator's closed loop: N clients, `requests_per_client` requests each (the fitted
    parameter where the harness does not say), lengths drawn as the harness draws them."""
    per_client = case.harness.requests_per_client or perf_params().bench_requests_per_client
    n = round(case.concurrency * per_client)
    floor = case.harness.length_floor

    def draw(label: int) -> Any:
        return rng.integers(int(floor * label), label + 1, size=n) if floor < 1.0 else np.full(n, label)

    return RequestSet(np.full(n, np.nan), np.asarray(draw(case.isl), dtype=np.int64), np.asarray(draw(case.osl), dtype=np.int64),
                      np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64) % case.concurrency)


def _config(c: BenchmarkCase) -> tuple[Any, ...]:
    return (c.model_path, c.system, c.engine_release, c.precision, c.moe_precision, c.topology_label, c.isl, c.osl, c.concurrency,
            c.harness.name)


def _med(values: list[float]) -> float | None:
    return round(100.0 * statistics.median(values), 1) if values else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-rows", type=int, default=0, help="simulate at most this many configurations (0: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    parts = [load_measurements(SHARED / f, model_dir=SHARED / "models", backends=("vllm",)) for f in FILES]
    cases = [c for m in parts for c in m.cases if c.mode == "agg" and c.agg is not None]
    models = {k: v for m in parts for k, v in m.models.items()}
    gpus = {k: v for m in parts for k, v in m.gpus.items()}
    estimates = predict_all(cases, models, gpus, params=perf_params())
    rng = np.random.default_rng(0)
    simulated: dict[tuple[Any, ...], tuple[float, float]] = {}
    rows: list[dict[str, Any]] = []
    for c, e in zip(cases, estimates, strict=True):
        if not isinstance(e, Prediction):
            continue
        key = _config(c)
        if key not in simulated:
            if args.max_rows and len(simulated) >= args.max_rows:
                continue
            t = c.agg
            assert t is not None
            layout = Layout.replicas(t.workers, Parallelism(tp=t.tp, pp=t.pp, dp=t.dp, ep=t.moe_ep > 1), simulator_knobs(c, gpus[c.system]))
            requests = harness_requests(c, rng)
            s = simulate(layout, model=models[c.model_path], gpu=gpus[c.system], engine=Engine.VLLM, requests=requests,
                         precision=c.precision).summary()
            front = float(request_overhead_s(Engine.VLLM, float(np.mean(requests.prompt_tokens))))
            simulated[key] = (s.ttft_ms.mean + front * 1e3, s.tpot_ms.mean)
        engine_ttft, tpot = simulated[key]
        rows.append({"kind": layout_kind(c), "clients": client_bucket(c), "sim_ttft": engine_ttft + float(delivery_s(tpot)),
                     "sim_tpot": tpot, "sim_ttft_engine": engine_ttft, "est_ttft": e.ttft_ms, "est_tpot": e.tpot_ms,
                     "ttft": c.ttft_ms, "tpot": c.tpot_ms})
    cpu = time.process_time() - t0

    def block(rs: list[dict[str, Any]]) -> dict[str, Any]:
        def ape(a: str, b: str) -> float | None:
            return _med([abs(r[a] / r[b] - 1.0) for r in rs])
        return {"rows": len(rs), "tpot_sim_vs_est": ape("sim_tpot", "est_tpot"), "ttft_sim_vs_est": ape("sim_ttft", "est_ttft"),
                "ttft_engine_vs_est": ape("sim_ttft_engine", "est_ttft"), "tpot_sim_vs_measured": ape("sim_tpot", "tpot"),
                "tpot_est_vs_measured": ape("est_tpot", "tpot"), "ttft_sim_vs_measured": ape("sim_ttft", "ttft"),
                "ttft_engine_vs_measured": ape("sim_ttft_engine", "ttft"), "ttft_est_vs_measured": ape("est_ttft", "ttft")}

    out = {"overall": block(rows), "configurations": len(simulated), "cpu_s": round(cpu, 1),
           "by_kind": {k: block([r for r in rows if r["kind"] == k]) for k in sorted({r["kind"] for r in rows})},
           "by_clients": {k: block([r for r in rows if r["clients"] == k]) for k in sorted({r["clients"] for r in rows})}}
    agreement = out["overall"]["tpot_sim_vs_est"]
    ttft_agreement = out["overall"]["ttft_sim_vs_est"]
    ok_tpot = agreement is not None and agreement <= TPOT_AGREEMENT_PCT
    ok_ttft = ttft_agreement is not None and ttft_agreement <= TTFT_AGREEMENT_PCT
    ok = ok_tpot and ok_ttft
    if args.json:
        print(json.dumps(out | {"target_tpot_sim_vs_est_pct": TPOT_AGREEMENT_PCT, "target_ttft_sim_vs_est_pct": TTFT_AGREEMENT_PCT,
                                "met": ok}))
    else:
        print(f"aggregated vLLM rows of {', '.join(FILES)}, shipped parameters (held out), {len(rows)} rows, "
              f"{len(simulated)} configurations simulated ({cpu:.0f} CPU s); median |ratio − 1| %")
        print(f"  {'':16s} {'rows':>5s}  {'TPOT sim/est':>12s} {'TTFT sim/est':>12s} {'engine/est':>10s}   "
              f"{'TPOT sim/meas':>13s} {'est/meas':>8s}   {'TTFT sim/meas':>13s} {'engine':>6s} {'est/meas':>8s}")

        def line(name: str, b: dict[str, Any]) -> str:
            def v(x: float | None) -> str:
                return "-" if x is None else f"{x:.1f}"
            return (f"  {name:16s} {b['rows']:5d}  {v(b['tpot_sim_vs_est']):>12s} {v(b['ttft_sim_vs_est']):>12s} "
                    f"{v(b['ttft_engine_vs_est']):>10s}   {v(b['tpot_sim_vs_measured']):>13s} {v(b['tpot_est_vs_measured']):>8s}   "
                    f"{v(b['ttft_sim_vs_measured']):>13s} {v(b['ttft_engine_vs_measured']):>6s} {v(b['ttft_est_vs_measured']):>8s}")
        print(line("overall", out["overall"]))
        for group in ("by_kind", "by_clients"):
            for k, b in out[group].items():
                print(line(k, b))
        print(f"  TPOT agreement {agreement} %: target ≤ {TPOT_AGREEMENT_PCT:g} %, {'met' if ok_tpot else 'NOT met'}")
        print(f"  TTFT agreement {ttft_agreement} %: target ≤ {TTFT_AGREEMENT_PCT:g} %, {'met' if ok_ttft else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
