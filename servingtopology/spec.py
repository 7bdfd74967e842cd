"""The planning spec: one pydantic schema for the CLI's YAML and the ServingTopology resource's spec.

Keys are camelCase. `load_spec` parses and validates; `to_problem` converts to the planner's frozen
values (the only place pydantic meets the planner); `to_layout` converts a `layout` block. Errors are
`SpecError` with every bad field named by its dotted path and the allowed values.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict

from servingtopology.planner.engines.caps import load_caps, resolve_version, uncovered_release
from servingtopology.planner.engines.role_knobs import DEFAULT_KNOBS
from servingtopology.planner.errors import InvalidSpec, did_you_mean
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, LayoutKind, Parallelism, RoleLayout
from servingtopology.planner.model.catalog import ModelArch, catalog_hf_id, from_hf_config, resolve_model
from servingtopology.planner.model.towers import LANGUAGE_ONLY_FLAGS, language_only_flag
from servingtopology.planner.problem import Problem, SearchSpace, SimulationBudget
from servingtopology.planner.search.decide import context_rejection
from servingtopology.planner.workload import LengthDist, LengthKind, Objective, Slo, Workload

__all__ = [
    "DEFAULT_SPEC",
    "PRESETS",
    "LayoutSpec",
    "PlanSpec",
    "SpecError",
    "load_spec",
    "unknown_field_hint",
    "parse_spec",
    "read_spec_data",
    "load_yaml",
    "DuplicateKey",
    "to_layout",
    "to_problem",
    "serving_precision",
    "CONTEXT_FLAGS",
    "context_flag_tokens",
    "served_context",
    "engine_extra_args",
    "read_model_config",
    "ModelIdentity",
    "model_identity",
    "read_model_identity",
]


class SpecError(ValueError):
    """A spec failed validation; `errors` lists (dotted field, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid spec:\n" + "\n".join(f"  {f}: {m}" for f, m in errors))


# ---- bounds: every number has a maximum and every string a length, so that the planner's and the simulator's
# work is bounded by the spec's size (issue #17: maxNumSeqs 1e8 took 8 GB, a 64^4 layout simulated 16.7M GPUs).
# Each bound is what the engines accept or well above any real deployment; the source is given beside it.
# hardware.maxGPUs: the GPU budget of the whole deployment. 16,384: the wide 70B example plans there within 30 CPU-seconds
# and 2 GB (benchmarks/funnel_scaling.py, which fails when it no longer does); the funnel's work grows linearly above it.
MAX_GPUS = 16_384
MAX_PARALLEL = 64  # tp / pp / dp per instance: the search's own limit; no catalog GPU node or NVL domain exceeds 72
# vLLM's --max-num-seqs has no upper bound in its argument parser (SchedulerConfig checks only that it is <=
# max_num_batched_tokens); its defaults are 256 / 1024 per DP rank (engines.md 1.1). SGLang derives
# --max-running-requests from the pool size and clamps it to [2048, 4096] (engines.md 2.4). 65,536 is 64x vLLM's
# largest default and 16x SGLang's clamp: more concurrent sequences than any GPU's KV pool holds at 1 token each.
MAX_NUM_SEQS = 65_536
# vLLM's --max-num-batched-tokens defaults to 2048-16384 and becomes max_model_len with chunked prefill off; the
# longest context windows in the catalog are 1M-10M tokens, served chunked. 2,097,152 (2^21) covers a 2M-token
# unchunked prefill; the LoRA kernel caps it at 65,528 (vLLM LoRAConfig), SGLang's --chunked-prefill-size is 8192 by default.
MAX_BATCHED_TOKENS = 2_097_152
MAX_TOKENS = 10_000_000  # input/output lengths: the longest context window shipped (Llama 4 Scout, 10M)
MAX_LIST = 16  # values per search list (the wide preset has at most 6) and per empirical-length list 10,000
MAX_EMPIRICAL = 10_000
MAX_RATE_RPS = 100_000.0  # arrivalRate: 100k req/s is ~1,000 GPUs' worth of short requests; the simulator draws from it
MAX_CONCURRENCY = 100_000  # closed-loop clients
MAX_SIM_REQUESTS = 200_000  # simulation.requests: a 200k-request simulation is about a minute of CPU (2k: ~0.5 s)
# Work of one simulation. Measured (CLI simulate, Llama-3.1-8B on B200): memory grows ~70 bytes per simulated engine
# step (200 requests of 100k output tokens at maxNumSeqs 1: 2e7 steps, 1.47 GB; at 256: 137 MB), CPU with the tokens
# (200k requests of ~4k tokens: 23 CPU s). Steps are estimated as requests x mean output / min(maxNumSeqs, requests).
MAX_SIM_STEPS = 10_000_000  # ~0.7 GB
MAX_SIM_TOKENS = 500_000_000
MAX_SEED = 2**32 - 1  # numpy's legacy seeding range; SeedSequence refuses negative seeds ("expected non-negative integer")
MAX_SLO_MS = 3_600_000.0  # an SLO bound of an hour; any larger is not a latency objective
MAX_ID = 256  # model / GPU ids: Hugging Face ids are <= 96 characters per part (org and name)
MAX_PATH = 4096  # modelConfig: Linux PATH_MAX
MAX_IMAGE = 512  # container image reference (the OCI distribution spec keeps a repository name under 256 + tag 128 + digest)
MAX_ARG = 1024  # one engine argument
MAX_ARGS = 128  # engine.extraArgs entries
MAX_SPEC_BYTES = 1_048_576  # a spec file: 1 MiB (a full spec is ~1 kB)
MAX_SPEC_DEPTH = 32  # nesting of a spec's YAML (the schema nests 5 deep)
MAX_CONFIG_BYTES = 16_777_216  # a model's config.json: 16 MiB (the largest in the catalog is ~40 kB)


def _cel(*rules: tuple[str, str]) -> ConfigDict:
    """Model config carrying CEL rules (`x-kubernetes-validations`) into the CRD (operator/api/crd.py); each rule mirrors a
    validator of the model, so the API server refuses what the operator would refuse."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]})


class _Base(BaseModel):
    # allow_inf_nan=False: `.nan` / `.inf` in any float field is refused with the field's name (a NaN SLO bound
    # used to reach the planner and read as "infeasible").
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


class EngineSpec(_Base):
    """The serving engine the plan is for."""

    name: Engine = Field(default=Engine.VLLM, description="serving engine: vllm or sglang")
    version: str | None = Field(default=None, max_length=32, pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?$",
                                description="engine release (0.11.0, or 0.11 for its newest covered patch); default: the image tag's, "
                                "else the newest covered release (planner/data/engine_caps)")
    image: str | None = Field(default=None, min_length=1, max_length=MAX_IMAGE,
                              description="container image of the engine; its tag picks the engine release when version is not set")
    extraArgs: list[Annotated[str, Field(max_length=MAX_ARG)]] = Field(
        default_factory=list, max_length=MAX_ARGS,
        description=f"extra engine flags appended to the planned command line, one argument per item (at most {MAX_ARGS}, "
                    f"{MAX_ARG} characters each), e.g. [--trust-remote-code]; default: none")


class HardwareSpec(_Base):
    """The GPUs the deployment may use."""

    gpu: str = Field(min_length=1, max_length=MAX_ID, description="GPU id from the catalog (h100_sxm, h200_sxm, b200_sxm, a100_sxm, ...) or an alias (H100)")
    gpusPerNode: int | None = Field(default=None, ge=1, le=72, description="GPUs in one node; default: the catalog GPU's usual "
                                    "node (8 for HGX boards)")
    maxGPUs: int = Field(ge=1, le=MAX_GPUS, description="GPU budget for the whole deployment (every role and replica together)")
    # NVLink 5 is 900 GB/s one-way per GPU and the fastest NICs 800 Gb/s: 100x headroom each
    nvlinkGBps: float | None = Field(default=None, gt=0, le=100_000, description="override: one-way NVLink bandwidth per GPU, "
                                     "in GB/s; default: the catalog GPU's")
    nicGbps: float | None = Field(default=None, gt=0, le=100_000, description="override: network (NIC) bandwidth per GPU, in "
                                  "Gb/s; default: the catalog GPU's")
    allowCrossNodeTP: bool = Field(default=False, description="let a tensor-parallel or attention-DP group (TP x DP) span "
                                   "whole nodes, e.g. TP16 or TP2 x DP8 on two 8-GPU nodes; its collectives are priced over the "
                                   "network (slow without NVLink across nodes); pipeline stages may always span nodes")


class DistributionSpec(_Base):
    """A distribution of request lengths, in tokens."""

    distribution: LengthKind = Field(default=LengthKind.FIXED, description="fixed (mean), uniform (min..max), lognormal "
                                     "(mean, sigma) or empirical (values)")
    mean: float | None = Field(default=None, gt=0, le=MAX_TOKENS, description="mean length in tokens (fixed, lognormal)")
    # lognormal sigma 4: the p99 is ~11,000x the median
    sigma: float = Field(default=0.5, ge=0, le=4.0, description="lognormal shape: standard deviation of the log of the length")
    min: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="shortest length in tokens (uniform)")
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="longest length in tokens (uniform)")
    values: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=list, max_length=MAX_EMPIRICAL,
        description=f"observed lengths in tokens, drawn with equal weight (empirical; at most {MAX_EMPIRICAL:,} values)")

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


Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)] | DistributionSpec


class WorkloadSpec(_Base):
    """The expected traffic: how much, and how long the requests are. Give exactly one of arrivalRate or concurrency."""

    model_config = _cel(("has(self.arrivalRate) != has(self.concurrency)",
                         "give exactly one of spec.workload.arrivalRate (requests/s) or spec.workload.concurrency (clients)"))

    arrivalRate: float | None = Field(default=None, gt=0, le=MAX_RATE_RPS, description="offered load in requests per second "
                                      "(open loop); exactly one of arrivalRate or concurrency")
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY, description="clients each sending one request at a "
                                    "time (closed loop); exactly one of arrivalRate or concurrency")
    inputTokens: Tokens = Field(description="prompt length in tokens: a number, or a distribution {distribution, mean, sigma, "
                                f"min, max, values}}; 1 to {MAX_TOKENS:,}")
    outputTokens: Tokens = Field(description="generated length in tokens: a number, or a distribution {distribution, mean, "
                                 f"sigma, min, max, values}}; 1 to {MAX_TOKENS:,}")
    prefixShare: float = Field(default=0.0, ge=0.0, le=1.0, description="fraction of each prompt shared with earlier requests "
                               "(a system prompt, a chat history) that prefix caching can reuse")
    arrivalCV: float = Field(default=1.0, gt=0.0, le=10.0, description="coefficient of variation of the inter-arrival times: 1 "
                             "is Poisson, above 1 bursty, below 1 smoother")

    @model_validator(mode="after")
    def _one_load(self) -> WorkloadSpec:
        if (self.arrivalRate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of 'arrivalRate' (requests/s) or 'concurrency' (clients)")
        return self


_PCT = re.compile(r"^p(\d{1,2}(\.\d+)?)$")


class SloSpec(_Base):
    """The latency objectives a layout must meet, each one percentile and its bound in milliseconds."""

    ttftMs: dict[str, float] = Field(description="time to first token: exactly one percentile (p50, p90, p95, p99, p99.9) "
                                     f"and its bound in ms, e.g. {{p95: 200}}; bound in (0, {MAX_SLO_MS:,.0f}]",
                                     json_schema_extra=lambda s: s.update(_slo_schema()))
    tpotMs: dict[str, float] = Field(description="time per output token after the first: exactly one percentile (p50, p90, "
                                     f"p95, p99, p99.9) and its bound in ms, e.g. {{p95: 35}}; bound in (0, {MAX_SLO_MS:,.0f}]",
                                     json_schema_extra=lambda s: s.update(_slo_schema()))

    @field_validator("ttftMs", "tpotMs")
    @classmethod
    def _percentile(cls, v: dict[str, float]) -> dict[str, float]:
        if len(v) != 1:
            raise ValueError("give exactly one percentile, e.g. {p95: 200}")
        (key, bound), = v.items()
        if len(key) > 16 or not _PCT.match(key) or not 0 < float(key[1:]) < 100:
            raise ValueError(f"percentile key {key[:16]!r} must look like p50, p90, p95, p99, p99.9")
        if not math.isfinite(bound) or not 0 < bound <= MAX_SLO_MS:
            raise ValueError(f"the bound must be a finite number of ms in (0, {MAX_SLO_MS:,.0f}] (got {bound!r})")
        return v


class SearchSpec(_Base):
    """The candidate layouts the planner tries: a preset, narrowed or widened per knob."""

    preset: Literal["narrow", "default", "wide"] = Field(default="default", description="knob lists to search: narrow (TP only), "
                                                         "default, or wide (more PP, batch sizes, memory fractions, fp8 KV cache)")
    layouts: list[LayoutKind] | None = Field(default=None, max_length=MAX_LIST, description="layout kinds to try: replicas "
                                             "(aggregated engines), pd (prefill/decode disaggregation); default: both")
    tp: list[Annotated[int, Field(ge=1, le=MAX_PARALLEL)]] | None = Field(
        default=None, max_length=MAX_LIST, description=f"tensor-parallel sizes to try (1 to {MAX_PARALLEL}); default: the preset's")
    pp: list[Annotated[int, Field(ge=1, le=MAX_PARALLEL)]] | None = Field(
        default=None, max_length=MAX_LIST, description=f"pipeline-parallel sizes to try (1 to {MAX_PARALLEL}); default: the preset's")
    dp: list[Annotated[int, Field(ge=1, le=MAX_PARALLEL)]] | None = Field(
        default=None, max_length=MAX_LIST, description=f"data-parallel sizes per engine to try (1 to {MAX_PARALLEL}); default: "
                                                      "the preset's for MoE and MLA models, else [1]")
    maxNumSeqs: list[Annotated[int, Field(ge=1, le=MAX_NUM_SEQS)]] | None = Field(
        default=None, max_length=MAX_LIST, description="batch sizes per attention-DP rank to try (vLLM --max-num-seqs; SGLang "
                                                      "--max-running-requests, rendered as the value x dp, which SGLang divides by "
                                                      f"--attn-dp-size), 1 to {MAX_NUM_SEQS:,}; vLLM candidates above their token "
                                                      "budget are never picked (vLLM refuses them); default: the preset's")
    maxNumBatchedTokens: list[Annotated[int, Field(ge=16, le=MAX_BATCHED_TOKENS)]] | None = Field(
        default=None, max_length=MAX_LIST, description="tokens per engine step to try (vLLM --max-num-batched-tokens per DP "
                                                      "rank; SGLang --chunked-prefill-size, divided by --attn-dp-size per rank), "
                                                      f"16 to {MAX_BATCHED_TOKENS:,}; default: the preset's")
    memoryFraction: list[Annotated[float, Field(gt=0.1, le=0.99)]] | None = Field(
        default=None, max_length=MAX_LIST, description="fractions of GPU memory the engine may use (--gpu-memory-utilization) to "
                                                      "try, in (0.1, 0.99]; default: the preset's")
    kvCacheDtypes: list[KvDtype] | None = Field(default=None, max_length=MAX_LIST, description="KV cache dtypes to try (auto, "
                                                "bf16, fp8); default: kvCacheDtype, or [auto, fp8] with the wide preset")
    topK: int = Field(default=8, ge=1, le=256, description="candidates kept after the analytical ranking and checked by "
                      "simulation")


class EngineArgsSpec(_Base):
    """Engine knobs of a pinned layout (or one role of it)."""

    maxNumSeqs: int | None = Field(default=None, ge=1, le=MAX_NUM_SEQS, description="sequences one attention-DP rank of an "
                                   "engine batches (the whole engine without dp). vLLM: --max-num-seqs, which applies per DP rank. "
                                   "SGLang: --max-running-requests is the server's cap, which SGLang divides by --attn-dp-size, "
                                   "so it is rendered as maxNumSeqs x dp (maxNumSeqs 4 at dp 4: --max-running-requests 16). vLLM "
                                   "refuses to start with maxNumSeqs above maxNumBatchedTokens; default: the layout's, else 256")
    maxNumBatchedTokens: int | None = Field(default=None, ge=16, le=MAX_BATCHED_TOKENS, description="tokens per engine step. "
                                            "vLLM: --max-num-batched-tokens, per DP rank; at least maxNumSeqs (vLLM refuses "
                                            "less at start-up). SGLang: --chunked-prefill-size as given, which SGLang divides by "
                                            "--attn-dp-size, so each attention-DP rank prefills this / dp tokens per step (as "
                                            "planned and simulated); default: the layout's, else 8192")
    memoryFraction: float | None = Field(default=None, gt=0.1, le=0.99, description="fraction of GPU memory the engine may use "
                                         "(vLLM --gpu-memory-utilization, SGLang --mem-fraction-static); default: the "
                                         "layout's, else 0.9")
    blockSize: int = Field(default=16, ge=1, le=256, description="vLLM's KV cache block size in tokens (--block-size); a "
                           "multiple of 16 (vLLM's CUDA attention backends refuse others). SGLang does not receive it: its "
                           "equivalent, --page-size, stays at SGLang's default (set it in engine.extraArgs)")
    enablePrefixCaching: bool = Field(default=True, description="reuse the KV cache of shared prompt prefixes")


def _slo_schema() -> dict[str, Any]:
    """The CRD's bounds of an SLO map: one entry, a percentile key, a bound in (0, MAX_SLO_MS] (as `_percentile`)."""
    return {"minProperties": 1, "maxProperties": 1,
            "additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SLO_MS},
            "x-kubernetes-validations": [
                {"rule": "self.size() == 1", "message": "give exactly one percentile, e.g. {p95: 200}"},
                {"rule": f"self.all(k, size(k) <= 16 && k.matches(r'{_PCT.pattern}') && double(k.substring(1)) > 0.0)",
                 "message": "the percentile key must look like p50, p90, p95, p99, p99.9"}]}


_DP_ATTENTION = ("true: dp splits the attention of the tp GPUs, as SGLang and Dynamo write it (tp 4, dp 4: four GPUs, "
                 "SGLang --tp-size 4 --attn-dp-size 4, or --dp-size 4 --enable-dp-attention where a release has no "
                 "--attn-dp-size; vLLM runs the same as -tp 1 -dp 4), so dp must divide tp; false: each of the dp ranks has "
                 "its own tp GPUs (tp x dp GPUs, vLLM's -tp and -dp)")


class RoleSpec(_Base):
    """One role (prefill or decode) of a pd layout: its instances and their shape."""

    count: int = Field(default=1, ge=1, le=MAX_GPUS, description="engine instances of this role")
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="tensor-parallel GPUs per instance")
    pp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="pipeline stages per instance")
    dp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="data-parallel ranks per instance")
    dpAttention: bool | None = Field(default=None, description=_DP_ATTENTION + "; default: the layout's dpAttention")
    ep: int | None = Field(default=None, ge=1, le=MAX_PARALLEL, description="expert parallelism of this role (MoE models): the GPUs "
                           "of a stage its experts are spread over; it must divide the stage's GPUs (tp, or tp x dp without "
                           "dpAttention). SGLang renders --ep-size N; vLLM only spreads them over all (--enable-expert-parallel, "
                           "N = the stage's GPUs); 1: none; default: the layout's ep")
    engineArgs: EngineArgsSpec | None = Field(default=None, description="this role's engine knobs, over the layout's engineArgs")
    gpu: str | None = Field(default=None, min_length=1, max_length=MAX_ID,
                            description="the GPU kind this role runs on (a catalog id or alias, as hardware.gpu), for prefill on "
                            "one kind and decode on another, the KV moving over the slower kind's NIC; default: hardware.gpu")

    @field_validator("ep", mode="before")
    @classmethod
    def _ep_is_a_size(cls, value: Any) -> Any:
        """RoleEpIsASize: `ep: true` on a role would read as EP size 1 (no expert parallelism) by YAML's bool-as-int, so
        the user's EP would silently vanish from the layout and the engine command; it is refused by name instead."""
        if isinstance(value, bool):
            raise ValueError("a role's ep is its EP size, the GPUs of a stage its experts are spread over (ep: 4 on a tp 4 "
                             "role; 1: none), not true/false; the layout's own ep: true spreads every role's experts over "
                             "all of its stage's GPUs")
        return value

    def gpus(self, *, dp_attention: bool) -> int:
        """GPUs of this role: count × tp × pp, times dp unless dp splits the tp GPUs' attention (`dp_attention`)."""
        return self.count * self.tp * self.pp * (1 if dp_attention else self.dp)


