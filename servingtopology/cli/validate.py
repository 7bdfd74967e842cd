"""`servingtopology validate`: predict silicon benchmark rows and compare with what was measured.

Reads a CSV in the aiconfigurator silicon schema, resolves each `model_path` as DIR/<org>/<name>/config.json
(when --model-dir is given) or in the built-in catalog, simulates every row as the closed-loop benchmark
it was (planner.fidelity.benchmark_cases / planner.perf.closed_loop) and prints per-row predicted against measured TTFT and
TPOT, then a summary overall and per (backend, mode, system). All file reading lives here.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servingtopology.planner.errors import PlannerError
from servingtopology.planner.fidelity.benchmark_cases import (
    BACKENDS,
    EXPORT_QUIRK,
    BenchmarkCase,
    Prediction,
    Skip,
    export_quirks,
    fill_from_twins,
    parse_row,
    predict_all,
    predict_held_out,
    without_harness,
)
from servingtopology.planner.fidelity.scores import summarize
from servingtopology.planner.hardware import Gpu, resolve_gpu
from servingtopology.planner.model.catalog import ModelArch, from_hf_config, resolve_model
from servingtopology.planner.perf.step import PerfParams, fit_record, perf_params
from servingtopology.spec import MAX_CONCURRENCY, MAX_GPUS, MAX_TOKENS, read_model_config

__all__ = ["add_parser", "run", "load_measurements", "Measurements", "evaluate"]


@dataclass(frozen=True, slots=True)
class Measurements:
    cases: list[BenchmarkCase]
    models: dict[str, ModelArch | Skip]
    gpus: dict[str, Gpu | Skip]
    skipped_at_parse: Counter[str]
    skipped_by_backend: dict[str, Counter[str]] = field(default_factory=dict)

    def for_backends(self, backends: Sequence[str]) -> Measurements:
        """The rows of `backends`, with only their own parse-time skips."""
        skipped: Counter[str] = Counter()
        for b in backends:
            skipped.update(self.skipped_by_backend.get(b, Counter()))
        return Measurements([c for c in self.cases if c.backend in backends], self.models, self.gpus, skipped,
                            {b: self.skipped_by_backend.get(b, Counter()) for b in backends})

    @staticmethod
    def merged(parts: Sequence[Measurements]) -> Measurements:
        """Several files' rows as one set, in the order given (their models, GPUs and parse-time skips pooled)."""
        skipped: Counter[str] = Counter()
        by_backend: dict[str, Counter[str]] = {}
        for m in parts:
            skipped.update(m.skipped_at_parse)
            for b, c in m.skipped_by_backend.items():
                by_backend.setdefault(b, Counter()).update(c)
        return Measurements([c for m in parts for c in m.cases], {k: v for m in parts for k, v in m.models.items()},
                            {k: v for m in parts for k, v in m.gpus.items()}, skipped, by_backend)


def _config_paths(path: str, model_dir: Path) -> list[Path]:
    """Where a row's model config may be under --model-dir: <org>/<name>/config.json, <name>/config.json,
    or aiconfigurator's flat <org>--<name>_config.json."""
    name = path.split("/")[-1]
    return [model_dir / path / "config.json", model_dir / name / "config.json", model_dir / f"{path.replace('/', '--')}_config.json"]


def _resolve_model(path: str, model_dir: Path | None) -> ModelArch | Skip:
    """The model of a row: its config.json under --model-dir first (any decoder-only LLM), else the catalog."""
    for cfg in _config_paths(path, model_dir) if model_dir is not None else []:
        if cfg.is_file():
            try:
                return from_hf_config(read_model_config(cfg, field=str(cfg)), name=path, field=str(cfg))
            except PlannerError as exc:
                kind = "unreadable model config" if "cannot read" in str(exc) else "model config lacks the sizes of a decoder"
                return Skip(kind, str(exc))
    try:
        return resolve_model(path)
    except PlannerError:
        where = f"no config.json for it under --model-dir {model_dir}" if model_dir is not None else "give --model-dir with its config.json"
        return Skip("unknown model", f"{path}: not in the catalog and {where}")


def _resolve_gpu(system: str) -> Gpu | Skip:
    try:
        return resolve_gpu(system)
    except PlannerError:
        return Skip("unknown GPU", system)


# A row's field longer than this is malformed (the longest in the shipped silicon CSV, silicon_data_source, is ~300).
MAX_FIELD_CHARS = 4096
_CONCURRENCY_TEXT = re.compile(r"silicon_concurrency=(\d+)")   # as planner/fidelity/benchmark_cases.py reads it
MALFORMED = "malformed row"
_SURROGATE = re.compile("[\udc80-\udcff]")  # what surrogateescape decodes a non-UTF-8 byte to


