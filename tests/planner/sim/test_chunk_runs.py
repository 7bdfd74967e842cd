"""Chunk runs (planner/sim/instance.py, ChunkRunAdvance): under SGLang attention DP, while ranks prefill long prompts a
chunk a step beside ranks that decode, the instance plans those steps without its schedulers. Every simulated array
must be what stepping through the schedulers gives, bit for bit (the pinned long-prompt runs of test_pinned_runs.py
hold it against the code before chunk runs); here against the same code with chunk runs switched off, over seeds,
engines shapes and roles, and the runs must actually happen."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import SimResult, closed_loop, simulate
from servingtopology.planner.sim.instance import Instance
from servingtopology.planner.workload import LengthDist, LengthKind, Workload
from tests.planner.sim.test_pinned_runs import _arrays

H100 = resolve_gpu("h100_sxm")
KNOBS = EngineKnobs(max_num_seqs=64, max_num_batched_tokens=8192)


def _open(prompt_tokens: float, output_tokens: float, rate_rps: float) -> Workload:
    return Workload(LengthDist(LengthKind.LOGNORMAL, prompt_tokens, sigma=0.6), LengthDist(LengthKind.LOGNORMAL, output_tokens, sigma=0.6),
                    arrival_rate_rps=rate_rps)


CASES: dict[str, Callable[[int], SimResult]] = {
    # one aggregated instance, 4 ranks: a rank prefilling 20k-token prompts in 2,048-token chunks beside decoding ranks
    "dp4-open": lambda seed: simulate(Layout.replicas(1, Parallelism(dp=4), KNOBS), model=resolve_model("llama-3.1-8b"), gpu=H100,
                                      engine=Engine.SGLANG, workload=_open(20_000, 300, 2.0), num_requests=80, seed=seed),
    # small chunks (256 tokens a rank) beside many long decodes: steps as long as the slowest decoding rank's
    "dp4-small-chunks": lambda seed: simulate(Layout.replicas(1, Parallelism(dp=4), EngineKnobs(max_num_seqs=64, max_num_batched_tokens=1024)),
                                              model=resolve_model("llama-3.1-8b"), gpu=H100, engine=Engine.SGLANG,
                                              workload=_open(6_000, 1_500, 6.0), num_requests=120, seed=seed),
    # the same in a 60k-token pool a rank: retractions reset the decode reserve's ratio, which then decays a step at a
    # time through chunk runs and decides when a queued prompt is admitted
    "dp4-small-chunks-tight-pool": lambda seed: simulate(
        Layout.replicas(1, Parallelism(dp=4), EngineKnobs(max_num_seqs=64, max_num_batched_tokens=1024)), model=resolve_model("llama-3.1-8b"),
        gpu=H100, engine=Engine.SGLANG, workload=_open(6_000, 1_500, 6.0), num_requests=120, seed=seed, pool_tokens={Role.AGGREGATED: 60_000}),
    # two replicas of 2 ranks in a closed loop (arrivals at finishes), prefix-free 12k prompts
    "2xdp2-closed": lambda seed: simulate(Layout.replicas(2, Parallelism(dp=2), KNOBS), model=resolve_model("llama-3.1-8b"), gpu=H100,
                                          engine=Engine.SGLANG, requests=closed_loop(clients=24, input_tokens=12_000 + seed,
                                                                                     output_tokens=200, num_requests=72)),
    # PD: prefill ranks holding KV for transfer (released mid-run), decode ranks receiving it
    "pd-dp4-dp2": lambda seed: simulate(Layout.pd(RoleLayout(1, Parallelism(tp=2, dp=4), KNOBS), RoleLayout(1, Parallelism(tp=2, dp=2), KNOBS)),
                                        model=resolve_model("llama-3.1-70b"), gpu=H100, engine=Engine.SGLANG,
                                        workload=_open(40_000, 200, 1.0), num_requests=60, seed=seed),
}


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    steps: list[int] = []
    run_step = Instance._run_step

    def counting(self: Instance, now_s: float) -> float:
        steps.append(1)
        return run_step(self, now_s)

    monkeypatch.setattr(Instance, "_run_step", counting)
    return steps


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_chunk_run_simulates_bit_for_bit_what_stepping_through_the_schedulers_does(name: str, seed: int,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    run_steps = _counted(monkeypatch)
    fast = _arrays(CASES[name](seed))
    assert len(run_steps) > 20, f"{name}: {len(run_steps)} chunk-run steps: the case no longer exercises chunk runs"
    monkeypatch.setattr(Instance, "_start_run", lambda self, states: False)
    stepped = _arrays(CASES[name](seed))
    assert fast.keys() == stepped.keys()
    changed = [k for k in fast if fast[k].shape != stepped[k].shape or fast[k].tobytes() != stepped[k].tobytes()]
    assert not changed, f"{name} seed {seed}: arrays differ from stepping: {changed}"


def test_the_pinned_long_prompt_runs_take_chunk_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.planner.sim.test_pinned_runs import RUNS

    for name in ("open-dp8-sglang-llama31-8b-long-prompts", "open-2p-dp4-1d-dp2-sglang-llama31-70b-long-prompts"):
        run_steps = _counted(monkeypatch)
        r = RUNS[name]()
        assert len(run_steps) > 200 and np.count_nonzero(~np.isnan(r.finish_s)) > 50, (name, len(run_steps))
