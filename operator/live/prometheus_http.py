"""The Prometheus HTTP client: one query (instant or range) to the host and port the allow-list checked, read within bounds.

Called by operator/live/metrics.py (`PrometheusMetrics`), one client per metrics read, and operator/live/history.py
(`calibrate --prometheus`'s range queries). Owns the socket, the HTTP/1.1
exchange and the JSON answer; must not decide anything about the figures. The server is untrusted (its URL is a
resource author's), so every read is bounded and every failure is a `PrometheusAnswerError` with a named reason:

    PrometheusAnswerError(reason=PrometheusFailure.*)
    ├── PrometheusRedirectRefused   a 3xx: never followed (the Location is neither read out nor called)
    ├── PrometheusAddressRefused    the checked name resolves where the address policy forbids (url_policy.py,
    │                               ResolvedAddressChecked): nothing is connected to
    ├── PrometheusAnswerTooLarge    a body (or headers) past the cap, refused as soon as it passes, never read whole
    ├── PrometheusTimeout           the query's deadline (one total for resolving, connect, headers and body; never per read)
    ├── PrometheusCertificateUntrusted  https: the server's certificate does not chain to the CA (spec.metrics.tls.ca,
    │                               else the system's), has expired, or does not name the URL's host (TlsNamed)
    ├── PrometheusTLSFailed         https: the handshake or the session failed otherwise (a protocol the server does not
    │                               speak, a client certificate it asks for or refuses, plain HTTP on the port)
    ├── PrometheusAnswerInvalid     not HTTP/1.x, not UTF-8 JSON, nested past the depth cap, NaN/Infinity/overflowing
    │                               numbers, a truncated body, no Prometheus `data.result`, or an answer in more pieces
    │                               (reads and chunks) than ReadLimits.pieces
    └── MetricsUnavailable          no connection, or an HTTP error status (only the code is kept, never the body)

Interim1xx: a `100 Continue` (any 1xx but 101) before the answer is skipped, as RFC 9110 says, within the header cap
and at most MAX_INTERIM of them; a 101 is refused (no upgrade was asked for). BoundedPieces: each read costs a system
call and each chunk a parse, so an answer sent a byte at a time cost 24.6 CPU s; past `pieces` reads and chunks
together it is refused (a real answer comes in a few, 1 MiB in 64 KiB reads in 16). ResolveWithinDeadline: the name is
resolved in a small bounded pool of threads, waited for no longer than the query's deadline (getaddrinfo itself has no
timeout), and every address is checked before one is connected to.

TlsNamed: an ssl error is worded from its verify message or OpenSSL reason code only (what the client found, never the
server's bytes); nothing is sent before the handshake verified the server. The context (operator/live/prometheus_tls.py)
always verifies.

The bearer token is sent only in the one request this client makes, to `url.host:url.port`; nothing here parses a
URL again or follows one the server names.
"""

from __future__ import annotations

import enum
import json
import math
import re
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from servingtopology.operator.live.url_policy import AddressPolicy, PrometheusUrl

__all__ = ["PrometheusFailure", "PrometheusAnswerError", "tls_failure", "ReadLimits", "BoundedPrometheus", "parse_answer", "parse_matrix",
           "nesting_exceeds", "MAX_DEPTH"]


class PrometheusFailure(enum.StrEnum):
    """Why a query has no answer: the reason of the MetricsAvailable=False condition."""

    REDIRECT_REFUSED = "PrometheusRedirectRefused"
    ADDRESS_REFUSED = "PrometheusAddressRefused"
    TOO_LARGE = "PrometheusAnswerTooLarge"
    TIMEOUT = "PrometheusTimeout"
    CERT_UNTRUSTED = "PrometheusCertificateUntrusted"
    TLS_FAILED = "PrometheusTLSFailed"
    TLS_CONFIG_INVALID = "PrometheusTLSConfigInvalid"   # spec.metrics.tls unusable (operator/live/prometheus_tls.py)
    INVALID = "PrometheusAnswerInvalid"
    UNAVAILABLE = "MetricsUnavailable"


class PrometheusAnswerError(Exception):
    """A query without a usable answer; `reason` names it, the message says why without repeating the server."""

    def __init__(self, reason: PrometheusFailure, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# TlsNamed: OpenSSL reason codes that mean the server asked for a client certificate, or refused the one shown.
_CLIENT_CERT_ALERTS = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "CERTIFICATE_UNKNOWN", "HANDSHAKE_FAILURE")


