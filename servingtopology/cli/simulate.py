"""`servingtopology simulate SPEC.yaml [--trace FILE]` and `simulate --replay DIR`: run the step-level simulator.

The spec's `layout` names the deployment (else the planner's best is used) and `simulation` sets the
request count, seed and warm-up; `--trace` replays a JSONL/CSV trace instead of drawing requests.
`--replay DIR` re-runs a recorded engine run (requests.jsonl, meta.json, config.json) and prints
predicted against recorded TTFT/TPOT/latency. File reading happens here; the simulator is pure.
Exit 0 done, 1 infeasible, 2 invalid input.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from servingtopology.cli.calibration_io import (
    add_calibration_arg,
    calibration_summary,
    interval_text,
    prediction_intervals,
    read_bytes,
    read_calibration,
    read_calibration_of,
)
from servingtopology.cli.progress import StageBar, wanted
from servingtopology.cli.spec_input import emit_spec_error, layout_for, read_spec
from servingtopology.planner.engines.caps import release_of
from servingtopology.planner.engines.defaults import max_running, memory_fraction, token_budget
from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.figure_text import count_text, finite_json, gpus_text, ms_text, rps_text
from servingtopology.planner.hardware import Gpu, Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, Role
from servingtopology.planner.model.catalog import ModelArch, from_hf_config, resolve_model
from servingtopology.planner.perf.deployment_fit import Deployment
from servingtopology.planner.perf.memory_fit import Longest
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import predict_layout, refuse_pin
from servingtopology.planner.search.stage6_size import STAGE6_REQUESTS, stage6_requests
from servingtopology.planner.sim import (
    Percentiles,
    RequestSet,
    SimResult,
    SimSummary,
    from_rows,
    from_workload,
    percentiles,
    recorded_latencies,
    simulate,
)
from servingtopology.planner.sim.stage import simulate_problem, slo_figures, stage6_figures, warmup_of
from servingtopology.planner.slo import meets_slo_ms
from servingtopology.planner.workload import Slo
from servingtopology.spec import (
    MAX_BATCHED_TOKENS,
    MAX_CONFIG_BYTES,
    MAX_GPUS,
    MAX_ID,
    MAX_NUM_SEQS,
    MAX_PARALLEL,
    MAX_SIM_REQUESTS,
    MAX_SIM_STEPS,
    MAX_SIM_TOKENS,
    MAX_TOKENS,
    SpecError,
    read_model_config,
    to_problem,
)

__all__ = ["add_parser", "run", "read_trace", "Replay", "load_replay", "run_replay", "compare", "summary_json"]

METRICS = ("ttft_ms", "tpot_ms", "latency_ms")
STATS = ("mean", "p50", "p90", "p99")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate one layout step by step, or replay a recorded run",
                       description="Run the iteration-level simulator on the spec's layout (or the planner's best), "
                                   "or replay a recorded engine run with --replay DIR.")
    p.add_argument("spec", nargs="?", help="planning spec (YAML); omit with --replay")
    p.add_argument("--trace", metavar="FILE", help="replay this JSONL or CSV trace (arrival time, input and output tokens)")
    p.add_argument("--replay", metavar="DIR", help="a recorded run: requests.jsonl, meta.json, config.json")
    p.add_argument("--model-config", metavar="PATH", help="with --replay: the model's Hugging Face config.json when the run's "
                                                            "folder has none and its model id is not in the catalog")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (drawn on a terminal's stderr only, never with --json)")
    add_calibration_arg(p)


# A trace is held to the spec's simulation bounds: at most MAX_SIM_REQUESTS rows, each request's lengths within
# MAX_TOKENS, times finite (issue #17: the planner's work stays bounded by its input's size).
MAX_TRACE_BYTES = 256 * 1024 * 1024


def read_trace(path: Path, *, field: str = "trace") -> list[dict[str, object]]:
    """Rows of a JSONL (one object per line) or CSV (header row) trace file; every way it can be unreadable
    (missing, over 256 MiB or MAX_SIM_REQUESTS rows, not UTF-8, a line that is not a JSON object, a field over
    the csv module's limit) is an InvalidSpec naming `field` and the line."""
    raw = read_bytes(path, MAX_TRACE_BYTES, field)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = raw[:exc.start].count(b"\n") + 1
        raise InvalidSpec(f"{field} line {bad_line}", "not UTF-8 text") from None
    rows: list[dict[str, object]] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        try:
            for r in reader:
                rows.append(dict(r))
                _check_rows(rows, field)
        except csv.Error as exc:
            raise InvalidSpec(f"{field} line {reader.line_num}", f"not CSV: {exc}") from None
        return rows
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
                raise InvalidSpec(f"{field} line {i + 1}", f"not JSON: {msg}") from None
            if not isinstance(row, dict):
                raise InvalidSpec(f"{field} line {i + 1}", f"not a JSON object of request fields (got a {type(row).__name__})")
            rows.append(row)
            _check_rows(rows, field)
    return rows


def _check_rows(rows: list[dict[str, object]], field: str) -> None:
    if len(rows) > MAX_SIM_REQUESTS:
        raise InvalidSpec(field, f"more than {MAX_SIM_REQUESTS:,} requests (the bound of simulation.requests)")


def _trace_requests(path: Path) -> RequestSet:
    """The trace's requests, held to the spec's bounds: finite times, lengths within MAX_TOKENS."""
    try:
        requests = from_rows(read_trace(path))
    except (OverflowError, ValueError) as exc:  # round(inf) in from_rows; InvalidSpec is a PlannerError, not a ValueError
        raise InvalidSpec("trace", f"a request holds a number out of range ({exc})") from None
    if not len(requests):
        raise InvalidSpec("trace", f"{path} holds no requests")
    if not np.isfinite(requests.arrival_s).all():
        raise InvalidSpec("trace", "an arrival time is not a finite number")
    longest = int(max(requests.prompt_tokens.max(), requests.output_tokens.max()))
    if longest > MAX_TOKENS:
        raise InvalidSpec("trace", f"a request of {longest:,} tokens; at most {MAX_TOKENS:,} (the longest context window)")
    return requests


# ---- replay of a recorded run ------------------------------------------------------------------------
class Replay:
    """A recorded run turned into simulator inputs."""

    def __init__(self, *, layout: Layout, model: ModelArch, gpu: Gpu, engine: Engine, requests: RequestSet,
                 recorded: dict[str, Any], pool_tokens: int | None, release: str = "") -> None:
        self.layout, self.model, self.gpu, self.engine = layout, model, gpu, engine
        self.requests, self.recorded, self.pool_tokens = requests, recorded, pool_tokens
        self.release = release   # the engine's own record of its release (meta.json vllm_version / sglang_version); '' if none


# Bounds of what a recorded run's files may say (the spec's own bounds where it has them): a count past them is an
# InvalidSpec naming the file and the field, never a crash or a simulation too big to hold (max_num_seqs 1e8 took 4 GB).
MAX_GPU_BLOCKS = 16_777_216   # kv_cache.num_gpu_blocks: 2^24 blocks (268M tokens at block 16) is past any GPU's pool
MAX_BLOCK_SIZE = 256          # the spec's engineArgs.blockSize bound


class _Read:
    """Typed reads of one JSON object of a replay folder, each failure an InvalidSpec naming the file and the field."""

    def __init__(self, path: Path, node: Mapping[str, Any], prefix: str = "") -> None:
        self.path, self.node, self.prefix = path, node, prefix

    def field(self, key: str) -> str:
        return f"{self.path.name} {self.prefix}{key}"

    def fail(self, key: str, what: str) -> InvalidSpec:
        return InvalidSpec(self.field(key), f"{what} (in {self.path})")

    def obj(self, key: str) -> _Read:
        value = self.node.get(key)
        if value is None:
            return _Read(self.path, {}, f"{self.prefix}{key}.")
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a JSON object, got {type(value).__name__}")
        return _Read(self.path, value, f"{self.prefix}{key}.")

    def text(self, key: str, default: str = "") -> str:
        value = self.node.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or len(value) > MAX_ID:
            raise self.fail(key, f"must be a string of at most {MAX_ID} characters, got {_shown(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.node.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_shown(value)}")
        return value

    def count(self, key: str, *, low: int, high: int) -> int | None:
        """An integer in [low, high] (an integral JSON number); None when absent or null."""
        value = self.node.get(key)
        if value is None:
            return None
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and float(value).is_integer()
        if not ok or not low <= value <= high:
            raise self.fail(key, f"must be a whole number from {low:,} to {high:,}, got {_shown(value)}")
        return int(value)

    def fraction(self, key: str) -> float | None:
        value = self.node.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
            raise self.fail(key, f"must be a number above 0 and at most 1, got {_shown(value)}")
        return float(value)


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | bool) or value is None else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "…"


