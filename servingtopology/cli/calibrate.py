"""`servingtopology calibrate RESULTS... --spec SPEC.yaml --out CAL.yaml`: fit a deployment's correction (issue #27).

With `--prometheus URL --since 24h` instead of RESULTS it fits from the deployment's Prometheus history
(servingtopology/cli/calibrate_prometheus.py: the operator's series and its live fit).

RESULTS are the files the benchmark clients people already run write, and recorded runs:
  - vLLM's `vllm bench serve --save-result` JSON (with or without --save-detailed): one point per file, at its
    request rate (Poisson arrivals, the recorded lengths when detailed) or, at an infinite rate, its max concurrency;
  - guidellm's report (`guidellm run --output json`): one point per benchmark of the report (its constant, Poisson or
    concurrent strategy);
  - a recorded run folder as `simulate --replay` takes it (requests.jsonl, meta.json, config.json): one point, the
    run's own requests, compared on the engine's clock.
The deployment (model, GPU, engine, layout) is the spec's: a file of another model, GPU or engine is refused. The
release is the results' own where they record it (a recorded run's meta.json; a vllm bench file run with `--metadata
engine_version=X.Y.Z`), else the spec's, and the output says which. The fit (planner.perf.deployment_fit, the
per-deployment correction; not planner.fidelity.benchmark_cases, the engine-default fit) writes CAL.yaml with the
factors, the residuals before and after, and the provenance (each file's sha256 and the rows used). `plan`, `simulate`
(a recorded run's replay too) and `sweep` take it with `--calibration CAL.yaml`.

Every file is read bounded (size, UTF-8, JSON shape, each number finite and in range); any failure exits 2 naming the
file and the field; nothing is written then. Exit 0 written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servingtopology.cli.calibrate_prometheus import MAX_WINDOWS, no_points_message, read_history
from servingtopology.cli.calibration_io import deployment_of, read_bytes
from servingtopology.cli.output_paths import check_output, write_output
from servingtopology.cli.spec_input import emit_spec_error, layout_for, read_spec
from servingtopology.planner.engines.caps import release_of, version_from_image
from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.fidelity.deployment_points import PointFn, closed_loop_fn, predictor, simulated_fn
from servingtopology.planner.figure_text import count_text
from servingtopology.planner.layout import Layout, Role
from servingtopology.planner.live.calibration import fit_points
from servingtopology.planner.perf.deployment_fit import (
    DEFAULT_HALF_LIFE_S,
    MIN_POINTS,
    CalibrationRefused,
    Deployment,
    Point,
    Source,
    fit,
    refuse_other,
)
from servingtopology.planner.problem import Problem
from servingtopology.planner.sim import RequestSet
from servingtopology.spec import PlanSpec, SpecError, to_problem

__all__ = ["add_parser", "run", "read_results", "MAX_RESULT_BYTES"]

MAX_RESULT_BYTES = 64 * 1024 * 1024       # one result file; a detailed vllm bench file of 100k requests is ~20 MB
MAX_FILES = 64
MAX_REQUESTS_PER_POINT = 1_000_000
SIM_REQUESTS = 600                        # requests simulated per rate point (the first ones of the recorded lengths)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a deployment's correction from benchmark results (vllm bench, guidellm, recorded runs)",
                       description="Read vllm bench serve --save-result JSON, guidellm JSON reports and recorded run folders of one "
                                   "deployment and write its calibration (CAL.yaml) for plan/simulate/sweep --calibration.")
    p.add_argument("results", nargs="*", metavar="RESULTS", help="result files or recorded run folders (or --prometheus)")
    p.add_argument("--prometheus", metavar="URL", help="fit from this Prometheus's history of the deployment instead: the series "
                   "the operator reads, over --since (no benchmark run needed)")
    p.add_argument("--since", default="24h", help="with --prometheus: how far back, e.g. 90m, 24h (default 24h)")
    p.add_argument("--step", help=f"with --prometheus: one point per window this long (default: --since / {MAX_WINDOWS}, at least 1m)")
    p.add_argument("--topology", metavar="NAMESPACE/NAME", help="with --prometheus: the ServingTopology whose engines' series to read "
                   "(the operator's labels); default: every engine series --selector matches")
    p.add_argument("--selector", action="append", default=[], metavar="LABEL=VALUE", help="with --prometheus: a label matcher "
                   "(repeatable), e.g. namespace=ml")
    p.add_argument("--prometheus-ca", metavar="CA.pem", help="with an https --prometheus: the CA bundle its certificate chains to "
                   "(default: the system's CAs)")
    p.add_argument("--prometheus-cert", metavar="CERT.pem", help="with an https --prometheus that asks for one: a client certificate")
    p.add_argument("--prometheus-key", metavar="KEY.pem", help="the client certificate's private key (unencrypted PEM)")
    p.add_argument("--spec", required=True, help="the deployment's spec (model, GPU, engine, layout), as plan takes it")
    p.add_argument("--out", required=True, metavar="CAL.yaml", help="where to write the calibration")
    p.add_argument("--half-life-days", type=float, default=DEFAULT_HALF_LIFE_S / 86400.0,
                   help="a point's weight halves every this many days of age (default 7)")
    p.add_argument("--min-points", type=int, default=MIN_POINTS, help=f"refuse to fit on fewer points (default {MIN_POINTS})")
    p.add_argument("--json", action="store_true", help="print the calibration as one JSON object")


# ---- bounded reading ------------------------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _read_json(path: Path) -> Any:
    raw = read_bytes(path, MAX_RESULT_BYTES, path.name)
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidSpec(path.name, f"{path} is not UTF-8 JSON ({str(exc)[:200] or 'nested too deep'})") from None


def _num(node: Mapping[str, Any], key: str, where: str, *, lo: float = 0.0, hi: float = 1e12, required: bool = True,
         allow_inf: bool = False) -> float | None:
    v = node.get(key)
    if v is None:
        if required:
            raise InvalidSpec(f"{where} {key}", "missing")
        return None
    if isinstance(v, str) and allow_inf and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InvalidSpec(f"{where} {key}", f"must be a number, got {str(v)[:40]!r}")
    x = float(v)
    if math.isinf(x) and allow_inf:
        return x
    if not math.isfinite(x):
        raise CalibrationRefused("NonFinite", f"{where} {key}", f"{x} is not a finite number")
    if not lo <= x <= hi:
        raise InvalidSpec(f"{where} {key}", f"must be from {lo:g} to {hi:g}, got {x:g}")
    return x


def _list(node: Mapping[str, Any], key: str, where: str, n: int) -> list[float] | None:
    v = node.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != n:
        raise InvalidSpec(f"{where} {key}", f"must be a list of {n} numbers (one per completed request)")
    out = []
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(float(x)) or x < 0:
            raise InvalidSpec(f"{where} {key}[{i}]", f"must be a non-negative finite number, got {str(x)[:40]!r}")
        out.append(float(x))
    return out


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


class _Read:
    """Points read from the files, their predictors' inputs, the deployments the files name, and provenance."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.requests: list[RequestSet | None] = []     # a rate point's requests (recorded lengths), else None
        self.replays: list[Any] = []                    # a recorded run's Replay, else None
        self.named: list[tuple[Deployment, str]] = []   # (what a file says it measured, the field that says it)
        self.sources: list[Source] = []


