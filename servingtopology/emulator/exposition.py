"""vLLM- and SGLang-shaped Prometheus metrics for an emulated engine, in the text exposition format.

Names, labels and bucket edges follow shared/reference/engines.md §1.4 (vLLM: `model_name`, `engine`) and
§2.3 (SGLang: `model_name`; scheduler gauges add `engine_type`, `tp_rank`, `pp_rank`). Fed by
emulator/instance.py from the simulator's progress; rendered on every scrape. Thread-safe; no I/O.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from servingtopology.emulator.command_parser import EngineConfig
from servingtopology.emulator.seam import Gauges, Progress
from servingtopology.planner.engines.caps import load_caps, resolve_version
from servingtopology.planner.engines.metric_names import SglangMetric as S
from servingtopology.planner.engines.metric_names import VllmMetric as V
from servingtopology.planner.layout import Engine, Role

__all__ = ["EngineMetrics", "Histogram"]

# Values of the labels a release adds to some metrics (from the capability data's label expressions).
_LABEL_VALUES = {"is_streaming": "true", "cache_source": "device", "finished_reason": "length", "source": "local_compute"}

_VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                      40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                         480.0, 960.0, 1920.0, 7680.0)
_SGL_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_SGL_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
                    0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
_SGL_LATENCY_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
                        800.0, 1200.0, 2400.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


@dataclass(slots=True)
class Histogram:
    """A cumulative-bucket histogram; `observe` may add several identical observations at once."""

    edges: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.edges)

    def observe(self, value: float, times: int = 1) -> None:
        index = bisect.bisect_left(self.edges, value)
        if index < len(self.edges):
            self.counts[index] += times
        self.total += value * times
        self.count += times

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for edge, n in zip(self.edges, self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{_fmt(edge)}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {_fmt(self.total)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{float(value):.1f}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())


class EngineMetrics:
    """The metric state of one emulated engine; `record` after each advance, `render` on each scrape."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.caps = load_caps(config.engine.value, config.version or resolve_version(config.engine))
        self._lock = threading.Lock()
        vllm = config.engine is Engine.VLLM
        self._ttft = Histogram(_VLLM_TTFT_BUCKETS if vllm else _SGL_TTFT_BUCKETS)
        self._itl = Histogram(_VLLM_ITL_BUCKETS if vllm else _SGL_ITL_BUCKETS)
        self._e2e = Histogram(_VLLM_LATENCY_BUCKETS if vllm else _SGL_LATENCY_BUCKETS)
        self._queue = Histogram(_VLLM_LATENCY_BUCKETS if vllm else _SGL_LATENCY_BUCKETS)
        self._prompt_len = Histogram(_TOKEN_BUCKETS)
        self._output_len = Histogram(_TOKEN_BUCKETS)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._cached_tokens = 0
        self._queried_tokens = 0
        self._finished = 0
        self._preemptions = 0
        self._gauges = Gauges(0, 0, 0, 1)
        self._recent_tokens_s = 0.0

    def record(self, progress: Progress, gauges: Gauges, *, window_s: float) -> None:
        """Adds one advance's completions and token counts; `window_s` is the wall time it covered."""
        with self._lock:
            for c in progress.completions:
                self._ttft.observe(c.ttft_s)
                if c.output_tokens > 1:
                    self._itl.observe(c.mean_itl_s, c.output_tokens - 1)
                self._e2e.observe(c.e2e_s)
                self._queue.observe(c.queue_s)
                self._prompt_len.observe(c.input_tokens)
                self._output_len.observe(c.output_tokens)
                self._cached_tokens += c.cached_tokens
                self._queried_tokens += c.input_tokens
                self._finished += 1
            self._prompt_tokens += progress.prompt_tokens
            self._generation_tokens += progress.generation_tokens
            self._preemptions += progress.preemptions
            self._gauges = gauges
            if window_s > 0:
                self._recent_tokens_s = progress.generation_tokens / window_s

    def _labels_for(self, name: str, base: dict[str, str]) -> str:
        """`base` plus the labels the release adds to this metric (its source's label expression, e.g.
        SGLang's `cache_source` on cached tokens and `is_streaming` on request metrics)."""
        declared = name if self.caps.metric(name) else name.removesuffix("_total")
        metric = self.caps.metric(declared)
        extra = re.findall(r"['\"]([a-z_]+)['\"]", metric.labels_expr) if metric else []
        return _labels({**base, **{k: _LABEL_VALUES.get(k, "") for k in extra}})

    def render(self) -> str:
        """The `/metrics` body."""
        with self._lock:
            return self._render_vllm() if self.config.engine is Engine.VLLM else self._render_sglang()

    def _render_vllm(self) -> str:
        c, g = self.config, self._gauges
        base = _labels({"model_name": c.served_model_name, "engine": "0"})
        by = {"model_name": c.served_model_name, "engine": "0"}
        usage = g.kv_used_tokens / g.kv_capacity_tokens if g.kv_capacity_tokens else 0.0
        block_size = 16
        info = _labels({"block_size": str(block_size), "cache_dtype": c.kv_cache_dtype,
                        "gpu_memory_utilization": str(c.memory_fraction or 0.9),
                        "num_gpu_blocks": str(g.kv_capacity_tokens // block_size), "engine": "0"})
        lines = [
            *_family(V.REQUESTS_RUNNING, "gauge", [f"{V.REQUESTS_RUNNING}{{{base}}} {g.running}"]),
            *_family(V.REQUESTS_WAITING, "gauge", [f"{V.REQUESTS_WAITING}{{{base}}} {g.waiting}"]),
            *_family(V.KV_CACHE_USAGE, "gauge", [f"{V.KV_CACHE_USAGE}{{{base}}} {_fmt(usage)}"]),
            *_family(V.CACHE_CONFIG_INFO, "gauge", [f"{V.CACHE_CONFIG_INFO}{{{info}}} 1.0"]),
            *_counter(V.PROMPT_TOKENS, self._labels_for(V.PROMPT_TOKENS, by), self._prompt_tokens),
            *_counter(V.GENERATION_TOKENS, base, self._generation_tokens),
            *_counter(V.PREFIX_CACHE_QUERIES, base, self._queried_tokens),
            *_counter(V.PREFIX_CACHE_HITS, base, self._cached_tokens),
            *_counter(V.PREEMPTIONS, base, self._preemptions),
            *_family(V.REQUEST_SUCCESS, "counter",
                     [f'{V.REQUEST_SUCCESS}{{{base},finished_reason="length"}} {self._finished}']),
            *_family(V.TTFT, "histogram", self._ttft.lines(V.TTFT, base)),
            *_family(V.INTER_TOKEN_LATENCY, "histogram", self._itl.lines(V.INTER_TOKEN_LATENCY, base)),
            *_family(V.E2E_LATENCY, "histogram", self._e2e.lines(V.E2E_LATENCY, base)),
            *_family(V.QUEUE_TIME, "histogram", self._queue.lines(V.QUEUE_TIME, base)),
            *_family(V.PROMPT_LENGTH, "histogram", self._prompt_len.lines(V.PROMPT_LENGTH, base)),
            *_family(V.GENERATION_LENGTH, "histogram",
                     self._output_len.lines(V.GENERATION_LENGTH, base)),
        ]
        return "\n".join(lines) + "\n"

    def _render_sglang(self) -> str:
        c, g = self.config, self._gauges
        engine_type = {Role.PREFILL: "prefill", Role.DECODE: "decode"}.get(c.role, "unified")
        model = {"model_name": c.served_model_name}

        def tok(name: str) -> str:
            return self._labels_for(name, model)
        sched_base = {"model_name": c.served_model_name, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0"}
        sched = _labels(sched_base)
        # Scheduler gauges: one series per attention-DP rank (label dp_rank), but only the first rank reports unless
        # --enable-metrics-for-all-schedulers (sglang/srt/observability/metrics_collector.py). The instance's totals
        # are shared evenly over its ranks.
        ranks = c.dp if c.dp_attention else 1
        reporting = range(ranks) if (c.metrics_all_ranks or ranks == 1) else range(1)

        def gauge(name: str, total: float, *, share: bool = True, fmt: bool = False) -> list[str]:
            samples = []
            for rank in reporting:
                labels = _labels({**sched_base, "dp_rank": str(rank)}) if c.dp_attention else sched
                value = total / ranks if share else total
                samples.append(f"{name}{{{labels}}} {_fmt(value) if fmt or (share and ranks > 1) else int(value)}")
            return _family(name, "gauge", samples)
        usage = g.kv_used_tokens / g.kv_capacity_tokens if g.kv_capacity_tokens else 0.0
        hit_rate = self._cached_tokens / self._queried_tokens if self._queried_tokens else 0.0
        lines = [
            *gauge(S.RUNNING_REQS, g.running),
            *gauge(S.QUEUE_REQS, g.waiting),
            *gauge(S.USED_TOKENS, g.kv_used_tokens),
            *gauge(S.TOKEN_USAGE, usage, share=False, fmt=True),
            *gauge(S.CACHE_HIT_RATE, hit_rate, share=False, fmt=True),
            *gauge(S.GEN_THROUGHPUT, self._recent_tokens_s, fmt=True),
            *gauge(S.RETRACTED_REQS, 0),
            *_counter(S.PROMPT_TOKENS, tok(S.PROMPT_TOKENS), self._prompt_tokens),
            *_counter(S.GENERATION_TOKENS, tok(S.GENERATION_TOKENS), self._generation_tokens),
            *_counter(S.CACHED_TOKENS, tok(S.CACHED_TOKENS), self._cached_tokens),
            *_counter(S.REQUESTS, tok(S.REQUESTS), self._finished),
            *_family(S.TTFT, "histogram",
                     self._ttft.lines(S.TTFT, tok(S.TTFT))),
            *_family(S.INTER_TOKEN_LATENCY, "histogram",
                     self._itl.lines(S.INTER_TOKEN_LATENCY, tok(S.INTER_TOKEN_LATENCY))),
            *_family(S.E2E_LATENCY, "histogram",
                     self._e2e.lines(S.E2E_LATENCY, tok(S.E2E_LATENCY))),
            *_family(S.QUEUE_TIME, "histogram", self._queue.lines(S.QUEUE_TIME, sched)),
        ]
        return "\n".join(lines) + "\n"


def _family(name: str, kind: str, samples: list[str]) -> list[str]:
    return [f"# HELP {name} Emulated by servingtopology (simulated, not measured).", f"# TYPE {name} {kind}", *samples]


def _counter(name: str, labels: str, value: int) -> list[str]:
    return _family(name, "counter", [f"{name}{{{labels}}} {value}"])
