"""What a simulation returns: per-request arrays, the step timeline, and their summary figures.

Built by `simulate` from the run's ledger; read by the planner's funnel, the CLI and benchmarks.
Percentiles use numpy's linear interpolation; a request that did not finish is left out of the
latency figures and counted in `unfinished`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from servingtopology.planner.slo import meets_slo_ms
from servingtopology.planner.workload import Slo

__all__ = ["Percentiles", "SimSummary", "SimResult", "percentiles"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Percentiles:
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99}

    def at(self, q: float) -> float:
        """The figure at percentile q (one of 50, 90, 95, 99; others interpolate between them)."""
        table = {50.0: self.p50, 90.0: self.p90, 95.0: self.p95, 99.0: self.p99}
        if q in table:
            return table[q]
        xs = sorted(table)
        return float(np.interp(q, xs, [table[x] for x in xs]))


def percentiles(values: F64, weights: F64 | None = None) -> Percentiles:
    """Mean and p50/p90/p95/p99 of `values` (weighted when `weights` is given); NaN when empty."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        nan = float("nan")
        return Percentiles(nan, nan, nan, nan, nan)
    if weights is None:
        q = np.percentile(v, [50, 90, 95, 99])
        return Percentiles(float(v.mean()), *(float(x) for x in q))
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    total = float(cum[-1])
    def at(p: float) -> float:
        return float(v[min(int(np.searchsorted(cum, p / 100.0 * total, side="left")), len(v) - 1)])
    return Percentiles(float((v * w).sum() / total), at(50), at(90), at(95), at(99))


