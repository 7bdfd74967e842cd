"""Request sets for the simulator: open-loop arrivals, closed-loop clients, sessions, recorded traces.

Called by `simulate` and by the CLI (which reads trace files and hands their rows here). Pure: sampling
takes a seed, traces arrive as already-parsed rows; this module never opens a file or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.workload import LengthDist, Workload

__all__ = ["RequestSet", "Sessions", "from_workload", "from_rows", "recorded_latencies", "closed_loop"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Cache key of the shared system prompt implied by Workload.prefix_share; sessions use keys 1, 2, ...
SHARED_PROMPT_KEY = 0


@dataclass(frozen=True, slots=True)
class RequestSet:
    """Requests to replay, one array entry per request, in issue order.

    arrival_s: open-loop arrival time (s from the start); NaN where a closed-loop client issues it.
    client: the closed-loop client that issues the request (its requests go out one after another,
        `think_s` after the previous one finishes); −1 for open-loop requests.
    prefix_key / shared_tokens: the first `shared_tokens` tokens of the request (prompt then output) are
        identical for every request with the same key ≥ 0; two such requests share min(shared) tokens.
    """

    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    prefix_key: IntArray
    shared_tokens: IntArray
    client: IntArray
    think_s: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        for name in ("arrival_s", "output_tokens", "prefix_key", "shared_tokens", "client"):
            if len(getattr(self, name)) != n:
                raise InvalidSpec(f"requests.{name}", f"has {len(getattr(self, name))} entries, expected {n}")
        if n and (int(self.prompt_tokens.min()) < 1 or int(self.output_tokens.min()) < 1):
            raise InvalidSpec("requests", "every request needs at least one input and one output token")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def closed_loop(self) -> bool:
        return bool(len(self) and np.all(self.client >= 0))

    @property
    def num_clients(self) -> int:
        return int(self.client.max()) + 1 if self.closed_loop else 0


@dataclass(frozen=True, slots=True)
class Sessions:
    """Multi-turn sessions: each turn re-sends the whole conversation so far plus new input tokens.

    The workload's input distribution gives the new tokens of each turn; `turns` the turns per session.
    """

    turns: LengthDist


def _arrivals(rate_rps: float, cv: float, n: int, rng: np.random.Generator) -> FloatArray:
    """Arrival times of a renewal process: Poisson at cv 1, gamma(shape 1/cv²) otherwise."""
    if rate_rps <= 0 or not math.isfinite(rate_rps):
        raise InvalidSpec("workload.arrivalRate", f"must be a positive number, got {rate_rps}")
    if cv <= 0:
        gaps = np.full(n, 1.0 / rate_rps)
    elif abs(cv - 1.0) < 1e-12:
        gaps = rng.exponential(1.0 / rate_rps, size=n)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    out = np.cumsum(gaps)
    return np.asarray(out - out[0], dtype=np.float64) if n else np.zeros(0)


def from_workload(workload: Workload, *, num_requests: int, seed: int, sessions: Sessions | None = None,
                  think_s: float = 0.0) -> RequestSet:
    """Draw `num_requests` requests from a workload (open loop if it has a rate, else closed loop).

    prefix_share p gives every prompt a shared system prefix of round(p × prompt) tokens (key 0).
    With sessions, the turns of one session are consecutive requests; the closed-loop client of a
    session issues its turns in order, open-loop turns arrive at the workload's rate.
    """
    if num_requests < 0:
        raise InvalidSpec("simulation.requests", f"must be ≥ 0, got {num_requests}")
    rng = np.random.default_rng(seed)
    new_in = workload.input_tokens.sample(rng, num_requests)
    out = workload.output_tokens.sample(rng, num_requests)
    key = np.full(num_requests, -1, dtype=np.int64)
    shared = np.zeros(num_requests, dtype=np.int64)
    prompt = new_in.copy()
    session_of = np.arange(num_requests, dtype=np.int64)
    if sessions is not None:
        i = 0
        s = 0
        while i < num_requests:
            turns = int(sessions.turns.sample(rng, 1)[0])
            context = 0
            for _ in range(turns):
                if i >= num_requests:
                    break
                prompt[i] = context + new_in[i]
                key[i] = SHARED_PROMPT_KEY + 1 + s
                shared[i] = prompt[i] + out[i]
                context = int(prompt[i] + out[i])
                session_of[i] = s
                i += 1
            s += 1
    elif workload.prefix_share > 0:
        share = min(max(workload.prefix_share, 0.0), 1.0)
        shared = np.rint(prompt * share).astype(np.int64)
        key = np.where(shared > 0, SHARED_PROMPT_KEY, -1).astype(np.int64)
    if workload.arrival_rate_rps is not None:
        arrival = _arrivals(workload.arrival_rate_rps, workload.arrival_cv, num_requests, rng)
        client = np.full(num_requests, -1, dtype=np.int64)
    else:
        clients = int(workload.concurrency or 1)
        if clients < 1:
            raise InvalidSpec("workload.concurrency", f"must be ≥ 1, got {clients}")
        arrival = np.full(num_requests, np.nan)
        client = (session_of % clients).astype(np.int64)
    return RequestSet(arrival, prompt.astype(np.int64), out.astype(np.int64), key, shared, client, think_s)


def closed_loop(*, clients: int, input_tokens: int, output_tokens: int, num_requests: int, think_s: float = 0.0) -> RequestSet:
    """Fixed-length closed-loop benchmark: `clients` clients, each sending its next request when one ends."""
    if clients < 1:
        raise InvalidSpec("concurrency", f"must be ≥ 1, got {clients}")
    n = num_requests
    return RequestSet(np.full(n, np.nan), np.full(n, input_tokens, dtype=np.int64), np.full(n, output_tokens, dtype=np.int64),
                      np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64) % clients, think_s)


_ARRIVAL = ("arrival_s", "arrival", "timestamp", "arrival_time", "time")
_ENGINE_ARRIVAL = "queued_ts"
_INPUT = ("input_tokens", "input_toks", "prompt_tokens", "input_length", "input_len", "isl", "num_prompt_tokens")
_OUTPUT = ("output_tokens", "output_toks", "completion_tokens", "output_length", "output_len", "osl", "num_output_tokens")
_KEY = ("prefix_id", "session_id", "session", "conversation_id")
_SHARED = ("prefix_tokens", "shared_tokens", "prefix_len")


def _field(row: Mapping[str, object], names: Sequence[str], index: int, what: str, *, required: bool = True) -> object:
    for name in names:
        value = row.get(name)
        if value not in (None, ""):
            return value
    if required:
        raise InvalidSpec(f"trace row {index}", f"has no {what} field; expected one of: {', '.join(names)}")
    return None


def _number(value: object, index: int, what: str) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidSpec(f"trace row {index}", f"{what} is not a number: {value!r}") from None


def from_rows(rows: Sequence[Mapping[str, object]]) -> RequestSet:
    """Build an open-loop request set from trace rows (JSONL objects or CSV dicts), sorted by arrival.

    Arrival comes from the engine's own `queued_ts` when the row has first/last-token timestamps on that
    clock (the recorded latencies are measured from it), else from an arrival/timestamp field; times are
    made relative to the first request. Optional prefix_id/session_id (hashed into a cache key) with
    prefix_tokens; a session id without prefix_tokens shares the whole prompt with later turns.
    """
    n = len(rows)
    arrival = np.zeros(n)
    prompt = np.zeros(n, dtype=np.int64)
    out = np.zeros(n, dtype=np.int64)
    key = np.full(n, -1, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)
    keys: dict[str, int] = {}
    for i, row in enumerate(rows):
        engine_clock = _ENGINE_ARRIVAL in row and "first_token_ts" in row
        raw = row[_ENGINE_ARRIVAL] if engine_clock else _field(row, _ARRIVAL, i, "arrival time")
        arrival[i] = _number(raw, i, "arrival time")
        prompt[i] = max(1, round(_number(_field(row, _INPUT, i, "input token count"), i, "input tokens")))
        out[i] = max(1, round(_number(_field(row, _OUTPUT, i, "output token count"), i, "output tokens")))
        kid = _field(row, _KEY, i, "prefix id", required=False)
        if kid is not None:
            key[i] = keys.setdefault(str(kid), SHARED_PROMPT_KEY + 1 + len(keys))
            sh = _field(row, _SHARED, i, "prefix tokens", required=False)
            shared[i] = min(prompt[i], round(_number(sh, i, "prefix tokens"))) if sh is not None else prompt[i]
    if n:
        order = np.argsort(arrival, kind="stable")
        arrival, prompt, out, key, shared = arrival[order] - arrival[order][0], prompt[order], out[order], key[order], shared[order]
    return RequestSet(arrival, prompt, out, key, shared, np.full(n, -1, dtype=np.int64))


def recorded_latencies(rows: Sequence[Mapping[str, object]]) -> dict[str, FloatArray]:
    """Recorded per-request TTFT, TPOT and latency (ms), in the arrival order of `from_rows`.

    TTFT = first_token_ts − queued_ts, TPOT = (last_token_ts − first_token_ts) / (output − 1) over requests
    with more than one output token, latency = last_token_ts − queued_ts. Rows lacking them are skipped.
    """
    have = [r for r in rows if all(r.get(k) not in (None, "") for k in ("queued_ts", "first_token_ts", "last_token_ts"))]
    if not have:
        raise InvalidSpec("trace", "rows carry no queued_ts/first_token_ts/last_token_ts timestamps to compare against")
    have.sort(key=lambda r: _number(r["queued_ts"], 0, "queued_ts"))
    q = np.array([_number(r["queued_ts"], i, "queued_ts") for i, r in enumerate(have)])
    f = np.array([_number(r["first_token_ts"], i, "first_token_ts") for i, r in enumerate(have)])
    last = np.array([_number(r["last_token_ts"], i, "last_token_ts") for i, r in enumerate(have)])
    o = np.array([_number(_field(r, _OUTPUT, i, "output token count"), i, "output tokens") for i, r in enumerate(have)])
    multi = o > 1
    return {
        "ttft_ms": (f - q) * 1e3,
        "tpot_ms": ((last - f)[multi] / (o[multi] - 1)) * 1e3,
        "latency_ms": (last - q) * 1e3,
    }
