"""The engines' metric names: one vocabulary for the operator's PromQL (operator/live/metrics.py) and the engine
emulator's exposition (servingtopology/emulator/exposition.py).

Each name is the series as Prometheus scrapes it (counters with their `_total`; a histogram by its base name, the
readers add `_bucket`, `_sum`, `_count`), after shared/reference/engines.md §1.4 (vLLM), §2.3 (SGLang) and the PD
routers' own exports. The names are held to the capability data generated from the released packages
(planner/data/engine_caps/*.json, `EngineCaps.metrics`) per release by tests/planner/test_metric_names.py: every
current name is one the newest covered release exports, every LEGACY name one only an older covered release exports.
Pure data; no I/O.
"""

from __future__ import annotations

import enum

from servingtopology.planner.layout import Engine

__all__ = ["VllmMetric", "SglangMetric", "RouterMetric", "LEGACY", "HISTOGRAM_SUFFIXES", "vocabulary"]


class VllmMetric(enum.StrEnum):
    """vLLM's series (V1 engine), the names older releases used last (see LEGACY)."""

    REQUESTS_RUNNING = "vllm:num_requests_running"
    REQUESTS_WAITING = "vllm:num_requests_waiting"
    KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
    GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"                  # the pre-0.12 name of KV_CACHE_USAGE
    CACHE_CONFIG_INFO = "vllm:cache_config_info"
    PROMPT_TOKENS = "vllm:prompt_tokens_total"
    GENERATION_TOKENS = "vllm:generation_tokens_total"
    PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"        # tokens since 0.9.2
    PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
    GPU_PREFIX_CACHE_QUERIES = "vllm:gpu_prefix_cache_queries_total"  # blocks; removed in 0.12
    GPU_PREFIX_CACHE_HITS = "vllm:gpu_prefix_cache_hits_total"
    PREEMPTIONS = "vllm:num_preemptions_total"
    REQUEST_SUCCESS = "vllm:request_success_total"
    TTFT = "vllm:time_to_first_token_seconds"                       # histograms from here on
    INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
    TIME_PER_OUTPUT_TOKEN = "vllm:time_per_output_token_seconds"    # 0.11's name of INTER_TOKEN_LATENCY
    REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"
    E2E_LATENCY = "vllm:e2e_request_latency_seconds"
    QUEUE_TIME = "vllm:request_queue_time_seconds"
    PROMPT_LENGTH = "vllm:request_prompt_tokens"
    GENERATION_LENGTH = "vllm:request_generation_tokens"


class SglangMetric(enum.StrEnum):
    """SGLang's series: the scheduler's gauges, the tokenizer manager's counters and histograms."""

    RUNNING_REQS = "sglang:num_running_reqs"
    QUEUE_REQS = "sglang:num_queue_reqs"
    USED_TOKENS = "sglang:num_used_tokens"
    TOKEN_USAGE = "sglang:token_usage"
    CACHE_HIT_RATE = "sglang:cache_hit_rate"
    GEN_THROUGHPUT = "sglang:gen_throughput"
    RETRACTED_REQS = "sglang:num_retracted_reqs"
    PROMPT_TOKENS = "sglang:prompt_tokens_total"
    GENERATION_TOKENS = "sglang:generation_tokens_total"
    CACHED_TOKENS = "sglang:cached_tokens_total"
    REQUESTS = "sglang:num_requests_total"
    TTFT = "sglang:time_to_first_token_seconds"                     # histograms from here on
    INTER_TOKEN_LATENCY = "sglang:inter_token_latency_seconds"
    REQUEST_TPOT = "sglang:request_time_per_output_token_seconds"
    E2E_LATENCY = "sglang:e2e_request_latency_seconds"
    QUEUE_TIME = "sglang:queue_time_seconds"
    PROMPT_LENGTH = "sglang:prompt_tokens_histogram"                # only with --collect-tokens-histogram
    GENERATION_LENGTH = "sglang:generation_tokens_histogram"


class RouterMetric(enum.StrEnum):
    """The PD routers' client-side TTFT histograms (smg; vllm-router exports request durations only)."""

    SMG_PD_TTFT = "smg_pd_ttft_seconds"          # smg's HTTP PD router, which the operator deploys
    SMG_TTFT = "smg_router_ttft_seconds"         # its gRPC router's ("help: gRPC only")


# Names only an older covered release exports: read as fallbacks after the current name, never emitted by the emulator.
LEGACY: frozenset[str] = frozenset({VllmMetric.GPU_CACHE_USAGE, VllmMetric.GPU_PREFIX_CACHE_QUERIES, VllmMetric.GPU_PREFIX_CACHE_HITS,
                                    VllmMetric.TIME_PER_OUTPUT_TOKEN})

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def vocabulary(engine: Engine) -> tuple[str, ...]:
    """Every name of the engine's vocabulary: its own series, and for SGLang its PD router's (smg)."""
    if engine is Engine.VLLM:
        return tuple(m.value for m in VllmMetric)
    return (*(m.value for m in SglangMetric), *(m.value for m in RouterMetric))