def read_rows(csv_path: Path) -> tuple[list[dict[str, str]], Counter[str]]:
    """The CSV's well-formed rows (header keys, str values) and a count of malformed ones by reason.

    Malformed: bytes that are not UTF-8, a field the csv module refuses (over its 131,072-character limit) or over
    MAX_FIELD_CHARS, a row with more or fewer fields than the header, a non-finite number (inf, nan, 1e999).
    Each is counted and the rest are read (issue #17: `inf`, non-UTF-8 and a 131,072-character field crashed the
    command). Raises OSError when the file cannot be read.
    """
    text = csv_path.read_bytes().decode("utf-8", errors="surrogateescape")
    bad: Counter[str] = Counter()
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    rows: list[dict[str, str]] = []
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error:
            bad[f"{MALFORMED}: a field over the csv module's limit or a broken quote"] += 1
            continue
        if header is None:
            header = fields
            continue
        if not any(f.strip() for f in fields):
            continue
        reason = _malformed(fields, header)
        if reason:
            bad[f"{MALFORMED}: {reason}"] += 1
            continue
        rows.append(dict(zip(header, fields, strict=True)))
    return rows, bad


def _is_size(column: str) -> bool:
    """Lengths and counts: isl, osl, batch sizes, tp/pp/dp/ep sizes, worker counts."""
    return column in ("isl", "osl") or column.endswith(("_size", "_workers"))


def _count_bound(column: str) -> int | None:
    """The largest count a column may hold (the spec's bounds): parallel sizes and worker counts 4,096 (the GPU budget;
    measured rows reach TP 72 on an NVL72 domain), batch sizes (clients per engine) 100,000; None for lengths and
    non-counts (lengths are held to MAX_TOKENS)."""
    if column.endswith(("tp_size", "pp_size", "dp_size", "ep_size", "_workers")):
        return MAX_GPUS
    if column.endswith("batch_size"):
        return MAX_CONCURRENCY
    return None


def _malformed(fields: list[str], header: list[str]) -> str | None:
    if len(fields) != len(header):
        return f"{len(fields)} fields where the header has {len(header)}"
    for column, f in zip(header, fields, strict=True):
        if _SURROGATE.search(f):
            return "not UTF-8"
        if len(f) > MAX_FIELD_CHARS:
            return f"a field over {MAX_FIELD_CHARS:,} characters"
        try:
            number = float(f)
        except ValueError:
            continue
        if not math.isfinite(number):
            return "a non-finite number (inf, nan)"
        if _is_size(column) and abs(number) > MAX_TOKENS:
            # a 1e300-token row overflowed the closed-loop model; no benchmark runs more than the longest context
            return f"a length or size over {MAX_TOKENS:,} ({column})"
        bound = _count_bound(column)
        if bound is not None and abs(number) > bound:
            return f"{column} {f[:20]} over {bound:,}"
    source = dict(zip(header, fields, strict=True)).get("silicon_data_source") or ""
    for found in _CONCURRENCY_TEXT.finditer(source):
        # The closed-loop client count (benchmark_cases's silicon_concurrency=N): unbounded, 10^50 clients were "predicted"
        digits = found.group(1).lstrip("0")
        if not digits or len(digits) > len(str(MAX_CONCURRENCY)) or int(digits) > MAX_CONCURRENCY:
            return f"silicon_concurrency {found.group(1)[:20]} out of 1 to {MAX_CONCURRENCY:,} (silicon_data_source)"
    return None


def load_measurements(csv_path: Path, *, model_dir: Path | None = None, backends: Sequence[str] | None = None) -> Measurements:
    """Read and parse the rows of `backends` (all when None), resolving each model and GPU once."""
    cases: list[BenchmarkCase] = []
    by_backend: dict[str, Counter[str]] = {}
    raw, skipped = read_rows(csv_path)  # malformed rows are counted in `skipped` (their backend cannot be trusted)
    rows = fill_from_twins(raw)
    quirks = export_quirks(rows)
    for i, row in enumerate(rows):
        backend = (row.get("backend") or "").strip().lower()
        if backends and backend not in backends:
            continue
        if i in quirks:
            skipped[EXPORT_QUIRK] += 1
            by_backend.setdefault(backend, Counter())[EXPORT_QUIRK] += 1
            continue
        try:
            cases.append(parse_row(row))
        except Skip as s:
            skipped[s.kind] += 1
            by_backend.setdefault(backend, Counter())[s.kind] += 1
    models = {p: _resolve_model(p, model_dir) for p in sorted({c.model_path for c in cases})}
    gpus = {s: _resolve_gpu(s) for s in sorted({c.system for c in cases})}
    return Measurements(cases, models, gpus, skipped, by_backend)


