"""Accuracy of a deployment's own calibration (issue #27; planner.perf.deployment_fit), never fitted on the rows it predicts.

A. Replays (shared/groundtruth/llmservingsim_vllm_refs): each recorded vLLM run's requests, by arrival, are split in
   halves. The calibration is fitted on the first half's measured latencies only (two points: the mean TTFT and TPOT
   of its first and of its second quarter), the simulator replaying the run's arrivals and lengths (inputs: a request
   of the first half still decoding shares its steps with the second half's early arrivals); the second half is then
   predicted by the same replay with the fitted factors. No latency of the second half is read before the comparison.
   Target: the second half's mean TTFT and mean TPOT within ±3 %.
B. Leave-one-load-level-out on the shared silicon rows (vLLM + SGLang of silicon_calibration.csv and
   silicon_qwen3_32b.csv): a deployment is one (model, GPU, engine and release, precision, layout, lengths, harness)
   measured at three or more client counts. Each client count in turn is held out; the calibration is fitted on the
   other counts' rows and predicts the held-out ones. The model under it is the leave-one-model-out fold that never saw
   the family (as in lomo_decisions.py), so "uncalibrated" is the model on a cluster it never saw. Target: the median
   TTFT and TPOT absolute percentage errors of the held-out rows at least halved against uncalibrated.

Prints the figures; exits 1 when a target is missed (`--no-fail` prints only).

    .venv/bin/python benchmarks/calibration_accuracy.py [--json] [--no-fail] [--max-groups N]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lomo_decisions as lomo

from servingtopology.cli.simulate import (
    load_replay,
    read_trace,
)
from servingtopology.planner.fidelity.benchmark_cases import BenchmarkCase, Prediction, predict_cases
from servingtopology.planner.layout import Role
from servingtopology.planner.perf.deployment_fit import Deployment, Point, fit, with_factors
from servingtopology.planner.perf.step import fit_record, perf_params
from servingtopology.planner.sim import RequestSet, simulate
from tests.groundtruth import GROUNDTRUTH

REPLAY_TARGET_PCT = 3.0
HALVING = 0.5


# ---- A. replays: first half -> second half ---------------------------------------------------------------------
def _per_request(folder: Path, output_tokens: Any) -> tuple[Any, Any]:
    """Recorded TTFT and TPOT (ms) per request, in from_rows' arrival order (TPOT NaN for one-token answers)."""
    rows = [r for r in read_trace(folder / "requests.jsonl", field="requests.jsonl")]
    rows.sort(key=lambda r: float(r["queued_ts"]))  # type: ignore[arg-type]
    q = np.array([float(r["queued_ts"]) for r in rows])  # type: ignore[arg-type]
    f = np.array([float(r["first_token_ts"]) for r in rows])  # type: ignore[arg-type]
    last = np.array([float(r["last_token_ts"]) for r in rows])  # type: ignore[arg-type]
    o = np.asarray(output_tokens, dtype=float)  # the replay's own count, same arrival order
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(o > 1, (last - f) / (o - 1), np.nan) * 1e3
    return (f - q) * 1e3, tpot


def _subset(req: RequestSet, idx: Any) -> RequestSet:
    return RequestSet(req.arrival_s[idx], req.prompt_tokens[idx], req.output_tokens[idx], req.prefix_key[idx], req.shared_tokens[idx],
                      req.client[idx])


