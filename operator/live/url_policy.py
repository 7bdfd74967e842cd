"""Which Prometheus URLs a ServingTopology may name, read by one parser: the allow-list the chart gives the operator.

Called by operator/live_replan.py before the operator reads a token Secret or sends a query; the `PrometheusUrl` the check
returns is what operator/live/prometheus_http.py connects to, so the host and port that were checked are the ones called.
Pure: strings in, a verdict out. A resource author must not have the operator (and its bearer token) call any URL
of their choosing.

Rules are globs over the normalised URL `scheme://host[:port][/path]` (lower-case scheme and host, no trailing
slash): `*` matches any run of characters but `/`, `@`, `?` and `#` (so it stays inside the host or one path
segment), `**` matches anything, so `http://prometheus-operated.*.svc:9090` allows that Service in every namespace and
`https://prom.example.com/**` a prefix.

OneReading: a URL is refused before any rule is tried when two parsers could read it differently (the allow-list
once used urllib.parse and the HTTP client urllib3, which split `http://evil.example\\x.svc:9090` at the backslash):
- a backslash, whitespace, a control or non-ASCII character anywhere;
- user info (`@`), a query or a fragment; percent-encoding anywhere; a `.` or `..` path segment;
- a host that is not a plain DNS name, a dotted-quad IPv4 address or a bracketed IPv6 address (`127.1`, `0x7f.1`);
- a port outside 1..65535; a scheme other than http and https;
- any URL urllib.parse.urlsplit or urllib3.util.parse_url reads with another scheme, host or port than this parser.

ResolvedAddressChecked: a rule allows a name, and DNS says where the name points; a tenant can make an allowed name
point elsewhere (an ExternalName `prometheus-operated` Service in their namespace names any host). So the client checks
every address a name resolves to before it connects (`AddressPolicy`, operator/live/prometheus_http.py):
- an IP address in the URL is the address a rule allowed by its spelling: no DNS, nothing more to check;
- with networks given (the chart's operator.prometheusNetworks, `--allow-prometheus-network`: the cluster's Service
  CIDR, say), a name's addresses must all lie in them;
- without, a name may resolve anywhere but to loopback (the operator's own pod: its probes and metrics), link-local
  (the node's and the cloud's metadata services, 169.254.169.254), unspecified, multicast or reserved addresses, IPv4
  ones written as IPv6 included. The refusal is `PrometheusAddressRefused`, naming the name, the address and the rule.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["UrlAllowList", "AddressPolicy", "parse_network", "DEFAULT_PROMETHEUS_URLS", "normalise_url", "PrometheusUrl", "UrlRefused", "parse_prometheus_url",
           "UrlVerdict", "URL_NOT_ALLOWED", "URL_REFUSED"]

# The in-cluster Prometheus Services the chart's PodMonitors feed: the Prometheus Operator's governing Service
# `prometheus-operated` (port 9090) and kube-prometheus-stack's `<release>-kube-prometheus-prometheus`, in any
# namespace, short or fully qualified.
DEFAULT_PROMETHEUS_URLS: tuple[str, ...] = (
    "http://prometheus-operated.*.svc:9090",
    "http://prometheus-operated.*.svc.cluster.local:9090",
    "http://*-kube-prometheus-prometheus.*.svc:9090",
    "http://*-kube-prometheus-prometheus.*.svc.cluster.local:9090",
)
URL_NOT_ALLOWED = "PrometheusUrlNotAllowed"   # read one way, but no rule allows it
URL_REFUSED = "PrometheusUrlRefused"          # not read one way (OneReading): no rule is even tried

_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHAPE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<path>[^?#]*)(?P<rest>[?#].*)?", re.DOTALL)
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::(?P<port>[0-9]{1,5}))?")
_PATH = re.compile(r"(?:/[A-Za-z0-9._~!$&'()*+,;=:-]*)*")


class UrlRefused(ValueError):
    """A URL that is not read one way (OneReading); the message says which rule refused it."""


@dataclass(frozen=True, slots=True)
class PrometheusUrl:
    """One reading of a Prometheus URL: what the allow-list checks and the client connects to.

    `host` is lower-case (an IPv6 address without brackets); `port` is the explicit port or the scheme's default;
    `path` has no trailing slash."""

    scheme: str
    host: str
    port: int
    path: str
    explicit_port: bool

    @property
    def authority(self) -> str:
        """`host[:port]` as the Host header and the normalised URL spell it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.explicit_port else host

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}{self.path}"