def evaluate(m: Measurements, params: PerfParams | None = None) -> tuple[list[Prediction | Skip], dict[str, Any]]:
    """Predictions for every case and the summary dictionary."""
    results = predict_all(m.cases, m.models, m.gpus, params=params)
    return results, summarize(m.cases, results, skipped_at_parse=m.skipped_at_parse)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("validate", help="compare the performance model with measured benchmark rows",
                              description="Predict each silicon benchmark row as its closed-loop benchmark ran (InferenceX rows: "
                                          "the lengths its client drew, 10 requests per client; other rows: fixed lengths) and "
                                          "report the errors.")
    p.add_argument("--measurements", required=True, type=Path, help="CSV in the aiconfigurator silicon schema")
    p.add_argument("--model-dir", type=Path, default=None, help="folder holding <org>/<name>/config.json")
    p.add_argument("--backend", default="", help=f"comma-separated backends to keep ({', '.join(BACKENDS)}); default all")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--rows", action="store_true", help="with --json, include every row's figures")
    p.add_argument("--no-harness", action="store_true",
                   help="predict every row as if its benchmark harness were unknown (fixed lengths, fitted requests per client, "
                        "engine defaults): the figures without the harness knowledge")


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _print_block(name: str, b: dict[str, Any]) -> None:
    t, o, r, s = b["ttft"], b["tpot"], b["ranking"], b["skipped"]
    print(f"{name:34s} {b['rows']:5d} {s['count']:5d}  {_fmt(t['median_ape']):>6s} {_fmt(t['mape']):>7s} {_fmt(t['within_20pct'], '.2f'):>5s}"
          f"  {_fmt(o['median_ape']):>6s} {_fmt(o['mape']):>7s} {_fmt(o['within_20pct'], '.2f'):>5s}  {r['groups']:4d} {_fmt(r['top1_tpot'], '.2f'):>5s}"
          f" {_fmt(r['top1_tokens_per_gpu'], '.2f'):>7s} {_fmt(r['top1_within_5pct'], '.2f'):>5s}")


def print_summary(summary: dict[str, Any]) -> None:
    """The human table: overall first, then one line per (backend, mode, system)."""
    print(f"{'':34s} {'rows':>5s} {'skip':>5s}  {'TTFT: med%':>6s} {'mean%':>7s} {'±20%':>5s}  {'TPOT: med%':>6s} {'mean%':>7s} {'±20%':>5s}"
          f"  {'grps':>4s} {'top1 TPOT':>5s} {'tok/GPU':>7s} {'≤5%':>5s}")
    _print_block("overall", summary)
    for k, b in summary["groups"].items():
        _print_block(k, b)
    r = summary["ranking"]
    if r["groups"]:
        print(f"ranking over {r['groups']} groups: top-1 {r['top1_agreement']} (trivial baseline, most GPUs for TPOT and fewest for "
              f"tokens/s per GPU, equal GPU counts tied at random: {r['baseline_top1']}; {r['baseline_top1_first_listed']} giving ties "
              f"to the first listed); pairwise ordering "
              f"{r['pairwise_ordering']} over {r['pairs']} pairs")
        dq = r.get("decision_quality")
        if dq and dq["groups"]:
            for obj, rule in (("tokens_per_gpu", "fewest GPUs"), ("tpot", "most GPUs")):
                d = dq[obj]
                print(f"decision quality, {obj.replace('_', ' ')} ({dq['groups']} groups of one release): pick within 5 % of the "
                      f"measured best in {d['within_5pct']:.3f} (rule '{rule}', ties averaged: {d['rule_within_5pct']:.3f}); regret "
                      f"median {d['median_regret_pct']} %, worst {d['worst_regret_pct']} % (rule {d['rule_worst_regret_pct']} %)")
    e2e = summary.get("e2e")
    if e2e and e2e["median_ape"] is not None:
        print(f"end-to-end latency (TTFT + (osl − 1)·TPOT): median APE {e2e['median_ape']} %, mean {e2e['mape']} %")
    reasons = summary["skipped"]["by_reason"]
    if reasons:
        print("skipped: " + ", ".join(f"{k} ({v})" for k, v in sorted(reasons.items())))


