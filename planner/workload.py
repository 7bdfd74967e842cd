"""Workload and SLO values: arrival process, request-length distributions, prefix sharing, targets.

Shared by the funnel, the simulator and the operator's estimator. Pure; sampling takes a numpy
Generator so results are deterministic under a seed.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["LengthKind", "LengthDist", "Workload", "Slo", "Objective"]


class LengthKind(enum.StrEnum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"
    EMPIRICAL = "empirical"


def _normal_quantile(q: float) -> float:
    """Standard normal quantile (statistics.NormalDist)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(min(max(q, 1e-12), 1 - 1e-12))


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Token-length distribution. FIXED uses `mean`; UNIFORM `low`..`high`; LOGNORMAL `mean` and `sigma`
    (of the underlying normal); EMPIRICAL draws from `values`."""

    kind: LengthKind = LengthKind.FIXED
    mean: float = 512.0
    low: int = 0
    high: int = 0
    sigma: float = 0.0
    values: tuple[int, ...] = ()

    @staticmethod
    def fixed(tokens: int) -> LengthDist:
        return LengthDist(LengthKind.FIXED, float(tokens))

    @property
    def expected_tokens(self) -> float:
        if self.kind is LengthKind.UNIFORM:
            return (self.low + self.high) / 2.0
        if self.kind is LengthKind.EMPIRICAL and self.values:
            return float(sum(self.values)) / len(self.values)
        return self.mean

    @property
    def p99_tokens(self) -> float:
        """An upper quantile used for capacity checks (the longest request a layout must hold)."""
        return self.quantile(0.99)

    def quantile(self, q: float) -> float:
        """Length at quantile q in (0, 1); lognormal uses the closed form, empirical the sample quantile."""
        if self.kind is LengthKind.FIXED:
            return self.mean
        if self.kind is LengthKind.UNIFORM:
            return self.low + q * (self.high - self.low)
        if self.kind is LengthKind.EMPIRICAL and self.values:
            return float(np.quantile(np.asarray(self.values), q))
        mu = math.log(self.mean) - self.sigma**2 / 2
        return math.exp(mu + _normal_quantile(q) * self.sigma)

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
        """Draw n lengths (at least 1 token each)."""
        if self.kind is LengthKind.FIXED:
            out = np.full(n, round(self.mean), dtype=np.int64)
        elif self.kind is LengthKind.UNIFORM:
            out = rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        elif self.kind is LengthKind.EMPIRICAL:
            out = rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
        else:
            mu = math.log(self.mean) - self.sigma**2 / 2
            out = np.rint(rng.lognormal(mu, self.sigma, size=n)).astype(np.int64)
        return np.maximum(out, 1)


@dataclass(frozen=True, slots=True)
class Workload:
    """Open loop at `arrival_rate_rps`, or closed loop with `concurrency` clients (exactly one is set).

    prefix_share: fraction of each prompt shared with earlier prompts (cacheable), 0..1.
    """

    input_tokens: LengthDist
    output_tokens: LengthDist
    arrival_rate_rps: float | None = None
    concurrency: int | None = None
    prefix_share: float = 0.0
    arrival_cv: float = 1.0  # coefficient of variation of inter-arrival times (1 = Poisson)


class Objective(enum.StrEnum):
    GOODPUT_PER_GPU = "goodput-per-gpu"
    MIN_GPUS = "min-gpus"


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets at percentiles (e.g. p95 TTFT ≤ 200 ms)."""

    ttft_ms: float
    tpot_ms: float
    ttft_percentile: float = 95.0
    tpot_percentile: float = 95.0
