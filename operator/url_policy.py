"""Which Prometheus URLs a ServingTopology may name: the allow-list the chart gives the operator.

Called by operator/live.py before the operator reads a token Secret or sends a query: a resource author must
not have the operator (and its bearer token) call any URL of their choosing. Pure: strings in, a verdict out.

Rules are globs over the normalised URL `scheme://host[:port][/path]` (lower-case scheme and host, no trailing
slash): `*` matches any run of characters but `/`, `@`, `?` and `#` (so it stays inside the host or one path
segment), `**` matches anything, so `http://prometheus-operated.*.svc:9090` allows that Service in every namespace and
`https://prom.example.com/**` a prefix. A URL with user info, a query or a fragment is never allowed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["UrlAllowList", "DEFAULT_PROMETHEUS_URLS", "normalise_url"]

# The in-cluster Prometheus Services the chart's PodMonitors feed: the Prometheus Operator's governing Service
# `prometheus-operated` (port 9090) and kube-prometheus-stack's `<release>-kube-prometheus-prometheus`, in any
# namespace, short or fully qualified.
DEFAULT_PROMETHEUS_URLS: tuple[str, ...] = (
    "http://prometheus-operated.*.svc:9090",
    "http://prometheus-operated.*.svc.cluster.local:9090",
    "http://*-kube-prometheus-prometheus.*.svc:9090",
    "http://*-kube-prometheus-prometheus.*.svc.cluster.local:9090",
)


def normalise_url(url: str) -> str | None:
    """`scheme://host[:port][/path]` of an http(s) URL, or None when it has user info, a query, a fragment or no host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    if parts.query or parts.fragment or "@" in parts.netloc:
        return None
    host = parts.hostname.lower() + (f":{port}" if port is not None else "")
    return f"{parts.scheme}://{host}{parts.path.rstrip('/')}"


def _compile(pattern: str) -> re.Pattern[str]:
    out = []
    for token in re.split(r"(\*\*|\*)", pattern.strip().rstrip("/")):
        out.append(".*" if token == "**" else "[^/@?#]*" if token == "*" else re.escape(token))
    return re.compile("".join(out), re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class UrlAllowList:
    """The glob rules a Prometheus URL must match (see the module docstring)."""

    patterns: tuple[str, ...]

    @staticmethod
    def of(patterns: Sequence[str]) -> UrlAllowList:
        return UrlAllowList(tuple(p.strip() for p in patterns if p.strip()))

    def allows(self, url: str) -> bool:
        normal = normalise_url(url)
        return normal is not None and any(_compile(p).fullmatch(normal) for p in self.patterns)

    def refusal(self, url: str, *, field: str) -> str | None:
        """Why `url` is refused (naming `field` and the allowed rules), or None when it is allowed."""
        if self.allows(url):
            return None
        rules = ", ".join(self.patterns) or "none: the operator was given an empty allow-list"
        return (f"{field} {url!r} is not allowed by the operator's Prometheus URL allow-list ({rules}); no request was made. "
                "Use an allowed URL, or ask the operator's administrator to add it (chart value operator.prometheusUrlAllowList)")