def _gpu_for(folder: Path, meta: _Read, cluster: _Read) -> Gpu:
    names: list[str] = []
    device = meta.obj("hardware").text("device_name")
    if device:
        names += [device, device.removeprefix("NVIDIA ").removeprefix("GeForce ")]
    nodes = cluster.node.get("nodes")
    if nodes is not None and not isinstance(nodes, list):
        raise cluster.fail("nodes", f"must be a list of node objects, got {_shown(nodes)}")
    for i, node in enumerate(nodes or ()):
        if not isinstance(node, Mapping):
            raise cluster.fail(f"nodes[{i}]", f"must be a node object, got {_shown(node)}")
        instances = node.get("instances")
        if instances is not None and not isinstance(instances, list):
            raise cluster.fail(f"nodes[{i}].instances", f"must be a list of instance objects, got {_shown(instances)}")
        for j, inst in enumerate(instances or ()):
            if not isinstance(inst, Mapping):
                raise cluster.fail(f"nodes[{i}].instances[{j}]", f"must be an instance object, got {_shown(inst)}")
            hw = _Read(cluster.path, inst, f"nodes[{i}].instances[{j}].").text("hardware")
            if hw:
                names.append(hw)
    names.append(folder.name.split("_")[0][:MAX_ID])
    for name in names:
        try:
            return resolve_gpu(name)
        except InvalidSpec:
            continue
    raise InvalidSpec("replay", f"cannot tell the GPU of {folder} (tried {', '.join(names)}); "
                                "set meta.json hardware.device_name to a catalog GPU")


