"""Benchmark cases: public silicon benchmark rows (already parsed into str dicts) turned into problems and predictions.

Called by `servingtopology validate`, benchmarks/fit_perf.py and benchmarks/validate_silicon.py. It reads
the aiconfigurator silicon CSV schema (agg: tp/pp/attention_dp/moe_tp/moe_ep; disagg: prefill_*/decode_*
with worker counts; concurrency in `silicon_concurrency=N`), and predicts each row's mean TTFT and TPOT with
planner.perf.closed_loop over the shared step-time model, vectorised per (model, GPU, precision, backend, mode).
Where the data source names the benchmark harness (InferenceX), the row is predicted as that harness ran it:
the mean of the lengths its client drew, its requests per client, the server knobs its recipes set.
Pure: the caller reads files and resolves models.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servingtopology.planner.engines.caps import release_key
from servingtopology.planner.engines.defaults import max_running, memory_fraction, sglang_mem_fraction, token_budget
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype
from servingtopology.planner.model.catalog import ModelArch
from servingtopology.planner.perf.closed_loop import aggregated, disaggregated
from servingtopology.planner.perf.memory import fixed_bytes_per_seq, kv_bytes_per_token, kv_pool_bytes, weight_bytes_per_gpu
from servingtopology.planner.perf.step import (
    PerfParams,
    StepCoefficients,
    StepGeometry,
    concat_geometry,
    evaluate_step_s,
    fold_coefficients,
    kv_transfer_s,
    perf_params,
    step_geometry,
)
from servingtopology.planner.sim.sglang import MIN_NEW_TOKEN_RATIO

__all__ = ["Topology", "BenchmarkCase", "Skip", "parse_row", "fill_from_twins", "export_quirks", "EXPORT_QUIRK", "Prediction",
           "predict_cases", "predict_all", "prepare_cases", "PreparedCases", "predict_held_out", "BACKENDS",
           "Harness", "INFERENCEX", "UNSTATED", "harness_of", "without_harness"]

BACKENDS = ("vllm", "sglang", "trtllm")
# Quant-mode labels of the schema's gemm_quant_mode / moe_quant_mode columns (aiconfigurator's and TensorRT-LLM's
# QuantAlgo names, lower-cased): the precision class of the weights each names (8-bit integer modes as FP8 bytes).
_QUANT = {"": Precision.BF16, "bf16": Precision.BF16, "fp16": Precision.BF16, "float16": Precision.BF16, "fp8": Precision.FP8,
          "fp8_block": Precision.FP8, "fp8_ootb": Precision.FP8, "fp8_pb_wo": Precision.FP8, "mxfp8": Precision.FP8,
          "w8a8": Precision.FP8, "sq": Precision.FP8, "int8_wo": Precision.FP8, "w8a16": Precision.FP8, "nvfp4": Precision.FP4,
          "fp4": Precision.FP4, "mxfp4": Precision.FP4, "w4a16_mxfp4": Precision.FP4, "w4a8_mxfp4_fp8": Precision.FP4,
          "w4a8_mxfp4_mxfp8": Precision.FP4, "w4a8_nvfp4_fp8": Precision.FP4, "int4": Precision.INT4, "int4_wo": Precision.INT4,
          "w4a16": Precision.INT4, "w4a16_awq": Precision.INT4, "w4a16_gptq": Precision.INT4, "w4a8_awq": Precision.INT4,
          "w4afp8": Precision.INT4}
_CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


@dataclass(frozen=True, slots=True)
class Harness:
    """The benchmark client that measured a row, as far as the row's data source names it.

    `length_floor`: each request's input and output lengths are drawn uniformly from the integers in
    [int(floor × L), L] for the row's labelled L (1.0: exactly L). `requests_per_client`: measured requests
    per client, which sets how much the start-up wave weighs in the mean TTFT (None: the fitted parameter).
    """

    name: str
    length_floor: float = 1.0
    requests_per_client: float | None = None

    def mean_length(self, label: Any) -> Any:
        """Mean of the drawn lengths for labelled length(s) `label`."""
        label = np.asarray(label, dtype=float)
        return 0.5 * (np.floor(self.length_floor * label) + label)


# SemiAnalysisAI/InferenceX (benchmarks/benchmark_lib.sh run_benchmark_serving, utils/bench_serving/benchmark_serving.py
# sample_random_requests): `--dataset-name random --random-range-ratio 0.8` with a one-sided sampler (uniform integers in
# [int(0.8·L), L] for input and output independently), `--num-prompts 10×CONC --max-concurrency CONC --request-rate inf
# --ignore-eos --num-warmups 2×CONC`. Its rows carry `source_file=<date>.csv; model=…` or `db-dump/…; workflow_run_id=…`.
INFERENCEX = Harness("inferencex", length_floor=0.8, requests_per_client=10.0)
# A row whose source does not name its client ran fixed lengths (SOURCES.md) and, by assumption, the common benchmark
# length of 10 requests per client (NVIDIA's genai-perf examples run `--request-count $((concurrency*10))`, InferenceX
# `--num-prompts 10×CONC`). Declared, not fitted: a fitted length per backend absorbed other errors of the few models
# it was fitted on and did not carry to a model left out (Llama-3.1-8B's SGLang TTFT 108 % leave-one-model-out).
UNSTATED = Harness("unstated", requests_per_client=10.0)
_INFERENCEX_SOURCE = re.compile(r"^(db-dump/|source_file=\d{4}-\d{2}-\d{2}\.csv;)")


def _recv_interval(case: BenchmarkCase) -> float:
    """SGLang's `--scheduler-recv-interval` the row's server ran with (1: every step, the engine default).

    InferenceX's single-node SGLang recipes for B200 and B300 (benchmarks/single_node/dsr1_fp8_b200.sh and the
    FP4 and B300 ones) set 10 below 16 concurrent clients and 30 from 16 on; its H200 recipes leave the default.
    """
    if case.harness is INFERENCEX and case.backend == "sglang" and case.mode == "agg" and case.system in ("b200_sxm", "b300_sxm"):
        return 10.0 if case.concurrency < 16 else 30.0
    return 1.0


@dataclass(frozen=True, slots=True)
class _Recipe:
    """Engine flags a harness's launch script set for a row's server (None: the engine's default)."""

    kv_dtype: KvDtype | None = None
    memory_fraction: float | None = None
    max_num_seqs: int | None = None
    budget_per_isl: float | None = None  # --max-num-batched-tokens as a multiple of the row's labelled input length


_MINIMAX_M25 = "MiniMaxAI/MiniMax-M2.5"
# SemiAnalysisAI/InferenceX's single-node vLLM scripts for MiniMax-M2.5 at the runs' images (benchmarks/single_node/
# minimaxm2.5_{fp8,fp4}_{b200,b300}.sh, _fp8_h100.sh, _fp8_h200.sh; each config key's image in perf-changelog.yaml, PR
# #947 of 2026-04-03 moving B200 FP8 from vLLM v0.17.0 to v0.19.0): from v0.19.0 on B200 and B300 (and the NVFP4 scripts,
# which began there, nightly images included) `--kv-cache-dtype fp8 --gpu-memory-utilization 0.90
# --max-num-batched-tokens $((ISL * 2))`; B200 on v0.17.0 `--gpu-memory-utilization 0.95`; H200 0.95; H100 0.90 with
# `--max-num-seqs 256`. The other flags (block size 32, no prefix caching, stream interval 20) change no modelled figure.
_MINIMAX_BLACKWELL_FROM = (0, 19, 0)


def _recipe(case: BenchmarkCase) -> _Recipe | None:
    """The engine flags the row's harness launched its server with, where its script is known (else the defaults)."""
    if case.harness is not INFERENCEX or case.backend != "vllm" or case.model_path != _MINIMAX_M25:
        return None
    if case.system in ("b200_sxm", "b300_sxm"):
        if case.engine_release.startswith("nightly") or release_key(case.engine_release) >= _MINIMAX_BLACKWELL_FROM:
            return _Recipe(kv_dtype=KvDtype.FP8, memory_fraction=0.90, budget_per_isl=2.0)
        return _Recipe(memory_fraction=0.95) if case.engine_release else None
    if case.system == "h200_sxm":
        return _Recipe(memory_fraction=0.95)
    if case.system == "h100_sxm":
        return _Recipe(memory_fraction=0.90, max_num_seqs=256)
    return None


# SGLang releases whose fixed-length closed-loop rows run in lockstep (closed_loop._lockstep): every client sent
# together, prompts prefilled batch after batch, all decoding together. Read off the 78 SGLang 0.5.1.post1 rows of
# silicon_qwen3_32b.csv (TTFT 2–5× the steady state, TPOT the pure decode step: the issue's "TTFT −72 %, TPOT +44 %,
# end-to-end +12 %"); the fixed-length rows of 0.5.6.post2 and 0.5.8.post1 from the same sweep do not show it (Llama-3.1-8B at
# 80–512 clients reaches a first token in 0.4–3 s, not the 2–8 s a lockstep wave takes), so the harness or the
# scheduler changed between them. Identified on the rows it is scored on: the figures say so (benchmarks/README).
SGLANG_LOCKSTEP_BEFORE = (0, 5, 2)


def lockstep_closed_loop(case: BenchmarkCase) -> bool:
    """Whether the row's clients stay in lockstep: fixed lengths on an SGLang release before SGLANG_LOCKSTEP_BEFORE."""
    rel = release_key(case.engine_release)
    return case.backend == "sglang" and case.harness.length_floor >= 1.0 and bool(rel) and rel < SGLANG_LOCKSTEP_BEFORE


def without_harness(cases: Sequence[BenchmarkCase]) -> list[BenchmarkCase]:
    """The cases as if no data source named its harness (fixed lengths, the fitted requests per client, engine
    defaults): the figures the model gives without the benchmark-harness knowledge."""
    return [dataclasses.replace(c, harness=UNSTATED) for c in cases]


def harness_of(data_source: str) -> Harness:
    """The harness a `silicon_data_source` string names; rows from other sweeps ran fixed lengths (SOURCES.md)."""
    return INFERENCEX if _INFERENCEX_SOURCE.match(data_source.strip()) else UNSTATED


class Skip(Exception):
    """A row that cannot be predicted; `kind` groups the reasons in the summary."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Topology:
    """One worker kind: `workers` engines of tp × dp × pp GPUs; experts over moe_tp × moe_ep = tp × dp."""

    tp: int
    pp: int
    dp: int
    moe_ep: int
    workers: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.workers

    @property
    def label(self) -> str:
        s = f"{self.workers}x" if self.workers > 1 else ""
        s += f"TP{self.tp}"
        s += f"PP{self.pp}" if self.pp > 1 else ""
        s += f"DP{self.dp}" if self.dp > 1 else ""
        return s + (f"EP{self.moe_ep}" if self.moe_ep > 1 else "")


@dataclass(frozen=True, slots=True)
class BenchmarkCase:
    row_id: str
    backend: str
    mode: str  # agg | disagg
    system: str
    model_path: str
    isl: int
    osl: int
    concurrency: int
    precision: Precision
    moe_precision: Precision
    agg: Topology | None
    prefill: Topology | None
    decode: Topology | None
    ttft_ms: float
    tpot_ms: float
    harness: Harness = UNSTATED
    # The engine release that ran the row, as the schema's `backend_version` records it ("" when not recorded).
    # planner.fidelity.scores ranks topologies within one release (a sweep that ran one topology on an older release and
    # another on a newer one measures the releases as much as the topologies); `lockstep_closed_loop` reads it.
    engine_release: str = ""

    @property
    def gpus(self) -> int:
        if self.agg is not None:
            return self.agg.gpus
        assert self.prefill is not None and self.decode is not None
        return self.prefill.gpus + self.decode.gpus

    @property
    def topology_label(self) -> str:
        if self.agg is not None:
            return self.agg.label
        assert self.prefill is not None and self.decode is not None
        return f"P[{self.prefill.label}] D[{self.decode.label}]"


def _int(row: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is None:
            raise Skip("missing topology", f"{key} is empty")
        return default
    try:
        return int(float(raw))
    except ValueError:
        raise Skip("bad value", f"{key}={raw!r} is not a number") from None


def _topology(row: Mapping[str, str], prefix: str, *, workers: bool) -> Topology:
    tp = _int(row, f"{prefix}tp_size")
    pp = _int(row, f"{prefix}pp_size", 1)
    moe_tp = _int(row, f"{prefix}moe_tp_size", 0)
    moe_ep = _int(row, f"{prefix}moe_ep_size", 0)
    dp_raw = (row.get(f"{prefix}attention_dp_size") or "").strip()
    # When attention DP is blank, moe_tp × moe_ep = tp × dp gives it back (vLLM -dp on MoE models).
    dp = _int(row, f"{prefix}attention_dp_size") if dp_raw else max(1, (max(moe_tp, 1) * max(moe_ep, 1)) // max(tp, 1))
    if min(tp, pp, dp) < 1:
        raise Skip("missing topology", f"{prefix}tp/pp/dp must be ≥ 1")
    if moe_tp > 1 and moe_ep == moe_tp and tp == moe_tp * moe_ep and dp == 1:
        # SGLang rows that record `--tp N --ep N` as tp = N × N (their figures equal the tp = N, ep = N rows'):
        # the engine ran N GPUs with experts expert-parallel over them.
        tp, moe_tp = moe_ep, 1
    if dp > 1 and dp == tp and moe_tp <= 1 and moe_ep == tp * dp:
        # Attention DP over all of tp's GPUs, exported in the launch's own terms: InferenceX's `tp: N, ep: N, dp-attn: true`
        # runs vLLM as `--tensor-parallel-size 1 --data-parallel-size N --enable-expert-parallel` (SemiAnalysisAI/InferenceX
        # benchmarks/single_node/*.sh, `DP_ATTENTION`), as SGLang's `--tp N --dp N --enable-dp-attention` is N GPUs with
        # attention TP N / N = 1. The export wrote tp N, attention DP N and EP N × N, which read literally is N × N GPUs.
        # The figures side with N: MiniMax-M2.5's TP4 · DP4 · EP16 rows measure within 2 % of TP4·EP4 on 4 GPUs in most
        # groups, and its TP2 · DP2 · EP4 rows within 3 % of TP2·EP2 on 2 GPUs, where 16 (or 4) GPUs would be far faster.
        # So such a row is N GPUs: attention DP N at attention TP 1, experts expert-parallel over the N.
        tp, moe_ep = 1, dp
    if workers and not (row.get(f"{prefix}num_workers") or "").strip():
        # Lossy disagg exports drop the worker counts and put each worker's GPUs in tp_size; predicting them with an
        # assumed worker count would complete the row's inputs by guess (fill_from_twins restores those it can).
        raise Skip("worker counts not recorded", f"{prefix}num_workers is empty (a lossy export of a disaggregated row)")
    return Topology(tp=tp, pp=pp, dp=dp, moe_ep=max(moe_ep, 1), workers=_int(row, f"{prefix}num_workers") if workers else 1)


def _precision(row: Mapping[str, str], key: str) -> Precision:
    raw = (row.get(key) or row.get("precision") or "").strip().lower()
    if raw not in _QUANT:
        raise Skip("unsupported precision", raw)
    return _QUANT[raw]


def parse_row(row: Mapping[str, str]) -> BenchmarkCase:
    """One CSV row (str values) as a case; raises Skip with the reason kind for unusable rows."""
    backend = (row.get("backend") or "").strip().lower()
    if backend not in BACKENDS:
        # Each engine's defaults, token budget and admission reserve are its own; a row of another engine (or none)
        # would be predicted with guessed ones.
        raise Skip("unsupported backend", f"backend {backend[:40]!r}: allowed {', '.join(BACKENDS)}")
    mode = (row.get("mode") or "agg").strip().lower()
    if mode not in ("agg", "disagg"):
        raise Skip("unsupported mode", mode)
    m = _CONCURRENCY.search(row.get("silicon_data_source") or "")
    if m:
        concurrency = int(m.group(1))
    elif (row.get("batch_size") or "").strip():
        concurrency = _int(row, "batch_size")
    elif mode == "disagg":
        concurrency = _int(row, "decode_batch_size") * _int(row, "decode_num_workers", 1)
    else:
        raise Skip("missing concurrency", "no silicon_concurrency and no batch_size")
    try:
        ttft, tpot = float(row.get("silicon_ttft_ms") or "nan"), float(row.get("silicon_tpot_ms") or "nan")
    except ValueError:
        raise Skip("bad measurement", "TTFT/TPOT not numbers") from None
    if not (math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0):
        raise Skip("bad measurement", "TTFT/TPOT missing or non-positive")
    agg = _topology(row, "", workers=False) if mode == "agg" else None
    pre = _topology(row, "prefill_", workers=True) if mode == "disagg" else None
    dec = _topology(row, "decode_", workers=True) if mode == "disagg" else None
    return BenchmarkCase(
        row_id=str(row.get("id", "")), backend=backend, mode=mode, system=(row.get("system") or "").strip(),
        model_path=(row.get("model_path") or "").strip(), isl=_int(row, "isl"), osl=_int(row, "osl"),
        concurrency=max(concurrency, 1), precision=_precision(row, "gemm_quant_mode"), moe_precision=_precision(row, "moe_quant_mode"),
        agg=agg, prefill=pre, decode=dec, ttft_ms=ttft, tpot_ms=tpot, harness=harness_of(row.get("silicon_data_source") or ""),
        engine_release=(row.get("backend_version") or "").strip(),
    )


_ROLE_KEYS = tuple(f"{role}_{k}" for role in ("prefill", "decode")
                   for k in ("num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"))


_MEASURED_ON = re.compile(r"measured=(\d{4}-\d{2}-\d{2})")
_TWIN_FIELDS = ("backend", "system", "isl", "osl", "gemm_quant_mode", "moe_quant_mode")


def _count(r: Mapping[str, str], key: str) -> int:
    raw = (r.get(key) or "").strip()
    try:
        return int(float(raw)) if raw else 1
    except ValueError:
        return 0


def fill_from_twins(rows: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """Complete disagg rows whose worker counts are blank from the one complete row that ran the same inputs.

    Some exported rows are lossy copies of another export's row (the same benchmark run) that kept the full
    topology; the copy recorded each worker's GPU count as its tp and dropped the worker counts. A twin is
    found from inputs only, never from measured outcomes: same backend, system, lengths, quantisation,
    concurrency, measurement date and engine image, and per role a worker of tp × pp × attention-DP GPUs equal
    to the copy's tp × pp. A copy is completed only when exactly one topology fits; otherwise it is left as
    recorded.
    """
    def key(r: Mapping[str, str]) -> tuple[str, ...] | None:
        source = r.get("silicon_data_source") or ""
        conc, day = _CONCURRENCY.search(source), _MEASURED_ON.search(source)
        if r.get("mode") != "disagg" or conc is None or day is None:
            return None
        image = source.rsplit(";", 1)[-1].strip().removeprefix("image=")
        return (*(str(r.get(f, "")).strip().lower() for f in _TWIN_FIELDS), conc.group(1), day.group(1), image)

    def complete(r: Mapping[str, str]) -> bool:
        return bool((r.get("prefill_num_workers") or "").strip() and (r.get("decode_num_workers") or "").strip())

    def worker_gpus(r: Mapping[str, str], *, lossy: bool) -> tuple[int, ...]:
        dp = ("",) if lossy else ("attention_dp_size",)
        return tuple(_count(r, f"{role}_tp_size") * _count(r, f"{role}_pp_size") * (_count(r, f"{role}_{dp[0]}") if dp[0] else 1)
                     for role in ("prefill", "decode"))

    full: dict[tuple[str, ...], list[Mapping[str, str]]] = {}
    for r in rows:
        k = key(r)
        if k is not None and complete(r):
            full.setdefault(k, []).append(r)
    out: list[dict[str, str]] = []
    for r in rows:
        k = key(r)
        twin = None
        if k is not None and not complete(r):
            fits = [t for t in full.get(k, []) if worker_gpus(t, lossy=False) == worker_gpus(r, lossy=True)]
            topologies = {tuple(t.get(f, "") for f in _ROLE_KEYS) for t in fits}
            twin = fits[0] if len(topologies) == 1 else None
        out.append({**r, **{f: twin.get(f, "") for f in _ROLE_KEYS}} if twin is not None else dict(r))
    return out


EXPORT_QUIRK = "export quirk: layout columns contradicted by its figures"
_SWEEP_FIELDS = ("model_path", "system", "backend", "backend_version", "precision", "isl", "osl", "gemm_quant_mode", "moe_quant_mode",
                 "mode")


def _gpus_recorded(r: Mapping[str, str]) -> int:
    """GPUs an aggregated row's layout columns imply (tp × pp × attention DP); 0 for other rows."""
    if (r.get("mode") or "").strip() != "agg":
        return 0
    return _count(r, "tp_size") * _count(r, "pp_size") * _count(r, "attention_dp_size")


def export_quirks(rows: Sequence[Mapping[str, str]]) -> set[int]:
    """Indices of rows whose layout columns claim a GPU count the benchmark did not run (issue #24).

    An export that wrote tp × ep into `tp_size` (DeepSeek-R1 on B200, SGLang 0.5.9: TP8·EP8 also appears as tp_size 64,
    TP4·EP4 as 16) leaves two rows of one sweep, one concurrency and different layouts with the very same measured TTFT and
    TPOT: one run, exported twice. Two runs of different layouts never agree to the last digit, so such a pair marks the
    copy; the row claiming more GPUs, when its tp_size is the other's tp × ep, is the one whose layout did not run. This
    reads measured figures only to refuse a row, never to fill one.
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, r in enumerate(rows):
        conc = _CONCURRENCY.search(r.get("silicon_data_source") or "")
        figures = ((r.get("silicon_ttft_ms") or "").strip(), (r.get("silicon_tpot_ms") or "").strip())
        if not all(figures) or _gpus_recorded(r) == 0:
            continue
        key = (*(str(r.get(f, "")).strip().lower() for f in _SWEEP_FIELDS), conc.group(1) if conc else "", *figures)
        groups.setdefault(key, []).append(i)
    quirks: set[int] = set()
    for idx in groups.values():
        for i in idx:
            for j in idx:
                ri, rj = rows[i], rows[j]
                if _gpus_recorded(ri) > _gpus_recorded(rj) and _count(ri, "tp_size") == _count(rj, "tp_size") * _count(rj, "moe_ep_size") > 0:
                    quirks.add(i)
    return quirks


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float
    throughput_rps: float


@dataclass(frozen=True, slots=True)
class _EngineDefaults:
    engine: Engine
    mixed: bool
    kv_dtype: KvDtype
    memory_fraction: float
    max_running: int
    overhead_scale: float | None
    ttft_overhead_s: float
    ttft_s_per_input_token: float


def _defaults(backend: str, p: PerfParams) -> _EngineDefaults:
    """Engine defaults the benchmarks ran with (shared/reference/engines.md sections 1.1 and 2.1). vLLM's max_running and
    memory fraction here are placeholders: `_group` takes them from planner.engines.defaults for the row's GPU and release."""
    if backend == "sglang":
        return _EngineDefaults(Engine.SGLANG, False, KvDtype.AUTO, 0.85, 2048, None, p.sglang_ttft_overhead_s,
                               p.sglang_ttft_s_per_input_token)
    if backend == "trtllm":  # in-flight batching mixes context and generation; FP8 KV in the recipes
        return _EngineDefaults(Engine.VLLM, True, KvDtype.FP8, 0.9, 2048, p.trtllm_overhead_scale, p.trtllm_ttft_overhead_s,
                               p.ttft_s_per_input_token)
    return _EngineDefaults(Engine.VLLM, True, KvDtype.AUTO, 0.9, 1024, None, p.ttft_overhead_s, p.ttft_s_per_input_token)


def _requests_per_client(case: BenchmarkCase, p: PerfParams) -> float:
    """Benchmark length of the harness that measured the row (else the parameter file's)."""
    if case.harness.requests_per_client is not None:
        return case.harness.requests_per_client
    return p.bench_requests_per_client


def _token_budget(backend: str, gpu: Gpu, dp: Any, release: str) -> Any:
    """The engine's default at the row's release (a row that records none: the newest rule)."""
    return token_budget(Engine.SGLANG if backend == "sglang" else Engine.VLLM, gpu, dp, release=release)


def _output_reserve(backend: str) -> float | None:
    """Share of its future outputs a request's admission reserves in the KV pool (closed_loop.aggregated
    `output_reserve`): vLLM none (the prompt's blocks only); SGLang the new-token ratio its scheduler settles at between
    retractions (planner/sim/sglang.py, decayed to MIN_NEW_TOKEN_RATIO over 600 steps); TensorRT-LLM's default
    guaranteed-no-evict capacity scheduler the whole sequence (None: the clients over the cap queue before their first
    token)."""
    if backend == "vllm":
        return 0.0
    if backend == "sglang":
        return MIN_NEW_TOKEN_RATIO
    return None


def _arr(cases: Sequence[BenchmarkCase], fn: Any) -> Any:
    return np.array([fn(c) for c in cases], dtype=float)


def _rank_cap(model: ModelArch, gpu: Gpu, d: _EngineDefaults, prec: Precision, budget: Any, topo: Sequence[Topology],
              ctx_tokens: Any, release: str = "") -> Any:
    """Requests one rank can run: max sequences, or KV pool over the mean context (no cap when the pool is unknown)."""
    tp, pp, dp = (np.array([getattr(t, k) for t in topo], dtype=float) for k in ("tp", "pp", "dp"))
    fraction = sglang_mem_fraction(gpu, release, tp, pp, dp) if d.engine is Engine.SGLANG and d.overhead_scale is None else d.memory_fraction
    pool = kv_pool_bytes(model, gpu, engine=d.engine, precision=prec, tp=tp, pp=pp, dp=dp, max_num_batched_tokens=budget,
                         max_num_seqs=d.max_running, memory_fraction=fraction)
    per_tok = kv_bytes_per_token(model, d.kv_dtype, tp=tp, pp=pp)
    per_seq = per_tok * ctx_tokens + fixed_bytes_per_seq(model, d.kv_dtype, tp=tp, pp=pp, engine=d.engine)  # + window KV and fixed state
    seqs = np.where(pool > 0, pool / np.maximum(per_seq, 1e-9), np.inf)
    return np.minimum(np.maximum(seqs, 1.0), d.max_running)


def _topo_arrays(topo: Sequence[Topology]) -> tuple[Any, Any, Any, Any]:
    return tuple(np.array([getattr(t, k) for t in topo], dtype=float) for k in ("tp", "pp", "dp", "moe_ep"))  # type: ignore[return-value]


def _geometry(model: ModelArch, gpu: Gpu, case: BenchmarkCase, d: _EngineDefaults, topo: Sequence[Topology],
              switches: tuple[bool, bool, bool, bool, bool]) -> StepGeometry:
    """What `step_coefficients` folds for these topologies that no fitted parameter changes (`switches`: measured
    all-reduce, exchange, MoE, dense GEMM and decode-attention tables)."""
    tp, pp, dp, ep = _topo_arrays(topo)
    return step_geometry(model, gpu, precision=case.precision, kv_dtype=d.kv_dtype, engine=d.engine, tp=tp, pp=pp, dp=dp, moe_ep=ep,
                         moe_precision=case.moe_precision, release=case.engine_release or None,
                         tables_for=d.engine if d.overhead_scale is None else None, table_allreduce=switches[0],
                         table_exchange=switches[1], table_moe=switches[2], release_recorded=bool(case.engine_release),
                         table_gemm=switches[3], table_decode_attention=switches[4])


def _stepper(coeffs: StepCoefficients) -> Any:
    def step(*, prefill_tokens: Any, prefill_pairs: Any, decode_tokens: Any, decode_context_tokens: Any, moe_tokens: Any = None) -> Any:
        return evaluate_step_s(coeffs, prefill_tokens=prefill_tokens, prefill_pairs=prefill_pairs, decode_tokens=decode_tokens,
                               decode_context_tokens=decode_context_tokens, moe_tokens=moe_tokens)
    return step


@dataclass(frozen=True)
class _Group:
    """Rows that share model, GPU, precisions, backend, mode and engine release (`idx`: their positions in the cases), with
    what no parameter changes: lengths, clients, topologies, token budgets and rank caps."""

    idx: np.ndarray
    model: ModelArch
    gpu: Gpu
    first: BenchmarkCase
    defaults: _EngineDefaults  # the parameter-free fields only (engine, kv dtype, memory fraction, caps)
    isl: Any
    osl: Any
    conc: Any
    harness_per_client: Any  # NaN: the parameter file's bench_requests_per_client
    topo: tuple[Topology, ...]
    budget: Any
    max_running: Any
    recv: Any = None
    lockstep: Any = None
    decode: tuple[Topology, ...] = ()
    prefill_ranks: Any = None
    decode_ranks: Any = None
    same_node: bool = True


def _launch_defaults(case: BenchmarkCase, gpu: Gpu) -> _EngineDefaults:
    """The parameter-free engine flags a row's server ran with: the engine's defaults on the GPU at the row's release, then
    its harness's launch script (`_recipe`)."""
    d = _defaults(case.backend, PerfParams())
    if case.backend == "vllm":   # vLLM's own defaults on this GPU at the row's release: the one home, not a restatement
        d = dataclasses.replace(d, max_running=max_running(Engine.VLLM, gpu, release=case.engine_release),
                                memory_fraction=memory_fraction(Engine.VLLM, gpu))
    recipe = _recipe(case)
    if recipe is not None:
        d = dataclasses.replace(d, kv_dtype=recipe.kv_dtype or d.kv_dtype, memory_fraction=recipe.memory_fraction or d.memory_fraction,
                                max_running=recipe.max_num_seqs or d.max_running)
    return d


def simulator_knobs(case: BenchmarkCase, gpu: Gpu) -> EngineKnobs:
    """An aggregated vLLM row's server flags as the simulator's knobs: the sequence cap, memory fraction and KV dtype
    `_group` prices (`_launch_defaults`), the token budget of the row's release or its launch script, prefix caching off
    (the harnesses draw random prompts)."""
    if case.backend != "vllm" or case.agg is None:
        raise ValueError(f"{case.row_id}: only an aggregated vLLM row has simulator knobs here")
    d = _launch_defaults(case, gpu)
    recipe = _recipe(case)
    budget = recipe.budget_per_isl * case.isl if recipe is not None and recipe.budget_per_isl is not None else \
        float(np.asarray(_token_budget(case.backend, gpu, float(case.agg.dp), case.engine_release)).reshape(-1)[0])
    return EngineKnobs(max_num_seqs=int(d.max_running), max_num_batched_tokens=int(budget), memory_fraction=d.memory_fraction,
                       kv_dtype=d.kv_dtype, enable_prefix_caching=False)


def _group(idx: Sequence[int], cases: Sequence[BenchmarkCase], model: ModelArch, gpu: Gpu) -> _Group:
    sub = [cases[i] for i in idx]
    first = sub[0]
    d = _launch_defaults(first, gpu)  # one per group: prepare_cases keys the groups by the launch script (`_recipe`)
    recipe = _recipe(first)
    # Mean lengths the harness drew (the labelled ones where it ran fixed lengths).
    isl, osl = _arr(sub, lambda c: c.harness.mean_length(c.isl)), _arr(sub, lambda c: c.harness.mean_length(c.osl))
    conc = _arr(sub, lambda c: c.concurrency)
    per_client = _arr(sub, lambda c: math.nan if c.harness.requests_per_client is None else c.harness.requests_per_client)
    ctx = isl + 0.5 * osl
    common = {"idx": np.asarray(idx, dtype=np.int64), "model": model, "gpu": gpu, "first": first, "defaults": d, "isl": isl, "osl": osl,
              "conc": conc, "harness_per_client": per_client}
    if first.mode == "agg":
        topo = tuple(c.agg for c in sub if c.agg is not None)
        dp = np.array([t.dp for t in topo], dtype=float)
        budget = _token_budget(first.backend, gpu, dp, first.engine_release)
        if recipe is not None and recipe.budget_per_isl is not None:
            budget = recipe.budget_per_isl * _arr(sub, lambda c: c.isl)
        return _Group(**common, topo=topo, budget=budget, max_running=_rank_cap(model, gpu, d, first.precision, budget, topo, ctx, first.engine_release),
                      recv=_arr(sub, _recv_interval), lockstep=np.array([lockstep_closed_loop(c) for c in sub], dtype=bool))
    pre = tuple(c.prefill for c in sub if c.prefill is not None)
    dec = tuple(c.decode for c in sub if c.decode is not None)
    pdp = np.array([t.dp for t in pre], dtype=float)
    ddp = np.array([t.dp for t in dec], dtype=float)
    gpus = np.array([c.gpus for c in sub], dtype=float)
    dbudget = _token_budget(first.backend, gpu, ddp, first.engine_release)
    return _Group(**common, topo=pre, budget=_token_budget(first.backend, gpu, pdp, first.engine_release),
                  max_running=_rank_cap(model, gpu, d, first.precision, dbudget, dec, ctx, first.engine_release), decode=dec,
                  prefill_ranks=pdp * np.array([t.workers for t in pre], dtype=float),
                  decode_ranks=ddp * np.array([t.workers for t in dec], dtype=float), same_node=bool(np.all(gpus <= gpu.gpus_per_node)))


@dataclass(frozen=True)
class _Part:
    """The rows of one mode (aggregated or disaggregated) over all their groups, concatenated: the parameter-free inputs
    of one closed-loop pass, a row per element."""

    groups: list[_Group]
    idx: np.ndarray
    backend: np.ndarray  # index into BACKENDS
    isl: Any
    osl: Any
    conc: Any
    harness_per_client: Any
    budget: Any
    max_running: Any
    dp: Any = None
    mixed: Any = None
    recv: Any = None
    lockstep: Any = None
    reserve: Any = None
    dp_lockstep: Any = None
    prefill_ranks: Any = None
    decode_ranks: Any = None


def _part(groups: list[_Group]) -> _Part:
    def cat(fn: Any) -> Any:
        return np.concatenate([np.broadcast_to(np.asarray(fn(g)), (len(g.idx),)) for g in groups])
    common = {"groups": groups, "idx": cat(lambda g: g.idx), "backend": cat(lambda g: BACKENDS.index(g.first.backend)),
              "isl": cat(lambda g: g.isl), "osl": cat(lambda g: g.osl), "conc": cat(lambda g: g.conc),
              "harness_per_client": cat(lambda g: g.harness_per_client), "budget": cat(lambda g: g.budget),
              "max_running": cat(lambda g: g.max_running)}
    if groups[0].first.mode == "agg":
        dps = [np.array([t.dp for t in g.topo], dtype=float) for g in groups]
        return _Part(**common, dp=np.concatenate(dps), mixed=cat(lambda g: g.defaults.mixed), recv=cat(lambda g: g.recv),
                     lockstep=cat(lambda g: g.lockstep),
                     reserve=cat(lambda g: np.nan if (r := _output_reserve(g.first.backend)) is None else r),
                     dp_lockstep=np.concatenate([np.broadcast_to(bool(np.any(d > 1)), d.shape) for d in dps]))
    return _Part(**common, prefill_ranks=cat(lambda g: g.prefill_ranks), decode_ranks=cat(lambda g: g.decode_ranks))


@dataclass
class PreparedCases:
    """`predict_all`'s rows with everything no parameter changes done once (the skips, the groups, their geometry), so a
    fit can price them under many parameter sets: all aggregated rows in one vectorised closed-loop pass, all
    disaggregated rows in another, each row's figures the floats its group alone would get (every step is elementwise)."""

    n: int
    skips: dict[int, Skip]
    groups: list[_Group]
    _parts: list[_Part] = dataclasses.field(default_factory=list)
    # (aggregated or prefill, decode) geometry of each part under the measured-table switches (all-reduce, exchange, MoE, GEMM,
    # decode attention)
    _geometry: dict[tuple[bool, bool, bool, bool, bool], list[tuple[StepGeometry, StepGeometry | None]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for mode in ("agg", "disagg"):
            gs = [g for g in self.groups if (g.first.mode == "agg") == (mode == "agg")]
            if gs:
                self._parts.append(_part(gs))

    def _geometries(self, p: PerfParams) -> list[tuple[StepGeometry, StepGeometry | None]]:
        key = (p.measured_allreduce >= 0.5, p.measured_exchange >= 0.5, p.measured_moe >= 0.5, p.measured_gemm >= 0.5,
               p.measured_decode_attention >= 0.5)
        if key not in self._geometry:
            def geo(gs: list[_Group], decode: bool) -> StepGeometry:
                return concat_geometry([(_geometry(g.model, g.gpu, g.first, g.defaults, g.decode if decode else g.topo, key), len(g.idx))
                                        for g in gs])
            self._geometry[key] = [(geo(part.groups, False), None if part.dp is not None else geo(part.groups, True)) for part in self._parts]
        return self._geometry[key]

    def figures(self, params: PerfParams | None = None) -> tuple[Any, Any, Any]:
        """Mean TTFT (ms), TPOT (ms) and requests/s of every row (NaN for the skipped ones), in the cases' order."""
        p = params or perf_params()
        out = np.full((3, self.n), np.nan)
        engines = [_defaults(b, p) for b in BACKENDS]
        ttft_fixed = np.array([e.ttft_overhead_s for e in engines])
        ttft_tok = np.array([e.ttft_s_per_input_token for e in engines])
        overheads = np.array([np.nan if e.overhead_scale is None else e.overhead_scale for e in engines])
        for part, (geometry, decode) in zip(self._parts, self._geometries(p), strict=True):
            per_client = np.where(np.isnan(part.harness_per_client), p.bench_requests_per_client, part.harness_per_client)
            overhead = overheads[part.backend]
            if decode is None:
                res = aggregated(_stepper(fold_coefficients(geometry, p, overhead)), clients_per_rank=part.conc / part.dp, isl=part.isl,
                                 osl=part.osl, token_budget=part.budget, max_running=part.max_running, mixed_batches=part.mixed,
                                 ranks=part.dp, ttft_overhead_s=ttft_fixed[part.backend] + ttft_tok[part.backend] * part.isl,
                                 requests_per_client=per_client, recv_interval=part.recv, lockstep=part.lockstep,
                                 output_reserve=part.reserve, dp_lockstep=part.dp_lockstep, params=p)
            else:
                transfer = np.concatenate([np.broadcast_to(kv_transfer_s(g.model, g.gpu, kv_dtype=g.defaults.kv_dtype, tokens=g.isl,
                                                                         same_node=g.same_node, params=p), g.isl.shape) for g in part.groups])
                res = disaggregated(_stepper(fold_coefficients(geometry, p, overhead)), _stepper(fold_coefficients(decode, p, overhead)),
                                    clients=part.conc, prefill_ranks=part.prefill_ranks, decode_ranks=part.decode_ranks, isl=part.isl,
                                    osl=part.osl, prefill_budget=part.budget, decode_max_running=part.max_running, transfer_s=transfer,
                                    ttft_overhead_s=ttft_fixed[part.backend] + p.disagg_ttft_overhead_s + ttft_tok[part.backend] * part.isl,
                                    requests_per_client=per_client, params=p)
            for row, v in enumerate((res.ttft_s, res.tpot_s, res.throughput_rps)):
                out[row, part.idx] = np.broadcast_to(np.asarray(v, dtype=float), part.isl.shape)
        return out[0] * 1e3, out[1] * 1e3, out[2]

    def predictions(self, params: PerfParams | None = None) -> list[Prediction | Skip]:
        """`figures` as predict_all gives them: a Skip where a row was skipped or its figures are not finite and positive."""
        ttft, tpot, x = self.figures(params)
        out: list[Prediction | Skip] = []
        for i in range(self.n):
            skip = self.skips.get(i)
            if skip is not None:
                out.append(skip)
                continue
            a, b = float(ttft[i]), float(tpot[i])
            ok = math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0
            out.append(Prediction(ttft_ms=a, tpot_ms=b, throughput_rps=float(x[i])) if ok else Skip("no steady state", "the estimator found no finite figures"))
        return out


def predict_cases(cases: Sequence[BenchmarkCase], model: ModelArch, gpu: Gpu, *, params: PerfParams | None = None) -> list[Prediction]:
    """Predict cases that share model, GPU, precisions, backend, mode, engine release and launch script (one vectorised
    pass)."""
    if not cases:
        return []
    if len({_recipe(c) for c in cases}) > 1:
        raise ValueError("cases launched with different engine flags (benchmark_cases._recipe) are predicted in separate passes")
    prepared = PreparedCases(len(cases), {}, [_group(range(len(cases)), cases, model, gpu)])
    ttft, tpot, x = prepared.figures(params)
    return [Prediction(ttft_ms=float(a), tpot_ms=float(b), throughput_rps=float(r)) for a, b, r in zip(ttft, tpot, x, strict=True)]


def _tp_not_dividing_heads(model: ModelArch, case: BenchmarkCase) -> int | None:
    """A recorded TP degree no engine could have run (vLLM, SGLang and TensorRT-LLM all require it to divide the
    attention heads), or None. Such rows are lossy exports that put a role's total GPU count in tp_size."""
    for t in (case.agg, case.prefill, case.decode):
        if t is not None and model.num_heads % t.tp != 0:
            return t.tp
    return None


def _fits(model: ModelArch, gpu: Gpu, case: BenchmarkCase) -> bool:
    """Whether one GPU of every worker kind can hold its share of the weights."""
    topos = [t for t in (case.agg, case.prefill, case.decode) if t is not None]
    prec = case.moe_precision if model.is_moe else case.precision
    return all(float(weight_bytes_per_gpu(model, prec, tp=t.tp, pp=t.pp, dp=t.dp)) < gpu.memory_bytes for t in topos)


def prepare_cases(cases: Sequence[BenchmarkCase], models: Mapping[str, ModelArch | Skip], gpus: Mapping[str, Gpu | Skip]) -> PreparedCases:
    """`predict_all`'s parameter-free work: each case's Skip (its model or GPU did not resolve, its recorded TP cannot have
    run, its weights do not fit) or its group."""
    skips: dict[int, Skip] = {}
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, c in enumerate(cases):
        model, gpu = models.get(c.model_path), gpus.get(c.system)
        if isinstance(model, Skip) or model is None:
            skips[i] = model if isinstance(model, Skip) else Skip("unknown model", c.model_path)
            continue
        if isinstance(gpu, Skip) or gpu is None:
            skips[i] = gpu if isinstance(gpu, Skip) else Skip("unknown GPU", c.system)
            continue
        odd = _tp_not_dividing_heads(model, c)
        if odd is not None:
            skips[i] = Skip("recorded TP does not divide the attention heads", f"{c.topology_label}: TP{odd} over {model.num_heads} heads")
            continue
        if not _fits(model, gpu, c):
            skips[i] = Skip("weights do not fit the recorded topology", f"{c.topology_label} on {c.system}")
            continue
        groups.setdefault((c.model_path, c.system, c.precision, c.moe_precision, c.backend, c.mode, c.engine_release, _recipe(c)), []).append(i)
    out = []
    for key, idx in groups.items():
        model, gpu = models[key[0]], gpus[key[1]]
        assert isinstance(model, ModelArch) and isinstance(gpu, Gpu)
        out.append(_group(idx, cases, model, gpu))
    return PreparedCases(len(cases), skips, out)


def predict_all(cases: Sequence[BenchmarkCase], models: Mapping[str, ModelArch | Skip], gpus: Mapping[str, Gpu | Skip], *,
                params: PerfParams | None = None) -> list[Prediction | Skip]:
    """Predict every case, in order; a case whose model or GPU did not resolve gets that Skip."""
    return prepare_cases(cases, models, gpus).predictions(params)


def predict_held_out(cases: Sequence[BenchmarkCase], models: Mapping[str, ModelArch | Skip], gpus: Mapping[str, Gpu | Skip],
                     folds: Sequence[Mapping[str, Any]], base: PerfParams) -> tuple[list[Prediction | Skip], list[str]]:
    """Every row predicted by parameters that never saw its model family, and which parameters those were.

    `folds`: the leave-one-model-out folds benchmarks/fit_perf.py recorded ({"models": [...], "params": {...}}), each
    fitted without the families' rows it lists; a row of such a model is predicted with that fold's parameters over
    `base`. A fit records a fold for every family it saw, so a row whose model is in no fold was never fitted on and
    `base` (the shipped fit) is already held out for it.
    """
    results: list[Prediction | Skip] = [Skip("internal", "not predicted")] * len(cases)
    used = ["shipped parameters (the fit never saw this model)"] * len(cases)
    covered: set[str] = set()
    for fold in folds:
        names = set(fold["models"])
        idx = [i for i, c in enumerate(cases) if c.model_path in names]
        if not idx:
            continue
        covered |= names
        values: dict[str, Any] = {str(k): float(v) for k, v in fold["params"].items()}
        params = dataclasses.replace(base, **values)
        for i, pred in zip(idx, predict_all([cases[i] for i in idx], models, gpus, params=params), strict=True):
            results[i] = pred
            used[i] = "fold without " + ", ".join(sorted(names))
    rest = [i for i, c in enumerate(cases) if c.model_path not in covered]
    for i, pred in zip(rest, predict_all([cases[i] for i in rest], models, gpus, params=base), strict=True):
        results[i] = pred
    return results, used
