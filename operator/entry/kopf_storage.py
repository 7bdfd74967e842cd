"""kopf's storages for this operator: a compact diff base (the long values as digests), and handler progress whose delay
holds only for the generation it was set on.

Called by operator/entry/handlers.py (`register`, at start-up). kopf keeps the essence of the last handled object (spec,
labels, annotations) in the annotation `kopf.servingtopology.io/last-handled-configuration` and diffs each event against
it (kopf 1.45 `_cogs/configs/diffbase.py`: `DiffBaseStorage.build/fetch/store`). The API server caps an object's
annotations at 256 KiB together, so a verbatim copy of a spec above about 256 KiB (a pod template with ten 32 KiB
environment values is 321 KiB) was refused with every handler's patch: the status never written, a traceback on every
event, each change seen only by the timer. The handlers read the body, never kopf's `old`/`new`/`diff`, so the record
only has to tell changed from unchanged, field by field. Decisions, by name:
- DigestLongValues: a value of the essence up to DIGEST_DEPTH levels down (spec.workload.arrivalRate, one annotation)
  stays as it is when its JSON is at most DIGEST_OVER_CHARS characters, else it becomes "sha256:<32 hex>" of its
  canonical JSON; a change anywhere under it changes the digest, so kopf sees the change under the same field;
- RecordOverLimit: a record still above RECORD_LIMIT_BYTES (thousands of short annotations) is compacted one level
  less deep: each field of a section (spec.workload, metadata.annotations) as itself or its digest; the CRD bounds
  spec's fields, so the record is bounded;
- a record written by kopf's own AnnotationsDiffBaseStorage (before this storage) is compacted when read, so an
  upgrade sees no change in what it holds (only the generation below, once: one pass per resource);
- GenerationInTheEssence: the record holds metadata.generation too. kopf stores the essence only once every change
  handler is done, so while a pass waits its requeue the record is the generation before: an edit that reverts the
  pending one (replicas 1 → 5 → 1) had the essence of the record, and kopf dropped it as "nothing changed" until the
  timer came. With the generation it is a change like any other.
- NewGenerationWakes: kopf keeps a change handler's delay (a pass's requeue, a failure's back-off) in its progress
  annotation and does not run the handler before it, whatever arrives meanwhile (kopf 1.45 `HandlerState.sleeping`),
  so an edit made while the last pass waited on a rollout (15 s) or a back-off (15 s doubling to 300 s) was handled
  only when that delay or the timer came. The progress record carries the generation it was written for; read back
  for a newer generation its delay is dropped and the handler runs on the edit's own event.
Must not hold state: every call is a function of the body.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, cast

import kopf

__all__ = ["CompactDiffBaseStorage", "GenerationProgressStorage", "compact_essence", "DIGEST_DEPTH", "DIGEST_OVER_CHARS", "RECORD_LIMIT_BYTES", "DIGEST_PREFIX"]

DIGEST_DEPTH = 3            # the essence's root, its sections (spec, metadata), their fields, their fields' fields
DIGEST_OVER_CHARS = 64      # a value's JSON longer than this is kept as its digest
RECORD_LIMIT_BYTES = 16_384  # RecordOverLimit: above this, DIGEST_DEPTH - 1
DIGEST_PREFIX = "sha256:"
_DIGEST_HEX = 32            # 128 bits of the sha256


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(value: Any) -> str:
    return DIGEST_PREFIX + hashlib.sha256(_canonical(value).encode()).hexdigest()[:_DIGEST_HEX]


def _compact(value: Any, depth: int) -> Any:
    if depth > 0 and isinstance(value, dict):
        return {key: _compact(item, depth - 1) for key, item in value.items()}
    return value if len(_canonical(value)) <= DIGEST_OVER_CHARS else _digest(value)


def compact_essence(essence: Any) -> Any:
    """The record of `essence` (DigestLongValues, then RecordOverLimit); idempotent: a record compacts to itself."""
    if not isinstance(essence, dict):
        return essence
    record = _compact(essence, DIGEST_DEPTH)
    if len(_canonical(record).encode()) > RECORD_LIMIT_BYTES:
        record = _compact(essence, DIGEST_DEPTH - 1)
    return record


class CompactDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base (same key), holding `compact_essence` of the essence rather than the essence."""

    def build(self, *, body: Any, extra_fields: Iterable[Any] | None = None) -> Any:
        essence: dict[str, Any] = dict(super().build(body=body, extra_fields=extra_fields))
        generation = _generation(body)
        if generation is not None:
            essence["metadata"] = {**essence.get("metadata", {}), "generation": generation}
        return compact_essence(essence)

    def fetch(self, *, body: Any) -> Any:
        stored = super().fetch(body=body)
        return None if stored is None else compact_essence(stored)


GENERATION_KEY = "generation"


def _generation(body: Any) -> int | None:
    value = (body.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class GenerationProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage with NewGenerationWakes: a record's delay holds for its generation only."""

    def store(self, *, key: Any, record: Any, body: Any, patch: Any) -> None:
        generation = _generation(body)
        stamped: dict[str, Any] = dict(record)
        if generation is not None:
            stamped[GENERATION_KEY] = generation
        super().store(key=key, record=cast(Any, stamped), body=body, patch=patch)   # kopf writes every key it is given

    def fetch(self, *, key: Any, body: Any) -> Any:
        stored = super().fetch(key=key, body=body)
        if stored is None:
            return None
        # kopf compares the record it read with the one it would write, and writes only when they differ: give it
        # back kopf's own fields, so an unchanged handler costs no patch.
        record = {k: v for k, v in stored.items() if k != GENERATION_KEY}
        written_for, now = stored.get(GENERATION_KEY), _generation(body)
        if record.get("delayed") and isinstance(written_for, int) and now is not None and now != written_for:
            record["delayed"] = None
        return record