def _age_s(when: datetime | None, now: datetime) -> float:
    return max((now - when).total_seconds(), 0.0) if when else 0.0


def _epoch(value: Any) -> datetime | None:
    """A report's Unix time in seconds (guidellm's benchmark start_time) as a UTC datetime; None where it has none."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)) or not 0 < float(value) < 1e11:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def _vllm_bench(path: Path, doc: Mapping[str, Any], raw: bytes, out: _Read, now: datetime) -> None:
    """One `vllm bench serve --save-result` file: one point."""
    where = path.name
    n = int(_num(doc, "completed", where, lo=1, hi=MAX_REQUESTS_PER_POINT) or 0)
    rate = _num(doc, "request_rate", where, lo=1e-6, hi=1e9, allow_inf=True)
    conc = _num(doc, "max_concurrency", where, lo=1, hi=1e7, required=False)
    ttft = _num(doc, "mean_ttft_ms", where)
    tpot = _num(doc, "mean_tpot_ms", where)
    isl = (_num(doc, "total_input_tokens", where, lo=1) or 0.0) / n
    osl = (_num(doc, "total_output_tokens", where, lo=1) or 0.0) / n
    pct = {f"{m}_p{q}": float(doc[f"p{q}_{m}_ms"]) for m in ("ttft", "tpot") for q in ("50", "90", "99")
           if isinstance(doc.get(f"p{q}_{m}_ms"), int | float) and math.isfinite(float(doc[f"p{q}_{m}_ms"]))}
    when = None
    if isinstance(doc.get("date"), str):
        try:
            when = datetime.strptime(doc["date"], "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        except ValueError:
            raise InvalidSpec(f"{where} date", f"not vllm bench's YYYYMMDD-HHMMSS, got {doc['date'][:40]!r}") from None
    assert rate is not None and ttft is not None and tpot is not None
    if math.isinf(rate):
        kind, load = "concurrency", conc if conc is not None else float(n)
    else:
        kind, load = "rate", rate
    point = Point(ttft, tpot, load, kind, isl, osl, n, _age_s(when, now), str(path), f"request_rate={doc.get('request_rate')}", pct)
    ins, outs = _list(doc, "input_lens", where, n), _list(doc, "output_lens", where, n)
    requests = None
    if kind == "rate":
        # The client's own send times when it saved them (start_times, --save-detailed), else Poisson arrivals at its rate.
        k = min(n, SIM_REQUESTS)
        starts = _list(doc, "start_times", where, n)
        if starts is not None:
            arrival = np.sort(np.array(starts))[:k]
        else:
            arrival = np.cumsum(np.random.default_rng(0).exponential(1.0 / rate, k))
        pl = np.array(ins[:k] if ins else [isl] * k)
        ol = np.array(outs[:k] if outs else [osl] * k)
        requests = RequestSet(arrival - arrival[0], np.maximum(np.rint(pl), 1).astype(np.int64), np.maximum(np.rint(ol), 1).astype(np.int64),
                              np.full(k, -1, dtype=np.int64), np.zeros(k, dtype=np.int64), np.full(k, -1, dtype=np.int64))
    out.points.append(point)
    out.requests.append(requests)
    out.replays.append(None)
    model_id = doc.get("model_id")
    model = model_id[:256] if isinstance(model_id, str) else ""
    backend = str(doc.get("backend") or "")
    engine = backend if backend in ("vllm", "sglang") else ""
    # vllm bench serve records no server release of its own (its files hold the client's settings and figures); a run
    # that passes `--metadata engine_version=X.Y.Z` has it at the top level, and that is the server's word.
    release = release_of(str(doc.get("engine_version") or "")[:64])
    out.named.append((Deployment(model, "", engine, release), f"{where} model_id/backend{'/engine_version' if release else ''}"))
    out.sources.append(Source(str(path), _sha(raw), (point.row,), "vllm bench serve", str(doc.get("vllm_version") or "")))


def _stat(node: Any, where: str, *names: str) -> float | None:
    """guidellm's distribution summary of a metric: its `successful.mean` (or `mean`)."""
    cur = node
    for name in names:
        if not isinstance(cur, Mapping) or name not in cur:
            return None
        cur = cur[name]
    if isinstance(cur, Mapping):
        cur = cur.get("successful", cur)
        if isinstance(cur, Mapping):
            cur = cur.get("mean")
    if cur is None:
        return None
    if isinstance(cur, bool) or not isinstance(cur, int | float):
        raise InvalidSpec(f"{where} {'.'.join(names)}", f"must be a number, got {str(cur)[:40]!r}")
    if not math.isfinite(float(cur)):
        raise CalibrationRefused("NonFinite", f"{where} {'.'.join(names)}", f"{cur} is not a finite number")
    return float(cur)