def replay_split(folder: Path) -> dict[str, Any]:
    rep = load_replay(folder)
    ttft, tpot = _per_request(folder, rep.requests.output_tokens)
    n = len(rep.requests)
    assert len(ttft) == n, (len(ttft), n)
    half, quarter = n // 2, n // 4
    first = np.arange(half)
    second = np.arange(half, n)
    pools = {Role.AGGREGATED: rep.pool_tokens} if rep.pool_tokens else None

    def sim(requests: RequestSet) -> Any:
        return simulate(rep.layout, model=rep.model, gpu=rep.gpu, engine=rep.engine, requests=requests, pool_tokens=pools)

    windows = (np.arange(quarter), np.arange(quarter, half))
    points = [Point(float(np.mean(ttft[w])), float(np.nanmean(tpot[w])), float(len(w)), "rate",
                    float(np.mean(rep.requests.prompt_tokens[w])), float(np.mean(rep.requests.output_tokens[w])), len(w),
                    source=str(folder), row=f"requests {w[0]}-{w[-1]} by arrival") for w in windows]
    del first

    def predict(factors: Mapping[str, float]) -> Any:
        # The whole run's arrivals and lengths (inputs, as a replay takes them: a first-half request still decoding
        # shares its steps with the second half's early arrivals; replaying the first half alone under-states its
        # TPOT by 2-22 %), compared on the first half's measured latencies only.
        with with_factors(factors):
            r = sim(rep.requests)
        return np.array([[np.mean(r.ttft_ms[w]), np.nanmean(r.tpot_ms[w])] for w in windows])

    t0 = time.process_time()
    cal = fit(Deployment(rep.model.name, rep.gpu.id, rep.engine.value, layout=rep.layout.label), points, predict, half_life_s=math.inf)
    cpu = time.process_time() - t0
    raw = sim(rep.requests)
    with cal.applied():
        calibrated = sim(rep.requests)
    measured = (float(np.mean(ttft[second])), float(np.nanmean(tpot[second])))

    def err(r: Any) -> tuple[float, float]:
        return (100 * (float(np.mean(r.ttft_ms[second])) / measured[0] - 1), 100 * (float(np.nanmean(r.tpot_ms[second])) / measured[1] - 1))
    return {"run": folder.name, "requests": n, "fit_cpu_s": round(cpu, 1), "factors": {k: round(v, 3) for k, v in cal.factors.items()},
            "uncalibrated_pct": [round(x, 2) for x in err(raw)], "calibrated_pct": [round(x, 2) for x in err(calibrated)],
            "measured_second_half_ms": [round(x, 2) for x in measured]}


# ---- B. leave-one-load-level-out on the shared rows ----------------------------------------------------------------
def _deployment_key(c: BenchmarkCase) -> tuple[Any, ...]:
    return (c.model_path, c.system, c.backend, c.engine_release, c.precision, c.moe_precision, c.mode, c.topology_label, c.isl, c.osl,
            c.harness.name)


