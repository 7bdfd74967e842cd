"""Fit the global efficiency parameters of the performance model on the shared measurements.

Reproducible from shared/groundtruth: silicon_calibration.csv with its model configs, and the decode steps
recorded in llmservingsim_vllm_refs/*/timeseries.csv (only the run whose KV occupancy was recorded, the RTX
4090 one; the RTX PRO 6000 run stays a check). The loss, over log(predicted / measured):
  - per row, TTFT (weight --ttft-weight) and TPOT of the vLLM and SGLang rows (TensorRT-LLM rows at 0.3;
    they alone set its overhead scale);
  - per pair of rows that a ranking compares (same model, precision, system, backend, lengths and
    concurrency; different topology), the ratio of their TPOTs and of their request cycles (--rank-weight);
  - per recorded 1 s decode tick, the step time (--step-weight).
All terms use a Cauchy loss (scale 0.2), so rows whose setup cannot be what ran do not pull the bulk. The
search is a bounded compass search over log-parameters (written here; scipy is not a dependency). No
parameter is keyed by model. Writes planner/data/perf_params.json with its provenance.

    .venv/bin/python benchmarks/fit_perf.py [--csv PATH] [--model-dir DIR] [--evals N] [--fix NAME=VALUE] [--dry-run]
                                            [--lomo [--lomo-evals N] [--lomo-from-defaults]]

--lomo then leaves each model family out in turn (a family: the same shapes whatever the name or checkpoint
precision, so DeepSeek-R1/V3 and their NVFP4 exports are one): it refits without that family's rows and decode
ticks and predicts its rows, and records the pooled figures under "leave_one_model_out" (the number to improve;
`servingtopology validate --json` and validate_silicon.py report it). A fold is a compass search of --lomo-evals
evaluations warm-started from the fit on every row (about 1 CPU minute a fold for 300); the warm start carries some
information from the held-out rows, so these figures are if anything optimistic (--lomo-from-defaults avoids it).

Pinned from outside the data: gemm_eff_max = 0.8, the best share of BF16 peak a large matmul reaches on
H100 SXM (80.3 %) and B200 (77.6 %) in the "Maximum Achievable Matmul FLOPS" table of
stas00/ml-engineering (compute/accelerator/README.md). The silicon rows are FP8 and FP4 only, so without it
BF16 efficiency would be an extrapolation. The committed file's command line is in its "command" field.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
from replay_refs import decode_ticks

from servingtopology.cli.validate import Measurements, evaluate, load_measurements
from servingtopology.planner.fidelity.benchmark_cases import Prediction, PreparedCases, Skip, predict_all, prepare_cases, without_harness
from servingtopology.planner.fidelity.scores import summarize
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, KvDtype, Role
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.step import NOT_FITTED, PerfParams, load_params, perf_params, step_time_s

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "groundtruth"
OUT = ROOT / "planner" / "data" / "perf_params.json"

# name: (lower, upper) bounds; fitted in log space.
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_eff_max": (0.2, 0.95),
    "gemm_half_tokens": (1.0, 1024.0),
    "fp4_eff_scale": (0.2, 1.0),
    "moe_eff_scale": (0.1, 1.0),
    "mem_eff": (0.3, 0.95),
    "roofline_sharpness": (1.0, 8.0),
    "narrow_width_cols": (1.0, 2048.0),
    "attn_prefill_eff": (0.1, 0.9),
    "attn_decode_mem_eff": (0.2, 0.95),
    "link_eff": (0.2, 0.95),
    "allreduce_latency_s": (1e-6, 60e-6),
    "allreduce_peer_latency_s": (1e-8, 10e-6),
    "a2a_latency_s": (2e-6, 200e-6),
    "layer_overhead_s": (1e-6, 80e-6),
    "step_overhead_s": (1e-4, 8e-3),
    "per_seq_overhead_s": (1e-7, 200e-6),
    "seq_serial_s": (1e-8, 200e-6),
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
    "queue_factor": (0.1, 20.0),
}
_FLOOR: dict[str, float] = {}
# Declared, not fitted (a fold that cannot pin a parameter must fall back to a sourced value, not drift): the
# benchmark length where a caller does not state one (planner.fidelity.benchmark_cases.UNSTATED's 10), the FP8 GEMM share and
# the steady-state prompt collisions (sources beside their PerfParams defaults in planner/perf/step.py).
DECLARED = {"bench_requests_per_client": 10.0, "fp8_eff_scale": PerfParams().fp8_eff_scale, "arrival_burst": PerfParams().arrival_burst}


def _to_params(x: np.ndarray, base: PerfParams, names: list[str]) -> PerfParams:
    values = {}
    for v, name in zip(x, names, strict=True):
        lo, hi = BOUNDS[name]
        lo = max(lo, _FLOOR.get(name, lo))
        values[name] = float(min(max(math.exp(v), lo), hi))
    return replace(base, **values)


# Where a search starts a parameter that the start file lacks (its PerfParams default is 0: the term switched off).
_START = {"allreduce_peer_latency_s": 0.5e-6, "seq_serial_s": 10e-6}


def _from_params(p: PerfParams, names: list[str]) -> np.ndarray:
    return np.array([math.log(max(getattr(p, name) or _START.get(name, 0.0), _FLOOR.get(name, 1e-12))) for name in names])


def _name_values(specs: list[str], allowed: Sequence[str], flag: str) -> dict[str, float]:
    """`NAME=VALUE` pairs of `flag`, each NAME one of `allowed`."""
    out = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        if name not in allowed:
            raise SystemExit(f"{flag}: unknown name {name!r}; allowed: {', '.join(allowed)}")
        out[name] = float(value)
    return out


def _pins(specs: list[str]) -> dict[str, float]:
    """`NAME=VALUE` pairs held fixed during the search (a physical choice, e.g. the roofline's form)."""
    return _name_values(specs, list(BOUNDS), "--fix")


# Settings a fit holds as given: the step model's switches and its values declared from measured kernels.
SWITCHES = ("measured_allreduce", "measured_moe", "measured_gemm", "measured_decode_attention", "moe_layer_latency_s",
            "moe_latency_by_format")


def shipped_switches() -> dict[str, float]:
    """The shipped fit's switches and declared values (planner/data/perf_params.json): the step model a fit from defaults
    fits unless `--set` says otherwise, so its folds are fitted under the model `lomo_decisions.py` scores them with."""
    shipped = perf_params()
    return {name: float(getattr(shipped, name)) for name in SWITCHES}


def _switches(specs: list[str]) -> dict[str, float]:
    """`NAME=VALUE` settings of the step model's switches and declared values (not fitted; recorded with the parameters)."""
    return _name_values(specs, SWITCHES, "--set")


def _pairs(m: Measurements) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs of rows that a ranking compares: same model, precisions, system, backend, lengths and
    concurrency, different topology (the groups of planner.fidelity.scores.ranking_score)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, c in enumerate(m.cases):
        groups.setdefault((c.model_path, c.precision, c.moe_precision, c.system, c.backend, c.isl, c.osl, c.concurrency), []).append(i)
    left, right = [], []
    for idx in groups.values():
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                ca, cb = m.cases[idx[a]], m.cases[idx[b]]
                if (ca.mode, ca.topology_label) != (cb.mode, cb.topology_label):
                    left.append(idx[a])
                    right.append(idx[b])
    return np.array(left, dtype=int), np.array(right, dtype=int)


@dataclass(frozen=True)
class Targets:
    """What the loss compares against, derived once from the measurements: per-row weights, measured
    (TTFT, TPOT), osl − 1, the row pairs a ranking compares, and the rows' parameter-free prediction work
    (benchmark_cases.prepare_cases: skips, groups, geometry), so that each evaluation only prices them."""

    weight: np.ndarray
    measured: np.ndarray
    osl_minus_1: np.ndarray
    left: np.ndarray
    right: np.ndarray
    prepared: PreparedCases


def _targets(m: Measurements) -> Targets:
    left, right = _pairs(m)
    return Targets(weight=np.array([1.0 if c.backend in ("vllm", "sglang") else 0.3 for c in m.cases]),
                   measured=np.array([[c.ttft_ms, c.tpot_ms] for c in m.cases]),
                   osl_minus_1=np.array([max(c.osl - 1, 0) for c in m.cases], dtype=float), left=left, right=right,
                   prepared=prepare_cases(m.cases, m.models, m.gpus))


RANK_WEIGHT = 1.0  # weight of the between-topology term against the per-row term
TTFT_WEIGHT = 1.5  # weight of a row's TTFT error against its TPOT error
STEP_WEIGHT = 0.5  # weight of the measured decode steps of the recorded single-GPU runs


def _cauchy(e: np.ndarray, c: float = 0.2) -> np.ndarray:
    return 0.5 * c * c * np.log1p((e / c) ** 2)


@dataclass(frozen=True)
class StepTicks:
    """Pure-decode step times measured on one recorded run (benchmarks/replay_refs.decode_ticks)."""

    name: str
    model: ModelArch
    gpu: Gpu
    precision: Precision
    kv_dtype: KvDtype
    engine: Engine
    running: np.ndarray
    context: np.ndarray
    measured_s: np.ndarray

    def loss(self, params: PerfParams) -> float:
        t = step_time_s(self.model, self.gpu, precision=self.precision, kv_dtype=self.kv_dtype, engine=self.engine, tp=1, pp=1, dp=1,
                        prefill_tokens=0.0 * self.running, prefill_pairs=0.0, decode_tokens=self.running,
                        decode_context_tokens=self.context, params=params)
        return float(np.mean(_cauchy(np.log(t / self.measured_s))))


def _step_ticks(refs: Path) -> list[StepTicks]:
    """Decode ticks whose KV in use was recorded, from every run under `refs` (single-GPU runs only)."""
    out = []
    for folder in sorted(p for p in refs.iterdir() if (p / "timeseries.csv").exists()):
        rep, decode, _ = decode_ticks(folder, measured_kv_only=True)
        rl = rep.layout.roles[Role.AGGREGATED]
        if not decode or rl.parallelism.gpus != 1:
            continue
        a = np.array(decode)
        out.append(StepTicks(folder.name, rep.model, rep.gpu, rep.layout.precision, rl.knobs.kv_dtype, rep.engine, a[:, 0], a[:, 1], a[:, 2]))
    return out


def _loss(m: Measurements, t: Targets, params: PerfParams, rank_weight: float = RANK_WEIGHT, ticks: Sequence[StepTicks] = (),
          step_weight: float = STEP_WEIGHT, ttft_weight: float = TTFT_WEIGHT) -> float:
    """Weighted Cauchy loss (scale 0.2) of log(predicted / measured) TTFT (weight 1.5) and TPOT (1) per row,
    plus the same loss on the differences between topologies that a ranking compares.

    The per-row term fits the figures; the pair term fits what the planner decides on: for two topologies
    measured under the same benchmark, log(TPOT_a / TPOT_b) and log(cycle_a / cycle_b), where a request's
    cycle (TTFT + (osl − 1)·TPOT) sets tokens/s per GPU. The Cauchy loss flattens for large errors, so rows
    whose recorded topology or setup cannot be what ran (a few hundred-fold TTFTs) do not pull the bulk.
    """
    ttft, tpot, _ = t.prepared.figures(params)  # the figures predict_all gives: a row is predicted where finite and positive
    w, meas, a, b = t.weight, t.measured, t.left, t.right
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(ttft) & np.isfinite(tpot) & (ttft > 0) & (tpot > 0)
    pred = np.where(ok[:, None], np.stack([ttft, tpot], axis=1), 1.0)
    e = np.log(pred / meas)
    per_row = np.where(ok, _cauchy(e) @ np.array([ttft_weight, 1.0]), 0.5)
    row_term = float(np.sum(w * per_row) / np.sum(w))
    step_term = step_weight * float(np.mean([tick.loss(params) for tick in ticks])) if ticks else 0.0
    if len(a) == 0:
        return row_term + step_term
    cyc_p, cyc_m = pred[:, 0] + t.osl_minus_1 * pred[:, 1], meas[:, 0] + t.osl_minus_1 * meas[:, 1]
    e_tpot = np.log(pred[a, 1] / pred[b, 1]) - np.log(meas[a, 1] / meas[b, 1])
    e_cyc = np.log(cyc_p[a] / cyc_p[b]) - np.log(cyc_m[a] / cyc_m[b])
    pw = np.where(ok[a] & ok[b], w[a] * w[b], 0.0)
    pair_term = float(np.sum(pw * (_cauchy(e_tpot) + _cauchy(e_cyc))) / max(np.sum(pw), 1e-9))
    return row_term + rank_weight * pair_term + step_term


def family(model: ModelArch) -> tuple[object, ...]:
    """A model's architecture without its name and checkpoint format: DeepSeek-R1, DeepSeek-V3 and their NVFP4
    exports are one family, as are Llama-3.1-8B-Instruct and its FP8 export (the same shapes run the same way).
    The reader's notes (warnings, assumptions) describe the checkpoint too, so they are left out with it."""
    return tuple(getattr(model, f.name) for f in fields(model) if f.name not in ("name", "checkpoint", "warnings", "assumptions"))


def _subset(m: Measurements, keep: Sequence[bool]) -> Measurements:
    return Measurements([c for c, k in zip(m.cases, keep, strict=True) if k], m.models, m.gpus, m.skipped_at_parse, m.skipped_by_backend)


def _backends(m: Measurements, backends: tuple[str, ...] = ("vllm", "sglang")) -> Measurements:
    return m.for_backends(backends)


def _figures(s: dict) -> dict:
    return {k: s[k] for k in ("ttft", "tpot", "ranking")} | {"predicted": s["predicted"]}


def _families(m: Measurements) -> list[list[str]]:
    fams: dict[tuple[object, ...], list[str]] = {}
    for path, model in m.models.items():
        if isinstance(model, ModelArch):
            fams.setdefault(family(model), []).append(path)
    return sorted(fams.values(), key=lambda v: sorted(v))


def _pooled(m: Measurements, results: list[Prediction | Skip]) -> dict:
    vs = [c.backend in ("vllm", "sglang") for c in m.cases]
    all_s = summarize(m.cases, results, skipped_at_parse=m.skipped_at_parse)
    vs_s = summarize([c for c, k in zip(m.cases, vs, strict=True) if k], [r for r, k in zip(results, vs, strict=True) if k],
                     skipped_at_parse=_backends(m).skipped_at_parse)
    return {"all": _figures(all_s), "vllm_sglang": _figures(vs_s)}


def assemble_folds(m: Measurements, base: PerfParams, records: Sequence[dict]) -> dict:
    """Leave-one-model-out figures pooled from the folds that separate runs recorded (`--lomo-folds` splits the folds
    over processes): each family's rows are predicted again with its own fold's parameters."""
    # A fold recorded twice (a run and its --lomo-resume continuation): the one with the most evaluations.
    best: dict[tuple[str, ...], dict] = {}
    for r in records:
        for f in r["folds"]:
            f = dict(f, evals=f.get("evals", r["evals_per_fold"]))
            if tuple(f["models"]) not in best or f["evals"] > best[tuple(f["models"])]["evals"]:
                best[tuple(f["models"])] = f
    folds = list(best.values())
    results: list[Prediction | Skip] = [Skip("not predicted", "no fold")] * len(m.cases)
    for fold in folds:
        held = [c.model_path in fold["models"] for c in m.cases]
        params = replace(base, **{k: float(v) for k, v in fold["params"].items()})
        preds = predict_all([c for c, h in zip(m.cases, held, strict=True) if h], m.models, m.gpus, params=params)
        for i, pred in zip([i for i, h in enumerate(held) if h], preds, strict=True):
            results[i] = pred
    missing = [sorted(p) for p in _families(m) if not any(sorted(p) == f["models"] for f in folds)]
    if missing:
        raise SystemExit(f"--lomo-from: no fold recorded for {missing}")
    first = records[0]
    # Records from before the search was named ran the compass search ("pattern").
    searches = sorted({s for r in records for s in (r["search"] if isinstance(r.get("search"), list) else [r.get("search", "pattern")])})
    return {"evals_per_fold": sorted({f["evals"] for f in folds}), "start_step": first["start_step"], "start": first.get("start", ""),
            "search": searches[0] if len(searches) == 1 else searches,
            "folds": sorted(folds, key=lambda f: f["models"]), "cpu_s": round(sum(f["cpu_s"] for f in folds), 1),
            # A record that was itself assembled keeps the commands that ran its folds.
            "commands": [c for r in records for c in (r.get("commands") or [r.get("command")])]} | _pooled(m, results)


def leave_one_model_out(m: Measurements, base: PerfParams, names: list[str], x0: np.ndarray, *, evals: int, ticks: Sequence[StepTicks],
                        step: float, loss_args: dict, only: Sequence[str] = (), resume: Sequence[dict] = (),
                        pattern_moves: bool = False) -> dict:
    """Each model family's rows predicted by a fit that never saw that family (its rows and its decode ticks left
    out). Every fold starts from `x0` and runs a compass search of `evals` loss evaluations from `step` (with Hooke and
    Jeeves' pattern moves where `pattern_moves`). `only`: run
    just the folds whose model ids contain one of these strings (the others are left unpredicted). `resume`: folds
    recorded by an earlier run; a fold found there starts from its own recorded parameters (fitted without the
    held-out family, so the continuation stays honest) and adds its evaluations and CPU to the record."""
    earlier = {tuple(f["models"]): dict(f, evals=f.get("evals", r["evals_per_fold"])) for r in resume for f in r["folds"]}
    results: list[Prediction | Skip] = [Skip("not predicted", "no fold")] * len(m.cases)
    folds = []
    for paths in _families(m):
        held = [c.model_path in paths for c in m.cases]
        if not any(held) or (only and not any(o in p for o in only for p in paths)):
            continue
        t0 = time.process_time()
        train = _subset(m, [not h for h in held])
        fam = family(m.models[paths[0]])  # type: ignore[arg-type]
        fold_ticks = [t for t in ticks if family(t.model) != fam]
        targets = _targets(train)

        def loss_of(v: np.ndarray, train: Measurements = train, targets: Targets = targets, fold_ticks: list = fold_ticks) -> float:
            return _loss(train, targets, _to_params(v, base, names), ticks=fold_ticks, **loss_args)

        print(f"fold {'+'.join(sorted(paths))}: {sum(held)} rows held out, {len(train.cases)} fitted", flush=True)
        prior = earlier.get(tuple(sorted(paths)))
        start = x0 if prior is None else _from_params(replace(base, **{k: float(v) for k, v in prior["params"].items()}), names)
        x, fx = pattern_search(loss_of, start, step=step, evals=evals, pattern_moves=pattern_moves) if evals > 1 else (start, loss_of(start))
        held_cases = [c for c, h in zip(m.cases, held, strict=True) if h]
        preds = predict_all(held_cases, m.models, m.gpus, params=_to_params(x, base, names))
        for i, pred in zip([i for i, h in enumerate(held) if h], preds, strict=True):
            results[i] = pred
        cpu = time.process_time() - t0 + (prior["cpu_s"] if prior else 0.0)
        _, fs = evaluate(_backends(_subset(m, held)), _to_params(x, base, names))
        fitted = _to_params(x, base, names)
        folds.append({"models": sorted(paths), "rows": sum(held), "fit_loss": round(fx, 6), "cpu_s": round(cpu, 1),
                      "evals": evals + (prior["evals"] if prior else 0),
                      "vllm_sglang": _figures(fs), "params": {n: float(f"{getattr(fitted, n):.10g}") for n in names}})
        print(f"  held-out vLLM+SGLang: TTFT {fs['ttft']['median_ape']} %, TPOT {fs['tpot']['median_ape']} % ({cpu:.0f} CPU s)", flush=True)
    return {"evals_per_fold": evals, "start_step": step, "search": "hooke-jeeves" if pattern_moves else "pattern",
            "folds": folds} | _pooled(m, results)


def without_harness_figures(m: Measurements, params: PerfParams) -> dict:
    """vLLM+SGLang figures of `params` with every row predicted as if its harness were not known."""
    sub = _backends(m)
    _, s = evaluate(Measurements(without_harness(sub.cases), sub.models, sub.gpus, sub.skipped_at_parse), params)
    return _figures(s)


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


def pattern_search(fn, x0: np.ndarray, *, step: float, evals: int, min_step: float = 0.01,
                   pattern_moves: bool = False) -> tuple[np.ndarray, float]:
    """Compass search (Kolda, Lewis and Torczon 2003): try ±step on each coordinate, keep any improvement,
    halve the step after a sweep without one. Slower per step than Nelder–Mead but it does not stall in a
    flat simplex, so it keeps moving from a warm start.

    `pattern_moves` (Hooke and Jeeves 1961): after a sweep that moved, step again by the sweep's whole move, as long as
    that improves. It follows shallow valleys that cross the coordinates faster (a fold from defaults reached in 1,281
    evaluations the loss the plain search reached in 2,037), and the folds it fits predict their held-out family worse
    (TPOT 12.2 → 14.6 %): an ablation, not the default (benchmarks/README.md, "Folds from defaults in 800 evaluations").

    A point tried before is not evaluated again (the sweep after a move along a coordinate tries the point it came
    from): its loss is remembered. It still counts against `evals`, so the search visits the same points and stops
    where it would have."""
    seen: dict[bytes, float] = {}
    evaluate = fn

    def fn(y: np.ndarray) -> float:
        key = y.tobytes()
        if key not in seen:
            seen[key] = evaluate(y)
        return seen[key]

    x, fx = x0.copy(), fn(x0)
    used = 1
    while used < evals and step >= min_step:
        improved = False
        before = x
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                y = x.copy()
                y[i] += sign * step
                fy = fn(y)
                used += 1
                if fy < fx:
                    x, fx, improved = y, fy, True
                    break
        while pattern_moves and improved and used < evals:
            y = x + (x - before)
            fy = fn(y)
            used += 1
            if not fy < fx:
                break
            before, x, fx = x, y, fy
        print(f"  eval {used:5d}  loss {fx:.5f}  step {step:.3f}  ({len(seen)} evaluated)", flush=True)
        if not improved:
            step *= 0.5
    return x, fx


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, nargs="+", default=[SHARED / "silicon_calibration.csv"],
                    help="the measurements to fit (several: their rows pooled, each family still its own fold with --lomo)")
    ap.add_argument("--model-dir", type=Path, default=SHARED / "models")
    ap.add_argument("--evals", type=int, default=1200, help="loss evaluations per Nelder–Mead restart")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--perturb", type=int, default=None, metavar="SEED",
                    help="start from the start parameters scattered by ×exp(N(0, 0.2)) (a restart away from a local minimum)")
    ap.add_argument("--method", choices=("nelder-mead", "pattern", "hooke-jeeves"), default="pattern",
                    help="search method (hooke-jeeves: the compass search with pattern moves)")
    ap.add_argument("--from-defaults", action="store_true",
                    help="start from PerfParams() instead of the current fit (the shipped fit's switches and declared values kept: "
                         "shipped_switches; --set changes them)")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, do not write the data file")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a switch of the step model that is not fitted (measured_allreduce=1, measured_moe=1, measured_gemm=1: the measured "
                         "kernel tables) in the fit and every fold")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a parameter at VALUE instead of fitting it (repeatable)")
    ap.add_argument("--out", type=Path, default=OUT, help="where to write the fitted parameters")
    ap.add_argument("--start", type=Path, default=None, help="warm-start from this parameter file instead of the committed one")
    ap.add_argument("--step-refs", type=Path, default=SHARED / "llmservingsim_vllm_refs",
                    help="recorded runs whose timeseries.csv decode steps join the fit (see --step-weight)")
    ap.add_argument("--step-weight", type=float, default=STEP_WEIGHT, help="weight of the measured decode-step term (0 = off)")
    ap.add_argument("--ttft-weight", type=float, default=TTFT_WEIGHT, help="weight of a row's TTFT error against its TPOT error")
    ap.add_argument("--rank-weight", type=float, default=RANK_WEIGHT, help="weight of the between-topology loss term")
    ap.add_argument("--lomo", action="store_true",
                    help="after the fit, leave each model family out in turn: refit without it and predict its rows")
    ap.add_argument("--lomo-evals", type=int, default=300, help="loss evaluations per leave-one-model-out fold")
    ap.add_argument("--lomo-method", choices=("pattern", "hooke-jeeves"), default="pattern",
                    help="each fold's search: the compass search, or with Hooke and Jeeves' pattern moves")
    ap.add_argument("--lomo-step", type=float, default=0.3, help="first compass step of each fold (log-parameter units)")
    ap.add_argument("--lomo-from-defaults", action="store_true",
                    help="start each fold from PerfParams() instead of the fitted parameters (no information from the held-out rows)")
    ap.add_argument("--lomo-folds", default="", metavar="SUBSTR,...",
                    help="run only the folds whose model ids contain one of these strings (to split the folds over processes)")
    ap.add_argument("--lomo-resume", type=Path, nargs="+", default=(), metavar="FILE",
                    help="continue the folds these earlier --lomo-from-defaults runs recorded, each from its own parameters")
    ap.add_argument("--lomo-from", type=Path, nargs="+", default=None, metavar="FILE",
                    help="record the leave-one-model-out folds these parameter files hold (runs with --lomo-from-defaults, which "
                         "do not depend on this fit) instead of running them")
    args = ap.parse_args(argv)

    m = Measurements.merged([load_measurements(f, model_dir=args.model_dir) for f in args.csv])
    names_of_data = [f.name for f in args.csv]
    pins = _pins(args.fix)
    switches = _switches(args.set)
    start = load_params(json.loads(args.start.read_text())) if args.start else perf_params()
    base = replace(replace(PerfParams(), **shipped_switches()) if args.from_defaults else start, **DECLARED, **pins, **switches)
    names = [n for n in BOUNDS if n not in pins]
    x = _from_params(base, names)
    if args.perturb is not None:
        x = x + np.random.default_rng(args.perturb).normal(0.0, 0.2, size=len(x))
    t0 = time.perf_counter()
    ticks = _step_ticks(args.step_refs) if args.step_weight > 0 and args.step_refs.is_dir() else []
    print("decode-step ticks: " + (", ".join(f"{t.name} {len(t.running)}" for t in ticks) or "none"))

    targets = _targets(m)

    def loss_of(v: np.ndarray) -> float:
        return _loss(m, targets, _to_params(v, base, names), args.rank_weight, ticks, args.step_weight, args.ttft_weight)

    start_loss = loss_of(x)
    print(f"rows {len(m.cases)}, start loss {start_loss:.5f}")
    loss = start_loss
    for k in range(args.restarts):
        if args.method == "nelder-mead":
            x, loss = nelder_mead(loss_of, x, step=0.3 / (k + 1), evals=args.evals)
        else:
            x, loss = pattern_search(loss_of, x, step=0.3 / (k + 1), evals=args.evals, pattern_moves=args.method == "hooke-jeeves")
        print(f"restart {k}: loss {loss:.5f} after {time.perf_counter() - t0:.0f} s")
    fitted = _to_params(x, base, names)
    lomo = None
    if args.lomo_from:
        records = [json.loads(f.read_text()) for f in args.lomo_from]
        lomo_records = [dict(r["leave_one_model_out"], command=r["command"]) for r in records]
        if any(not str(r.get("start")).startswith("PerfParams() defaults") for r in lomo_records):
            raise SystemExit("--lomo-from: only folds started from PerfParams() defaults (--lomo-from-defaults) can be recorded beside another fit")
        lomo = assemble_folds(m, base, lomo_records)
    elif args.lomo:
        t_lomo = time.process_time()
        x0 = _from_params(replace(PerfParams(), **pins), names) if args.lomo_from_defaults else x
        lomo = leave_one_model_out(m, base, names, x0, evals=args.lomo_evals, ticks=ticks, step=args.lomo_step,
                                   loss_args={"rank_weight": args.rank_weight, "step_weight": args.step_weight, "ttft_weight": args.ttft_weight},
                                   only=[s for s in args.lomo_folds.split(",") if s],
                                   resume=[json.loads(f.read_text())["leave_one_model_out"] for f in args.lomo_resume],
                                   pattern_moves=args.lomo_method == "hooke-jeeves")
        lomo["start"] = "PerfParams() defaults" if args.lomo_from_defaults else "the parameters fitted on every row (warm start)"
        if args.lomo_resume:
            lomo["start"] += ", continued from the folds of " + ", ".join(str(f) for f in args.lomo_resume)
            lomo["evals_per_fold"] = max(f["evals"] for f in lomo["folds"])
        lomo["cpu_s"] = round(time.process_time() - t_lomo, 1)
        s_ = lomo["vllm_sglang"]
        print(f"leave-one-model-out vLLM+SGLang: TTFT {s_['ttft']['median_ape']} %, TPOT {s_['tpot']['median_ape']} %, "
              f"ranking {s_['ranking']} ({lomo['cpu_s']} CPU s)")
    no_harness = without_harness_figures(m, fitted)
    print(f"without the harness knowledge, vLLM+SGLang: TTFT {no_harness['ttft']['median_ape']} %, TPOT {no_harness['tpot']['median_ape']} %")
    _, summary = evaluate(m, fitted)
    sub = _backends(m)
    _, sub_summary = evaluate(sub, fitted)
    for name in BOUNDS:
        print(f"  {name:28s} {getattr(fitted, name):.6g}")
    for label, s in (("all rows", summary), ("vLLM+SGLang", sub_summary)):
        print(f"{label}: TTFT median APE {s['ttft']['median_ape']} %, TPOT median APE {s['tpot']['median_ape']} %, "
              f"top-1 {s['ranking']['top1_agreement']}, skipped {s['skipped']['count']}")
    record = {
        "source": f"benchmarks/fit_perf.py on {', '.join(names_of_data)} (ai-dynamo/aiconfigurator @ 095f58a51c4c "
                  f"silicon_sample.csv subset{'s' if len(names_of_data) > 1 else ''})",
        "data_file": names_of_data[0] if len(names_of_data) == 1 else names_of_data,
        "commit": _commit(),
        "fitted_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "rows_used": len(m.cases),
        "loss": round(loss, 6),
        "fixed": pins,
        "method": args.method,
        "perturb": args.perturb,
        "command": "benchmarks/fit_perf.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "start": str(args.start) if args.start else ("defaults" if args.from_defaults else "committed parameters"),
        "start_command": json.loads(args.start.read_text()).get("command") if args.start else None,
        "rank_weight": args.rank_weight,
        "step_ticks": {t.name: len(t.running) for t in ticks},
        "step_weight": args.step_weight,
        "ttft_weight": args.ttft_weight,
        "fit_error": {
            "all": {k: summary[k] for k in ("ttft", "tpot", "ranking")},
            "vllm_sglang": {k: sub_summary[k] for k in ("ttft", "tpot", "ranking")},
            "vllm_sglang_without_harness": no_harness,
        },
        "leave_one_model_out": lomo,
        "params": {k: v for k, v in asdict(fitted).items() if k not in ("source", *NOT_FITTED)},
    }
    if args.dry_run:
        print(json.dumps(record["params"], indent=1))
        return 0
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