def _host(text: str) -> str:
    if text.startswith("["):
        try:
            return str(ipaddress.IPv6Address(text[1:-1])).lower()
        except ValueError:
            raise UrlRefused("its host is not an IPv6 address") from None
    host = text.lower()
    if not _HOSTNAME.fullmatch(host) or len(host) > 253:
        raise UrlRefused("its host is not a DNS name or an IP address (letters, digits, '-' and '.')")
    last = host.rsplit(".", 1)[-1]
    if last.isdigit() or last.startswith("0x"):   # numeric: only the dotted quad, never 127.1 or 0x7f.1
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise UrlRefused("its host looks numeric but is not a dotted-quad IPv4 address") from None
    return host


def _agrees(text: str, url: PrometheusUrl) -> bool:
    """Whether urllib.parse and urllib3 read the same scheme, host and port (OneReading's last rule)."""
    from urllib3.util import parse_url

    try:
        split, other = urlsplit(text), parse_url(text)
        split_port, other_port = split.port, other.port
    except ValueError:
        return False
    other_host = (other.host or "").strip("[]").lower()
    if ":" in other_host:
        other_host = str(ipaddress.IPv6Address(other_host)).lower()
    return ((split.scheme.lower(), (split.hostname or "").lower(), split_port or _DEFAULT_PORTS.get(split.scheme.lower()))
            == ((other.scheme or "").lower(), other_host, other_port or _DEFAULT_PORTS.get((other.scheme or "").lower()))
            == (url.scheme, url.host, url.port))


