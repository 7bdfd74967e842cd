"""Every array of a few simulations, pinned bit for bit: a speed-up of the simulator must not move any simulated figure.

The runs use the real step model (`InstancePerf`, through the simulator's memo) and cover the paths the speed work
touches: the 300-request RTX 4090 vLLM replay (benchmarks/sim_speed.py's slowest case; per-request TTFT and TPOT are
also compared one by one so a failure names the request), vLLM closed loops with and without preemption pressure,
SGLang, attention DP over two ranks, several replicas open loop and a PD pair. The pins are sha256 digests of each
array's bytes (float64 / int64), taken from the code before the speed work. Regenerate deliberately, only for a change
meant to move simulated figures, with SIM_REGEN_PINNED=1 and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from servingtopology.cli.simulate import load_replay, run_replay
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import SimResult, closed_loop, simulate
from servingtopology.planner.workload import LengthDist, LengthKind, Workload
from tests.groundtruth import GROUNDTRUTH

PINS = Path(__file__).parent / "golden" / "pinned_runs.json"
REPLAY = GROUNDTRUTH / "llmservingsim_vllm_refs" / "RTX4090_Llama-3.1-8B"
H100 = resolve_gpu("h100_sxm")
KNOBS = EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192)


def _open_loop() -> Workload:
    return Workload(LengthDist(LengthKind.LOGNORMAL, 2000.0, sigma=0.7), LengthDist(LengthKind.LOGNORMAL, 300.0, sigma=0.6),
                    arrival_rate_rps=40.0)


KNOBS_64 = EngineKnobs(max_num_seqs=64, max_num_batched_tokens=8192)


def _long_prompts(prompt_tokens: float, output_tokens: float, rate_rps: float) -> Workload:
    return Workload(LengthDist(LengthKind.LOGNORMAL, prompt_tokens, sigma=0.5), LengthDist(LengthKind.LOGNORMAL, output_tokens, sigma=0.5),
                    arrival_rate_rps=rate_rps)


def _closed(name: str, engine: Engine, *, par: Parallelism | None = None, knobs: EngineKnobs = KNOBS, n: int = 1200) -> SimResult:
    return simulate(Layout.replicas(1, par or Parallelism(), knobs), model=resolve_model(name), gpu=H100, engine=engine,
                    requests=closed_loop(clients=256, input_tokens=1000, output_tokens=1000, num_requests=n))


RUNS: dict[str, Callable[[], SimResult]] = {
    "replay-rtx4090-vllm": lambda: run_replay(load_replay(REPLAY)),
    "closed-llama31-8b-vllm": lambda: _closed("llama-3.1-8b", Engine.VLLM),
    "closed-llama31-8b-sglang": lambda: _closed("llama-3.1-8b", Engine.SGLANG),
    "closed-llama2-7b-vllm-preempting": lambda: _closed("llama-2-7b", Engine.VLLM),
    "closed-llama2-7b-vllm-no-cache": lambda: _closed(
        "llama-2-7b", Engine.VLLM, knobs=EngineKnobs(max_num_seqs=256, max_num_batched_tokens=8192, enable_prefix_caching=False), n=600),
    "closed-llama31-8b-sglang-dp2": lambda: _closed("llama-3.1-8b", Engine.SGLANG, par=Parallelism(dp=2), n=800),
    "open-4xtp4-llama31-70b-vllm": lambda: simulate(
        Layout.replicas(4, Parallelism(tp=4), KNOBS), model=resolve_model("llama-3.1-70b"), gpu=H100, engine=Engine.VLLM,
        workload=_open_loop(), num_requests=600, seed=1),
    "open-2p2d-tp4-llama31-70b-sglang": lambda: simulate(
        Layout.pd(RoleLayout(2, Parallelism(tp=4), KNOBS), RoleLayout(2, Parallelism(tp=4), KNOBS)), model=resolve_model("llama-3.1-70b"),
        gpu=H100, engine=Engine.SGLANG, workload=_open_loop(), num_requests=600, seed=1),
    # SGLang attention DP with prompts of many chunks: ranks prefilling beside ranks decoding (chunk runs, ChunkRunAdvance)
    "open-dp8-sglang-llama31-8b-long-prompts": lambda: simulate(
        Layout.replicas(1, Parallelism(dp=8), EngineKnobs(max_num_seqs=32, max_num_batched_tokens=16384)), model=resolve_model("llama-3.1-8b"),
        gpu=H100, engine=Engine.SGLANG, workload=_long_prompts(60_000, 800, 1.0), num_requests=120, seed=5),
    "open-2p-dp4-1d-dp2-sglang-llama31-70b-long-prompts": lambda: simulate(
        Layout.pd(RoleLayout(2, Parallelism(tp=2, dp=4), KNOBS_64), RoleLayout(1, Parallelism(tp=4, dp=2), KNOBS_64)),
        model=resolve_model("llama-3.1-70b"), gpu=H100, engine=Engine.SGLANG, workload=_long_prompts(40_000, 300, 1.5), num_requests=150,
        seed=2),
    "open-1p1d-llama31-8b-vllm": lambda: simulate(
        Layout.pd(RoleLayout(1, Parallelism(), KNOBS), RoleLayout(1, Parallelism(), KNOBS)), model=resolve_model("llama-3.1-8b"),
        gpu=H100, engine=Engine.VLLM, workload=_open_loop(), num_requests=400, seed=4, pool_tokens={Role.DECODE: 60_000}),
}


def _arrays(r: SimResult) -> dict[str, np.ndarray]:
    out = {name: np.asarray(getattr(r, name)) for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "cached_tokens",
                                                          "preemptions", "itl_s", "itl_weight", "preemption_times_s")}
    out.update({f"timeline.{k}": np.asarray(v) for k, v in r.timeline.items()})
    out["end_s"] = np.asarray([r.end_s], dtype=np.float64)
    return out


def _digest(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()


def _per_request_ms(r: SimResult) -> dict[str, list[float]]:
    """TTFT and TPOT of each request (ms, full float precision; NaN as None)."""
    ttft = (r.first_token_s - r.arrival_s) * 1e3
    tpot = (r.finish_s - r.first_token_s) / np.maximum(r.output_tokens - 1, 1) * 1e3
    return {"ttft_ms": [None if np.isnan(x) else float(x) for x in ttft],  # type: ignore[misc]
            "tpot_ms": [None if np.isnan(x) else float(x) for x in tpot]}  # type: ignore[misc]


def _pins(name: str, r: SimResult) -> dict[str, object]:
    pins: dict[str, object] = {"sha256": {k: _digest(v) for k, v in _arrays(r).items()},
                               "finished": int(np.count_nonzero(~np.isnan(r.finish_s))), "preemptions": int(r.preemptions.sum())}
    if name.startswith("replay"):
        pins["per_request"] = _per_request_ms(r)
    return pins


@pytest.mark.parametrize("name", sorted(RUNS))
def test_simulated_arrays_are_pinned_bit_for_bit(name: str) -> None:
    got = _pins(name, RUNS[name]())
    if os.environ.get("SIM_REGEN_PINNED") == "1":
        pins = json.loads(PINS.read_text()) if PINS.exists() else {}
        pins[name] = got
        PINS.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
        pytest.skip("pinned runs regenerated")
    want = json.loads(PINS.read_text())[name]
    if "per_request" in want:
        for metric, values in want["per_request"].items():
            mine = got["per_request"][metric]  # type: ignore[index]
            diff = [i for i, (a, b) in enumerate(zip(values, mine, strict=True)) if a != b]
            assert not diff, f"{name}: {metric} of request {diff[0]} is {mine[diff[0]]}, pinned {values[diff[0]]} ({len(diff)} differ)"
    assert got["finished"] == want["finished"] and got["preemptions"] == want["preemptions"], (got["finished"], got["preemptions"])
    changed = sorted(k for k, v in want["sha256"].items() if got["sha256"].get(k) != v)  # type: ignore[attr-defined]
    assert not changed, f"{name}: arrays changed: {changed}"
    assert set(got["sha256"]) == set(want["sha256"])  # type: ignore[arg-type]


def test_pinned_runs_exercise_what_they_claim() -> None:
    """The preempting runs preempt and the replay is the 300-request run with its preemptions."""
    pins = json.loads(PINS.read_text())
    assert pins["closed-llama2-7b-vllm-preempting"]["preemptions"] > 100
    assert pins["replay-rtx4090-vllm"]["finished"] == 300 and pins["replay-rtx4090-vllm"]["preemptions"] > 100
    assert set(pins) == set(RUNS)