class LayoutSpec(_Base):
    """A fixed layout: identical replicas, or prefill and decode roles (pd)."""

    model_config = _cel(("!has(self.kind) || self.kind != 'pd' || (has(self.prefill) && has(self.decode))",
                         "kind pd needs both prefill and decode ({count, tp, pp})"))

    kind: LayoutKind = Field(default=LayoutKind.REPLICAS, description="replicas (identical aggregated engines) or pd (prefill "
                             "and decode roles, both required)")
    replicas: int = Field(default=1, ge=1, le=MAX_GPUS, description="engine instances (kind replicas)")
    count: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="the same as replicas, in the word a pd role uses "
                              "(kind replicas; give one of the two)")
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="tensor-parallel GPUs per instance (kind replicas)")
    pp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="pipeline stages per instance (kind replicas)")
    dp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="data-parallel ranks per instance (kind replicas)")
    dpAttention: bool = Field(default=False, description=_DP_ATTENTION + " (kind replicas; with kind pd, each role's default)")
    ep: bool = Field(default=False, description="expert parallelism across the instance's GPUs (MoE models)")
    prefill: RoleSpec | None = Field(default=None, description="the prefill role (kind pd)")
    decode: RoleSpec | None = Field(default=None, description="the decode role (kind pd)")
    engineArgs: EngineArgsSpec = Field(default_factory=EngineArgsSpec, description="engine knobs of every instance (a role's "
                                       "own engineArgs override them)")

    @model_validator(mode="before")
    @classmethod
    def _count_is_replicas(cls, data: Any) -> Any:
        """CountIsReplicas: `count` (the word a pd role uses) means replicas in kind replicas; a clash is refused after."""
        if isinstance(data, dict) and "count" in data and "replicas" not in data and data.get("kind", "replicas") == "replicas":
            return {**data, "replicas": data["count"]}
        return data

    @model_validator(mode="after")
    def _roles(self) -> LayoutSpec:
        if self.kind is LayoutKind.PD and (self.prefill is None or self.decode is None):
            raise ValueError("kind pd needs both 'prefill' and 'decode' ({count, tp, pp})")
        if self.count is not None and self.kind is LayoutKind.PD:
            raise ValueError("count: kind pd counts each role: prefill.count and decode.count")
        if self.count is not None and self.count != self.replicas:
            raise ValueError(f"count: the same as replicas, given twice with different values (replicas {self.replicas}, "
                             f"count {self.count}); give one")
        for where, tp, dp, attention in self.shapes():
            if attention and tp % dp:
                raise ValueError(f"{where + '.' if where else ''}dp: with dpAttention, dp splits the attention of the tp GPUs, so "
                                 f"it must divide tp (tp 4, dp 4: four GPUs, attention split four ways); got tp {tp}, dp {dp}")
        for name, r in (("prefill", self.prefill), ("decode", self.decode)):
            if r is not None and r.ep is not None:
                if self.kind is not LayoutKind.PD:
                    raise ValueError(f"{name}.ep: a role's ep is for kind pd (kind replicas: ep)")
                stage = r.tp if self.role_attention(r) else r.tp * r.dp
                if stage % r.ep:
                    raise ValueError(f"{name}.ep: expert parallelism spreads the experts over GPUs of one stage, so ep must divide "
                                     f"its {stage} GPUs ({'tp' if self.role_attention(r) else 'tp x dp'}); got ep {r.ep}")
        return self

    def role_attention(self, role: RoleSpec) -> bool:
        """Whether `role`'s dp splits its tp GPUs' attention: the role's dpAttention, else the layout's."""
        return self.dpAttention if role.dpAttention is None else role.dpAttention

    def shapes(self) -> list[tuple[str, int, int, bool]]:
        """(where, tp, dp, dpAttention) of each instance shape: '' for kind replicas, 'prefill' and 'decode' for pd."""
        if self.kind is LayoutKind.REPLICAS:
            return [("", self.tp, self.dp, self.dpAttention)]
        return [(name, r.tp, r.dp, self.role_attention(r)) for name, r in (("prefill", self.prefill), ("decode", self.decode))
                if r is not None]

    def gpus(self) -> int:
        """GPUs this layout occupies (replicas x tp x pp x dp, dp left out under dpAttention; or the sum over the PD roles)."""
        if self.kind is LayoutKind.PD and self.prefill is not None and self.decode is not None:
            return sum(r.gpus(dp_attention=self.role_attention(r)) for r in (self.prefill, self.decode))
        return self.replicas * self.tp * self.pp * (1 if self.dpAttention else self.dp)

    def dp_attention_hint(self) -> str:
        """DpAttentionHint: when a shape reads as tp × dp GPUs but tp is a multiple of dp, the user may mean SGLang's and
        Dynamo's spelling (`--tp-size 4 --dp-size 4 --enable-dp-attention` is four GPUs); say how to write it, and the
        GPUs it would take."""
        if not any(dp > 1 and tp % dp == 0 and not attention for _, tp, dp, attention in self.shapes()):
            return ""
        as_attention = self.model_copy(update={"dpAttention": True, **{
            name: r.model_copy(update={"dpAttention": True}) for name, r in (("prefill", self.prefill), ("decode", self.decode))
            if r is not None and r.dp > 1 and r.tp % r.dp == 0}})
        return (f"; tp × dp GPUs per instance were counted: if tp is the engine's TP size with attention split dp ways (SGLang "
                f"--tp-size T --dp-size D --enable-dp-attention), set dpAttention: true, which takes {as_attention.gpus():,} GPUs")