def _guidellm(path: Path, doc: Mapping[str, Any], raw: bytes, out: _Read, now: datetime) -> None:
    """A guidellm report: one point per benchmark (constant/Poisson rate or concurrent streams)."""
    benches = doc.get("benchmarks")
    if not isinstance(benches, list) or not benches:
        raise InvalidSpec(f"{path.name} benchmarks", "must be a non-empty list (a guidellm report)")
    version = ""
    meta = doc.get("metadata")
    if isinstance(meta, Mapping):
        version = str(meta.get("guidellm_version") or "")[:64]
    rows = []
    for i, b in enumerate(benches[:256]):
        where = f"{path.name} benchmarks[{i}]"
        if not isinstance(b, Mapping):
            raise InvalidSpec(where, "must be an object")
        strategy = _find(b, ("config", "strategy")) or _find(b, ("args", "strategy")) or {}
        if not isinstance(strategy, Mapping):
            strategy = {}
        kind = str(strategy.get("type_") or strategy.get("type") or "")
        metrics = b.get("metrics")
        if not isinstance(metrics, Mapping):
            raise InvalidSpec(f"{where} metrics", "missing (not a guidellm benchmark)")
        ttft = _stat(metrics, where, "time_to_first_token_ms")
        # TPOT as vLLM counts it (the gaps after the first token): guidellm's inter_token_latency_ms; its
        # time_per_output_token_ms spreads the whole latency, the first token's included, over every token.
        tpot = _stat(metrics, where, "inter_token_latency_ms")
        if tpot is None:
            tpot = _stat(metrics, where, "time_per_output_token_ms")
        isl = _stat(metrics, where, "prompt_token_count")
        osl = _stat(metrics, where, "output_token_count")
        if ttft is None or tpot is None or isl is None or osl is None:
            raise InvalidSpec(f"{where} metrics", "needs time_to_first_token_ms, time_per_output_token_ms (or inter_token_latency_ms), "
                                                  "prompt_token_count and output_token_count")
        n = _count_requests(b)
        if kind in ("constant", "poisson", "async"):
            rate = strategy.get("rate")
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < float(rate) < 1e9:
                raise InvalidSpec(f"{where} config.strategy.rate", f"must be a positive number for a {kind} strategy, got {str(rate)[:40]!r}")
            load_kind, load = "rate", float(rate)
        elif kind in ("concurrent", "synchronous", "throughput"):
            streams = strategy.get("streams", 1 if kind == "synchronous" else strategy.get("max_concurrency"))
            if isinstance(streams, bool) or not isinstance(streams, int | float) or not 1 <= float(streams) < 1e7:
                raise InvalidSpec(f"{where} config.strategy.streams", f"must be a positive number for a {kind} strategy, got {str(streams)[:40]!r}")
            load_kind, load = "concurrency", float(streams)
        else:
            raise InvalidSpec(f"{where} config.strategy.type_", f"{kind!r}; calibrate reads constant, poisson, async, concurrent, "
                                                                 "synchronous and throughput benchmarks")
        row = f"benchmarks[{i}] {kind} {load:g}"
        pct = {}
        for m, key in (("ttft", "time_to_first_token_ms"), ("tpot", "inter_token_latency_ms")):
            node = metrics.get(key)
            node = node.get("successful", node) if isinstance(node, Mapping) else None
            perc = node.get("percentiles") if isinstance(node, Mapping) else None
            if isinstance(perc, Mapping):
                for q in ("p50", "p90", "p99"):
                    v = perc.get(q)
                    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
                        pct[f"{m}_{q}"] = float(v)
        point = Point(ttft, tpot, load, load_kind, isl, osl, max(n, 1), _age_s(_epoch(b.get("start_time")), now), str(path), row, pct)
        requests = None
        if load_kind == "rate":
            rng = np.random.default_rng(0)
            k = min(max(n, 1), SIM_REQUESTS)
            arrival = np.cumsum(rng.exponential(1.0 / load, k))
            requests = RequestSet(arrival - arrival[0], np.full(k, max(round(isl), 1), dtype=np.int64),
                                  np.full(k, max(round(osl), 1), dtype=np.int64), np.full(k, -1, dtype=np.int64),
                                  np.zeros(k, dtype=np.int64), np.full(k, -1, dtype=np.int64))
        out.points.append(point)
        out.requests.append(requests)
        out.replays.append(None)
        model = _find(doc, ("config", "spec", "backend", "model")) or ""
        out.named.append((Deployment(str(model)[:256] if isinstance(model, str) else "", "", ""), f"{where} model"))
        rows.append(row)
    out.sources.append(Source(str(path), _sha(raw), tuple(rows), "guidellm", version))