_HF_CONFIG_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "text_config", "language_config", "llm_config")


def _is_hf_config(cfg: Mapping[str, Any]) -> bool:
    return any(k in cfg for k in _HF_CONFIG_KEYS)


def _model_for(folder: Path, name: str, config: Mapping[str, Any], model_config: Path | None = None) -> ModelArch:
    """The run's model: --model-config, else a Hugging Face config.json in the folder, else the catalog by meta's id.

    The folder's config.json may be the model's (Hugging Face) or the simulator's cluster file (LLMServingSim);
    the model's config is also looked for as model_config.json, hf_config.json, model/config.json and
    <org>/<name>/config.json under the folder.
    """
    candidates: list[tuple[Path, Mapping[str, Any] | None]] = [(model_config, None)] if model_config else []
    candidates.append((folder / "config.json", config))
    candidates += [(folder / rel, None) for rel in ("model_config.json", "hf_config.json", "model/config.json")]
    if name and ".." not in name.split("/"):
        candidates.append((folder / name / "config.json", None))
    for path, parsed in candidates:
        if parsed is None:
            if not path.is_file():
                continue
            parsed = read_model_config(path, field="replay")
        if isinstance(parsed, Mapping) and _is_hf_config(parsed):
            return from_hf_config(parsed, name=name or path.parent.name, field=str(path))
    if not name:
        raise InvalidSpec("replay", f"no Hugging Face config.json in {folder} and meta.json names no model")
    try:
        return resolve_model(name, field="meta.json model")
    except InvalidSpec:
        raise InvalidSpec("meta.json model", f"{name!r} is not in the catalog and {folder} holds no Hugging Face config.json of it "
                                        "(looked for config.json, model_config.json, hf_config.json, model/config.json, "
                                        f"{name}/config.json); give --model-config PATH") from None


