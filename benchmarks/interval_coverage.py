"""Error bars of issue #27: the interval table from leave-one-model-out residuals, and its coverage measured out of fold.

Every vLLM and SGLang row of the shared silicon files is predicted by parameters that never saw its model family
(lomo_decisions.lomo_predictions: the folds of planner/data/perf_params.json; Qwen3-32B by the shipped parameters).
The residual of a row is log(measured / predicted) of its TTFT and of its TPOT; its class is (engine, layout kind,
client bucket). planner.live.error_bars turns the classes' residuals into a symmetric nominal 80 % interval (the 80th
percentile of |residual| per class, pooled down all → engine → kind → bucket with PRIOR_ROWS rows of the parent, at
least the engine's). One run counts once: rows of one engine, GPU, release, layout, lengths, clients and precision with
the very same measured TTFT and TPOT are one run exported more than once (benchmark_cases.export_quirks' rule: two runs
never agree to the last digit; 238 of the 545 DeepSeek SGLang rows are such copies, filed under DeepSeek-R1 and -V3 and
by two exports), and only the first is kept. Measured figures are read only to drop a copy, never to fill a row.

Coverage is measured out of fold: for each fold (the rows one set of parameters predicted without their family), the
table is rebuilt from the other folds' rows only and the fold's rows are checked against it. Printed by engine and by
fold and engine, so a reader sees whether one family decides an engine's figure. Target: 75–85 % by engine, for TTFT
and for TPOT; exits 1 when an engine is outside (`--no-fail` prints only).

    .venv/bin/python benchmarks/interval_coverage.py [--write] [--json] [--no-fail]

`--write` writes the table built from every row into planner/data/prediction_intervals.json with its provenance
(source files and their sha256, the parameter file's sha256, rows per class, the out-of-fold coverage).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lomo_decisions as lomo

from servingtopology.planner.fidelity.benchmark_cases import Prediction
from servingtopology.planner.live import error_bars
from tests.groundtruth import GROUNDTRUTH

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "planner" / "data" / "prediction_intervals.json"
TARGET = (0.75, 0.85)
METRICS = ("ttft", "tpot")


def residual_rows() -> list[dict[str, Any]]:
    """One dict per predicted run: engine, kind, clients, fold, and the TTFT and TPOT residuals (copies of a run dropped)."""
    lomo.SHARED = GROUNDTRUTH
    m, results, used = lomo.shared_lomo_predictions(GROUNDTRUTH)
    rows, seen = [], set()
    for c, r, u in zip(m.cases, results, used, strict=True):
        run = (c.backend, c.system, c.engine_release, c.topology_label, c.isl, c.osl, c.concurrency, c.precision, c.moe_precision,
               c.ttft_ms, c.tpot_ms)
        if isinstance(r, Prediction) and run not in seen:
            seen.add(run)
            rows.append({"engine": c.backend, "kind": lomo.layout_kind(c), "clients": c.concurrency, "fold": u,
                         "ttft": float(np.log(c.ttft_ms / r.ttft_ms)), "tpot": float(np.log(c.tpot_ms / r.tpot_ms))})
    return rows


def build_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per class (all; engine; engine/kind; engine/kind/bucket): rows and the 80th percentile of |residual| per metric."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        e, k, b = r["engine"], r["kind"], error_bars.client_bucket(r["clients"])
        for key in ("all", e, f"{e}/{k}", f"{e}/{k}/{b}"):
            groups[key].append(r)
    return {"classes": {key: {"rows": len(g), **{m: round(float(np.quantile(np.abs([x[m] for x in g]), error_bars.LEVEL)), 5)
                                                  for m in METRICS}}
                        for key, g in sorted(groups.items())}}


def out_of_fold(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Coverage by engine and metric, and by fold and engine, each fold's rows against a table built without them."""
    hits: dict[tuple[str, str], list[bool]] = defaultdict(list)
    fold_hits: dict[tuple[str, str, str], list[bool]] = defaultdict(list)
    for fold in sorted({r["fold"] for r in rows}):
        data = build_table([r for r in rows if r["fold"] != fold])
        for r in (r for r in rows if r["fold"] == fold):
            for m in METRICS:
                h, _, _ = error_bars.half_width(m, engine=r["engine"], kind=r["kind"], clients=r["clients"], data=data)
                ok = abs(r[m]) <= h
                hits[(r["engine"], m)].append(ok)
                fold_hits[(fold, r["engine"], m)].append(ok)
    engines = sorted({e for e, _ in hits})
    pairs = sorted({(f, e) for f, e, _ in fold_hits}, key=lambda p: (p[1], p[0]))
    return {"by_engine": {e: {"rows": len(hits[(e, "ttft")]), **{m: round(float(np.mean(hits[(e, m)])), 3) for m in METRICS}}
                          for e in engines},
            "by_fold": {f"{e} {f}": {"rows": len(fold_hits[(f, e, "ttft")]),
                                     **{m: round(float(np.mean(fold_hits[(f, e, m)])), 3) for m in METRICS}} for f, e in pairs}}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-fail", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    rows = residual_rows()
    table = build_table(rows)
    coverage = out_of_fold(rows)
    cpu = time.process_time() - t0
    missed = [f"{e} {m} {c[m]:.3f}" for e, c in coverage["by_engine"].items() for m in METRICS if not TARGET[0] <= c[m] <= TARGET[1]]
    if args.write:
        params = ROOT / "planner" / "data" / "perf_params.json"
        doc = {"level": error_bars.LEVEL, "prior_rows": error_bars.PRIOR_ROWS,
               "method": "per class, q = the 80th percentile of |log(measured / predicted)| of its leave-one-model-out rows (one "
                         "row per run); h pooled down all -> engine -> engine/kind -> engine/kind/bucket as "
                         "h^2 = (n q^2 + prior_rows h_parent^2) / (n + prior_rows), at least the engine's; interval "
                         "[value / e^h, value · e^h] (planner/live/error_bars.py)",
               "provenance": {"command": "benchmarks/interval_coverage.py --write",
                              "sources": {f: _sha(GROUNDTRUTH / f) for f in lomo.FILES},
                              "perf_params_sha256": _sha(params), "rows": len(rows)},
               "coverage_out_of_fold": coverage, **table}
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps({"coverage": coverage, "table": table, "missed": missed, "cpu_s": round(cpu, 2)}))
    else:
        print(f"nominal 80 % intervals from leave-one-model-out residuals, {len(rows)} vLLM + SGLang runs ({cpu:.1f} CPU s)")
        print("coverage out of fold (each fold's rows against a table built without them), target 75–85 % by engine:")
        for e, c in coverage["by_engine"].items():
            print(f"  {e:8s} rows {c['rows']:5d}  TTFT {c['ttft']:.3f}  TPOT {c['tpot']:.3f}")
        print("by engine and fold:")
        for f, c in coverage["by_fold"].items():
            print(f"  {f[:78]:78s} rows {c['rows']:4d}  TTFT {c['ttft']:.3f}  TPOT {c['tpot']:.3f}")
        print("80th percentile of |log residual| by engine: " + ", ".join(f"{k} TTFT ±{v['ttft']:.3f} TPOT ±{v['tpot']:.3f}"
                                                            for k, v in table["classes"].items() if "/" not in k))
        print("missed: " + ("; ".join(missed) if missed else "none"))
        if args.write:
            print(f"wrote {OUT.relative_to(ROOT)}")
    return 1 if missed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