def _recorded_lomo(csv_path: Path) -> dict[str, Any] | None:
    """Leave-one-model-out figures that benchmarks/fit_perf.py --lomo recorded with the shipped parameters, when
    they were measured on a file of this name (a refit per model is minutes of CPU, too slow for this command)."""
    record = fit_record()
    lomo = record.get("leave_one_model_out")
    if not lomo or record.get("data_file") != csv_path.name:
        return None
    return {"recorded_by": record.get("command"), "commit": record.get("commit"), **lomo}


def held_out(m: Measurements) -> dict[str, Any] | None:
    """The rows scored leave-one-model-out, now: each family's rows predicted by the recorded fold that was fitted without
    it (a model in no fold by the shipped parameters, which never saw it): TTFT, TPOT and end-to-end errors and the
    decision quality against the trivial rules. None when the parameter file records no folds."""
    folds = (fit_record().get("leave_one_model_out") or {}).get("folds") or []
    if not folds:
        return None
    results, used = predict_held_out(m.cases, m.models, m.gpus, folds, perf_params())
    out = summarize(m.cases, results, skipped_at_parse=m.skipped_at_parse)
    return {k: out[k] for k in ("rows", "predicted", "skipped", "ttft", "tpot", "e2e", "ranking")} | {
        "parameters": {u: used.count(u) for u in sorted(set(used))}}


def run(args: argparse.Namespace) -> int:
    backends = [b.strip().lower() for b in args.backend.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        print(f"--backend: unknown backend {unknown[0]!r}; allowed: {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    if not args.measurements.is_file():
        print(f"--measurements: no such file {args.measurements}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        m = load_measurements(args.measurements, model_dir=args.model_dir, backends=backends or None)
    except OSError as exc:
        print(f"--measurements: cannot read {args.measurements}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    malformed = {k: v for k, v in m.skipped_at_parse.items() if k.startswith(MALFORMED)}
    for reason, n in sorted(malformed.items()):
        print(f"--measurements: {n} {reason.replace(MALFORMED, 'malformed row' + ('s' if n > 1 else ''), 1)}", file=sys.stderr)
    if not m.cases:
        print(f"--measurements: no row of {args.measurements} could be read ({sum(m.skipped_at_parse.values())} skipped: "
              + (", ".join(f"{k} ({v})" for k, v in sorted(m.skipped_at_parse.items())) or "no data rows") + ")", file=sys.stderr)
        return 2
    if args.no_harness:
        m = Measurements(without_harness(m.cases), m.models, m.gpus, m.skipped_at_parse)
    results, summary = evaluate(m)
    notes = {p: list(a.warnings) for p, a in m.models.items() if isinstance(a, ModelArch) and a.warnings}
    if notes:
        summary["model_warnings"] = notes
        for p, ws in notes.items():
            for w in ws:
                print(f"warning: {p}: {w}", file=sys.stderr)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    if args.json:
        summary["harness_knowledge"] = not args.no_harness
        if not args.no_harness:
            _, bare = evaluate(Measurements(without_harness(m.cases), m.models, m.gpus, m.skipped_at_parse))
            summary["without_harness"] = {k: bare[k] for k in ("ttft", "tpot", "ranking")}
        summary["leave_one_model_out"] = _recorded_lomo(args.measurements)
        summary["held_out"] = held_out(m)
        if args.rows:
            summary["row_figures"] = [
                {"id": c.row_id, "measured_ttft_ms": c.ttft_ms, "measured_tpot_ms": c.tpot_ms,
                 **({"predicted_ttft_ms": round(r.ttft_ms, 3), "predicted_tpot_ms": round(r.tpot_ms, 3)} if isinstance(r, Prediction)
                    else {"skipped": str(r)})}
                for c, r in zip(m.cases, results, strict=True)]
        print(json.dumps(summary))
        return 0
    print(f"{'row':60s} {'topology':28s} {'conc':>5s} {'TTFT ms meas':>12s} {'pred':>9s} {'TPOT ms meas':>12s} {'pred':>8s}")
    for c, r in zip(m.cases, results, strict=True):
        head = f"{c.row_id[:60]:60s} {c.topology_label[:28]:28s} {c.concurrency:5d} {c.ttft_ms:12.1f}"
        if isinstance(r, Prediction):
            print(f"{head} {r.ttft_ms:9.1f} {c.tpot_ms:12.2f} {r.tpot_ms:8.2f}")
        else:
            print(f"{head} {'skipped':>9s} {c.tpot_ms:12.2f}  {r}")
    print()
    print_summary(summary)
    print(f"validated {summary['rows']} rows in {summary['seconds']} s")
    return 0
