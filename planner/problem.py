"""The planner's input (`Problem`) and output (`Decision`, `Prediction`, `FunnelStage`, `PdRatio`) values.

Built by the spec conversion (CLI, operator) and returned by `decide`. Frozen dataclasses only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from servingtopology.planner.arch import ModelArch
from servingtopology.planner.hardware import Gpu, Precision
from servingtopology.planner.layout import Engine, KvDtype, Layout, LayoutKind, Parallelism
from servingtopology.planner.workload import Objective, Slo, Workload

__all__ = ["SearchSpace", "SimulationBudget", "Problem", "Prediction", "FunnelStage", "Candidate", "PdRatio", "Decision"]


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """What the funnel may enumerate. Empty knob tuples mean "the preset's list"."""

    layouts: tuple[LayoutKind, ...] = (LayoutKind.REPLICAS, LayoutKind.PD)
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2)
    dp: tuple[int, ...] = (1,)
    max_num_seqs: tuple[int, ...] = (64, 128, 256)
    max_num_batched_tokens: tuple[int, ...] = (2048, 8192)
    memory_fraction: tuple[float, ...] = (0.9,)
    kv_dtypes: tuple[KvDtype, ...] = (KvDtype.AUTO,)
    allow_cross_node_tp: bool = False
    top_k: int = 8


@dataclass(frozen=True, slots=True)
class SimulationBudget:
    """What stage 6 may simulate per layout: at most `requests` (the spec's simulation.requests; planner.search.stage6_size
    lowers it to the work rule and 600), drawn under `seed`, the first `warmup_requests` (at most a quarter of them) left
    out of the percentiles. The defaults are the operator's stage 6 before the spec's figures reached it."""

    requests: int = 600
    seed: int = 0
    warmup_requests: int = 50


@dataclass(frozen=True, slots=True)
class Problem:
    """Everything `decide` needs; `pinned` skips the search and only predicts that layout."""

    model: ModelArch
    gpu: Gpu
    engine: Engine
    precision: Precision
    max_gpus: int
    workload: Workload
    slo: Slo
    objective: Objective = Objective.GOODPUT_PER_GPU
    search: SearchSpace = field(default_factory=SearchSpace)
    pinned: Layout | None = None
    current: Layout | None = None
    # A deployment calibration's bounded time factors, (term, factor) pairs of planner.perf.deployment_fit.TERMS (the operator's
    # own fit of its measurements, or a `calibrate` file): decide and predict_layout predict with them applied. () = none.
    factors: tuple[tuple[str, float], ...] = ()
    # The engine release (planner/engines/caps.py); empty: the newest covered release of `engine`.
    engine_version: str = ""
    # The release the spec named when the capability data does not cover it and `engine_version` is the nearest covered
    # one it is planned at (caps.nearest_covered); empty otherwise. The record says so.
    engine_version_requested: str = ""
    simulation: SimulationBudget = field(default_factory=SimulationBudget)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted figures of one layout at the problem's load (times in ms at the SLO percentiles)."""

    ttft_ms: float
    tpot_ms: float
    throughput_tok_s: float          # output tokens per second, whole deployment
    capacity_rps: float              # the highest request rate the layout carries within the SLOs
    goodput_rps: float               # requests/s meeting every SLO at the problem's load
    goodput_per_gpu: float
    tokens_per_s_per_user: float     # 1000 / mean TPOT
    kv_pool_tokens: int              # per attention-DP rank (decode role for PD)
    max_request_tokens: int
    meets_slo: bool
    source: str = "analytical"       # "analytical" or "simulated"
    # Of ttft_ms, the steps between the engine's first token and the client's (perf.step.delivery_s): the engine's own
    # TTFT histogram is taken before most of them, so what is compared with it is `engine_ttft_ms` (the client's less them).
    delivery_ms: float = 0.0
    # Of ttft_ms, the front end's part (perf.predict.front_end_s: HTTP, tokenizer, the hand-off to the scheduler).
    front_end_ms: float = 0.0

    @property
    def engine_ttft_ms(self) -> float:
        """TTFT as the engine's own metric counts it (vllm:time_to_first_token_seconds): the client's less the delivery."""
        return self.ttft_ms - self.delivery_ms


@dataclass(frozen=True, slots=True)
class Candidate:
    layout: Layout
    prediction: Prediction
    score: float
    why: str = ""


@dataclass(frozen=True, slots=True)
class FunnelStage:
    stage: str
    admitted: int
    rejected: int
    seconds: float
    reasons: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PdRatio:
    """A chosen prefill:decode split: counts, the roles' shapes, their per-instance capacities and why."""

    prefill_count: int
    decode_count: int
    prefill: Parallelism
    decode: Parallelism
    prefill_rps_per_instance: float
    decode_rps_per_instance: float
    meets_slo: bool
    reason: str

    @property
    def label(self) -> str:
        """The ratio in lowest terms, `3:1`."""
        g = math.gcd(self.prefill_count, self.decode_count) or 1
        return f"{self.prefill_count // g}:{self.decode_count // g}"

    @property
    def balanced(self) -> float:
        """Prefill instances per decode instance at which both roles saturate together (μd/μp)."""
        return self.decode_rps_per_instance / max(self.prefill_rps_per_instance, 1e-12)


@dataclass(frozen=True, slots=True)
class Decision:
    """The plan: the best candidate, ranked alternatives, the funnel, and the reasons."""

    best: Candidate
    alternatives: tuple[Candidate, ...]
    funnel: tuple[FunnelStage, ...]
    candidates_total: int
    kv_bytes_per_token: int
    weight_bytes: float
    reasons: tuple[str, ...] = ()
    current: Candidate | None = None  # the current layout's prediction, when one was given
    evaluated: tuple[Candidate, ...] = ()  # every refined candidate (for Pareto plots)
    pd_ratio: PdRatio | None = None        # for a PD choice: the prefill:decode decision for the load, with its reason
    uncalibrated: Candidate | None = None  # with Problem.factors: the chosen layout predicted without them