def _find(node: Any, keys: Sequence[str]) -> Any:
    for k in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(k)
    return node


def _count_requests(b: Mapping[str, Any]) -> int:
    totals = _find(b, ("metrics", "request_totals")) or _find(b, ("run_stats", "requests_made")) or {}
    if isinstance(totals, Mapping):
        v = totals.get("successful")
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_REQUESTS_PER_POINT:
            return v
    return 1


def _replay(path: Path, out: _Read) -> None:
    from servingtopology.cli.simulate import load_replay

    rep = load_replay(path)
    n = len(rep.requests)
    span = float(rep.requests.arrival_s[-1] - rep.requests.arrival_s[0]) if n > 1 else 0.0
    rate = (n - 1) / span if span > 0 else float(n)
    ttft = float(np.mean(rep.recorded["ttft_ms"]))
    tpot = float(np.mean(rep.recorded["tpot_ms"]))
    pct = {f"{m}_p{q}": float(np.percentile(rep.recorded[f"{m}_ms"], int(q))) for m in ("ttft", "tpot") for q in ("50", "90", "99")}
    point = Point(ttft, tpot, rate, "rate", float(np.mean(rep.requests.prompt_tokens)), float(np.mean(rep.requests.output_tokens)), n,
                  0.0, str(path), f"{n} requests", pct)
    out.points.append(point)
    out.requests.append(None)
    out.replays.append(rep)
    out.named.append((Deployment(rep.model.name, rep.gpu.id, rep.engine.value, rep.release, "", rep.layout.label), f"{path.name}/meta.json"))
    digest = hashlib.sha256()
    for name in ("requests.jsonl", "meta.json", "config.json"):
        f = path / name
        if f.is_file():
            digest.update(read_bytes(f, 256 * 1024 * 1024, f"{path.name}/{name}"))
    out.sources.append(Source(str(path), digest.hexdigest(), (point.row,), "recorded run (simulate --replay)", ""))


