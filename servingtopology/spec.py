"""The planning spec: one pydantic schema for the CLI's YAML and the ServingTopology resource's spec.

Keys are camelCase. `load_spec` parses and validates; `to_problem` converts to the planner's frozen
values (the only place pydantic meets the planner); `to_layout` converts a `layout` block. Errors are
`SpecError` with every bad field named by its dotted path and the allowed values.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from servingtopology.planner.engine_caps import resolve_version
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, LayoutKind, Parallelism, RoleLayout
from servingtopology.planner.model import ModelArch, from_hf_config, resolve_model
from servingtopology.planner.problem import Problem, SearchSpace
from servingtopology.planner.role_knobs import DEFAULT_KNOBS
from servingtopology.planner.workload import LengthDist, LengthKind, Objective, Slo, Workload

__all__ = [
    "DEFAULT_SPEC",
    "PRESETS",
    "LayoutSpec",
    "PlanSpec",
    "SpecError",
    "load_spec",
    "parse_spec",
    "to_layout",
    "to_problem",
    "serving_precision",
    "read_model_config",
]


class SpecError(ValueError):
    """A spec failed validation; `errors` lists (dotted field, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid spec:\n" + "\n".join(f"  {f}: {m}" for f, m in errors))


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class EngineSpec(_Base):
    name: Engine = Engine.VLLM
    version: str | None = Field(default=None, pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?$",
                                description="engine release (0.11.0, or 0.11 for its newest covered patch); default: the image tag's, "
                                "else the newest covered release (planner/data/engine_caps)")
    image: str | None = None
    extraArgs: list[str] = Field(default_factory=list)


class HardwareSpec(_Base):
    gpu: str = Field(description="GPU id from the catalog (h100_sxm, h200_sxm, b200_sxm, a100_sxm, ...) or an alias (H100)")
    gpusPerNode: int | None = Field(default=None, ge=1, le=72)
    maxGPUs: int = Field(ge=1, le=4096, description="GPU budget for the whole deployment")
    nvlinkGBps: float | None = Field(default=None, gt=0, description="override: one-way NVLink GB/s per GPU")
    nicGbps: float | None = Field(default=None, gt=0, description="override: NIC Gb/s per GPU")
    allowCrossNodeTP: bool = False


class DistributionSpec(_Base):
    distribution: LengthKind = LengthKind.FIXED
    mean: float | None = Field(default=None, gt=0)
    sigma: float = Field(default=0.5, ge=0)
    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1)
    values: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _complete(self) -> DistributionSpec:
        k = self.distribution
        if k in (LengthKind.FIXED, LengthKind.LOGNORMAL) and self.mean is None:
            raise ValueError(f"distribution {k.value} needs 'mean'")
        if k is LengthKind.UNIFORM and (self.min is None or self.max is None or self.min > self.max):
            raise ValueError("distribution uniform needs 'min' <= 'max'")
        if k is LengthKind.EMPIRICAL and not self.values:
            raise ValueError("distribution empirical needs a non-empty 'values' list")
        return self


Tokens = Annotated[int, Field(ge=1, le=10_000_000)] | DistributionSpec


