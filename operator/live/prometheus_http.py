"""The Prometheus HTTP client: one query (instant or range) to the host and port the allow-list checked, read within bounds.

Called by operator/live/metrics.py (`PrometheusMetrics`), one client per metrics read, and operator/live/history.py
(`calibrate --prometheus`'s range queries). Owns the connection (urllib3's, to the checked address), the bounds of the
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
    │                               than ReadLimits.pieces
    └── MetricsUnavailable          no connection, or an HTTP error status (only the code is kept, never the body)

The exchange is urllib3's: one `HTTPConnection`/`HTTPSConnection` to the checked IP address, the URL's host as TLS
server_hostname (SNI, the certificate's name) and as Host; one request, no pool, so nothing retries or redirects.
What urllib3 and http.client leave unbounded is kept here:
- ResolveWithinDeadline: the name is resolved in a small bounded pool of threads, waited for no longer than the
  query's deadline (getaddrinfo has no timeout), and every address is checked before one is connected to.
- OneDeadline (`QueryDeadline`): connect and handshake wait the time left; a timer shuts the socket down at the
  deadline (a per-read timeout never trips on a byte a second), and whatever the cut read raised is PrometheusTimeout.
- StreamedCap (`capped_body`): a 200's body is read a piece at a time and refused as soon as it passes `answer_bytes`
  (by its Content-Length before any of it is read); a 3xx is refused, a compressed body is invalid (identity was asked
  for, so nothing is decompressed), and another status's body is never read.
- HeadReader, the one hand-written piece: http.client skips any number of `100 Continue`, returns a `102` as the
  answer and reads 100 header lines of 64 KiB (test_prometheus_client_lows.py shows it). The reader it reads through
  skips interim 1xx heads as RFC 9110 says, at most MAX_INTERIM (Interim1xx), refuses a 101 (no upgrade was asked for)
  and the heads past `header_bytes` as soon as they pass it; then counts the body's reads (BoundedPieces: an answer
  sent a byte at a time cost 24.6 CPU s; a chunk costs three reads, 1 MiB in 64 KiB reads takes 16).

`calibrate --prometheus`'s reader (servingtopology/cli/prometheus_reader.py, on requests' connections) keeps its bounds
with the same pieces: `QueryDeadline`, `transport_failure` naming its transport failures, `capped_body` reading its
bodies, `invalid_answer` wording an invalid 200, the head reader and the parser; so one failure reads the same from both.

TlsNamed: an ssl error is worded from its verify message or OpenSSL reason code only (what the client found, never the
server's bytes); nothing is sent before the handshake verified the server. The context (operator/live/prometheus_tls.py)
always verifies; urllib3 gets it with CERT_REQUIRED and no assert_hostname, so OpenSSL checks the name.

The bearer token is sent only in the one request this client makes, to `url.host:url.port`; nothing here parses a
URL again or follows one the server names.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import http.client
import io
import json
import math
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import urllib3

from servingtopology.operator.live.url_policy import AddressPolicy, PrometheusUrl

__all__ = ["PrometheusFailure", "PrometheusAnswerError", "tls_failure", "transport_failure", "ReadLimits", "QueryDeadline",
           "capped_body", "invalid_answer", "BoundedPrometheus", "parse_answer", "parse_matrix", "nesting_exceeds", "MAX_DEPTH",
           "RESOLVER_THREADS"]


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
    pieces: int = 4096               # reads of one answer's body, three a chunk (BoundedPieces)


MAX_INTERIM = 8    # 1xx interim responses skipped before the answer (Interim1xx)
_PIECE_BYTES = 65536   # one read of a body (capped_body): a 1 MiB answer in 16, well inside ReadLimits.pieces
# ResolveWithinDeadline: the resolutions running at once; one stuck past its query's deadline holds a thread until the
# resolver gives up (its own timeout), never more than these, and a query waiting for a free one still ends at its deadline.
RESOLVER_THREADS = 4
_RESOLVERS = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="prometheus-resolve")
Resolver = Callable[[str, int], Sequence[tuple[Any, ...]]]


def _getaddrinfo(host: str, port: int) -> Sequence[tuple[Any, ...]]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def _timeout(limits: ReadLimits) -> PrometheusAnswerError:
    return PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"no whole answer within {limits.query_s:g} s")


class QueryDeadline:
    """One query's deadline (OneDeadline): the time each step may still take, and a timer that shuts the watched
    sockets down when the deadline passes. Started when made; `finish()` when the query is over, whatever its end.

    `not_after_s`: a monotonic instant (on `clock`) the query may not pass either, besides its own `limits.query_s`."""

    def __init__(self, limits: ReadLimits, *, clock: Callable[[], float] = time.monotonic, not_after_s: float | None = None) -> None:
        self.limits, self._clock = limits, clock
        self.deadline_s = clock() + limits.query_s
        if not_after_s is not None:
            self.deadline_s = min(self.deadline_s, not_after_s)
        self.cut, self._lock, self._done = threading.Event(), threading.Lock(), False
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(max(0.0, self.deadline_s - clock()), self._shut_down)
        self._timer.daemon = True
        self._timer.start()

    def timeout(self) -> PrometheusAnswerError:
        """The failure of a query the deadline ended (PrometheusTimeout)."""
        return _timeout(self.limits)

    def left_s(self) -> float:
        """The seconds left; the timeout failure once none are, or once the timer has cut the query."""
        left = self.deadline_s - self._clock()
        if left <= 0 or self.cut.is_set():
            raise self.timeout()
        return left

    def watch(self, sock: socket.socket) -> None:
        """Shut `sock` down at the deadline (at once where it has passed)."""
        with self._lock:
            if self._done:
                return
            self._sockets.append(sock)
            if self.cut.is_set():
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):      # socket.socket's own shutdown: ssl's would race the reading thread
            socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _shut_down(self) -> None:
        with self._lock:
            if self._done:
                return
            self.cut.set()
            for sock in self._sockets:
                self._shut(sock)

    def finish(self) -> None:
        """Stop the timer; a socket watched from now on is left alone."""
        with self._lock:
            self._done = True
        self._timer.cancel()

    def resolve(self, host: str, port: int, *, resolver: Resolver = _getaddrinfo,
                pool: ThreadPoolExecutor = _RESOLVERS) -> list[str]:
        """The addresses `host` resolves to, each once, in the resolver's order (ResolveWithinDeadline): getaddrinfo
        has no timeout, so it runs in a thread of `pool`, waited for no longer than the time left."""
        resolving = pool.submit(resolver, host, port)
        try:
            found = list(resolving.result(timeout=self.left_s()))
        except FutureTimeout:
            resolving.cancel()
            raise PrometheusAnswerError(PrometheusFailure.TIMEOUT, f"{host} was not resolved within {self.limits.query_s:g} s") from None
        except OSError as exc:
            raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"cannot resolve {host}: {exc.strerror or type(exc).__name__}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if not addresses:
            raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"{host} resolves to no address")
        return addresses


_INTERIM = re.compile(rb"HTTP/1\.[01] (1[0-9]{2})[ \r\n]")
_HEAD_ENDS = (b"\r\n", b"\n", b"")
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


def invalid_answer(why: str) -> PrometheusAnswerError:
    """The PrometheusAnswerInvalid failure of a 200 answer; `why` says what the client found, never the server's text."""
    return PrometheusAnswerError(PrometheusFailure.INVALID, f"HTTP 200 with a body that is not Prometheus JSON ({why})")