def tls_failure(exc: ssl.SSLError, authority: str) -> PrometheusAnswerError:
    """The named failure of an ssl error talking to `authority` (TlsNamed): CERT_UNTRUSTED for a certificate that failed
    verification, TLS_FAILED for anything else, each worded from OpenSSL's verify message or reason code."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = str(exc.verify_message or exc.reason or "verification failed")[:160]
        return PrometheusAnswerError(PrometheusFailure.CERT_UNTRUSTED, f"the certificate of {authority} is not trusted: {why}; "
                                     "nothing was sent. Give the CA that signed it in spec.metrics.tls.ca")
    code = str(exc.reason or type(exc).__name__)[:80]
    hint = ""
    if any(alert in code for alert in _CLIENT_CERT_ALERTS):
        hint = "; the server asks for a client certificate, or refused the one shown (spec.metrics.tls.cert and .key)"
    elif isinstance(exc, ssl.SSLEOFError) or "EOF" in code:
        hint = ("; the server closed the session without a word, as a server does that asks for a client certificate and "
                "got none or one it does not trust (spec.metrics.tls.cert and .key)")
    elif "WRONG_VERSION_NUMBER" in code or "RECORD_LAYER" in code:
        hint = "; the port may not serve TLS (an http:// URL?)"
    return PrometheusAnswerError(PrometheusFailure.TLS_FAILED, f"TLS with {authority} failed: {code}{hint}")


MAX_DEPTH = 32   # a real answer is 6 levels deep


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """What one answer may cost. A real answer to the operator's aggregated queries is under 2 KiB, 6 levels deep."""

    answer_bytes: int = 1 << 20      # the body, after chunked decoding
    header_bytes: int = 32 << 10     # status line and headers together
    query_s: float = 10.0            # connect, send, headers and body of one query
    depth: int = MAX_DEPTH           # [ and { open at once
    pieces: int = 4096               # reads and chunks of one answer together (BoundedPieces)


MAX_INTERIM = 8    # 1xx interim responses skipped before the answer (Interim1xx)
# ResolveWithinDeadline: the resolutions running at once; one stuck past its query's deadline holds a thread until the
# resolver gives up (its own timeout), never more than these, and a query waiting for a free one still ends at its deadline.
RESOLVER_THREADS = 4
_RESOLVERS = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="prometheus-resolve")
Resolver = Callable[[str, int], Sequence[tuple[Any, ...]]]


def _getaddrinfo(host: str, port: int) -> Sequence[tuple[Any, ...]]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


_STATUS = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: [^\r\n]*)?\r?\n")
_CHUNK = re.compile(rb"([0-9a-fA-F]{1,8})(?:;[^\r\n]*)?\r?\n")
_STRING = re.compile(rb'"(?:[^"\\]|\\.?)*+"?', re.DOTALL)   # possessive: linear on any input, unterminated strings too
_NON_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_MAX_INT_DIGITS = 40


def nesting_exceeds(body: bytes, depth: int) -> bool:
    """Whether `body` (JSON) opens more than `depth` brackets at once, or leaves them unbalanced.

    Strings are blanked first; then each pass deletes every innermost pair, so `depth` passes empty a body that is
    nested at most `depth` deep. Bytes operations only: no recursion, linear per pass."""
    brackets = _STRING.sub(b'""', body).translate(None, _NON_BRACKETS).replace(b"{", b"[").replace(b"}", b"]")
    for _ in range(depth):
        if not brackets:
            return False
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return True           # unbalanced: `][` or a bracket left open
        brackets = shorter
    return bool(brackets)


def _invalid(why: str) -> PrometheusAnswerError:
    return PrometheusAnswerError(PrometheusFailure.INVALID, f"HTTP 200 with a body that is not Prometheus JSON ({why})")


