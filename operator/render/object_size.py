"""The API server's size limits, checked on the rendered objects before anything is applied.

Called by operator/reconcile.py on every object a pass would apply; pure (dicts in, sentences out). The CRD bounds
each field of a template, but not their sum: 64 pod annotations of 4 KiB each were admitted and the rendered
Deployment then broke the API server's 256 KiB annotation limit on every apply, retried for ever. Limits:

- the annotations of one ObjectMeta (the object's, or a pod template's): keys and values together at most
  262,144 bytes (apimachinery's TotalAnnotationSizeLimitB);
- one object, serialised: at most 1,572,864 bytes (etcd's default --max-request-bytes, 1.5 MiB).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["TOTAL_ANNOTATION_BYTES", "MAX_OBJECT_BYTES", "oversized", "annotation_bytes"]

TOTAL_ANNOTATION_BYTES = 262_144
MAX_OBJECT_BYTES = 1_572_864


def annotation_bytes(annotations: Mapping[str, Any]) -> int:
    """The size apimachinery counts: len(key) + len(value) over every annotation, in bytes."""
    return sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())


def _metadata(node: Any, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "metadata" and isinstance(value, Mapping):
                yield where, value
            yield from _metadata(value, where)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _metadata(item, f"{path}[{i}]")


def _size(node: Any) -> int:
    return len(json.dumps(node, separators=(",", ":"), ensure_ascii=False).encode())


def _largest(node: Any, path: str) -> tuple[str, int]:
    """The deepest field that holds most of `node`'s bytes (descending while one child holds over half)."""
    total = _size(node)
    children = (list(node.items()) if isinstance(node, Mapping)
                else [(f"[{i}]", v) for i, v in enumerate(node)] if isinstance(node, list) else [])
    if not children:
        return path, total
    key, child = max(children, key=lambda kv: _size(kv[1]))
    if _size(child) * 2 < total:
        return path, total
    return _largest(child, f"{path}{key}" if str(key).startswith("[") else (f"{path}.{key}" if path else str(key)))


def oversized(obj: Mapping[str, Any]) -> list[str]:
    """A sentence for each limit `obj` breaks, naming the field that grew it (empty: it fits)."""
    meta = obj.get("metadata") or {}
    name = f"{obj.get('kind')}/{meta.get('name')}"
    out = []
    for where, metadata in _metadata(obj, ""):
        annotations = metadata.get("annotations")
        if isinstance(annotations, Mapping) and (n := annotation_bytes(annotations)) > TOTAL_ANNOTATION_BYTES:
            out.append(f"{name}: {where}.annotations total {n:,} bytes, over the API server's {TOTAL_ANNOTATION_BYTES:,} "
                       f"(keys and values together; {len(annotations)} annotations)")
    total = _size(obj)
    if total > MAX_OBJECT_BYTES:
        where, held = _largest(obj, "")
        out.append(f"{name}: {total:,} bytes serialised, over the API server's {MAX_OBJECT_BYTES:,}; {where or 'the object'} "
                   f"holds {held:,} of them")
    return out
