"""Fit the global efficiency parameters of the performance model on the shared silicon measurements.

Reproducible from shared/groundtruth/silicon_calibration.csv and its model configs: a bounded Nelder–Mead
(written here; scipy is not a dependency) over log-parameters minimises a robust loss of log(predicted /
measured) TTFT and TPOT on the vLLM and SGLang rows (TensorRT-LLM rows at a lower weight, they alone set
its overhead scale). No parameter is keyed by model. Writes planner/data/perf_params.json with provenance.

    .venv/bin/python benchmarks/fit_perf.py [--csv PATH] [--model-dir DIR] [--evals N] [--dry-run]

The committed data file came from `--from-defaults --evals 1500 --restarts 2` (about 7 minutes on 2 cores);
without --from-defaults the search warm-starts from the committed parameters.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from servingtopology.cli.validate import Measurements, evaluate, load_measurements
from servingtopology.planner.calibration import Prediction, predict_all
from servingtopology.planner.perf import PerfParams, perf_params

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "groundtruth"
OUT = ROOT / "planner" / "data" / "perf_params.json"

# name: (lower, upper) bounds; fitted in log space.
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_eff_max": (0.2, 0.95),
    "gemm_half_tokens": (1.0, 1024.0),
    "fp8_eff_scale": (0.3, 1.0),
    "fp4_eff_scale": (0.2, 1.0),
    "moe_eff_scale": (0.1, 1.0),
    "mem_eff": (0.3, 0.95),
    "roofline_sharpness": (1.0, 8.0),
    "narrow_width_cols": (1.0, 2048.0),
    "attn_prefill_eff": (0.1, 0.9),
    "attn_decode_mem_eff": (0.2, 0.95),
    "link_eff": (0.2, 0.95),
    "allreduce_latency_s": (1e-6, 60e-6),
    "a2a_latency_s": (2e-6, 200e-6),
    "layer_overhead_s": (1e-6, 80e-6),
    "step_overhead_s": (1e-4, 8e-3),
    "per_seq_overhead_s": (1e-7, 60e-6),
    "sglang_overhead_scale": (0.2, 8.0),
    "trtllm_overhead_scale": (0.1, 3.0),
    "ttft_overhead_s": (1e-3, 0.5),
    "sglang_ttft_overhead_s": (1e-3, 0.5),
    "trtllm_ttft_overhead_s": (1e-3, 0.5),
    "disagg_ttft_overhead_s": (1e-3, 1.0),
    "ttft_s_per_input_token": (1e-8, 2e-4),
    "sglang_ttft_s_per_input_token": (1e-8, 2e-4),
    "result_delay_steps": (0.01, 5.0),
    "pd_admission_steps": (0.01, 30.0),
    "bench_requests_per_client": (1.0, 50.0),
    "sglang_bench_requests_per_client": (1.0, 50.0),
    "arrival_burst": (0.0, 1.0),
    "queue_factor": (0.1, 20.0),
}
_FLOOR = {"arrival_burst": 1e-3}


def _to_params(x: np.ndarray, base: PerfParams, names: list[str]) -> PerfParams:
    values = {}
    for v, name in zip(x, names, strict=True):
        lo, hi = BOUNDS[name]
        lo = max(lo, _FLOOR.get(name, lo))
        values[name] = float(min(max(math.exp(v), lo), hi))
    return replace(base, **values)


def _from_params(p: PerfParams, names: list[str]) -> np.ndarray:
    return np.array([math.log(max(getattr(p, name), _FLOOR.get(name, 1e-12))) for name in names])


def _pins(specs: list[str]) -> dict[str, float]:
    """`NAME=VALUE` pairs held fixed during the search (a physical choice, e.g. the roofline's form)."""
    pins = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        if name not in BOUNDS:
            raise SystemExit(f"--fix: unknown parameter {name!r}")
        pins[name] = float(value)
    return pins


def _loss(m: Measurements, params: PerfParams) -> float:
    """Weighted Cauchy loss of log(predicted / measured) (scale c = 0.2) over TTFT (weight 1.5) and TPOT (1).

    The Cauchy loss flattens for large errors, so rows whose recorded topology or setup cannot be what ran
    (a few hundred-fold TTFTs) do not pull the bulk: the targets are medians.
    """
    results = predict_all(m.cases, m.models, m.gpus, params=params)
    w = np.array([1.0 if c.backend in ("vllm", "sglang") else 0.3 for c in m.cases])
    ok = np.array([isinstance(r, Prediction) for r in results])
    pred = np.array([[r.ttft_ms, r.tpot_ms] if isinstance(r, Prediction) else [1.0, 1.0] for r in results])
    meas = np.array([[c.ttft_ms, c.tpot_ms] for c in m.cases])
    c = 0.2
    e = np.log(pred / meas)
    cauchy = 0.5 * c * c * np.log1p((e / c) ** 2)
    per_row = np.where(ok, cauchy @ np.array([1.5, 1.0]), 0.5)
    return float(np.sum(w * per_row) / np.sum(w))


def nelder_mead(fn, x0: np.ndarray, *, step: float, evals: int, log_every: int = 50) -> tuple[np.ndarray, float]:
    """Adaptive Nelder–Mead (Gao and Han 2012 coefficients) for `evals` function evaluations."""
    n = len(x0)
    alpha, gamma, rho, sigma = 1.0, 1.0 + 2.0 / n, 0.75 - 1.0 / (2 * n), 1.0 - 1.0 / n
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [fn(x) for x in simplex]
    used = n + 1
    last_log = 0
    while used < evals:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if used // log_every != last_log:
            last_log = used // log_every
            print(f"  eval {used:5d}  loss {values[0]:.5f}", flush=True)
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + alpha * (centroid - simplex[-1])
        fr = fn(xr)
        used += 1
        if values[0] <= fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        elif fr < values[0]:
            xe = centroid + gamma * (xr - centroid)
            fe = fn(xe)
            used += 1
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        else:
            outside = fr < values[-1]
            xc = centroid + rho * ((xr if outside else simplex[-1]) - centroid)
            fc = fn(xc)
            used += 1
            if fc < (fr if outside else values[-1]):
                simplex[-1], values[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + sigma * (simplex[i] - simplex[0])
                    values[i] = fn(simplex[i])
                used += n
    best = int(np.argmin(values))
    return simplex[best], values[best]


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=SHARED / "silicon_calibration.csv")
    ap.add_argument("--model-dir", type=Path, default=SHARED / "models")
    ap.add_argument("--evals", type=int, default=1200, help="loss evaluations per Nelder–Mead restart")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--from-defaults", action="store_true", help="start from PerfParams() instead of the current fit")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, do not write the data file")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a parameter at VALUE instead of fitting it (repeatable)")
    ap.add_argument("--out", type=Path, default=OUT, help="where to write the fitted parameters")
    args = ap.parse_args(argv)

    m = load_measurements(args.csv, model_dir=args.model_dir)
    pins = _pins(args.fix)
    base = replace(PerfParams() if args.from_defaults else perf_params(), **pins)
    names = [n for n in BOUNDS if n not in pins]
    x = _from_params(base, names)
    t0 = time.perf_counter()
    start_loss = _loss(m, _to_params(x, base, names))
    print(f"rows {len(m.cases)}, start loss {start_loss:.5f}")
    loss = start_loss
    for k in range(args.restarts):
        x, loss = nelder_mead(lambda v: _loss(m, _to_params(v, base, names)), x, step=0.3 / (k + 1), evals=args.evals)
        print(f"restart {k}: loss {loss:.5f} after {time.perf_counter() - t0:.0f} s")
    fitted = _to_params(x, base, names)
    _, summary = evaluate(m, fitted)
    sel = [c.backend in ("vllm", "sglang") for c in m.cases]
    sub = Measurements([c for c, s in zip(m.cases, sel, strict=True) if s], m.models, m.gpus, m.skipped_at_parse)
    _, sub_summary = evaluate(sub, fitted)
    for name in BOUNDS:
        print(f"  {name:28s} {getattr(fitted, name):.6g}")
    for label, s in (("all rows", summary), ("vLLM+SGLang", sub_summary)):
        print(f"{label}: TTFT median APE {s['ttft']['median_ape']} %, TPOT median APE {s['tpot']['median_ape']} %, "
              f"top-1 {s['ranking']['top1_agreement']}, skipped {s['skipped']['count']}")
    record = {
        "source": f"benchmarks/fit_perf.py on {args.csv.name} (ai-dynamo/aiconfigurator @ 095f58a51c4c silicon_sample.csv subset)",
        "data_file": str(args.csv.name),
        "commit": _commit(),
        "fitted_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "rows_used": len(m.cases),
        "loss": round(loss, 6),
        "fixed": pins,
        "fit_error": {
            "all": {k: summary[k] for k in ("ttft", "tpot", "ranking")},
            "vllm_sglang": {k: sub_summary[k] for k in ("ttft", "tpot", "ranking")},
        },
        "params": {k: v for k, v in asdict(fitted).items() if k != "source"},
    }
    if args.dry_run:
        print(json.dumps(record["params"], indent=1))
        return 0
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