def _refuse_constant(name: str) -> Any:
    raise _invalid(f"a bare {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _invalid("a number too large for a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _invalid(f"an integer of more than {_MAX_INT_DIGITS} digits")
    return int(text)


def _result(body: bytes, depth: int) -> tuple[Any, Any]:
    """(resultType, result) of a Prometheus answer read within the bounds; PrometheusAnswerError (INVALID) otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("not UTF-8") from None
    if nesting_exceeds(body, depth):
        raise _invalid(f"nested deeper than {depth} levels or unbalanced")
    try:
        answer = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except ValueError:       # JSONDecodeError; a PrometheusAnswerError from the hooks passes through
        raise _invalid("not JSON") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, dict) or "result" not in data or answer.get("status") != "success":
        raise PrometheusAnswerError(PrometheusFailure.INVALID, "HTTP 200 without a Prometheus result (no data.result)")
    return data.get("resultType"), data["result"]


def _is_point(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], str) and len(value[1]) <= 64


def parse_answer(body: bytes, *, depth: int = MAX_DEPTH) -> list[dict[str, Any]]:
    """The instant vector of a Prometheus answer (a scalar becomes one unlabelled sample); PrometheusAnswerError
    (INVALID) for anything else. Values stay Prometheus's strings; each sample is `{"metric": {...}, "value": [t, "v"]}`."""
    kind, result = _result(body, depth)
    if kind == "scalar":
        result = [{"metric": {}, "value": result}]
    elif kind != "vector" or not isinstance(result, list):
        raise _invalid(f"a result of type {str(kind)[:20]!r}, not an instant vector or a scalar")
    for sample in result:
        if not (isinstance(sample, dict) and _is_point(sample.get("value")) and isinstance(sample.get("metric", {}), dict)):
            raise _invalid("a sample that is not {metric, value: [time, \"number\"]}")
    return result


def parse_matrix(body: bytes, *, depth: int = MAX_DEPTH) -> list[dict[str, Any]]:
    """The range vector of a query_range answer: each series `{"metric": {...}, "values": [[t, "v"], ...]}`, values
    Prometheus's strings; PrometheusAnswerError (INVALID) for anything else."""
    kind, result = _result(body, depth)
    if kind != "matrix" or not isinstance(result, list):
        raise _invalid(f"a result of type {str(kind)[:20]!r}, not a range vector")
    for series in result:
        values = series.get("values") if isinstance(series, dict) else None
        if not (isinstance(values, list) and all(_is_point(v) for v in values) and isinstance(series.get("metric", {}), dict)):
            raise _invalid("a series that is not {metric, values: [[time, \"number\"], ...]}")
    return result


class _Exchange:
    """One request and its response on one socket, every read bounded by the query's deadline."""

    def __init__(self, sock: socket.socket, *, deadline_s: float, clock: Callable[[], float], limits: ReadLimits,
                 host: str = "") -> None:
        self.sock, self.deadline_s, self.clock, self.limits = sock, deadline_s, clock, limits
        self.sock_host = host
        self.buffer = bytearray()
        self.eof = False
        self.pieces = 0

    def _piece(self) -> None:
        """Count one read or chunk against `limits.pieces` (BoundedPieces)."""
        self.pieces += 1
        if self.pieces > self.limits.pieces:
            raise _invalid(f"sent in more than {self.limits.pieces} pieces (reads and chunks); a real answer comes in a few")

    def _remaining_s(self) -> float:
        left = self.deadline_s - self.clock()
        if left <= 0:
            raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"no whole answer within {self.limits.query_s:g} s")
        return left

    def _fill(self) -> None:
        """Read what the server sent next (at most 64 KiB), waiting no longer than the deadline."""
        self._piece()
        self.sock.settimeout(self._remaining_s())
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"no whole answer within {self.limits.query_s:g} s") from None
        except ssl.SSLError as exc:
            raise tls_failure(exc, self.sock_host) from None
        if not data:
            self.eof = True
        self.buffer += data

    def _take(self, n: int) -> bytes:
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    def head(self) -> tuple[int, dict[str, str]]:
        """The final status code and its headers (names lower-case), past any 1xx interim responses (Interim1xx);
        refused past `header_bytes`, all heads together."""
        seen = 0
        for _ in range(MAX_INTERIM + 1):
            raw = self._one_head(self.limits.header_bytes - seen)
            seen += len(raw)
            status = _STATUS.match(raw)
            if status is None:
                raise _invalid("no HTTP/1.x status line")
            code = int(status.group(1))
            if code == 101:
                raise _invalid("HTTP 101: a protocol switch nobody asked for")
            if not 100 <= code < 200:
                return code, self._headers(raw, status.end())
        raise _invalid(f"more than {MAX_INTERIM} interim (1xx) responses before the answer")

    def _one_head(self, budget: int) -> bytes:
        """One status line and its headers, up to the blank line; refused past `budget` bytes."""
        while b"\r\n\r\n" not in self.buffer and b"\n\n" not in self.buffer:
            if len(self.buffer) > budget:
                raise PrometheusAnswerError(PrometheusFailure.TOO_LARGE, f"headers over {self.limits.header_bytes} bytes")
            if self.eof:
                raise _invalid("the connection closed before the headers ended")
            self._fill()
        ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := self.buffer.find(sep)) >= 0]
        raw = self._take(min(ends))
        if len(raw) > budget:
            raise PrometheusAnswerError(PrometheusFailure.TOO_LARGE, f"headers over {self.limits.header_bytes} bytes")
        return raw

    @staticmethod
    def _headers(raw: bytes, start: int) -> dict[str, str]:
        headers: dict[str, str] = {}
        for line in raw[start:].splitlines():
            name, sep, value = line.partition(b":")
            if not line.strip():
                continue
            if not sep or not name.strip() or name != name.strip():
                raise _invalid("a malformed header line")
            key, text = name.decode("latin-1").lower(), value.strip().decode("latin-1")
            if key in headers and key in ("content-length", "transfer-encoding") and headers[key] != text:
                raise _invalid(f"two different {key} headers")
            headers[key] = text
        return headers

    def _capped(self, size: int) -> None:
        if size > self.limits.answer_bytes:
            raise PrometheusAnswerError(PrometheusFailure.TOO_LARGE, f"an answer over {self.limits.answer_bytes} bytes")

    def body(self, headers: dict[str, str]) -> bytes:
        """The body by Content-Length, chunked coding, or up to the close; refused as soon as it passes the cap."""
        coding = headers.get("transfer-encoding", "").lower()
        if coding and coding != "chunked":
            raise _invalid(f"transfer coding {coding[:20]!r}")
        if headers.get("content-encoding", "identity").lower() not in ("identity", ""):
            raise _invalid("a compressed body (identity was asked for)")
        if coding == "chunked":
            return self._chunked()
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit() or len(length) > 15:
                raise _invalid("a Content-Length that is not a number")
            self._capped(int(length))
            while len(self.buffer) < int(length):
                if self.eof:
                    raise _invalid("the body ended before its Content-Length (truncated)")
                self._fill()
            return self._take(int(length))
        while not self.eof:
            self._capped(len(self.buffer))
            self._fill()
        self._capped(len(self.buffer))
        return self._take(len(self.buffer))

    def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            while (line := _CHUNK.match(self.buffer)) is None:
                if len(self.buffer) > 1024 or self.eof or b"\n" in self.buffer:
                    raise _invalid("a malformed or truncated chunk")
                self._fill()
            size = int(line.group(1), 16)
            del self.buffer[:line.end()]
            self._piece()
            self._capped(len(out) + size)
            if size == 0:
                return bytes(out)       # trailers, if any, are left unread: the connection is closed next
            while len(self.buffer) < size + 1:
                if self.eof:
                    raise _invalid("a truncated chunk")
                self._fill()
            out += self._take(size)
            while not (self.buffer.startswith(b"\r\n") or self.buffer.startswith(b"\n")):
                if len(self.buffer) >= 2 or self.eof:
                    raise _invalid("a chunk without its line end")
                self._fill()
            del self.buffer[:2 if self.buffer.startswith(b"\r\n") else 1]