def read_results(paths: Sequence[str], *, now: datetime | None = None) -> _Read:
    """Every result file or folder, read bounded; InvalidSpec naming the file and the field on any failure."""
    if len(paths) > MAX_FILES:
        raise InvalidSpec("RESULTS", f"{len(paths)} files; at most {MAX_FILES}")
    now = now or datetime.now(UTC)
    out = _Read()
    for p in paths:
        path = Path(p)
        if path.is_dir():
            _replay(path, out)
            continue
        raw = read_bytes(path, MAX_RESULT_BYTES, path.name)
        try:
            doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise InvalidSpec(path.name, f"{path} is not UTF-8 JSON ({str(exc)[:200] or 'nested too deep'})") from None
        if isinstance(doc, Mapping) and "benchmarks" in doc:
            _guidellm(path, doc, raw, out, now)
        elif isinstance(doc, Mapping) and "mean_ttft_ms" in doc:
            _vllm_bench(path, doc, raw, out, now)
        else:
            raise InvalidSpec(path.name, "neither a vllm bench serve --save-result file (mean_ttft_ms, request_rate, ...) nor a guidellm "
                                         "report (benchmarks: [...]) nor a recorded run folder")
    return out


# ---- the deployment and its calibration ---------------------------------------------------------------------------
def _fns(read: _Read, problem: Problem, layout: Layout) -> list[PointFn]:
    fns: list[PointFn] = []
    for point, requests, rep in zip(read.points, read.requests, read.replays, strict=True):
        if rep is not None:
            pools = {Role.AGGREGATED: rep.pool_tokens} if rep.pool_tokens else None
            fns.append(simulated_fn(rep.requests, model=rep.model, gpu=rep.gpu, engine=rep.engine, layout=rep.layout, client_side=False,
                                    pool_tokens=pools))
        elif requests is not None:
            fns.append(simulated_fn(requests, model=problem.model, gpu=problem.gpu, engine=problem.engine, layout=layout, client_side=True))
        else:
            fns.append(closed_loop_fn(point, model=problem.model, gpu=problem.gpu, engine=problem.engine, layout=layout,
                                      release=problem.engine_version or ""))
    return fns


def _stated_release(spec: PlanSpec) -> bool:
    """Whether the spec names its engine release (engine.version, or the image's tag) rather than taking the default."""
    return bool(spec.engine.version or version_from_image(spec.engine.image or ""))