def parse_prometheus_url(text: str) -> PrometheusUrl:
    """Read `text` one way, or raise UrlRefused naming the rule it breaks (OneReading, in the module docstring)."""
    if "\\" in text:
        raise UrlRefused("it has a backslash (URL parsers disagree on where its host ends)")
    if any(not 0x21 <= ord(c) <= 0x7E for c in text):
        raise UrlRefused("it has whitespace, a control character or a non-ASCII character")
    if "%" in text:
        raise UrlRefused("it has percent-encoding ('%')")
    shape = _SHAPE.fullmatch(text)
    if shape is None:
        raise UrlRefused("it is not scheme://host[:port][/path]")
    scheme = shape["scheme"].lower()
    if scheme not in _DEFAULT_PORTS:
        raise UrlRefused(f"its scheme {scheme!r} is not http or https")
    if shape["rest"] is not None:
        raise UrlRefused("it has a query or a fragment")
    authority = shape["authority"]
    if "@" in authority:
        raise UrlRefused("it has user info ('@')")
    parts = _HOST_PORT.fullmatch(authority)
    if parts is None:
        raise UrlRefused("its host[:port] cannot be read one way")
    port = int(parts["port"]) if parts["port"] is not None else _DEFAULT_PORTS[scheme]
    if not 1 <= port <= 65535:
        raise UrlRefused(f"its port {port} is outside 1..65535")
    path = shape["path"].rstrip("/")
    if not _PATH.fullmatch(path) or any(seg in (".", "..") for seg in path.split("/")):
        raise UrlRefused("its path has characters outside letters, digits and -._~!$&'()*+,;=: or a '.'/'..' segment")
    url = PrometheusUrl(scheme=scheme, host=_host(parts["host"]), port=port, path=path, explicit_port=parts["port"] is not None)
    if not _agrees(text, url):
        raise UrlRefused("urllib.parse and urllib3 read its scheme, host or port differently")
    return url


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_network(text: str) -> Network:
    """A CIDR such as `10.96.0.0/12` (a bare address is its /32 or /128); raises ValueError naming the shape."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{text!r} is not a network: give a CIDR such as 10.96.0.0/12 or fd00::/108") from None


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Where a checked name may resolve to (ResolvedAddressChecked, in the module docstring); pure."""

    networks: tuple[Network, ...] = ()

    def refusal(self, url: PrometheusUrl, address: str) -> str | None:
        """Why the client may not connect to `address`, one of `url.host`'s (None: it may)."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{url.host} resolved to {address[:60]!r}, not an IP address"
        if _is_literal(url.host):
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if self.networks:
            if any(ip in n for n in self.networks if n.version == ip.version):
                return None
            return (f"{url.host} resolves to {ip}, outside the networks the operator may call "
                    f"({', '.join(map(str, self.networks))}: --allow-prometheus-network)")
        for kind, hit in (("loopback: the operator's own pod", ip.is_loopback),
                          ("link-local: the node's and the cloud's metadata services", ip.is_link_local),
                          ("unspecified", ip.is_unspecified), ("multicast", ip.is_multicast), ("reserved", ip.is_reserved)):
            if hit:
                return (f"{url.host} resolves to {ip}, a {kind} address, which a name in the allow-list never reaches (an "
                        "address in the URL itself, or --allow-prometheus-network, can allow it)")
        return None


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def normalise_url(url: str) -> str | None:
    """`scheme://host[:port][/path]` of an http(s) URL read one way, or None when it is refused (OneReading)."""
    try:
        return str(parse_prometheus_url(url))
    except UrlRefused:
        return None


def _compile(pattern: str) -> re.Pattern[str]:
    out = []
    for token in re.split(r"(\*\*|\*)", pattern.strip().rstrip("/")):
        out.append(".*" if token == "**" else "[^/@?#]*" if token == "*" else re.escape(token))
    return re.compile("".join(out), re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class UrlVerdict:
    """The allow-list's answer: the URL to call, or why not (`reason` is URL_REFUSED or URL_NOT_ALLOWED)."""

    url: PrometheusUrl | None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class UrlAllowList:
    """The glob rules a Prometheus URL must match (see the module docstring)."""

    patterns: tuple[str, ...]
    addresses: AddressPolicy = field(default_factory=AddressPolicy)   # where an allowed name may resolve to

    @staticmethod
    def of(patterns: Sequence[str], *, networks: Sequence[Network] = ()) -> UrlAllowList:
        return UrlAllowList(tuple(p.strip() for p in patterns if p.strip()), AddressPolicy(tuple(networks)))

    def allows(self, url: str) -> bool:
        return self.check(url, field="url").url is not None

    def check(self, url: str, *, field: str) -> UrlVerdict:
        """The one reading of `url` when a rule allows it; else why not, naming `field` (and the rules)."""
        try:
            parsed = parse_prometheus_url(url)
        except UrlRefused as why:
            return UrlVerdict(None, URL_REFUSED, f"{field} {url!r} is refused: {why}; no request was made. Spell the URL as "
                                                 "scheme://host[:port][/path] with a plain DNS name or IP address")
        if any(_compile(p).fullmatch(str(parsed)) for p in self.patterns):
            return UrlVerdict(parsed)
        rules = ", ".join(self.patterns) or "none: the operator was given an empty allow-list"
        return UrlVerdict(None, URL_NOT_ALLOWED,
                          f"{field} {url!r} is not allowed by the operator's Prometheus URL allow-list ({rules}); no request was "
                          "made. Use an allowed URL, or ask the operator's administrator to add it (chart value "
                          "operator.prometheusUrlAllowList)")

    def refusal(self, url: str, *, field: str) -> str | None:
        """Why `url` is refused (naming `field` and the allowed rules), or None when it is allowed."""
        verdict = self.check(url, field=field)
        return None if verdict.url is not None else verdict.message