def load_level_out(max_groups: int | None) -> dict[str, Any]:
    lomo.SHARED = GROUNDTRUTH
    m, results, used = lomo.shared_lomo_predictions(GROUNDTRUTH)
    folds = {", ".join(sorted(f["models"])): f["params"] for f in (fit_record().get("leave_one_model_out") or {}).get("folds") or []}
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, (c, r) in enumerate(zip(m.cases, results, strict=True)):
        if isinstance(r, Prediction) and c.mode == "agg":
            groups[_deployment_key(c)].append(i)
    eligible = [idx for idx in groups.values() if len({m.cases[i].concurrency for i in idx}) >= 3]
    eligible.sort(key=lambda idx: (m.cases[idx[0]].backend, m.cases[idx[0]].model_path, m.cases[idx[0]].system, m.cases[idx[0]].topology_label))
    if max_groups:
        eligible = eligible[:max_groups]
    rows: list[dict[str, Any]] = []
    t0 = time.process_time()
    for idx in eligible:
        first = m.cases[idx[0]]
        model, gpu = m.models[first.model_path], m.gpus[first.system]
        fold = used[idx[0]].removeprefix("fold without ")
        base = replace(perf_params(), **{k: float(v) for k, v in folds[fold].items()}) if fold in folds else perf_params()
        levels = sorted({m.cases[i].concurrency for i in idx})
        for held in levels:
            train = [m.cases[i] for i in idx if m.cases[i].concurrency != held]
            test = [(i, m.cases[i]) for i in idx if m.cases[i].concurrency == held]
            points = [Point(c.ttft_ms, c.tpot_ms, c.concurrency, "concurrency", c.isl, c.osl, 10 * c.concurrency, row=c.row_id)
                      for c in train]

            def predict(factors: Mapping[str, float], train: list[BenchmarkCase] = train, base: Any = base, model: Any = model,
                        gpu: Any = gpu) -> Any:
                with with_factors(factors, base):
                    preds = predict_cases(train, model, gpu)  # type: ignore[arg-type]
                return np.array([[p.ttft_ms, p.tpot_ms] for p in preds])
            cal = fit(Deployment(first.model_path, first.system, first.backend, first.engine_release, "", first.topology_label), points, predict,
                      half_life_s=math.inf)
            with cal.applied(base):
                calibrated = predict_cases([c for _, c in test], model, gpu)  # type: ignore[arg-type]
            for (i, c), p in zip(test, calibrated, strict=True):
                raw = results[i]
                assert isinstance(raw, Prediction)
                rows.append({"engine": c.backend, "deployment": f"{c.model_path} {c.system} {c.backend} {c.engine_release} {c.topology_label} "
                             f"{c.isl}/{c.osl}", "clients": c.concurrency, "levels_fitted": len(levels) - 1,
                             "ttft_raw": abs(raw.ttft_ms / c.ttft_ms - 1) * 100, "tpot_raw": abs(raw.tpot_ms / c.tpot_ms - 1) * 100,
                             "ttft_cal": abs(p.ttft_ms / c.ttft_ms - 1) * 100 if math.isfinite(p.ttft_ms) else math.inf,
                             "tpot_cal": abs(p.tpot_ms / c.tpot_ms - 1) * 100 if math.isfinite(p.tpot_ms) else math.inf})
    cpu = time.process_time() - t0

    def med(key: str, sel: list[dict[str, Any]]) -> float:
        return round(float(np.median([r[key] for r in sel])), 2) if sel else math.nan
    by_engine = {e: {k: med(k, [r for r in rows if r["engine"] == e]) for k in ("ttft_raw", "ttft_cal", "tpot_raw", "tpot_cal")}
                 | {"rows": sum(r["engine"] == e for r in rows)} for e in sorted({r["engine"] for r in rows})}
    return {"deployments": len(eligible), "rows": len(rows), "cpu_s": round(cpu, 1),
            "median_ape": {k: med(k, rows) for k in ("ttft_raw", "ttft_cal", "tpot_raw", "tpot_cal")}, "by_engine": by_engine}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-fail", action="store_true")
    ap.add_argument("--max-groups", type=int, default=None, help="only the first N deployments of part B (a quick look)")
    ap.add_argument("--skip-replays", action="store_true")
    args = ap.parse_args(argv)
    refs = GROUNDTRUTH / "llmservingsim_vllm_refs"
    replays = [] if args.skip_replays else [replay_split(f) for f in sorted(refs.iterdir()) if (f / "requests.jsonl").exists()]
    lolo = load_level_out(args.max_groups)
    missed = []
    for r in replays:
        for name, v in zip(("TTFT", "TPOT"), r["calibrated_pct"], strict=True):
            if abs(v) > REPLAY_TARGET_PCT:
                missed.append(f"{r['run']} second-half mean {name} {v:+.2f} %")
    med = lolo["median_ape"]
    for m_ in ("ttft", "tpot"):
        if not med[f"{m_}_cal"] <= HALVING * med[f"{m_}_raw"]:
            missed.append(f"leave-one-load-level-out median {m_.upper()} {med[f'{m_}_raw']} → {med[f'{m_}_cal']} % (not halved)")
    if args.json:
        print(json.dumps({"replays": replays, "leave_one_load_level_out": lolo, "missed": missed}))
    else:
        print("A. replays, calibrated on the first half of each run's requests (by arrival), predicting the second half (target ±3 %):")
        for r in replays:
            u, c = r["uncalibrated_pct"], r["calibrated_pct"]
            print(f"  {r['run']:28s} {r['requests']} requests; second-half mean TTFT {u[0]:+.2f} → {c[0]:+.2f} %, TPOT {u[1]:+.2f} → {c[1]:+.2f} % "
                  f"(fit {r['fit_cpu_s']} CPU s)")
            print("    factors: " + ", ".join(f"{k} {v}" for k, v in r["factors"].items() if abs(v - 1) > 0.0005))
        print(f"B. leave-one-load-level-out, {lolo['deployments']} deployments (≥ 3 client counts each), {lolo['rows']} held-out rows, "
              f"under leave-one-model-out parameters ({lolo['cpu_s']} CPU s):")
        print(f"  median APE uncalibrated → calibrated: TTFT {med['ttft_raw']} → {med['ttft_cal']} %, TPOT {med['tpot_raw']} → {med['tpot_cal']} % "
              "(target: at least halved)")
        for e, b in lolo["by_engine"].items():
            print(f"    {e:8s} {b['rows']:4d} rows: TTFT {b['ttft_raw']} → {b['ttft_cal']} %, TPOT {b['tpot_raw']} → {b['tpot_cal']} %")
        print("missed: " + ("; ".join(missed) if missed else "none"))
    return 1 if missed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