def _measured_release(mine: Deployment, read: _Read, *, stated: bool) -> tuple[Deployment, str]:
    """ReleaseFromResults: the release a calibration is labelled with, and where it came from. The results' own word
    (a recorded run's meta.json, a vllm bench file's engine_version) first: files that disagree are refused by name; a
    spec that names another release is refused by refuse_other. With no result recording one, the spec's release,
    said to be the spec's (its default when it names none)."""
    said = [(named.release, field) for named, field in read.named if named.release]
    releases = {r for r, _ in said}
    if len(releases) > 1:
        raise CalibrationRefused("OtherRelease", said[0][1], "the results record different engine releases: "
                                 + ", ".join(f"{r} ({f})" for r, f in said) + "; calibrate one release at a time")
    if said:
        release, field = said[0]
        if stated:
            return mine, f"{mine.release}, as the spec names it and {field} records it"
        return replace(mine, release=release), f"{release}, as {field} records it (the spec names none)"
    if stated:
        return mine, f"{mine.release}, as the spec names it (no result records the server's release)"
    return mine, (f"{mine.release}, the spec's default (no result records the server's release; set engine.version to the "
                  "release measured)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.min_points < 1 or not ((args.half_life_days > 0 and math.isfinite(args.half_life_days)) or args.half_life_days == math.inf):
            raise InvalidSpec("--min-points/--half-life-days", "min points ≥ 1 and a positive half-life")
        check_output("--out", args.out)   # written as given, in YAML whatever its suffix
        spec = read_spec(args.spec)
        problem = to_problem(spec)
        layout = layout_for(spec, problem)
        extra: dict[str, Any] = {}
        if args.prometheus is not None:
            if args.results:
                raise InvalidSpec("RESULTS", "give result files or --prometheus, not both")
            history = read_history(args.prometheus, problem=problem, layout=layout, since=args.since, step=args.step,
                                   topology=args.topology, selector=args.selector, ca_file=args.prometheus_ca,
                                   cert_file=args.prometheus_cert, key_file=args.prometheus_key)
            if len(history.points) < args.min_points:
                raise CalibrationRefused("TooFewPoints", "--since", no_points_message(history, since=args.since))
            mine, release_from = _measured_release(deployment_of(problem, layout), _Read(), stated=_stated_release(spec))
            t0 = time.process_time()
            cal = fit_points(history.points, problem, deployment=mine, now_s=history.end_s, half_life_s=args.half_life_days * 86400.0,
                             min_points=args.min_points, sources=(history.source,), source=history.source.path)
            cpu = time.process_time() - t0
            extra = {"windows": history.windows, "quiet_windows": history.quiet, "window_s": history.window_s, "end_s": history.end_s}
        elif not args.results:
            raise InvalidSpec("RESULTS", "give result files (vllm bench, guidellm, recorded runs) or --prometheus URL")
        else:
            read = read_results(args.results)
            mine, release_from = _measured_release(deployment_of(problem, layout), read, stated=_stated_release(spec))
            aliases = [x for x in (spec.model, spec.servedModelName, spec.modelSource) if x]
            for named, field in read.named:
                refuse_other(mine, named, field=field, model_aliases=aliases)
            t0 = time.process_time()
            cal = fit(mine, read.points, predictor(_fns(read, problem, layout)), half_life_s=args.half_life_days * 86400.0,
                      min_points=args.min_points, sources=read.sources)
            cpu = time.process_time() - t0
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(exc, as_json=args.json)
    except Infeasible as exc:
        print(f"infeasible: {exc}", file=sys.stderr)
        return 1
    doc = cal.to_dict()
    try:
        write_output("--out", args.out, lambda target: target.write_text(yaml.safe_dump(doc, sort_keys=False)))
    except InvalidSpec as exc:
        return emit_spec_error(exc, as_json=args.json)
    if args.json:
        print(json.dumps(doc | {"out": args.out, "cpu_s": round(cpu, 2), "release_from": release_from} | extra))
        return 0
    d = cal.deployment
    print(f"calibration of {d.model} on {d.gpu} ({d.link}), {d.engine} {d.release or '(release not given)'}, {d.layout}: "
          f"{count_text(cal.points_used, 'point')} from {count_text(len(cal.sources), 'source')}, fitted in {cpu:.1f} CPU s")
    print(f"  release {release_from}")
    print(f"  {'point':<48}{'TTFT ms':>10}{'TPOT ms':>10}")
    for p in cal.points:
        print(f"  {(Path(p.source).name + ' ' + p.row)[:47]:<48}{p.ttft_ms:>10.2f}{p.tpot_ms:>10.2f}")
    print("  factors (time, 1 = as modelled, bound ×½–×2): " + ", ".join(f"{t} {f:.3f}" for t, f in cal.factors.items()))
    if cal.at_bound:
        print(f"  at the bound: {', '.join(cal.at_bound)} — this deployment is further from the model than a bounded correction carries")
    print(f"  RMS log error, uncalibrated → calibrated: TTFT {cal.residual_before['ttft']:.3f} → {cal.residual_after['ttft']:.3f}, "
          f"TPOT {cal.residual_before['tpot']:.3f} → {cal.residual_after['tpot']:.3f}")
    print(f"written to {args.out}")
    return 0