@dataclass(frozen=True, slots=True)
class SimSummary:
    """Headline figures of one run (times in ms, rates per second)."""

    requests: int
    finished: int
    unfinished: int
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    latency_ms: Percentiles
    queue_ms: Percentiles
    throughput_tok_s: float          # output tokens per second over the run
    throughput_tok_s_per_gpu: float
    input_tok_s: float
    request_rps: float
    goodput_rps: float               # requests/s meeting every SLO (NaN without an SLO)
    kv_utilisation_mean: float       # time-weighted share of the pool in use
    kv_utilisation_max: float
    preemptions: int
    cached_token_share: float        # prompt tokens served from the prefix cache
    duration_s: float
    gpus: int

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.as_dict() if isinstance(value, Percentiles) else value
        return out


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-request arrays (indexed like the request set) and the timeline of one simulated run."""

    arrival_s: F64
    scheduled_s: F64
    first_token_s: F64
    finish_s: F64
    prompt_tokens: I64
    output_tokens: I64
    cached_tokens: I64
    preemptions: I64
    itl_s: F64                      # inter-token gaps (s), each with a weight (sequences sharing it)
    itl_weight: F64
    timeline: dict[str, F64] = field(default_factory=dict)
    preemption_times_s: F64 = field(default_factory=lambda: np.zeros(0))  # when each preemption happened
    gpus: int = 1
    end_s: float = 0.0
    label: str = ""

    @property
    def finished(self) -> npt.NDArray[np.bool_]:
        return ~np.isnan(self.finish_s)

    @property
    def ttft_ms(self) -> F64:
        return (self.first_token_s - self.arrival_s) * 1e3

    @property
    def tpot_ms(self) -> F64:
        """Mean gap after the first token, per request with more than one output token (NaN otherwise)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            t = (self.finish_s - self.first_token_s) / (self.output_tokens - 1) * 1e3
        return np.where(self.output_tokens > 1, t, np.nan)

    @property
    def latency_ms(self) -> F64:
        return (self.finish_s - self.arrival_s) * 1e3

    @property
    def queue_ms(self) -> F64:
        return (self.scheduled_s - self.arrival_s) * 1e3

    def meets(self, slo: Slo) -> npt.NDArray[np.bool_]:
        """Finished requests within both the TTFT and the TPOT target."""
        tpot = np.nan_to_num(self.tpot_ms, nan=0.0)
        return np.asarray(self.finished & meets_slo_ms(slo, ttft_ms=self.ttft_ms, tpot_ms=tpot), dtype=np.bool_)

    def goodput_rps(self, slo: Slo, *, warmup_requests: int = 0) -> float:
        """Requests per second that met every SLO, over the measured window."""
        keep = self._window(warmup_requests)
        span = self._span_s(keep)
        return float(self.meets(slo)[keep].sum()) / span if span > 0 else 0.0

    def slo_attainment(self, slo: Slo, *, warmup_requests: int = 0) -> float:
        """The share of measured requests that finished within both the TTFT and the TPOT target (unfinished: missed)."""
        keep = self._window(warmup_requests)
        return float(self.meets(slo)[keep].sum()) / int(keep.sum()) if keep.any() else 0.0

    def offered_rps(self, *, warmup_requests: int = 0) -> float:
        """The arrival rate of the measured requests: arrivals per second between the first and the last arrival."""
        arrivals = self.arrival_s[self._window(warmup_requests)]
        span = float(arrivals.max() - arrivals.min()) if len(arrivals) > 1 else 0.0
        return (len(arrivals) - 1) / span if span > 0 else 0.0

    def _window(self, warmup_requests: int) -> npt.NDArray[np.bool_]:
        keep = np.ones(len(self.arrival_s), dtype=bool)
        keep[: max(0, warmup_requests)] = False
        return keep & ~np.isnan(self.arrival_s)

    def _span_s(self, keep: npt.NDArray[np.bool_]) -> float:
        done = keep & self.finished
        if not done.any():
            return 0.0
        return float(np.nanmax(self.finish_s[done]) - np.nanmin(self.arrival_s[keep]))

    def summary(self, slo: Slo | None = None, *, warmup_requests: int = 0) -> SimSummary:
        """Percentiles and rates over the requests after the first `warmup_requests`."""
        keep = self._window(warmup_requests)
        done = keep & self.finished
        span = self._span_s(keep)
        out_tokens = float(self.output_tokens[done].sum())
        in_tokens = float(self.prompt_tokens[done].sum())
        tl = self.timeline
        kv_mean = kv_max = 0.0
        if tl and len(tl.get("t_s", ())) > 1:
            means = []
            for inst in np.unique(tl["instance"]):  # time-weighted per instance, then averaged over instances
                mine = tl["instance"] == inst
                t, kv = tl["t_s"][mine], tl["kv_used_frac"][mine]
                dt = np.diff(t, prepend=t[0])
                means.append(float((kv * dt).sum() / dt.sum()) if dt.sum() > 0 else float(kv.mean()))
            kv_mean = float(np.mean(means))
            kv_max = float(tl["kv_used_frac"].max())
        tpot = self.tpot_ms[done]

        def rate(x: float) -> float:
            return x / span if span > 0 else 0.0

        return SimSummary(
            requests=int(keep.sum()),
            finished=int(done.sum()),
            unfinished=int(keep.sum() - done.sum()),
            ttft_ms=percentiles(self.ttft_ms[done]),
            tpot_ms=percentiles(tpot[~np.isnan(tpot)]),
            itl_ms=percentiles(self.itl_s * 1e3, self.itl_weight) if len(self.itl_s) else percentiles(np.zeros(0)),
            latency_ms=percentiles(self.latency_ms[done]),
            queue_ms=percentiles(self.queue_ms[done]),
            throughput_tok_s=rate(out_tokens),
            throughput_tok_s_per_gpu=rate(out_tokens) / max(self.gpus, 1),
            input_tok_s=rate(in_tokens),
            request_rps=rate(float(done.sum())),
            goodput_rps=self.goodput_rps(slo, warmup_requests=warmup_requests) if slo is not None else float("nan"),
            kv_utilisation_mean=kv_mean,
            kv_utilisation_max=kv_max,
            preemptions=int(self.preemptions[keep].sum()),
            cached_token_share=float(self.cached_tokens[done].sum()) / in_tokens if in_tokens else 0.0,
            duration_s=span,
            gpus=self.gpus,
        )