def _refuse_constant(name: str) -> Any:
    raise invalid_answer(f"a bare {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise invalid_answer("a number too large for a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise invalid_answer(f"an integer of more than {_MAX_INT_DIGITS} digits")
    return int(text)


def _result(body: bytes, depth: int) -> tuple[Any, Any]:
    """(resultType, result) of a Prometheus answer read within the bounds; PrometheusAnswerError (INVALID) otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_answer("not UTF-8") from None
    if nesting_exceeds(body, depth):
        raise invalid_answer(f"nested deeper than {depth} levels or unbalanced")
    try:
        answer = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except ValueError:       # JSONDecodeError; a PrometheusAnswerError from the hooks passes through
        raise invalid_answer("not JSON") from None
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
        raise invalid_answer(f"a result of type {str(kind)[:20]!r}, not an instant vector or a scalar")
    for sample in result:
        if not (isinstance(sample, dict) and _is_point(sample.get("value")) and isinstance(sample.get("metric", {}), dict)):
            raise invalid_answer("a sample that is not {metric, value: [time, \"number\"]}")
    return result


def parse_matrix(body: bytes, *, depth: int = MAX_DEPTH) -> list[dict[str, Any]]:
    """The range vector of a query_range answer: each series `{"metric": {...}, "values": [[t, "v"], ...]}`, values
    Prometheus's strings; PrometheusAnswerError (INVALID) for anything else."""
    kind, result = _result(body, depth)
    if kind != "matrix" or not isinstance(result, list):
        raise invalid_answer(f"a result of type {str(kind)[:20]!r}, not a range vector")
    for series in result:
        values = series.get("values") if isinstance(series, dict) else None
        if not (isinstance(values, list) and all(_is_point(v) for v in values) and isinstance(series.get("metric", {}), dict)):
            raise invalid_answer("a series that is not {metric, values: [[time, \"number\"], ...]}")
    return result


class _HeadReader:
    """The reader http.client reads a response through (HeadReader, Interim1xx, BoundedPieces): the final head only,
    within `header_bytes` for all heads together, then the body's reads counted against `pieces`."""

    def __init__(self, fp: io.BufferedReader, limits: ReadLimits) -> None:
        self._fp, self._limits = fp, limits
        self._head_left, self._status_next, self._in_head = limits.header_bytes, True, True
        self._pieces = 0

    def readline(self, limit: int = -1) -> bytes:
        if not self._in_head:
            self._piece()
            return self._fp.readline(limit)
        line = self._head_line(limit)
        if self._status_next:
            for _ in range(MAX_INTERIM + 1):
                interim = _INTERIM.match(line)
                if interim is None:
                    break
                if interim.group(1) == b"101":
                    raise invalid_answer("HTTP 101: a protocol switch nobody asked for")
                while self._head_line(limit) not in _HEAD_ENDS:
                    pass
                line = self._head_line(limit)
            else:
                raise invalid_answer(f"more than {MAX_INTERIM} interim (1xx) responses before the answer")
            self._status_next = False
        elif line in _HEAD_ENDS:
            self._in_head = False
        return line

    def _head_line(self, limit: int) -> bytes:
        """One line of a head, refused once the heads pass `header_bytes` (at most one byte past it is read)."""
        budget = self._head_left + 1
        line = self._fp.readline(budget if limit < 0 else min(limit, budget))
        self._head_left -= len(line)
        if self._head_left < 0:
            raise PrometheusAnswerError(PrometheusFailure.TOO_LARGE, f"headers over {self._limits.header_bytes} bytes")
        return line

    def _piece(self) -> None:
        self._pieces += 1
        if self._pieces > self._limits.pieces:
            raise invalid_answer(f"sent in more than {self._limits.pieces} pieces (reads and chunks); a real answer comes in a few")

    def read(self, size: int | None = -1) -> bytes:
        self._piece()
        return self._fp.read(size)

    def read1(self, size: int = -1) -> bytes:
        self._piece()
        return self._fp.read1(size)

    def __getattr__(self, name: str) -> Any:      # close, flush, closed: the buffered reader's own
        return getattr(self._fp, name)


class BoundedResponse(http.client.HTTPResponse):
    """http.client's response, read through a `_HeadReader`."""

    def __init__(self, sock: socket.socket, *, method: str | None = None, limits: ReadLimits) -> None:
        super().__init__(sock, method=method)
        self.fp = _HeadReader(self.fp, limits)   # type: ignore[assignment]


def _root(exc: BaseException, wrappers: tuple[type[BaseException], ...]) -> tuple[BaseException, bool]:
    """The error under the `wrappers` (MaxRetryError.reason, the wrapped argument, the cause, the context unless
    suppressed), and whether a NewConnectionError stood on the way down."""
    connecting = False
    for _ in range(8):
        connecting = connecting or isinstance(exc, urllib3.exceptions.NewConnectionError)
        if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
            exc = exc.reason
        elif isinstance(exc, wrappers):
            inner = (next((a for a in reversed(exc.args) if isinstance(a, BaseException)), None) or exc.__cause__
                     or (None if exc.__suppress_context__ else exc.__context__))
            if inner is None:
                return exc, connecting
            exc = inner
        else:
            return exc, connecting
    return exc, connecting


def transport_failure(exc: BaseException, authority: str, limits: ReadLimits, *,
                      wrappers: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError,),
                      truncated: bool = False) -> PrometheusAnswerError:
    """Name an error raised resolving, connecting, sending or reading one query to `authority`, from its type (and
    the OS's words for a refused connection), never from anything the server sent.

    The error is looked through `wrappers` first (urllib3's; a caller on requests adds requests.RequestException);
    `truncated`: the caller knows the body ended before its end (requests' ChunkedEncodingError). In this order:
    a PrometheusAnswerError as it is; TLS (tls_failure); no connection (MetricsUnavailable "cannot connect");
    a timeout (PrometheusTimeout); a truncated body, then anything else http.client or urllib3 refused to read
    (PrometheusAnswerInvalid); a connection that broke otherwise (MetricsUnavailable)."""
    root, connecting = _root(exc, wrappers)
    if isinstance(root, PrometheusAnswerError):
        return root
    if isinstance(root, ssl.SSLError):
        return tls_failure(root, authority)
    if connecting or isinstance(root, ConnectionRefusedError):    # before timeouts: NewConnectionError is one too
        words = f": {root.strerror}" if isinstance(root, OSError) and root.strerror else ""
        return PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"cannot connect to {authority}: {type(root).__name__}{words}")
    if isinstance(root, (TimeoutError, urllib3.exceptions.TimeoutError)):
        return _timeout(limits)
    if truncated or isinstance(root, http.client.IncompleteRead):
        return invalid_answer("the body ended before its length or its last chunk (truncated)")
    if isinstance(root, (http.client.HTTPException, urllib3.exceptions.HTTPError)):
        return invalid_answer(f"not HTTP/1.x as http.client reads it: {type(root).__name__}")
    return PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"the connection to {authority} broke: {type(root).__name__}")