class BoundedPrometheus:
    """Instant queries against one checked Prometheus URL (see the module docstring for every bound)."""

    def __init__(self, url: PrometheusUrl, *, bearer_token: str | None = None, limits: ReadLimits | None = None,
                 deadline_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 tls: ssl.SSLContext | None = None, addresses: AddressPolicy | None = None,
                 resolve: Resolver = _getaddrinfo) -> None:
        """`deadline_s`: a monotonic instant no query may pass (the read's deadline), besides each query's own;
        `addresses`: where the URL's name may resolve to (url_policy.py, ResolvedAddressChecked); `resolve`: getaddrinfo."""
        if bearer_token is not None and any(not 0x20 < ord(c) < 0x7F for c in bearer_token):
            raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, "the bearer token has whitespace or control characters")
        self.url, self.limits, self.clock = url, limits or ReadLimits(), clock
        self.deadline_s, self._token, self._tls = deadline_s, bearer_token, tls
        self.addresses, self._resolve = addresses or AddressPolicy(), resolve

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The instant vector of `query` (see parse_answer)."""
        return parse_answer(self._get("query", {"query": query, **(params or {})}), depth=self.limits.depth)

    def range_query(self, query: str, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        """The range vector of `query` from `start_s` to `end_s` (Unix seconds) every `step_s` (see parse_matrix); the
        same bounds as an instant query: the answer cap decides how long a history one query may carry."""
        params = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
        return parse_matrix(self._get("query_range", params), depth=self.limits.depth)

    def _get(self, endpoint: str, params: dict[str, Any]) -> bytes:
        """The body of a 200 answer to GET /api/v1/`endpoint` (every bound of the module docstring)."""
        deadline_s = self.clock() + self.limits.query_s
        if self.deadline_s is not None:
            deadline_s = min(deadline_s, self.deadline_s)
        target = f"{self.url.path}/api/v1/{endpoint}?{urlencode(params)}"
        lines = [f"GET {target} HTTP/1.1", f"Host: {self.url.authority}", "Accept: application/json", "Accept-Encoding: identity",
                 "Connection: close", "User-Agent: servingtopology-operator"]
        if self._token:
            lines.append(f"Authorization: Bearer {self._token}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
        with self._connect(deadline_s) as sock:
            exchange = _Exchange(sock, deadline_s=deadline_s, clock=self.clock, limits=self.limits, host=self.url.authority)
            sock.settimeout(exchange._remaining_s())
            try:
                sock.sendall(request)
            except TimeoutError:
                raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"the query was not sent within {self.limits.query_s:g} s") from None
            except ssl.SSLError as exc:
                raise tls_failure(exc, self.url.authority) from None
            status, headers = exchange.head()
            if 300 <= status < 400:
                raise PrometheusAnswerError(PrometheusFailure.REDIRECT_REFUSED, f"HTTP {status}: a redirect, which is never followed")
            if status != 200:
                raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"HTTP {status}")
            return exchange.body(headers)

    def _connect(self, deadline_s: float) -> socket.socket:
        """A socket to the checked host and port (TLS for https), opened within the deadline."""
        def left() -> float:
            remaining = deadline_s - self.clock()
            if remaining <= 0:
                raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"no connection within {self.limits.query_s:g} s")
            return remaining

        resolving = _RESOLVERS.submit(self._resolve, self.url.host, self.url.port)
        try:
            found = list(resolving.result(timeout=left()))
        except FutureTimeout:
            resolving.cancel()
            raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"{self.url.host} was not resolved within "
                                                                   f"{self.limits.query_s:g} s") from None
        except OSError as exc:
            raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"cannot resolve {self.url.host}: {exc.strerror or exc}") from None
        allowed: list[tuple[Any, ...]] = []
        refused: list[str] = []
        for info in found[:16]:   # only the addresses the policy allows are connected to, the first four at most
            why = self.addresses.refusal(self.url, str(info[4][0]))
            if why is None:
                allowed.append(info)
            else:
                refused.append(why)
        if not allowed:
            raise PrometheusAnswerError(PrometheusFailure.ADDRESS_REFUSED, (refused[0] if refused else f"{self.url.host} resolves to no address")
                                        + "; nothing was connected to")
        error: OSError | None = None
        for family, kind, proto, _, address in allowed[:4]:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(left())
                sock.connect(address)
                if self.url.scheme == "https":
                    tls = self._tls or ssl.create_default_context()
                    wrapped = tls.wrap_socket(sock, server_hostname=self.url.host, do_handshake_on_connect=False)
                    wrapped.settimeout(left())
                    wrapped.do_handshake()
                    return wrapped
                return sock
            except TimeoutError:
                sock.close()
                raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"no connection within {self.limits.query_s:g} s") from None
            except PrometheusAnswerError:
                sock.close()
                raise
            except ssl.SSLError as exc:   # the server's certificate or the handshake: another address serves the same
                sock.close()
                raise tls_failure(exc, self.url.authority) from None
            except OSError as exc:    # refused, unreachable
                sock.close()
                error = exc
        raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE,
                                    f"cannot connect to {self.url.authority}: {type(error).__name__}: {str(error)[:160]}")
