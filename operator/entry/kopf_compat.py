"""The one place the operator reaches into kopf's internals, checked when the handlers are registered.

Called by operator/entry/handlers.py (`register`). kopf marks every timer and daemon as needing a finalizer
(`requires_finalizer=True` in kopf.on.timer/daemon, kopf 1.45 `on.py`), so that it can stop them before the object
goes; unlike `kopf.on.delete(optional=True)` there is no public switch for timers (kopf issue #1074 asks for one;
`settings.persistence.finalizer` only renames the marker). With the finalizer, `kubectl delete` waits on a running
operator; this operator has nothing to do before deletion (owner references garbage-collect the workloads), so the
timer's handler is re-registered with `requires_finalizer=False`. That is the only internal left: stopping the timer
of a deleted object uses kopf's public `when=` filter (operator/entry/handlers.py), which kopf re-evaluates on every watch
event, DELETED included, and stops a timer whose filter no longer matches.

If a kopf release changes the registry's shape, `timer_without_finalizer` raises `KopfInternalsChanged` at start-up,
before any object is touched, naming the kopf version and the range this adapter was checked against (pyproject.toml
pins the same range).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf

__all__ = ["KOPF_CHECKED", "KopfInternalsChanged", "timer_without_finalizer"]

KOPF_CHECKED = ">=1.37,<1.46"     # kopf releases this adapter was checked against (pyproject.toml: the same pin)


class KopfInternalsChanged(RuntimeError):
    """kopf's registry no longer has the shape this adapter edits."""

    def __init__(self, what: str) -> None:
        version = getattr(kopf, "__version__", "unknown")
        super().__init__(f"kopf {version}: {what}; operator/entry/kopf_compat.py was checked against kopf{KOPF_CHECKED}. "
                         f"Install a kopf in that range, or update the adapter (it removes the finalizer kopf puts on "
                         f"every object for a timer)")


def timer_without_finalizer(registry: kopf.OperatorRegistry, handler_id: str) -> None:
    """Re-register the timer `handler_id` with `requires_finalizer=False`; KopfInternalsChanged if kopf moved."""
    spawning: Any = getattr(registry, "_spawning", None)
    handlers = getattr(spawning, "_handlers", None)
    if not isinstance(handlers, list):
        raise KopfInternalsChanged("OperatorRegistry has no `_spawning._handlers` list (where timers are registered)")
    found = [h for h in handlers if getattr(h, "id", None) == handler_id]
    if len(found) != 1:
        raise KopfInternalsChanged(f"{len(found)} spawning handlers have the id {handler_id!r} (expected the one timer)")
    handler = found[0]
    if not dataclasses.is_dataclass(handler) or isinstance(handler, type) or "requires_finalizer" not in {f.name for f in dataclasses.fields(handler)}:
        raise KopfInternalsChanged(f"the timer handler {type(handler).__name__} has no dataclass field `requires_finalizer`")
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False) if h is handler else h for h in handlers]
    check = [h for h in registry._spawning.get_all_handlers() if h.id == handler_id]
    if [h.requires_finalizer for h in check] != [False]:
        raise KopfInternalsChanged("the timer still requires a finalizer after the adapter removed it")