class WorkloadSpec(_Base):
    arrivalRate: float | None = Field(default=None, gt=0, description="requests per second (open loop)")
    concurrency: int | None = Field(default=None, ge=1, description="clients (closed loop)")
    inputTokens: Tokens
    outputTokens: Tokens
    prefixShare: float = Field(default=0.0, ge=0.0, le=1.0)
    arrivalCV: float = Field(default=1.0, gt=0.0, le=10.0, description="coefficient of variation of inter-arrival times")

    @model_validator(mode="after")
    def _one_load(self) -> WorkloadSpec:
        if (self.arrivalRate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of 'arrivalRate' (requests/s) or 'concurrency' (clients)")
        return self


_PCT = re.compile(r"^p(\d{1,2}(\.\d+)?)$")


class SloSpec(_Base):
    ttftMs: dict[str, float] = Field(description="one percentile and its bound, e.g. {p95: 200}")
    tpotMs: dict[str, float] = Field(description="one percentile and its bound, e.g. {p95: 35}")

    @field_validator("ttftMs", "tpotMs")
    @classmethod
    def _percentile(cls, v: dict[str, float]) -> dict[str, float]:
        if len(v) != 1:
            raise ValueError("give exactly one percentile, e.g. {p95: 200}")
        (key, bound), = v.items()
        if not _PCT.match(key) or not 0 < float(key[1:]) < 100:
            raise ValueError(f"percentile key {key!r} must look like p50, p90, p95, p99, p99.9")
        if bound <= 0:
            raise ValueError("the bound must be > 0 ms")
        return v


class SearchSpec(_Base):
    preset: Literal["narrow", "default", "wide"] = "default"
    layouts: list[LayoutKind] | None = None
    tp: list[Annotated[int, Field(ge=1, le=64)]] | None = None
    pp: list[Annotated[int, Field(ge=1, le=64)]] | None = None
    dp: list[Annotated[int, Field(ge=1, le=64)]] | None = None
    maxNumSeqs: list[Annotated[int, Field(ge=1)]] | None = None
    maxNumBatchedTokens: list[Annotated[int, Field(ge=16)]] | None = None
    memoryFraction: list[Annotated[float, Field(gt=0.1, le=0.99)]] | None = None
    kvCacheDtypes: list[KvDtype] | None = None
    topK: int = Field(default=8, ge=1, le=256)


class EngineArgsSpec(_Base):
    maxNumSeqs: int | None = Field(default=None, ge=1)
    maxNumBatchedTokens: int | None = Field(default=None, ge=16)
    memoryFraction: float | None = Field(default=None, gt=0.1, le=0.99)
    blockSize: int = Field(default=16, ge=1, le=256)
    enablePrefixCaching: bool = True


class RoleSpec(_Base):
    count: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    engineArgs: EngineArgsSpec | None = None


class LayoutSpec(_Base):
    kind: LayoutKind = LayoutKind.REPLICAS
    replicas: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    ep: bool = False
    prefill: RoleSpec | None = None
    decode: RoleSpec | None = None
    engineArgs: EngineArgsSpec = Field(default_factory=EngineArgsSpec)

    @model_validator(mode="after")
    def _roles(self) -> LayoutSpec:
        if self.kind is LayoutKind.PD and (self.prefill is None or self.decode is None):
            raise ValueError("kind pd needs both 'prefill' and 'decode' ({count, tp, pp})")
        return self


class SimulationSpec(_Base):
    requests: int = Field(default=2000, ge=10, le=1_000_000)
    seed: int = 0
    warmupRequests: int = Field(default=100, ge=0)


class PlanSpec(_Base):
    """The planning spec (also the core of the ServingTopology resource's spec)."""

    model: str | None = Field(default=None, description="catalog id or Hugging Face id")
    modelConfig: str | None = Field(default=None, description="path to a Hugging Face config.json")
    precision: Precision = Precision.BF16
    kvCacheDtype: KvDtype = KvDtype.AUTO
    engine: EngineSpec = Field(default_factory=EngineSpec)
    hardware: HardwareSpec
    workload: WorkloadSpec
    slo: SloSpec
    objective: Objective = Objective.GOODPUT_PER_GPU
    search: SearchSpec = Field(default_factory=SearchSpec)
    layout: LayoutSpec | None = None
    simulation: SimulationSpec = Field(default_factory=SimulationSpec)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _one_model(self) -> PlanSpec:
        if (self.model is None) == (self.modelConfig is None):
            raise ValueError("give exactly one of 'model' (catalog or Hugging Face id) or 'modelConfig' (config.json path)")
        return self


DEFAULT_SPEC: dict[str, Any] = {
    "model": "meta-llama/Llama-2-7b-hf",
    "precision": "bf16",
    "engine": "vllm",
    "hardware": {"gpu": "a100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
    "workload": {"arrivalRate": 32, "inputTokens": 512, "outputTokens": 128},
    "slo": {"ttftMs": {"p95": 200}, "tpotMs": {"p95": 35}},
    "objective": "goodput-per-gpu",
}

# Knob lists per preset: (tp, pp, dp, maxNumSeqs, maxNumBatchedTokens, memoryFraction).
PRESETS: dict[str, dict[str, tuple[Any, ...]]] = {
    "narrow": {"tp": (1, 2, 4, 8), "pp": (1,), "dp": (1,), "mns": (256,), "mnbt": (8192,), "mem": (0.9,)},
    "default": {"tp": (1, 2, 4, 8), "pp": (1, 2), "dp": (1, 2, 4, 8), "mns": (64, 128, 256, 512),
                "mnbt": (2048, 4096, 8192, 16384), "mem": (0.9,)},
    "wide": {"tp": (1, 2, 4, 8, 16), "pp": (1, 2, 4, 8), "dp": (1, 2, 4, 8), "mns": (32, 64, 128, 256, 512, 1024),
             "mnbt": (1024, 2048, 4096, 8192, 16384, 32768), "mem": (0.85, 0.9, 0.95)},
}


def _loc(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p.startswith(("function-", "constrained-")) or p in ("int", "DistributionSpec")))]
    return ".".join(parts) or "spec"


