"""The API server's admission as the last check before a rendered object is applied: what a refusal says, and which
verdicts are remembered so that an unchanged object is dry-run once per change, not once per pass.

Used by operator/cluster/cluster.py (`KubeCluster.admit`, which makes the server-side dry-run and keeps an
`AdmissionMemo`) and, through the Cluster seam, by operator/reconcile.py. Pure: no client, no clock of its own
(times come in as monotonic seconds). A refusal carries the API server's Status reason and message, never the
exception, its HTTP headers or a traceback.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["REFUSAL_CODES", "TYPED_PATCH_REFUSAL", "MESSAGE_CHARS", "RECHECK_BASE_S", "RECHECK_CAP_S", "AdmissionRefusal",
           "is_refusal", "refusal_from_answer", "object_digest", "recheck_after_s", "AdmissionMemo"]

# HTTP codes that are the API server's verdict on the object (validation 422, an admission plugin or webhook, a quota or
# a policy 403, a malformed object 400, too large 413): the same object gets the same answer until it or the cluster's
# admission changes. Anything else (5xx, 429, 409, timeouts) is transient and retried as an API failure, save one 500:
REFUSAL_CODES = frozenset({400, 403, 413, 422})
# TypedPatchRefused: a server-side apply whose object the API server's typed schema cannot hold (a string where a list
# belongs: `capabilities.add: IPC_LOCK` in a template's open securityContext) is answered 500 with this Status message
# (apiserver's fieldmanager), every time for the same object: a verdict, not an outage.
TYPED_PATCH_REFUSAL = "failed to create typed patch object"
MESSAGE_CHARS = 600          # of one object's refusal message (a Status message lists every invalid field)
RECHECK_BASE_S = 60.0        # a refused object is dry-run again after 60 s, 120 s, ... (the cluster's admission may change)
RECHECK_CAP_S = 900.0        # ... at most every 15 min
MEMO_ENTRIES = 4096          # verdicts remembered (least recently used dropped): a few per resource


@dataclass(frozen=True, slots=True)
class AdmissionRefusal:
    """The API server refused one rendered object: its Status code, reason (Invalid, Forbidden, BadRequest, ...) and
    message, whitespace collapsed and cut at MESSAGE_CHARS."""

    object: str       # Kind/name
    code: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.object}: {self.reason} ({self.code}): {self.message}"


def is_refusal(*, code: int, body: str | bytes | None) -> bool:
    """Whether an error answer is the API server's verdict on the object (REFUSAL_CODES, or a 500 TYPED_PATCH_REFUSAL)
    rather than a failure to retry."""
    if code in REFUSAL_CODES:
        return True
    if code != 500 or not body:
        return False
    try:
        status = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(status, Mapping) and status.get("kind") == "Status" and TYPED_PATCH_REFUSAL in str(status.get("message"))


def refusal_from_answer(object_name: str, *, code: int, http_reason: str, body: str | bytes | None) -> AdmissionRefusal:
    """The refusal as the API server's Status body states it; a body that is not a Status gives only the code and the
    HTTP reason (a proxy's HTML page is not shown)."""
    status: Any = None
    try:
        status = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        status = None
    if not isinstance(status, Mapping) or status.get("kind") != "Status":
        return AdmissionRefusal(object_name, code, http_reason or "Refused", f"{code} {http_reason}".strip())
    reason = str(status.get("reason") or http_reason or "Refused")
    message = " ".join(str(status.get("message") or f"{code} {reason}").split())
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS - 1] + "…"
    return AdmissionRefusal(object_name, int(status.get("code") or code), reason, message)


def object_digest(obj: Mapping[str, Any]) -> str:
    """sha256 of the object's canonical JSON: equal for equal rendered objects, whatever their key order."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def recheck_after_s(refusals: int) -> float:
    """How long the `refusals`-th refusal in a row of the same object stands: 60 s, 120 s, 240 s, ... at most 900 s."""
    return float(min(RECHECK_BASE_S * 2 ** max(0, refusals - 1), RECHECK_CAP_S))


@dataclass(frozen=True, slots=True)
class _Verdict:
    refusal: AdmissionRefusal | None
    at_s: float
    refusals: int          # refusals in a row of this object (0: admitted)


class AdmissionMemo:
    """Verdicts by object digest (OncePerChange): an admitted object is not dry-run again while it renders the same (an
    apply that is then refused records the refusal); a refused one stands for `recheck_after_s` and is then dry-run
    again, so a cluster whose admission changed (a namespace label, a quota, a webhook) is noticed without a hot loop.
    Bounded (MEMO_ENTRIES, least recently used dropped); thread-safe (passes of different resources run at once)."""

    def __init__(self, *, entries: int = MEMO_ENTRIES) -> None:
        self._entries = entries
        self._verdicts: OrderedDict[str, _Verdict] = OrderedDict()
        self._lock = threading.Lock()

    def standing(self, digest: str, *, now_s: float) -> tuple[bool, AdmissionRefusal | None]:
        """(True, the verdict) while the remembered verdict stands; (False, None) when the object must be dry-run."""
        with self._lock:
            verdict = self._verdicts.get(digest)
            if verdict is None:
                return False, None
            self._verdicts.move_to_end(digest)
            if verdict.refusal is not None and now_s - verdict.at_s >= recheck_after_s(verdict.refusals):
                return False, None
            return True, verdict.refusal

    def record(self, digest: str, refusal: AdmissionRefusal | None, *, now_s: float) -> None:
        with self._lock:
            before = self._verdicts.get(digest)
            refusals = 0 if refusal is None else (before.refusals if before is not None else 0) + 1
            self._verdicts[digest] = _Verdict(refusal, now_s, refusals)
            self._verdicts.move_to_end(digest)
            while len(self._verdicts) > self._entries:
                self._verdicts.popitem(last=False)