class SimulationSpec(_Base):
    """The discrete-event simulation that checks the top candidates."""

    requests: int = Field(default=2000, ge=10, le=MAX_SIM_REQUESTS, description="requests simulated per candidate: all of "
                          "them by simulate; plan and the operator simulate at most 600, and fewer for long requests (at most "
                          "2^25 simulated tokens a candidate, not under 100 requests by that rule); more: steadier percentiles, "
                          "more CPU")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="random seed of the simulated arrivals and lengths")
    warmupRequests: int = Field(default=100, ge=0, le=MAX_SIM_REQUESTS, description="first requests left out of the "
                                "percentiles (the empty-engine start) by simulate, plan and the "
                                "operator's stage 6 alike, at most a quarter of them")


def _mean_tokens(v: int | DistributionSpec) -> float:
    if isinstance(v, int):
        return float(v)
    if v.distribution is LengthKind.UNIFORM:
        return ((v.min or 1) + (v.max or 1)) / 2
    if v.distribution is LengthKind.EMPIRICAL:
        return sum(v.values) / max(len(v.values), 1)
    return float(v.mean or 1)


def _smallest_batch(layout: LayoutSpec | None, search: SearchSpec | None) -> int:
    """The fewest sequences one engine batches: the layout's maxNumSeqs (per role), else the search's smallest."""
    if layout is not None:
        args = [layout.engineArgs] + [r.engineArgs for r in (layout.prefill, layout.decode) if r is not None and r.engineArgs]
        return min(a.maxNumSeqs or layout.engineArgs.maxNumSeqs or DEFAULT_KNOBS.max_num_seqs for a in args)
    preset = search.preset if search is not None else "default"
    return min((search.maxNumSeqs if search is not None and search.maxNumSeqs else None) or PRESETS[preset]["mns"])