def _read_json_object(path: Path, *, required: bool) -> dict[str, Any]:
    if not required and not path.exists():
        return {}
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise InvalidSpec(path.name, f"{path} is over {MAX_CONFIG_BYTES:,} bytes")
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except OSError as exc:
        raise InvalidSpec(path.name, f"cannot read {exc.filename or path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidSpec(path.name, f"{path} is not UTF-8 JSON ({str(exc)[:200] or 'nested too deep'})") from None
    if not isinstance(value, dict):
        raise InvalidSpec(path.name, f"{path} must be a JSON object, got {type(value).__name__}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _replay_requests(folder: Path, knobs: EngineKnobs) -> tuple[RequestSet, dict[str, Any]]:
    """The recorded requests and latencies, held to the spec's simulation bounds (lengths, tokens and engine steps)."""
    field = "requests.jsonl"
    rows = read_trace(folder / "requests.jsonl", field=field)
    if not rows:
        raise InvalidSpec(field, f"{folder / field} holds no requests")
    try:
        requests, recorded = from_rows(rows), recorded_latencies(rows)
    except (OverflowError, ValueError) as exc:  # round(inf) in from_rows
        raise InvalidSpec(field, f"a request holds a number out of range ({exc})") from None
    except InvalidSpec as exc:   # the reader's own words name a row ("trace row 3"); the file is requests.jsonl
        raise InvalidSpec(f"{field} {exc.field.removeprefix('trace').strip()}".strip(), f"{exc.message} (in {folder / field})") from None
    n = len(requests)
    if not np.isfinite(requests.arrival_s).all() or not all(np.isfinite(v).all() for v in recorded.values()):
        raise InvalidSpec(field, "an arrival or token timestamp is not a finite number")
    if not all(len(v) for v in recorded.values()):
        raise InvalidSpec(field, "no request with more than one output token and its timestamps: nothing to compare TPOT against")
    longest = int(max(requests.prompt_tokens.max(), requests.output_tokens.max()))
    if longest > MAX_TOKENS:
        raise InvalidSpec(field, f"a request of {longest:,} tokens; at most {MAX_TOKENS:,} (the longest context window)")
    tokens = int(requests.prompt_tokens.sum() + requests.output_tokens.sum())
    steps = float(requests.output_tokens.sum()) / min(knobs.max_num_seqs, n)
    if tokens > MAX_SIM_TOKENS or steps > MAX_SIM_STEPS:
        raise InvalidSpec(field, f"{n:,} requests of {tokens:,} tokens in ~{steps:,.0f} engine steps at max_num_seqs "
                                 f"{knobs.max_num_seqs}; one simulation holds at most {MAX_SIM_TOKENS:,} tokens and {MAX_SIM_STEPS:,} steps")
    return requests, recorded


def load_replay(folder: Path, *, model_config: Path | None = None) -> Replay:
    """Read a recorded run's folder into a Replay (model, GPU, engine knobs, requests, recorded latencies).

    Every field read is typed and bounded (the spec's bounds: max_num_seqs, batched tokens, parallelism, block size):
    a wrong type or a count out of range is an InvalidSpec naming the file and the field."""
    meta_raw = _read_json_object(folder / "meta.json", required=True)
    config = _read_json_object(folder / "config.json", required=False)
    meta, cluster = _Read(folder / "meta.json", meta_raw), _Read(folder / "config.json", config)
    kw, kv = meta.obj("engine_kwargs"), meta.obj("kv_cache")
    run_name, kw_name = meta.text("model"), kw.text("model")   # both read, so both are checked
    name = run_name or kw_name
    gpu = _gpu_for(folder, meta, cluster)
    model = _model_for(folder, name, config, model_config)
    engine = Engine.SGLANG if "sglang_version" in meta_raw or "server_args" in meta_raw else Engine.VLLM
    release = release_of(meta.text(f"{engine.value}_version"))
    kv_dtype = KvDtype.FP8 if kw.text("kv_cache_dtype", "auto").startswith("fp8") else KvDtype.AUTO
    block = kv.count("block_size", low=1, high=MAX_BLOCK_SIZE) or kw.count("block_size", low=1, high=MAX_BLOCK_SIZE) or 16
    # A knob the run left out is what vLLM chose (the run's files name vLLM's knobs): planner.engines.defaults, the one
    # home of those rules (an A100-80GB is left out of the large defaults by name there).
    knobs = EngineKnobs(
        max_num_seqs=kw.count("max_num_seqs", low=1, high=MAX_NUM_SEQS) or max_running(Engine.VLLM, gpu, release=release),
        max_num_batched_tokens=kw.count("max_num_batched_tokens", low=1, high=MAX_BATCHED_TOKENS) or int(token_budget(Engine.VLLM, gpu, release=release)),
        memory_fraction=kv.fraction("gpu_memory_utilization") or kw.fraction("gpu_memory_utilization") or memory_fraction(Engine.VLLM, gpu),
        kv_dtype=kv_dtype,
        block_size_tokens=block,
        enable_prefix_caching=kv.flag("enable_prefix_caching", kw.flag("enable_prefix_caching", True)),
    )
    par = Parallelism(tp=kw.count("tensor_parallel_size", low=1, high=MAX_PARALLEL) or 1,
                      pp=kw.count("pipeline_parallel_size", low=1, high=MAX_PARALLEL) or 1,
                      dp=kw.count("data_parallel_size", low=1, high=MAX_PARALLEL) or 1, ep=kw.flag("enable_expert_parallel", False))
    if par.gpus > MAX_GPUS:
        raise kw.fail("tensor_parallel_size", f"tp x pp x dp is {par.gpus:,} GPUs; at most {MAX_GPUS:,}")
    quant = kw.text("quantization")
    # vLLM's --quantization when the run set it, else what the checkpoint's quantization_config says.
    precision = (Precision.FP8 if "fp8" in quant else Precision.FP4 if "fp4" in quant
                 else Precision.INT4 if quant.startswith(("awq", "gptq")) else model.checkpoint_precision)
    layout = Layout.replicas(1, par, knobs, precision)
    blocks = kv.count("num_gpu_blocks", low=1, high=MAX_GPU_BLOCKS)
    requests, recorded = _replay_requests(folder, knobs)
    return Replay(layout=layout, model=model, gpu=gpu, engine=engine, requests=requests, recorded=recorded,
                  pool_tokens=blocks * block if blocks else None, release=release)


def run_replay(rep: Replay, *, progress: Callable[[int], None] | None = None) -> SimResult:
    """Simulate a Replay (the recorded pool size when the run logged one, else the memory model's); `progress` hears the
    requests finished (planner.sim `simulate`)."""
    pools = {Role.AGGREGATED: rep.pool_tokens} if rep.pool_tokens else None
    return simulate(rep.layout, model=rep.model, gpu=rep.gpu, engine=rep.engine, requests=rep.requests, pool_tokens=pools,
                    progress=progress)


def compare(result: SimResult, recorded: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Predicted against recorded mean/p50/p90/p99 of TTFT, TPOT and latency, with the error in % (None where a side has no
    finite figure: no request finished)."""
    s = result.summary()
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for metric in METRICS:
        pred: Percentiles = getattr(s, metric)
        rec = percentiles(recorded[metric])
        out[metric] = {}
        for stat in STATS:
            p, r = getattr(pred, stat), getattr(rec, stat)
            err = _num((p - r) / r * 100.0) if r and math.isfinite(p) and math.isfinite(r) else None   # None: no error to state
            out[metric][stat] = {"predicted": _num(p), "recorded": _num(r), "error_pct": err}
    return out


def _print_compare(table: Mapping[str, Mapping[str, Mapping[str, float | None]]], title: str) -> None:
    print(title)
    print(f"{'metric':<14}{'predicted':>14}{'recorded':>14}{'error %':>10}")
    for metric, stats in table.items():
        for stat, v in stats.items():
            cells = [format(v[k], f">{sign}{w}.1f") if v[k] is not None else f"{'-':>{w}}" for k, w, sign in
                     (("predicted", 14, ""), ("recorded", 14, ""), ("error_pct", 10, "+"))]
            print(f"{metric.removesuffix('_ms') + ' ' + stat:<14}" + "".join(cells))


# ---- one layout from a spec ----------------------------------------------------------------------------
def summary_json(s: SimSummary, *, layout: Layout, wall_s: float, engine: Engine = Engine.VLLM) -> dict[str, Any]:
    """The `simulate --json` object (the layout named as `engine` names it)."""
    d = s.as_dict()
    out: dict[str, Any] = {"layout": layout.label_for(engine), "gpus": layout.gpus}
    for key in ("requests", "finished", "unfinished", "ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "queue_ms",
                "throughput_tok_s", "throughput_tok_s_per_gpu", "input_tok_s", "request_rps", "goodput_rps",
                "kv_utilisation_mean", "kv_utilisation_max", "preemptions", "cached_token_share", "duration_s"):
        value = d[key]
        out[key] = {k: _num(v) for k, v in value.items()} if isinstance(value, dict) else _num(value)
    out["wall_s"] = round(wall_s, 4)
    return out


def at_slo_json(problem: Problem, layout: Layout, summary: SimSummary) -> dict[str, Any]:
    """The run's figures at the SLO's percentiles as `plan` states a simulated prediction (planner.sim.stage.slo_figures:
    client TTFT with the front end, TPOT; None where a request did not finish), the verdict on them, and their source."""
    fig = slo_figures(problem, layout, summary)
    ttft_ms, tpot_ms = fig.ttft_s * 1e3, fig.tpot_s * 1e3
    return {"ttft_ms": _num(round(ttft_ms, 3)), "tpot_ms": _num(round(tpot_ms, 3)),
            "ttft_percentile": problem.slo.ttft_percentile, "tpot_percentile": problem.slo.tpot_percentile,
            "meets_slo": bool(math.isfinite(ttft_ms) and meets_slo_ms(problem.slo, ttft_ms=ttft_ms, tpot_ms=tpot_ms)),
            "source": "simulated"}


def _num(v: Any) -> Any:
    if isinstance(v, float):
        return None if not math.isfinite(v) else round(v, 4)
    return v


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _plans_figures(problem: Problem, layout: Layout, summary: SimSummary, *, simulated_here: int) -> dict[str, Any]:
    """What `plan` states for this pinned layout at the spec's load: decide's predict_layout with stage 6's simulator, the
    one computation behind plan's figures; this run's own summary stands in for stage 6's run where it is that run (the
    same count, seed and warm-up: planner.search.stage6_size), so nothing is simulated twice."""
    sized = stage6_requests(problem)
    same_run = sized.requests == simulated_here
    sim = (lambda _problem, _layout: slo_figures(problem, layout, summary)) if same_run else stage6_figures
    p = predict_layout(problem, layout, simulate=sim).prediction
    return {"ttft_ms": _num(p.ttft_ms), "tpot_ms": _num(p.tpot_ms), "meets_slo": p.meets_slo, "source": p.source,
            "requests": sized.requests if p.source == "simulated" else None, "reason": sized.reason or None,
            "same_run": same_run and p.source == "simulated"}


def _same_as_plan(out: Mapping[str, Any], slo: Slo) -> str:
    """Whether `plan` states these figures, else what it states (its own figures, labelled by source and run length), so
    two commands' p95s of one layout at one load are never set side by side unexplained."""
    plan = out.get("plan")
    if plan is None:
        return "the trace's requests, not the spec's workload that `plan` simulates"
    if plan["same_run"]:
        return "the simulated figures `plan` predicts and ranks by"
    if plan["source"] == "simulated":
        why = plan["reason"] or f"at most {STAGE6_REQUESTS:,} a layout"
        source = (f"its simulated figures over {plan['requests']:,} requests of the same workload ({why}), a shorter run than these "
                  "(where the queue grows through the run, a shorter run's tail is shorter too)")
    else:
        source = "its analytical figures: the load is past the layout's analytical capacity, so plan does not simulate it"
    return (f"`plan` states p{slo.ttft_percentile:g} TTFT {ms_text(plan['ttft_ms'])} ms and p{slo.tpot_percentile:g} TPOT "
            f"{ms_text(plan['tpot_ms'])} ms ({'met' if plan['meets_slo'] else 'missed'}), {source}")


def _print_summary(out: Mapping[str, Any], slo: Slo | None = None, rate_rps: float | None = None) -> bool:
    """Print one run's summary; False when no measured request finished (then there are no latencies to show, and it
    says so in words instead of a table of nan)."""
    print(f"layout {out['layout']} on {gpus_text(out['gpus'])}: {out['finished']} of {out['requests']} requests finished "
          f"({out['unfinished']} unfinished), {out['preemptions']} preemptions, simulated in {out['wall_s']:.2f} s")
    if not out["finished"]:
        print(f"no measured request finished, so no latency or throughput can be stated: the {out['unfinished']} left were still "
              "waiting or running when the simulation could go no further (a queue that never drains, or requests the ranks "
              "cannot admit)")
        return False
    # Each cell right-aligned after at least one space, so a queue of hours never runs into its neighbour.
    cells = {key: [_ms(out[key][k]) for k in ("mean", "p50", "p90", "p95", "p99")] for key in ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "queue_ms")}
    width = max(10, 1 + max(len(c) for row in cells.values() for c in row))
    print(f"{'ms':<10}" + "".join(f"{h:>{width}}" for h in ("mean", "p50", "p90", "p95", "p99")))
    for key, row in cells.items():
        print(f"{key.removesuffix('_ms'):<10}" + "".join(f"{c:>{width}}" for c in row))
    print(f"throughput {out['throughput_tok_s']:,.1f} output tok/s ({out['throughput_tok_s_per_gpu']:,.1f} per GPU) and "
          f"{rps_text(out['request_rps'])} req/s finished over the {out['duration_s']:,.1f} s from the first arrival to the last finish; "
          f"KV in use {out['kv_utilisation_mean']:.0%} on average")
    if slo is None or out.get("goodput_rps") is None:
        return True
    at = out["at_slo"]
    ttft, tpot = at["ttft_ms"], at["tpot_ms"]
    drawn = f" (the spec's {rate_rps:g} req/s, as drawn)" if rate_rps else ""
    print(f"SLOs {'met' if at['meets_slo'] else 'missed'} at the offered {rps_text(out['offered_rps'])} req/s{drawn}: p{slo.ttft_percentile:g} TTFT "
          f"{_ms(ttft)} ms (SLO {slo.ttft_ms:,g}, the front end included), p{slo.tpot_percentile:g} TPOT {_ms(tpot)} ms (SLO {slo.tpot_ms:,g}): "
          + _same_as_plan(out, slo))
    print(f"goodput {rps_text(out['goodput_rps'])} req/s: requests that each met both targets ({out['slo_attainment']:.1%} of them) per "
          f"second of the {out['duration_s']:,.1f} s run, the drain after the last arrival included (vLLM's benchmark definition), "
          f"so below the offered rate even when every request meets its targets")
    return True


def _run_spec(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    problem = to_problem(spec)
    layout = layout_for(spec, problem)
    longest = None
    if args.trace:
        requests = _trace_requests(Path(args.trace))
        longest = Longest(prompt_tokens=float(requests.prompt_tokens.max()),
                          request_tokens=float((requests.prompt_tokens + requests.output_tokens).max()), source="the trace's longest")
    else:
        requests = from_workload(problem.workload, num_requests=spec.simulation.requests, seed=spec.simulation.seed)
    # Held to the search's checks as `plan` holds a pin (the trace's own requests where there is one): a role whose rank
    # pool cannot hold them is refused by name, never simulated into requests that cannot finish.
    refuse_pin(problem, layout, longest=longest)
    calibration = read_calibration(args.calibration, problem) if getattr(args, "calibration", None) else None
    warmup = 0 if args.trace else warmup_of(problem, len(requests))  # a trace is measured whole
    bar = StageBar(enabled=wanted(args))   # SimulationProgress: requests finished, on a terminal's stderr only

    def one(cal: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        progress = bar.requests("simulation" + (" (calibrated)" if cal is not None else ""), len(requests),
                                note=layout.label_for(problem.engine))
        # Drawn as stage 6 draws them (planner.sim.stage), so `plan` and `simulate` read one run of the same requests.
        result = (simulate(layout, model=problem.model, gpu=problem.gpu, engine=problem.engine, requests=requests,
                           precision=problem.precision, seed=spec.simulation.seed, progress=progress) if args.trace else
                  simulate_problem(problem, layout, num_requests=spec.simulation.requests, seed=spec.simulation.seed,
                                   progress=progress))
        summary = result.summary(problem.slo, warmup_requests=warmup)
        out = summary_json(summary, layout=layout, wall_s=time.perf_counter() - t0, engine=problem.engine)
        out["offered_rps"] = _num(result.offered_rps(warmup_requests=warmup))
        out["slo_attainment"] = _num(result.slo_attainment(problem.slo, warmup_requests=warmup))
        out["at_slo"] = at_slo_json(problem, layout, summary)
        if not args.trace:
            out["plan"] = _plans_figures(problem, layout, summary, simulated_here=len(requests))
        out["intervals"] = {f"{m}_mean": iv for m, iv in zip(("ttft_ms", "tpot_ms"), prediction_intervals(
            problem, layout, out["ttft_ms"]["mean"] or math.nan, out["tpot_ms"]["mean"] or math.nan, cal).values(), strict=True)}
        return out
    try:
        out = one(None)
        if calibration is not None:
            with calibration.applied():
                out["calibrated"] = one(calibration)
            out["calibration"] = calibration_summary(calibration, args.calibration)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(finite_json(out)))
    else:
        if _print_summary(out, problem.slo, None if args.trace else problem.workload.arrival_rate_rps):
            iv = out["intervals"]
            print(f"mean TTFT {interval_text(iv['ttft_ms_mean'])} ms, mean TPOT {interval_text(iv['tpot_ms_mean'])} ms: nominal 80 % "
                  f"intervals (class {iv['ttft_ms_mean']['class']})")
        if calibration is not None:
            print(f"\ncalibrated ({args.calibration}: {count_text(calibration.points_used, 'point')}):")
            if _print_summary(out["calibrated"], problem.slo, None if args.trace else problem.workload.arrival_rate_rps):
                iv = out["calibrated"]["intervals"]
                print(f"mean TTFT {interval_text(iv['ttft_ms_mean'])} ms, mean TPOT {interval_text(iv['tpot_ms_mean'])} ms: nominal 80 % "
                      "intervals, with the deployment's own residual")
    return 0


def _run_replay(args: argparse.Namespace) -> int:
    """A recorded run predicted and set beside its own figures; with --calibration (of this run's model, GPU, engine and
    release, else refused by name) the calibrated prediction too, as `simulate SPEC --calibration` shows it."""
    rep = load_replay(Path(args.replay), model_config=Path(args.model_config) if args.model_config else None)
    calibration = None
    if getattr(args, "calibration", None):
        calibration = read_calibration_of(args.calibration, Deployment(rep.model.name, rep.gpu.id, rep.engine.value, rep.release))
    label = rep.layout.label_for(rep.engine)
    bar = StageBar(enabled=wanted(args))   # SimulationProgress: requests finished, on a terminal's stderr only
    try:
        table: dict[str, Any] = compare(run_replay(rep, progress=bar.requests("replay", len(rep.requests), note=label)), rep.recorded)
        calibrated = None
        if calibration is not None:
            with calibration.applied():
                calibrated = compare(run_replay(rep, progress=bar.requests("replay (calibrated)", len(rep.requests), note=label)),
                                     rep.recorded)
    finally:
        bar.close()
    title = f"replay of {args.replay}: {label} on {rep.gpu.id}, {len(rep.requests)} requests"
    if args.json:
        extra = {} if calibrated is None or calibration is None else {
            "calibrated": calibrated, "calibration": calibration_summary(calibration, args.calibration)}
        print(json.dumps(finite_json({**table, **extra})))
        return 0
    _print_compare(table, title + (" (uncalibrated)" if calibrated is not None else ""))
    if calibrated is not None and calibration is not None:
        print()
        _print_compare(calibrated, f"calibrated ({args.calibration}: {count_text(calibration.points_used, 'point')})")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.replay:
            return _run_replay(args)
        if not args.spec:
            print("simulate: give a SPEC.yaml or --replay DIR", file=sys.stderr)
            return 2
        return _run_spec(args)
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(exc, as_json=args.json)
    except Infeasible as exc:
        if args.json:
            print(json.dumps({"error": "infeasible", "message": str(exc)}))
        print(f"infeasible: {exc}", file=sys.stderr)
        return 1
