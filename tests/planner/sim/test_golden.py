"""Small golden scenarios: their summaries must stay within 0.5 % of the stored ones.

The step model (and the PD transfer time) here is a fixed affine one, so a recalibration of perf.py does not move these figures;
only a change in scheduling does. Regenerate deliberately with SIM_REGEN_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import RouterPolicy, Sessions, SimResult, simulate
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

GOLDEN = Path(__file__).parent / "golden" / "summaries.json"
TOLERANCE = 0.005
MODEL, GPU = resolve_model("llama-3.1-8b"), resolve_gpu("h100_sxm")


@dataclass(frozen=True)
class Affine:
    """5 ms per step, 20 µs per prompt token, 0.1 ms per decoding sequence, 20 ns per context token."""

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float, decode_context_tokens: float) -> float:
        return 5e-3 + 20e-6 * prefill_tokens + 1e-4 * decode_tokens + 2e-8 * decode_context_tokens


def _chat(rate: float) -> Workload:
    return Workload(LengthDist(LengthKind.LOGNORMAL, 900.0, sigma=0.8), LengthDist(LengthKind.LOGNORMAL, 250.0, sigma=0.6),
                    arrival_rate_rps=rate)


SCENARIOS: dict[str, Callable[[], SimResult]] = {
    # one vLLM replica pushed into preemption by a small pool
    "vllm-preempting": lambda: simulate(Layout.replicas(1, Parallelism(), EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048)),
                                        model=MODEL, gpu=GPU, engine=Engine.VLLM, workload=_chat(12.0), num_requests=300, seed=11,
                                        pool_tokens={Role.AGGREGATED: 30_000}, step_model=lambda r, rl: Affine()),
    # two SGLang replicas serving multi-turn sessions with prefix-affinity routing
    "sglang-sessions": lambda: simulate(Layout.replicas(2, Parallelism()), model=MODEL, gpu=GPU, engine=Engine.SGLANG,
                                        workload=Workload(LengthDist.fixed(300), LengthDist.fixed(120), concurrency=16),
                                        num_requests=240, seed=5, sessions=Sessions(LengthDist(LengthKind.UNIFORM, low=2, high=6)),
                                        router=RouterPolicy.PREFIX_AFFINITY, step_model=lambda r, rl: Affine()),
    # PD 1P2D with a decode pool that makes transfers wait
    "vllm-pd": lambda: simulate(Layout.pd(RoleLayout(1, Parallelism()), RoleLayout(2, Parallelism())), model=MODEL, gpu=GPU,
                                engine=Engine.VLLM, workload=_chat(10.0), num_requests=300, seed=2, transfer_s=lambda tokens: 1e-4 + 2e-6 * tokens,
                                pool_tokens={Role.PREFILL: 50_000, Role.DECODE: 20_000}, step_model=lambda r, rl: Affine()),
}


def _figures(result: SimResult) -> dict[str, float]:
    s = result.summary()
    return {
        "finished": float(s.finished), "ttft_mean_ms": s.ttft_ms.mean, "ttft_p99_ms": s.ttft_ms.p99, "tpot_mean_ms": s.tpot_ms.mean,
        "tpot_p99_ms": s.tpot_ms.p99, "itl_p99_ms": s.itl_ms.p99, "latency_mean_ms": s.latency_ms.mean,
        "throughput_tok_s": s.throughput_tok_s, "preemptions": float(s.preemptions), "cached_token_share": s.cached_token_share,
        "kv_utilisation_mean": s.kv_utilisation_mean,
    }


def test_golden_scenarios_keep_their_summaries() -> None:
    got = {name: _figures(run()) for name, run in SCENARIOS.items()}
    if os.environ.get("SIM_REGEN_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        pytest.skip("golden summaries regenerated")
    want = json.loads(GOLDEN.read_text())
    assert set(want) == set(got)
    for name, figures in got.items():
        for key, value in figures.items():
            expected = want[name][key]
            assert math.isclose(value, expected, rel_tol=TOLERANCE, abs_tol=1e-9), f"{name}.{key}: {value} against {expected}"
