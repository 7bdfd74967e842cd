"""Steady-state estimator of closed-loop benchmarks (N clients, one input and one output length each).

Called by planner.fidelity.benchmark_cases (and by the funnel when it wants a closed-loop figure) with a vectorised
step-time function: every argument may be a numpy array, one element per benchmark. It finds the running
batch that balances the loop (Little's law) by bisection instead of stepping an engine, so thousands of
rows take a fraction of a second. It must not shorten the benchmark: the start-up wave of a benchmark of
`bench_requests_per_client` requests per client is weighed in. Pure numpy; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from servingtopology.planner.engines.defaults import cuda_graph_tokens
from servingtopology.planner.layout import Engine
from servingtopology.planner.perf.step import PerfParams, attention_dp_moe_tokens, delivery_steps, perf_params

__all__ = ["BatchStepTime", "ClosedLoopResult", "aggregated", "disaggregated"]

_ITERATIONS = 30
_RHO_MAX = 0.97


class BatchStepTime(Protocol):
    """Vectorised step time (s) of one DP rank for batches given per rank. `moe_tokens` (passed only where attention-DP
    ranks step together): the tokens every rank routes to the experts, where the ranks' batches differ (step.token_terms)."""

    def __call__(self, *, prefill_tokens: Any, prefill_pairs: Any, decode_tokens: Any, decode_context_tokens: Any,
                 moe_tokens: Any = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class ClosedLoopResult:
    """Mean figures per benchmark (arrays): TTFT and TPOT in seconds, request throughput of the whole deployment."""

    ttft_s: Any
    tpot_s: Any
    throughput_rps: Any
    running_per_rank: Any
    saturated: Any  # True where a cap (sequences, KV or prefill capacity) holds clients in a queue


def _bisect(fn: Any, hi: Any) -> tuple[Any, Any]:
    """Largest b in (0, hi] with fn(b) <= 0 for an increasing fn (vectorised); also fn(hi) <= 0."""
    lo = np.zeros_like(hi) + 1e-6
    hi = np.asarray(hi, dtype=float)
    top_ok = fn(hi) <= 0.0
    a, b = lo.copy(), hi.copy()
    for _ in range(_ITERATIONS):
        mid = 0.5 * (a + b)
        ok = fn(mid) <= 0.0
        a = np.where(ok, mid, a)
        b = np.where(ok, b, mid)
    return np.where(top_ok, hi, a), top_ok


def _per_client(requests_per_client: Any, p: PerfParams) -> Any:
    """Requests each client sends in the benchmark (arrays allowed), else the parameter file's."""
    return p.bench_requests_per_client if requests_per_client is None else np.asarray(requests_per_client, dtype=float)


def aggregated(step: BatchStepTime, *, clients_per_rank: Any, isl: Any, osl: Any, token_budget: Any, max_running: Any,
               mixed_batches: Any, ranks: Any = 1, ttft_overhead_s: Any = 0.0, requests_per_client: Any = None,
               recv_interval: Any = 1.0, lockstep: Any = False, output_reserve: Any = None, dp_lockstep: Any = None,
               params: PerfParams | None = None) -> ClosedLoopResult:
    """Closed loop against aggregated engines: each rank serves `clients_per_rank` clients.

    mixed_batches: prefill chunks ride in decode steps under one token budget (vLLM V1, TRT-LLM);
    otherwise prefill batches pause decoding (SGLang). In steady state a request lives n_c = ⌈isl/C⌉
    prefill steps plus osl − 1 decode steps, so per step b/L requests finish and b·isl/L prompt tokens
    arrive; prefills of a burst of clients collide in one step. `requests_per_client` (default the parameter
    file's) sets how much the start-up wave weighs in the mean TTFT. `recv_interval`: the engine takes in new
    requests every that many steps (SGLang's `--scheduler-recv-interval`), so an arrival waits half of them.

    Prompts that arrive together are prefilled together: a step's prefill batch holds every waiting prompt up
    to the token budget (vLLM's `max_num_batched_tokens` beside the decodes, SGLang's chunked-prefill size), so
    the prefill side saturates when the prompt tokens arriving per step reach that capacity, not when every
    step carries a prefill. A new request first waits out the step in flight: the mean residual of a renewal
    process of decode steps (t_d) and prefill steps (t_p), E[S²]/(2·E[S]), which a long prefill lengthens
    beyond half a mean step (the inspection paradox); then it queues for budget (M/D/1 in the capacity's
    utilisation, scaled by `queue_factor`).

    `output_reserve`: None where the engine admits a request only when the pool holds its whole sequence (the clients
    over the `max_running` cap queue before their first token); else the share r of its future outputs that admission
    reserves beside the prompt (vLLM 0: `KVCacheManager.allocate_slots` for the prompt, then preempting the newest
    running request when a decode finds no free block; SGLang its new-token ratio). Where the KV cap binds, the wait
    is then split as a sequence claims its blocks: (isl + r·osl) / (isl + osl) of it before the first token, the rest
    during the decode (preempted or retracted, then recomputed); the cycle the capped throughput sets is unchanged
    (Little's law: N / X = TTFT + (osl − 1)·TPOT).

    `lockstep` (per benchmark): clients that start together with fixed lengths against an engine that runs
    prefill batches before decoding (SGLang, mixed_batches False) stay in step for the whole benchmark when all
    of them fit at once; see `_lockstep`.

    `mixed_batches` and `output_reserve` may be given per benchmark (NaN: None), so that benchmarks of several engines
    are estimated in one pass. `dp_lockstep` (per benchmark; default: any of the benchmarks runs more than one rank):
    whether the attention-DP ranks' lockstep is modelled for a benchmark of mixed batches (a caller passing benchmarks of
    several deployments gives each the value its own deployment's call would have had).
    """
    p = params or perf_params()
    clients = np.asarray(clients_per_rank, dtype=float)
    isl = np.asarray(isl, dtype=float)
    budget = np.maximum(np.asarray(token_budget, dtype=float), 1.0)
    n_c = np.ceil(isl / budget)
    n_d = np.maximum(np.asarray(osl, dtype=float) - 1.0, 0.0)
    life = n_c + np.maximum(n_d, 1.0)
    ctx = isl + 0.5 * n_d
    recv = np.maximum(np.asarray(recv_interval, dtype=float), 1.0)
    colliding = 1.0 + p.arrival_burst * (np.minimum(clients, np.maximum(budget / isl, 1.0)) - 1.0)
    r = np.asarray(ranks, dtype=float)
    mixed = np.asarray(mixed_batches, dtype=bool)
    lockstep_dp = mixed & (bool(np.any(r > 1.0)) if dp_lockstep is None else np.asarray(dp_lockstep, dtype=bool))
    any_lockstep_dp = bool(np.any(lockstep_dp))
    burst = colliding * np.minimum(isl, budget)  # the prompt tokens that collide in one step (b-independent)
    graph = cuda_graph_tokens(Engine.VLLM, max_running, budget)  # mixed batches' lockstep: vLLM's rule of the DP gather
    delay_steps = delivery_steps(recv_interval=recv, params=p)  # steps an arrival waits for intake and its result

    def state(b: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
        d = b * n_d / life
        p_bar = b * isl / life
        cap = np.where(mixed, np.maximum(budget - d, 1.0), budget)
        q = np.minimum(np.maximum(np.maximum(p_bar, burst), 1.0), cap)  # np.clip's arithmetic, without its overhead
        f = p_bar / q  # prefill steps per decode step (above 1: SGLang runs several prefill batches between decodes)
        pairs = q * isl / 2.0
        t_d = step(prefill_tokens=0.0 * d, prefill_pairs=0.0 * d, decode_tokens=d, decode_context_tokens=d * ctx)
        # Mixed batches carry the decodes beside the prefill chunk; otherwise (SGLang) a prefill batch pauses decoding.
        # Attention-DP ranks step in lockstep: a step in which any of the r ranks carries a prefill chunk takes that
        # rank's time on every rank (1 − (1 − f)^r of the steps, not f), and its experts see the chunk beside the
        # other ranks' own decodes: a step over vLLM's CUDA-graph bound runs eagerly, unpadded, q + d + (r − 1)·d tokens
        # gathered; one inside it pads every rank to the largest (step.attention_dp_moe_tokens; NaN where not modelled or
        # padded: `step`'s default).
        gathered = {"moe_tokens": np.where(lockstep_dp, attention_dp_moe_tokens(q + d + (r - 1.0) * d, q + d, r, sglang=False, extend=True,
                                                                                  graph_tokens=graph), np.nan)} if any_lockstep_dp else {}
        t_p = step(prefill_tokens=q, prefill_pairs=pairs, decode_tokens=np.where(mixed, d, 0.0 * d),
                   decode_context_tokens=np.where(mixed, d * ctx, 0.0 * d), **gathered)
        fm = np.minimum(f, 1.0)
        fm = np.where(lockstep_dp, 1.0 - (1.0 - fm) ** r, fm)
        tau = np.where(mixed, (1.0 - fm) * t_d + fm * t_p, t_d + f * t_p)
        residual = np.where(mixed, ((1.0 - fm) * t_d * t_d + fm * t_p * t_p) / (2.0 * tau), (t_d * t_d + f * t_p * t_p) / (2.0 * tau))
        return tau, t_p, p_bar / cap, b / (life * tau), d, residual

    def wait(tau: Any, t_p: Any, u: Any, residual: Any) -> Any:
        rho = np.minimum(u, _RHO_MAX)
        return (ttft_overhead_s + residual + delay_steps * tau
                + p.queue_factor * rho / (2.0 * (1.0 - rho)) * t_p)

    def excess(b: Any) -> Any:
        tau, t_p, u, x, _, res = state(b)
        over = np.where(mixed & (u >= _RHO_MAX), np.inf, 0.0)
        return b + x * wait(tau, t_p, u, res) - clients + over

    hi = np.maximum(np.minimum(clients, np.asarray(max_running, dtype=float)), 1e-3)
    b, capped = _bisect(excess, hi)
    tau, t_p, u, x, _, res = state(b)
    w = wait(tau, t_p, u, res)
    queued = np.maximum(clients - b - x * w, 0.0)
    ttft = w + queued / np.maximum(x, 1e-12) + n_c * t_p
    tau_client = tau
    if output_reserve is not None:
        # The wait the cap imposes (queued / X) is split as the pool's claims are: admission claims the prompt's blocks
        # and the reserved share of the outputs', decoding the rest, so (isl + r·osl) / (isl + osl) of the shortage is
        # met before the first token and the rest during the decode (preempted or retracted, then recomputed).
        reserve = np.asarray(output_reserve, dtype=float)
        excess = queued / np.maximum(x, 1e-12)
        at_admission = (isl + reserve * n_d) / (isl + np.maximum(n_d, 1.0))
        reserved = ~np.isnan(reserve)
        ttft = np.where(reserved, ttft - (1.0 - at_admission) * excess, ttft)
        tau_client = np.where(reserved, tau + (1.0 - at_admission) * excess / np.maximum(n_d, 1.0), tau)
    # Start-up wave: all clients arrive at once and their prompts go through C tokens per step.
    wave_tokens = np.minimum(clients * isl, budget)
    t_wave = step(prefill_tokens=wave_tokens, prefill_pairs=wave_tokens * isl / 2.0, decode_tokens=0.0 * b, decode_context_tokens=0.0 * b)
    wave_ttft = 0.5 * clients * isl / wave_tokens * t_wave + t_wave * 0.5 + ttft_overhead_s
    ttft = ttft + np.maximum(wave_ttft - ttft, 0.0) / _per_client(requests_per_client, p)
    tpot = tau_client
    sync = np.asarray(lockstep, dtype=bool) & ~mixed & (clients <= np.asarray(max_running, dtype=float))
    if np.any(sync):
        l_ttft, l_tpot, l_x = _lockstep(step, clients=clients, isl=isl, n_d=n_d, budget=budget, ttft_overhead_s=ttft_overhead_s)
        ttft, tpot, x = np.where(sync, l_ttft, ttft), np.where(sync, l_tpot, tpot), np.where(sync, l_x, x)
        b = np.where(sync, clients, b)
    return ClosedLoopResult(ttft_s=ttft, tpot_s=tpot, throughput_rps=x * ranks, running_per_rank=b,
                            saturated=capped | (queued > 1e-6 * clients))


def _lockstep(step: BatchStepTime, *, clients: Any, isl: Any, n_d: Any, budget: Any, ttft_overhead_s: Any) -> tuple[Any, Any, Any]:
    """Mean TTFT, TPOT (s) and requests/s of one rank whose N clients move in lockstep.

    Why they stay in step: every request has the same lengths, all N are sent at once, and SGLang's scheduler
    runs a waiting prefill batch before the next decode step (`get_next_batch_to_run` prefers a new prefill
    batch; mixed chunks are off by default), so the N prompts are prefilled in k = ⌈N·isl/C⌉ batches of the
    chunked-prefill size C, then the N requests decode together, finish in the same step and are sent again
    together. The i-th batch's requests see their first token after i batches (mean over requests: the whole
    prefill time T·(k + 1)/(2k)), then wait out the k − i batches after theirs before decoding, which the
    client counts in TPOT: (osl − 1)·t_d + T·(k − 1)/(2k) over osl − 1 tokens on average. vLLM mixes decode
    tokens into prefill steps, so its requests finish a step apart and drift out of step: not modelled there.
    """
    tokens = clients * isl
    per = np.maximum(np.minimum(tokens, budget), 1.0)
    k = np.ceil(tokens / per)
    zero = 0.0 * clients
    t_batch = step(prefill_tokens=per, prefill_pairs=per * np.minimum(isl, budget) / 2.0, decode_tokens=zero, decode_context_tokens=zero)
    total = t_batch * tokens / per
    t_d = step(prefill_tokens=zero, prefill_pairs=zero, decode_tokens=clients, decode_context_tokens=clients * (isl + 0.5 * n_d))
    ttft = ttft_overhead_s + total * (k + 1.0) / (2.0 * k)
    tpot = t_d + total * (k - 1.0) / (2.0 * k) / np.maximum(n_d, 1.0)
    cycle = ttft_overhead_s + total + n_d * t_d
    return ttft, tpot, clients / np.maximum(cycle, 1e-12)


def disaggregated(prefill_step: BatchStepTime, decode_step: BatchStepTime, *, clients: Any, prefill_ranks: Any,
                  decode_ranks: Any, isl: Any, osl: Any, prefill_budget: Any, decode_max_running: Any, transfer_s: Any,
                  ttft_overhead_s: Any = 0.0, requests_per_client: Any = None,
                  params: PerfParams | None = None) -> ClosedLoopResult:
    """Closed loop against prefill/decode pools: prefill ranks queue prompts, decode ranks run pure decode.

    For a decode batch b per rank: TPOT = decode step(b), throughput X = R_d·b/((osl − 1)·TPOT), each prefill
    rank sees X/R_p requests per second and queues them (M/D/1 wait); the loop balances when
    X·(TTFT + (osl − 1)·TPOT) = N.

    A prefill instance's ranks are priced alike (every rank carrying the chunk, as at saturation): the mean-field view,
    which cannot say which ranks are busy (the simulator applies the engine's gather, step.attention_dp_moe_tokens).
    """
    p = params or perf_params()
    clients = np.asarray(clients, dtype=float)
    isl = np.asarray(isl, dtype=float)
    n_d = np.maximum(np.asarray(osl, dtype=float) - 1.0, 1.0)
    ctx = isl + 0.5 * n_d
    r_p = np.asarray(prefill_ranks, dtype=float)
    r_d = np.asarray(decode_ranks, dtype=float)
    budget = np.maximum(np.asarray(prefill_budget, dtype=float), 1.0)
    zero = 0.0 * clients
    chunks = np.ceil(isl / budget)
    chunk = np.minimum(isl, budget)
    s1 = chunks * prefill_step(prefill_tokens=chunk, prefill_pairs=chunk * isl / 2.0, decode_tokens=zero, decode_context_tokens=zero)
    # Batched prefill: a full budget of prompts shares the weight reads, which sets the rank's capacity.
    per_batch = np.maximum(np.floor(budget / isl), 1.0)
    s_batch = prefill_step(prefill_tokens=per_batch * chunk, prefill_pairs=per_batch * chunk * isl / 2.0, decode_tokens=zero,
                           decode_context_tokens=zero) * chunks / per_batch

    def state(b: Any) -> tuple[Any, Any, Any, Any]:
        t_d = decode_step(prefill_tokens=0.0 * b, prefill_pairs=0.0 * b, decode_tokens=b, decode_context_tokens=b * ctx)
        x = r_d * b / (n_d * t_d)
        rho = x / r_p * s_batch
        w = p.queue_factor * np.minimum(rho, _RHO_MAX) / (2.0 * (1.0 - np.minimum(rho, _RHO_MAX))) * s1
        ttft = ttft_overhead_s + w + s1 + transfer_s + (0.5 + delivery_steps(disaggregated=True, params=p)) * t_d
        return t_d, x, rho, ttft

    def excess(b: Any) -> Any:
        t_d, x, rho, ttft = state(b)
        return x * (ttft + n_d * t_d) - clients + np.where(rho >= _RHO_MAX, np.inf, 0.0)

    hi = np.maximum(np.minimum(clients / r_d, np.asarray(decode_max_running, dtype=float)), 1e-3)
    b, capped = _bisect(excess, hi)
    t_d, x, _, ttft = state(b)
    ttft = np.maximum(ttft, clients / np.maximum(x, 1e-12) - n_d * t_d)
    wave = 0.5 * clients / r_p * s_batch + s1 + ttft_overhead_s
    ttft = ttft + np.maximum(wave - ttft, 0.0) / _per_client(requests_per_client, p)
    return ClosedLoopResult(ttft_s=ttft, tpot_s=t_d, throughput_rps=x, running_per_rank=b, saturated=capped)