def capped_body(answer: urllib3.BaseHTTPResponse, *, cap_bytes: int) -> bytes | None:
    """Read the body of a 200 `answer` a piece at a time, refused as soon as it passes `cap_bytes` (never read whole).

    `answer` is urllib3's, unread (preload_content=False). A 3xx is PrometheusRedirectRefused, its body and Location
    unused; any other status than 200 is None, its body unread, for the caller to name from the code alone. A
    content-encoding other than identity is invalid (identity was asked for), so nothing is ever decompressed and the cap
    counts the body's own bytes; a Content-Length over the cap is refused before the body is read.
    """
    status = answer.status
    if 300 <= status < 400:
        raise PrometheusAnswerError(PrometheusFailure.REDIRECT_REFUSED, f"HTTP {status}: a redirect, which is never followed")
    if status != 200:
        return None
    if answer.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
        raise invalid_answer("a compressed body (identity was asked for)")
    if answer.length_remaining is not None and answer.length_remaining > cap_bytes:
        raise PrometheusAnswerError(PrometheusFailure.TOO_LARGE, f"an answer over {cap_bytes} bytes")
    body = bytearray()
    while data := answer.read1(_PIECE_BYTES, decode_content=False):
        body += data
        if len(body) > cap_bytes:
            raise PrometheusAnswerError(PrometheusFailure.TOO_LARGE, f"an answer over {cap_bytes} bytes")
    return bytes(body)


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
        deadline = QueryDeadline(self.limits, clock=self.clock, not_after_s=self.deadline_s)
        headers = {"Host": self.url.authority, "Accept": "application/json", "Accept-Encoding": "identity",
                   "Connection": "close", "User-Agent": "servingtopology-operator"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        conn: urllib3.connection.HTTPConnection | None = None
        answer = None
        try:
            conn = self._connect(deadline)
            deadline.watch(conn.sock)      # here: http.client hands the socket to the answer and forgets it
            conn.timeout = deadline.left_s()
            conn.request("GET", f"{self.url.path}/api/v1/{endpoint}?{urlencode(params)}", headers=headers,
                         preload_content=False, decode_content=False)
            answer = conn.getresponse()
            body = self._body(answer)
        except PrometheusAnswerError:
            if not deadline.cut.is_set():
                raise
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            if not deadline.cut.is_set():
                raise transport_failure(exc, self.url.authority, self.limits) from None
        finally:
            deadline.finish()
            if answer is not None:
                answer.close()
            if conn is not None:
                conn.close()
        if deadline.cut.is_set():
            raise deadline.timeout()
        return body

    def _body(self, answer: urllib3.BaseHTTPResponse) -> bytes:
        """The body of a 200 answer (`capped_body`); another status is an unavailable answer naming its code."""
        body = capped_body(answer, cap_bytes=self.limits.answer_bytes)
        if body is None:
            raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"HTTP {answer.status}")
        return body

    def _connect(self, deadline: QueryDeadline) -> urllib3.connection.HTTPConnection:
        """urllib3's connection to a checked address of the URL's host (TLS verified for https), opened within the
        deadline; the next allowed address where one refuses, a connection error of urllib3's otherwise."""
        allowed: list[str] = []
        refused: list[str] = []
        for address in deadline.resolve(self.url.host, self.url.port, resolver=self._resolve)[:16]:
            why = self.addresses.refusal(self.url, address)   # only the addresses the policy allows are connected to
            if why is None:
                allowed.append(address)
            else:
                refused.append(why)
        if not allowed:
            raise PrometheusAnswerError(PrometheusFailure.ADDRESS_REFUSED, f"{refused[0]}; nothing was connected to")
        error: urllib3.exceptions.NewConnectionError | None = None
        for address in allowed[:4]:
            conn: urllib3.connection.HTTPConnection
            if self.url.scheme == "https":
                conn = urllib3.connection.HTTPSConnection(
                    address, self.url.port, timeout=deadline.left_s(), server_hostname=self.url.host,
                    ssl_context=self._tls or ssl.create_default_context(), cert_reqs=ssl.CERT_REQUIRED)
            else:
                conn = urllib3.connection.HTTPConnection(address, self.url.port, timeout=deadline.left_s())
            conn.response_class = functools.partial(BoundedResponse, limits=self.limits)   # type: ignore[assignment]
            try:
                conn.connect()
                return conn
            except urllib3.exceptions.NewConnectionError as exc:    # refused, unreachable: the next address
                conn.close()
                error = exc
            except (urllib3.exceptions.HTTPError, OSError):   # a timeout, the certificate, the handshake: named by _get
                conn.close()
                raise
        assert error is not None
        raise error