def parse_spec(data: Any) -> PlanSpec:
    """Validate an already-parsed mapping; raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError([("spec", "must be a mapping of fields (model, engine, hardware, workload, slo, ...)")])
    try:
        return PlanSpec.model_validate(data)
    except ValidationError as exc:
        errors: list[tuple[str, str]] = []
        for e in exc.errors():
            if any(str(part).startswith("constrained-") for part in e["loc"]) and isinstance(e.get("input"), dict):
                continue  # the number branch of "number | distribution" when a distribution was given
            msg = str(e["msg"]).removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown field"
            if "input" in e and e["type"] not in ("missing", "extra_forbidden") and not isinstance(e["input"], dict | list):
                msg += f" (got {e['input']!r})"
            errors.append((_loc(tuple(e["loc"])), msg))
        # A union (number | distribution) reports both branches; keep the first per field.
        seen: dict[str, str] = {}
        for f, m in errors:
            seen.setdefault(f, m)
        raise SpecError(list(seen.items())) from None


def load_spec(path: str | Path | None) -> PlanSpec:
    """Read and validate a YAML (or JSON) spec file; None gives the embedded default scenario."""
    if path is None:
        return parse_spec(json.loads(json.dumps(DEFAULT_SPEC)))
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError([("spec", f"cannot read {path}: {exc.strerror}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("spec", f"not valid YAML: {exc}")]) from None
    return parse_spec(data)


def _length(v: int | DistributionSpec) -> LengthDist:
    if isinstance(v, int):
        return LengthDist.fixed(v)
    if v.distribution is LengthKind.UNIFORM:
        return LengthDist(LengthKind.UNIFORM, mean=((v.min or 1) + (v.max or 1)) / 2, low=v.min or 1, high=v.max or 1)
    if v.distribution is LengthKind.EMPIRICAL:
        return LengthDist(LengthKind.EMPIRICAL, mean=sum(v.values) / len(v.values), values=tuple(v.values))
    return LengthDist(v.distribution, mean=float(v.mean or 1), sigma=v.sigma)


def read_model_config(path: Path, *, field: str = "modelConfig") -> dict[str, Any]:
    """A config.json as a dict; a ModelOpt checkpoint's sibling hf_quant_config.json stands in for a missing
    quantization_config (vLLM reads it the same way)."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidSpec(field, f"cannot read a config.json at {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise InvalidSpec(field, f"{path} is not a JSON object of model fields")
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    sibling = path.parent / "hf_quant_config.json"
    if "quantization_config" not in cfg and "quantization_config" not in inner and sibling.is_file():
        try:
            cfg["quantization_config"] = json.loads(sibling.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidSpec(field, f"cannot read {sibling}: {exc}") from None
    return cfg


def _model(spec: PlanSpec) -> ModelArch:
    if spec.model is not None:
        return resolve_model(spec.model)
    path = Path(spec.modelConfig or "")
    return from_hf_config(read_model_config(path), name=path.parent.name or "custom")


def serving_precision(spec: PlanSpec, model: ModelArch) -> Precision:
    """The spec's precision; when the spec leaves it out, the precision the checkpoint's weights are stored in
    (an FP8 or NVFP4 checkpoint is served as stored: vLLM and SGLang read its quantization_config)."""
    if "precision" in spec.model_fields_set:
        return spec.precision
    return model.checkpoint_precision


def _knobs(args: EngineArgsSpec | None, base: EngineArgsSpec, kv: KvDtype) -> EngineKnobs:
    a = args or base
    return EngineKnobs(
        max_num_seqs=a.maxNumSeqs or base.maxNumSeqs or DEFAULT_KNOBS.max_num_seqs,
        max_num_batched_tokens=a.maxNumBatchedTokens or base.maxNumBatchedTokens or DEFAULT_KNOBS.max_num_batched_tokens,
        memory_fraction=a.memoryFraction or base.memoryFraction or DEFAULT_KNOBS.memory_fraction,
        kv_dtype=kv,
        block_size_tokens=a.blockSize,
        enable_prefix_caching=a.enablePrefixCaching,
    )


def to_layout(spec: PlanSpec, layout: LayoutSpec | None = None, *, precision: Precision | None = None) -> Layout:
    """Convert the spec's `layout` block (or the given one) into a planner Layout (at `precision`, else the spec's)."""
    ls = layout or spec.layout
    prec = precision or spec.precision
    if ls is None:
        raise InvalidSpec("layout", "no layout given (kind: replicas|pd with replicas/tp/pp or prefill/decode)")
    if ls.kind is LayoutKind.REPLICAS:
        par = Parallelism(tp=ls.tp, pp=ls.pp, dp=ls.dp, ep=ls.ep)
        return Layout.replicas(ls.replicas, par, _knobs(None, ls.engineArgs, spec.kvCacheDtype), prec)
    assert ls.prefill is not None and ls.decode is not None
    roles = []
    for r in (ls.prefill, ls.decode):
        roles.append(RoleLayout(r.count, Parallelism(tp=r.tp, pp=r.pp, dp=r.dp, ep=ls.ep), _knobs(r.engineArgs, ls.engineArgs, spec.kvCacheDtype)))
    return Layout.pd(roles[0], roles[1], prec)


def _search(spec: PlanSpec, model: ModelArch) -> SearchSpace:
    s = spec.search
    preset = PRESETS[s.preset]
    dp_default = preset["dp"] if (model.is_moe or model.is_mla) else (1,)
    kv_default = (spec.kvCacheDtype,) if s.preset != "wide" or spec.kvCacheDtype is not KvDtype.AUTO else (KvDtype.AUTO, KvDtype.FP8)
    return SearchSpace(
        layouts=tuple(s.layouts or (LayoutKind.REPLICAS, LayoutKind.PD)),
        tp=tuple(s.tp or preset["tp"]),
        pp=tuple(s.pp or preset["pp"]),
        dp=tuple(s.dp or dp_default),
        max_num_seqs=tuple(s.maxNumSeqs or preset["mns"]),
        max_num_batched_tokens=tuple(s.maxNumBatchedTokens or preset["mnbt"]),
        memory_fraction=tuple(s.memoryFraction or preset["mem"]),
        kv_dtypes=tuple(s.kvCacheDtypes or kv_default),
        allow_cross_node_tp=spec.hardware.allowCrossNodeTP,
        top_k=s.topK,
    )


def _slo(spec: PlanSpec) -> Slo:
    (tk, tv), = spec.slo.ttftMs.items()
    (pk, pv), = spec.slo.tpotMs.items()
    return Slo(ttft_ms=tv, tpot_ms=pv, ttft_percentile=float(tk[1:]), tpot_percentile=float(pk[1:]))


def to_problem(spec: PlanSpec, *, pinned: Layout | None = None, current: Layout | None = None) -> Problem:
    """Convert a validated spec into the planner's Problem (raises InvalidSpec for unknown model or GPU)."""
    hw = spec.hardware
    gpu = resolve_gpu(hw.gpu, nvlink_gbps=hw.nvlinkGBps, nic_gbit=hw.nicGbps, gpus_per_node=hw.gpusPerNode)
    model = _model(spec)
    precision = serving_precision(spec, model)
    if "precision" in spec.model_fields_set and not gpu.supports(precision):
        raise InvalidSpec("precision", f"{gpu.id} has no {precision.value} tensor cores; allowed here: "
                          + ", ".join(p.value for p in Precision if gpu.supports(p)))
    if spec.kvCacheDtype is KvDtype.FP8 and not gpu.supports(Precision.FP8):
        raise InvalidSpec("kvCacheDtype", f"{gpu.id} has no fp8 support; allowed: auto, bf16")
    w = spec.workload
    workload = Workload(
        input_tokens=_length(w.inputTokens),
        output_tokens=_length(w.outputTokens),
        arrival_rate_rps=w.arrivalRate,
        concurrency=w.concurrency,
        prefix_share=w.prefixShare,
        arrival_cv=w.arrivalCV,
    )
    if pinned is None and spec.layout is not None:
        pinned = to_layout(spec, precision=precision)
    elif pinned is not None and "precision" not in spec.model_fields_set:
        pinned = replace(pinned, precision=precision)  # a layout built before the model was read (the operator's pin)
    return Problem(
        model=model, gpu=gpu, engine=spec.engine.name, precision=precision, max_gpus=hw.maxGPUs,
        engine_version=resolve_version(spec.engine.name, version=spec.engine.version, image=spec.engine.image),
        workload=workload, slo=_slo(spec), objective=spec.objective, search=_search(spec, model),
        pinned=pinned, current=current,
    )
