"""The planner's engine knobs in one place: the defaults of an engine instance and the PD roles' derived knobs.

Called by the funnel (its role tables and the layouts it names), the P:D ratio decision and the spec
conversion. A PD prefill instance holds prompts only, so it runs at the largest memory fraction offered and
at most PREFILL_MAX_NUM_SEQS sequences; a decode instance needs a token budget of at least its batch
(vLLM refuses max_num_batched_tokens < max_num_seqs) and never below DECODE_MIN_BATCHED_TOKENS.
Pure values and numpy; no engine facts per version (those belong to the engine capability tables).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servingtopology.planner.layout import EngineKnobs, KvDtype

__all__ = ["DEFAULT_KNOBS", "PREFILL_MAX_NUM_SEQS", "DECODE_MIN_BATCHED_TOKENS", "prefill_max_num_seqs",
           "decode_max_num_batched_tokens", "prefill_knobs", "decode_knobs"]

# An instance's knobs when a spec names none: vLLM's --max-num-seqs default (256), an 8k token budget and
# vLLM's --gpu-memory-utilization default (0.9); EngineKnobs' field defaults are these.
DEFAULT_KNOBS = EngineKnobs()
PREFILL_MAX_NUM_SEQS = 256
DECODE_MIN_BATCHED_TOKENS = 2048


def prefill_max_num_seqs(max_num_batched_tokens: Any) -> Any:
    """Sequences a prefill instance admits per step: its token budget, at most PREFILL_MAX_NUM_SEQS (arrays broadcast)."""
    return np.minimum(float(PREFILL_MAX_NUM_SEQS), max_num_batched_tokens)


def decode_max_num_batched_tokens(max_num_seqs: Any) -> Any:
    """A decode instance's token budget: its batch, at least DECODE_MIN_BATCHED_TOKENS (arrays broadcast)."""
    return np.maximum(max_num_seqs, float(DECODE_MIN_BATCHED_TOKENS))


def prefill_knobs(*, max_num_batched_tokens: int, memory_fraction: float, kv_dtype: KvDtype) -> EngineKnobs:
    """The knobs of a PD prefill instance with this token budget."""
    return EngineKnobs(max_num_seqs=min(PREFILL_MAX_NUM_SEQS, max_num_batched_tokens), max_num_batched_tokens=max_num_batched_tokens,
                       memory_fraction=memory_fraction, kv_dtype=kv_dtype)


def decode_knobs(*, max_num_seqs: int, memory_fraction: float, kv_dtype: KvDtype) -> EngineKnobs:
    """The knobs of a PD decode instance with this batch."""
    return EngineKnobs(max_num_seqs=max_num_seqs, max_num_batched_tokens=max(max_num_seqs, DECODE_MIN_BATCHED_TOKENS),
                       memory_fraction=memory_fraction, kv_dtype=kv_dtype)