def _no_schema_default(schema: JsonDict) -> None:
    schema.pop("default", None)


class PlanSpec(_Base):
    """The planning spec (also the core of the ServingTopology resource's spec)."""

    model: str | None = Field(default=None, min_length=1, max_length=MAX_ID, description="catalog id or Hugging Face id")
    modelConfig: str | None = Field(default=None, min_length=1, max_length=MAX_PATH, description="path to a Hugging Face config.json")
    modelSource: str | None = Field(default=None, min_length=1, max_length=MAX_PATH,
                                    description="what the engines load (vLLM's model argument, SGLang --model-path): a Hugging Face "
                                    "id or a path the engine can read; default: the model's Hugging Face id, or with a config.json "
                                    "alone the folder holding it (a file named config.json in a named folder), else its "
                                    "_name_or_path when that is a Hugging Face id; required with modelConfigMap")
    servedModelName: str | None = Field(default=None, min_length=1, max_length=MAX_ID,
                                        description="the model name clients send (vLLM and SGLang --served-model-name); default: "
                                        "what the engines load (modelSource, else the model's Hugging Face id)")
    # No default in the schema: an unset precision means "as the checkpoint is stored" (serving_precision), which a
    # defaulted `bf16` written by the API server would override.
    precision: Precision = Field(default=Precision.BF16, json_schema_extra=_no_schema_default,
                                 description="weight precision the engines serve: bf16, fp8, fp4 or int4; default: the "
                                             "checkpoint's own (its quantization_config), bf16 for an unquantized one")
    kvCacheDtype: KvDtype = Field(default=KvDtype.AUTO, description="KV cache dtype: auto (the model's dtype), bf16 or fp8")
    contextLength: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="the longest request (prompt + output) the "
                                      "engines accept, in tokens, passed as vLLM --max-model-len or SGLang --context-length; at "
                                      "most the model's own context; it sets what a request may ask for, not the KV memory to "
                                      "hold it (the plan checks that per rank); default: the model's context, or the flag in "
                                      "engine.extraArgs")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="the serving engine (vllm or sglang) and its release")
    hardware: HardwareSpec = Field(description="the GPU type, the GPU budget and the node shape")
    workload: WorkloadSpec = Field(description="the expected traffic: load (arrivalRate or concurrency) and request lengths")
    slo: SloSpec = Field(description="latency objectives: one TTFT and one TPOT percentile bound, in ms")
    objective: Objective = Field(default=Objective.GOODPUT_PER_GPU, description="how layouts meeting the SLO are ranked: "
                                 "goodput-per-gpu (most SLO-meeting requests per GPU) or min-gpus (fewest GPUs)")
    search: SearchSpec = Field(default_factory=SearchSpec, description="the candidate layouts to try; default: the default preset")
    layout: LayoutSpec | None = Field(default=None, description="a fixed layout to evaluate instead of searching")
    simulation: SimulationSpec = Field(default_factory=SimulationSpec, description="the simulation that checks the top candidates")

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _one_model(self) -> PlanSpec:
        if (self.model is None) == (self.modelConfig is None):
            raise ValueError("give exactly one of 'model' (catalog or Hugging Face id) or 'modelConfig' (config.json path)")
        return self

    @field_validator("simulation")
    @classmethod
    def _simulation_work(cls, v: SimulationSpec, info: ValidationInfo) -> SimulationSpec:
        # The simulator's work grows with the tokens it simulates and its memory with the engine steps (issue #17:
        # bounded work per spec); `workload`, `search` and `layout` are validated first (declared before).
        w = info.data.get("workload")
        if not isinstance(w, WorkloadSpec):
            return v
        tokens = v.requests * (_mean_tokens(w.inputTokens) + _mean_tokens(w.outputTokens))
        batch = _smallest_batch(info.data.get("layout"), info.data.get("search"))
        steps = v.requests * _mean_tokens(w.outputTokens) / min(batch, v.requests)
        if tokens > MAX_SIM_TOKENS or steps > MAX_SIM_STEPS:
            raise ValueError(f"requests: {v.requests:,} requests of the workload's lengths are {tokens:,.0f} tokens in ~{steps:,.0f} engine "
                             f"steps at maxNumSeqs {batch}; one simulation holds at most {MAX_SIM_TOKENS:,} tokens and "
                             f"{MAX_SIM_STEPS:,} steps: fewer simulation.requests, shorter workload lengths or a larger maxNumSeqs")
        return v

    @field_validator("layout")
    @classmethod
    def _layout_within_budget(cls, v: LayoutSpec | None, info: ValidationInfo) -> LayoutSpec | None:
        # The layout to simulate is held to the GPU budget, as every planned layout is: a 64^4 layout otherwise
        # simulated 16.7M GPUs (issue #17). `hardware` is validated first (declared before `layout`).
        hw = info.data.get("hardware")
        if v is not None and isinstance(hw, HardwareSpec) and v.gpus() > hw.maxGPUs:
            raise ValueError(f"the layout takes {v.gpus():,} GPUs, over hardware.maxGPUs ({hw.maxGPUs}){v.dp_attention_hint()}")
        return v


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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, unions, lists, dicts and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def unknown_field_hint(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """`unknown field` said with the nearest field of the section it sits in (DidYouMean): `hardware.maxGpus` → maxGPUs,
    and `layout.count` of kind replicas → replicas. The section is found by walking `loc` through the models' fields."""
    models = [root]
    for part in loc[:-1]:
        if isinstance(part, int) or part.startswith(("function-", "constrained-")):
            continue
        inner = [m for model in models if part in model.model_fields for m in _models_in(model.model_fields[part].annotation)]
        if not inner:
            break
        models = inner
    key = str(loc[-1])
    fields = sorted({f for model in models for f in model.model_fields})
    return f"unknown field{did_you_mean(key, fields)}; allowed here: {', '.join(fields)}"


_SUBFIELD = re.compile(r"^([a-z][A-Za-z.]{1,30}): ")


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
                msg = unknown_field_hint(PlanSpec, tuple(e["loc"]))
            if "input" in e and e["type"] not in ("missing", "extra_forbidden") and not isinstance(e["input"], dict | list):
                got = repr(e["input"])
                msg += f" (got {got if len(got) <= 80 else got[:60] + f'... ({len(got):,} characters)'})"
            field = _loc(tuple(e["loc"]))
            sub = _SUBFIELD.match(msg)
            if sub and e["type"] == "value_error" and field != "spec":  # a section's check that names one of its keys
                field, msg = f"{field}.{sub.group(1)}", msg[sub.end():]
            errors.append((field, msg))
        # A union (number | distribution) reports both branches; keep the first per field.
        seen: dict[str, str] = {}
        for f, m in errors:
            seen.setdefault(f, m)
        raise SpecError(list(seen.items())) from None


def _check_shape(data: Any, *, max_depth: int = MAX_SPEC_DEPTH, max_nodes: int = 100_000) -> None:
    """Refuse a parsed document nested deeper than `max_depth` or with more than `max_nodes` values (YAML aliases
    can make a small file expand to billions of nodes); iterative, so depth itself cannot overflow the stack."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    nodes = 0
    while stack:
        node, path = stack.pop()
        nodes += 1
        if len(path) > max_depth:
            where = ".".join(path[:4]) if path else "spec"  # the field the deep value sits under
            raise SpecError([(where, f"nested deeper than {max_depth} levels (the schema nests 5)")])
        if nodes > max_nodes:
            raise SpecError([("spec", f"more than {max_nodes:,} values (after expanding YAML aliases)")])
        if isinstance(node, dict):
            stack.extend((v, (*path, str(k)[:64])) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*path, str(i))) for i, v in enumerate(node))


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names one key twice (PyYAML keeps the last silently, so a second
    `slo:` would replace the first without a word)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)   # merge keys (<<) first: a merged key may be overridden, which is not a duplicate
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:          # an unhashable key: construct_mapping below raises PyYAML's own error for it
            continue
        if first is not None:
            raise DuplicateKey(str(key), line=key_node.start_mark.line + 1, first_line=first)
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


class DuplicateKey(yaml.YAMLError):
    """A YAML mapping names `key` twice (1-based lines)."""

    def __init__(self, key: str, *, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


def load_yaml(text: str) -> Any:
    """Parse YAML (or JSON) text safely, refusing duplicate keys (DuplicateKey, a yaml.YAMLError); every YAML the CLI
    reads goes through here."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass


def read_spec_data(path: str | Path) -> Any:
    """A spec file's parsed YAML (or JSON), bounded: at most 1 MiB, UTF-8, nested at most 32 deep. Every way a
    file can be unreadable is a SpecError on `spec` (issue #17: non-UTF-8 and deep nesting raised tracebacks)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError([("spec", f"cannot read {path}: {exc.strerror}")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError([("spec", f"{path} is over {MAX_SPEC_BYTES:,} bytes; a spec is a few kB")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([("spec", f"{path} is not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})")]) from None
    try:
        documents = [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d is not None]  # a SafeLoader subclass
        for d in documents:
            _check_shape(d)
        data = _spec_document(documents, path)
    except DuplicateKey as exc:
        raise SpecError([("spec", f"{exc} in {path}: give each key once")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([("spec", f"not valid YAML: {str(exc)[:500]}")]) from None
    except RecursionError:
        raise SpecError([("spec", f"nested deeper than {MAX_SPEC_DEPTH} levels (the schema nests 5)")]) from None
    return data


def _spec_document(documents: list[Any], path: str | Path) -> Any:
    """SpecDocument: the one document of a file, or of several (a manifest with a Secret and a PersistentVolumeClaim
    beside the resource, as `kubectl apply -f` takes) the one ServingTopology, else the one without a `kind` (a bare
    spec). Anything else is a SpecError naming the kinds found."""
    if len(documents) <= 1:
        return documents[0] if documents else None
    kinds = [d.get("kind") if isinstance(d, dict) else None for d in documents]
    for wanted in ("ServingTopology", None):
        hits = [d for d, k in zip(documents, kinds, strict=True) if k == wanted]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise SpecError([("spec", f"{path} holds {len(hits)} {wanted or 'bare spec'} documents; give one per file")])
    found = ", ".join(str(k) for k in kinds)
    raise SpecError([("spec", f"{path} holds {len(documents)} YAML documents ({found}) and none is a ServingTopology or a bare spec")])


def load_spec(path: str | Path | None) -> PlanSpec:
    """Read and validate a YAML (or JSON) spec file; None gives the embedded default scenario."""
    if path is None:
        return parse_spec(json.loads(json.dumps(DEFAULT_SPEC)))
    return parse_spec(read_spec_data(path))


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
    cfg = _read_json(path, field, what="a config.json")
    if not isinstance(cfg, dict):
        raise InvalidSpec(field, f"{path} is not a JSON object of model fields")
    text_config = cfg.get("text_config")
    inner = text_config if isinstance(text_config, dict) else {}
    sibling = path.parent / "hf_quant_config.json"
    if "quantization_config" not in cfg and "quantization_config" not in inner and sibling.is_file():
        cfg["quantization_config"] = _read_json(sibling, field, what="")
    return cfg


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number JSON allows")


def _read_json(path: Path, field: str, *, what: str) -> Any:
    """A JSON file, bounded (16 MiB, UTF-8, finite numbers, nesting the parser can hold); every failure is an
    InvalidSpec on `field` (issue #17: a non-UTF-8 or 1e400-holding config.json raised a traceback)."""
    where = f"{what} at {path}" if what else str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise InvalidSpec(field, f"cannot read {where}: over {MAX_CONFIG_BYTES:,} bytes")
        return json.loads(raw.decode("utf-8"), parse_float=_finite, parse_constant=_no_constant)
    except OSError as exc:
        raise InvalidSpec(field, f"cannot read {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidSpec(field, f"cannot read {where}: not UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise InvalidSpec(field, f"cannot read {where}: nested too deep") from None
    except ValueError as exc:  # json.JSONDecodeError, and _finite / _no_constant
        raise InvalidSpec(field, f"cannot read {where}: {str(exc)[:200]}") from None


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """What the engines load (`source`) and the name clients send (`served_name`): one rule for the CLI's printed
    commands and record and the operator's pods."""

    source: str
    served_name: str


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def model_identity(spec: PlanSpec, config: dict[str, Any] | None = None) -> ModelIdentity:
    """The model the engines load and the name they serve it under.

    `model`: modelSource, else its Hugging Face id (a catalog id becomes the catalog's). A config.json alone
    (`modelConfig`): modelSource, else the folder holding it when the file is named config.json inside a named folder
    (a checkpoint folder, as engines load one), else the config's `_name_or_path` when that is a Hugging Face id
    (`config`, the parsed file); otherwise InvalidSpec on `modelSource`: a config.json gives the architecture only, and
    `--model-path .` finds no weights and serves a name no client can call. The served name is servedModelName, else
    the source."""
    if spec.model is not None:
        source = spec.modelSource or (spec.model if "/" in spec.model else catalog_hf_id(spec.model) or spec.model)
        return ModelIdentity(source, spec.servedModelName or source)
    if spec.modelSource:
        return ModelIdentity(spec.modelSource, spec.servedModelName or spec.modelSource)
    path = Path(spec.modelConfig or "")
    folder = str(path.parent)
    if path.name == "config.json" and folder not in ("", ".") and path.parent.name not in ("", ".", ".."):
        return ModelIdentity(folder, spec.servedModelName or folder)
    hub = (config or {}).get("_name_or_path")
    if isinstance(hub, str) and _HUB_ID.match(hub) and not Path(hub).exists():
        return ModelIdentity(hub, spec.servedModelName or hub)
    raise InvalidSpec("modelSource", f"modelConfig {spec.modelConfig} gives the architecture only: set modelSource to what the engines "
                                     "load (a Hugging Face id, or the folder holding the weights) and, if clients call it by "
                                     "another name, servedModelName; or put config.json in the checkpoint's folder")


def _model(spec: PlanSpec) -> ModelArch:
    if spec.model is not None:
        return resolve_model(spec.model)
    path = Path(spec.modelConfig or "")
    cfg = read_model_config(path)
    try:
        name = model_identity(spec, cfg).served_name
    except InvalidSpec:
        name = path.parent.name or "custom"   # plan refuses it (cli/plan.py); simulate and validate need no served name
    try:
        return from_hf_config(cfg, name=name)
    except InvalidSpec:
        raise
    except (ArithmeticError, ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        # A config.json of the right shape with values no model has (a 10^30-layer model, a list for a size):
        # the user's input, named as such, not an internal error.
        raise InvalidSpec("modelConfig", f"{path} holds values no model has ({type(exc).__name__}: {str(exc)[:200]})") from None


def read_model_identity(spec: PlanSpec) -> ModelIdentity:
    """`model_identity`, reading the config.json when the spec gives one (for its _name_or_path)."""
    if spec.model is not None or spec.modelSource:
        return model_identity(spec)
    return model_identity(spec, read_model_config(Path(spec.modelConfig or "")))


def _towers_loaded(spec: PlanSpec, model: ModelArch, version: str) -> ModelArch:
    """A multimodal model's towers are counted unless the user's engine.extraArgs start the engine without them
    (planner.model.towers.language_only_flag, for this engine release); the decision record says which."""
    if not model.tower_params:
        return model
    engine = spec.engine.name.value
    caps = load_caps(engine, version)
    flag = language_only_flag(engine, tuple(spec.engine.extraArgs), caps.has)
    if flag is not None:
        note = (f"engine.extraArgs has {flag}: {engine} {version} skips the {model.tower_params / 1e9:.2f} B of vision/audio "
                "towers, so they are not counted (the model takes text only)")
        return replace(model, tower_params=0, assumptions=(*model.assumptions, note))
    named = [a for a in spec.engine.extraArgs if a.split("=", 1)[0] in ("--language-model-only", "--language-only")]
    if named:
        why = (f"not a flag of {engine} {version}" if engine in LANGUAGE_ONLY_FLAGS
               else f"what {engine} skips with it is not settled (planner.model.towers)")
        return replace(model, assumptions=(*model.assumptions, f"engine.extraArgs has {named[-1]}, {why}: the towers stay counted"))
    return model


# The engine flag that sets the served context (engines.md: vLLM --max-model-len, SGLang --context-length).
CONTEXT_FLAGS = {Engine.VLLM: "--max-model-len", Engine.SGLANG: "--context-length"}
_HUMAN_INT = re.compile(r"^(\d+)([kKmM]?)$")


def _flag_value(args: list[str], flag: str) -> str | None:
    """The last value of `flag` in argparse's forms (`--flag N`, `--flag=N`): the one the engine keeps."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def context_flag_tokens(spec: PlanSpec) -> int | None:
    """The served context engine.extraArgs sets (vLLM --max-model-len, which takes 32k / 1M too; SGLang --context-length),
    or None; InvalidSpec on engine.extraArgs when the value is not a token count."""
    flag = CONTEXT_FLAGS[spec.engine.name]
    text = _flag_value(list(spec.engine.extraArgs), flag)
    if text is None:
        return None
    m = _HUMAN_INT.match(text.strip())
    if m is None or int(m.group(1)) < 1:
        raise InvalidSpec("engine.extraArgs", f"{flag} {text[:40]!r} is not a token count (e.g. 32768 or 32k); set contextLength instead")
    return int(m.group(1)) * {"": 1, "k": 1000, "m": 1_000_000}[m.group(2).lower()]


def served_context(spec: PlanSpec, model: ModelArch) -> int | None:
    """ServedContext: the context the engines are told to serve (contextLength, else the engine flag in engine.extraArgs),
    or None for the model's own. Refused by name: one above the model's context (both engines refuse a --max-model-len /
    --context-length past what the config derives unless an environment override is set), and contextLength beside an
    engine.extraArgs flag of another value (the flag would win at start-up and the plan would check the wrong one)."""
    flagged, given = context_flag_tokens(spec), spec.contextLength
    flag = CONTEXT_FLAGS[spec.engine.name]
    if given is not None and flagged is not None and given != flagged:
        raise InvalidSpec("engine.extraArgs", f"{flag} {flagged:,} and contextLength {given:,} disagree (the flag would win at "
                                              f"start-up); give contextLength alone")
    context = given if given is not None else flagged
    if context is not None and context > model.max_context_tokens:
        field = "contextLength" if given is not None else "engine.extraArgs"
        raise InvalidSpec(field, f"{context:,} tokens is over the model's context of {model.max_context_tokens:,} ({model.name}: its "
                                 f"max_position_embeddings with any RoPE scaling); {spec.engine.name.value} refuses a longer "
                                 f"{flag}: at most {model.max_context_tokens:,}")
    return context


def engine_extra_args(spec: PlanSpec) -> tuple[str, ...]:
    """The flags appended to the planned command line, for the CLI's commands and the operator's pods alike: the served
    context's flag (contextLength; not again when engine.extraArgs sets it), then engine.extraArgs as given."""
    flag = CONTEXT_FLAGS[spec.engine.name]
    if spec.contextLength is None or context_flag_tokens(spec) is not None:
        return tuple(spec.engine.extraArgs)
    return (flag, str(spec.contextLength), *spec.engine.extraArgs)


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
        par = _parallelism(tp=ls.tp, pp=ls.pp, dp=ls.dp, ep=ls.ep, dp_attention=ls.dpAttention)
        return Layout.replicas(ls.replicas, par, _knobs(None, ls.engineArgs, spec.kvCacheDtype), prec)
    assert ls.prefill is not None and ls.decode is not None
    kinds = _role_kinds(spec, ls)
    roles = []
    for name, r in (("prefill", ls.prefill), ("decode", ls.decode)):
        par = _parallelism(tp=r.tp, pp=r.pp, dp=r.dp, ep=ls.ep if r.ep is None else r.ep, dp_attention=ls.role_attention(r))
        roles.append(RoleLayout(r.count, par, _knobs(r.engineArgs, ls.engineArgs, spec.kvCacheDtype), kinds.get(name, "")))
    return Layout.pd(roles[0], roles[1], prec)


def _parallelism(*, tp: int, pp: int, dp: int, ep: bool | int, dp_attention: bool) -> Parallelism:
    """One instance's shape in the planner's terms (vLLM's: `tp` GPUs per attention rank, `dp` ranks). Under dpAttention
    the user's tp is the engine's TP size, the whole group whose attention dp splits (SGLang's --tp-size): tp 4, dp 4 is
    Parallelism(tp=1, dp=4), which SGLang renders back as --tp-size 4 (planner.engines.args). `ep`: the layout's flag
    (all of a stage's GPUs), or a role's EP size (Parallelism.with_ep)."""
    tp_attention = tp // dp if dp_attention else tp
    if isinstance(ep, bool):
        return Parallelism(tp=tp_attention, pp=pp, dp=dp, ep=ep)
    return Parallelism.with_ep(tp=tp_attention, pp=pp, dp=dp, ep=ep)


def _role_kinds(spec: PlanSpec, ls: LayoutSpec) -> dict[str, str]:
    """EveryRoleNamed: the catalog id of each PD role's GPU kind when either role names one (the other runs on
    hardware.gpu, named too, so a status round trip gives the same layout); empty when neither does."""
    given = {name: r.gpu for name, r in (("prefill", ls.prefill), ("decode", ls.decode)) if r is not None and r.gpu}
    if not given:
        return {}
    default = resolve_gpu(spec.hardware.gpu).id
    return {name: resolve_gpu(given[name], field=f"layout.{name}.gpu").id if name in given else default for name in ("prefill", "decode")}


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


def _check_node_size(spec: PlanSpec, ls: LayoutSpec, gpus_per_node: int, gpu_id: str) -> None:
    """A layout's tensor-parallel group fits one node unless the spec allows cross-node TP, as the search holds
    its candidates (SearchSpace.allow_cross_node_tp); pipeline stages may span nodes."""
    if spec.hardware.allowCrossNodeTP:
        return
    roles = [("layout", ls.tp)] if ls.kind is LayoutKind.REPLICAS else [
        (f"layout.{name}", r.tp) for name, r in (("prefill", ls.prefill), ("decode", ls.decode)) if r is not None]
    for where, tp in roles:
        if tp > gpus_per_node:
            raise InvalidSpec(f"{where}.tp", f"TP {tp} spans more than one {gpus_per_node}-GPU node of {gpu_id}; at most "
                                             f"{gpus_per_node}, or set hardware.allowCrossNodeTP: true")


def to_problem(spec: PlanSpec, *, pinned: Layout | None = None, current: Layout | None = None) -> Problem:
    """Convert a validated spec into the planner's Problem (raises InvalidSpec for unknown model or GPU)."""
    hw = spec.hardware
    gpu = resolve_gpu(hw.gpu, nvlink_gbps=hw.nvlinkGBps, nic_gbit=hw.nicGbps, gpus_per_node=hw.gpusPerNode)
    version = resolve_version(spec.engine.name, version=spec.engine.version, image=spec.engine.image)
    requested = uncovered_release(spec.engine.name, version=spec.engine.version, image=spec.engine.image)
    model = _towers_loaded(spec, _model(spec), version)
    context, own_context = served_context(spec, model), model.max_context_tokens
    if context is not None and context < model.max_context_tokens:
        note = (f"the engines serve a {context:,}-token context ({CONTEXT_FLAGS[spec.engine.name]}), below the model's "
                f"{model.max_context_tokens:,}: longer requests are refused, as the engines refuse them")
        model = replace(model, max_context_tokens=context, assumptions=(*model.assumptions, note))
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
        _check_node_size(spec, spec.layout, gpu.gpus_per_node, gpu.id)
        pinned = to_layout(spec, precision=precision)
    elif pinned is not None and "precision" not in spec.model_fields_set:
        pinned = replace(pinned, precision=precision)  # a layout built before the model was read (the operator's pin)
    problem = Problem(
        model=model, gpu=gpu, engine=spec.engine.name, precision=precision, max_gpus=hw.maxGPUs,
        engine_version=version, engine_version_requested=requested,
        workload=workload, slo=_slo(spec), objective=spec.objective, search=_search(spec, model),
        pinned=pinned, current=current, simulation=SimulationBudget(requests=spec.simulation.requests, seed=spec.simulation.seed,
                                    warmup_requests=spec.simulation.warmupRequests),
    )
    try:
        context_rejection(problem)   # a request longer than the model's context: no layout serves it
    except InvalidSpec as exc:
        if context is None or context >= own_context:
            raise
        field = "contextLength" if spec.contextLength is not None else "engine.extraArgs"
        raise InvalidSpec(exc.field, f"{exc.message.split(';')[0]}; the engines are told to serve {context:,} tokens ({field}): raise "
                                     f"it, up to the model's {own_context:,}, or shorten the requests") from None
    return problem
