"""`calibrate --prometheus`'s reads through prometheus-api-client (the library this product was specified with), bounded.

Called by servingtopology/cli/calibrate_prometheus.py: `LibraryPrometheus.range_query` is the RangeClient that
operator/live/history.py's `fetch_history` asks. Each query is the library's `PrometheusConnect.custom_query_range`; the
HTTP is requests' on a Session built here, whose transport adapter (`BoundedAdapter`) keeps the bounds of the operator's
client (operator/live/prometheus_http.py) and raises its named failures (`PrometheusAnswerError`, reason
PrometheusFailure.*). Must not decide anything about the figures.

What the library (0.7.2, prometheus_connect.py) leaves open, and where each bound is kept:
- Retries: its constructor mounts `HTTPAdapter(max_retries=Retry(total=3, backoff 1 s, on 408/429/5xx))` at the URL.
  NoRetry: `BoundedAdapter` is mounted over it afterwards, at that prefix and every other, with `Retry(total=0)`.
- Redirects: `Session.request` follows 30 by default. NoRedirect: the adapter refuses any 3xx before its body or its
  Location is used (PrometheusRedirectRefused, by `capped_body`); the session's `max_redirects` is 0 besides.
- The whole body: `response.json()` reads `.content` whole. StreamedCap: the adapter sends with `stream=True` and reads
  the body itself with the operator client's `capped_body`, a piece at a time, refused as soon as it passes
  `ReadLimits.answer_bytes` (a compressed body refused, never decompressed); the library's `.json()` then parses only
  those bytes.
- NaN, Infinity, 1e999, nesting: `.json()` is plain `json.loads`. CheckedFirst: the adapter checks the body with the
  operator client's parser (`parse_matrix`: UTF-8, the depth pre-scan, NaN/Infinity/overflow refused, Prometheus's
  shape) before `.json()` sees it, and pins its encoding to UTF-8, so `.json()` reads the text that passed. Values stay
  Prometheus's strings, read by `figure_value` (NaNIsNoData, FigureRange): no inf or nan reaches a user.
- The server's body in its errors (`PrometheusApiClientException("HTTP Status Code 503 (b'...')")`). NoServerText: a
  status other than 200 reaches the library with an empty body (the server's is never read), and the library's and
  requests' exceptions are re-raised as named failures worded from the status code or the exception's type only.
- One deadline: requests' timeout is per socket operation. OneDeadline: each query has one deadline
  (`ReadLimits.query_s`) for resolving, connecting and reading, the operator client's `QueryDeadline`: a timer shuts
  the socket down when it passes, and the name is resolved in a small pool of threads waited for no longer than the
  time left (ResolveWithinDeadline). Transport failures are named by its `transport_failure`, so a timeout, a refused
  connection, a TLS or resolve failure reads the same here as in the operator's conditions.
- http.client's heads: it skips any number of `100 Continue` and reads 100 header lines of 64 KiB; neither requests
  nor urllib3 bounds them. HeadReader: the connections read their answers through the operator client's `_HeadReader`
  (its `BoundedResponse`), the one piece that is not the library's; tests/cli/test_prometheus_reader.py shows plain
  requests reading 90 KiB of headers and 50 interim heads.
- The environment: `trust_env` is off, so no proxy from HTTP(S)_PROXY, no .netrc credentials and no REQUESTS_CA_BUNDLE
  apply: only the checked URL's host and port are connected to (OneUrl: the adapter refuses any other), verified
  against the system's CAs (ssl.get_default_verify_paths, not certifi's bundle) or the --prometheus-ca file given as
  the session's `verify`, with the --prometheus-cert/--prometheus-key pair as its `cert`. Cookies are never kept.
"""

from __future__ import annotations

import contextvars
import functools
import http.client
import http.cookiejar
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import requests
import requests.adapters
import requests.structures
import urllib3
import urllib3.connection
import urllib3.exceptions
import urllib3.util
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from servingtopology.operator.live.prometheus_http import (
    BoundedResponse,  # HeadReader: the operator client's reader of heads, reused (the module docstring says why)
    PrometheusAnswerError,
    PrometheusFailure,
    QueryDeadline,
    ReadLimits,
    capped_body,
    invalid_answer,
    parse_matrix,
    transport_failure,
)
from servingtopology.operator.live.url_policy import PrometheusUrl

__all__ = ["LibraryPrometheus", "BoundedAdapter", "system_cas", "RESOLVER_THREADS"]

RESOLVER_THREADS = 2      # ResolveWithinDeadline: one CLI run asks one host, one query at a time
_RESOLVERS = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="calibrate-resolve")
_MAX_ADDRESSES = 4
_STATUS = re.compile(r"HTTP Status Code ([0-9]{3})\b")
_READS: dict[str, Callable[..., list[dict[str, Any]]]] = {"query_range": parse_matrix}   # the endpoints read (CheckedFirst)


_EXCHANGE: contextvars.ContextVar[QueryDeadline | None] = contextvars.ContextVar("calibrate_prometheus_exchange", default=None)
_WRAPPERS = (requests.RequestException, urllib3.exceptions.HTTPError)   # looked through to the error they wrap


def _exchange() -> QueryDeadline:
    exchange = _EXCHANGE.get()
    if exchange is None:       # a connection of this module outside BoundedAdapter.send: never made
        raise RuntimeError("a bounded Prometheus connection used outside BoundedAdapter.send")
    return exchange


def _open(conn: urllib3.connection.HTTPConnection) -> socket.socket:
    """The socket of `conn`, its host resolved within the deadline (urllib3's `_new_conn` resolves without one)."""
    exchange = _exchange()
    host = conn._dns_host.strip("[]")
    error: OSError | None = None
    for address in exchange.resolve(host, conn.port, pool=_RESOLVERS)[:_MAX_ADDRESSES]:
        try:
            return urllib3.util.connection.create_connection((address, conn.port), exchange.left_s(),
                                                            source_address=conn.source_address, socket_options=conn.socket_options)
        except TimeoutError as exc:
            raise urllib3.exceptions.ConnectTimeoutError(conn, f"connecting to {conn.host} timed out") from exc
        except OSError as exc:       # refused, unreachable: the next address
            error = exc
    raise urllib3.exceptions.NewConnectionError(conn, f"cannot connect to {conn.host}:{conn.port}: {type(error).__name__}") from error


def _before_answer(conn: urllib3.connection.HTTPConnection) -> None:
    """OneDeadline and HeadReader for the answer about to be read on `conn`."""
    exchange = _exchange()
    if conn.sock is not None:
        exchange.watch(conn.sock)
    conn.response_class = functools.partial(BoundedResponse, limits=exchange.limits)  # type: ignore[assignment]


class _HTTPConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _open(self)

    def getresponse(self) -> urllib3.response.HTTPResponse:  # type: ignore[override]
        _before_answer(self)
        return super().getresponse()


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _open(self)

    def getresponse(self) -> urllib3.response.HTTPResponse:  # type: ignore[override]
        _before_answer(self)
        return super().getresponse()


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


def _named(exc: BaseException, authority: str, limits: ReadLimits) -> PrometheusAnswerError:
    """The named failure of an error requests, urllib3 or http.client raised (NoServerText: its type, never its text)."""
    return transport_failure(exc, authority, limits, wrappers=_WRAPPERS,
                             truncated=isinstance(exc, requests.exceptions.ChunkedEncodingError))


class BoundedAdapter(requests.adapters.HTTPAdapter):
    """requests' transport for the one checked Prometheus URL, keeping every bound of the module docstring."""

    def __init__(self, url: PrometheusUrl, limits: ReadLimits) -> None:
        self.url, self.limits = url, limits
        super().__init__(pool_connections=1, pool_maxsize=1, max_retries=Retry(total=0, redirect=0, raise_on_redirect=True))

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}

    def _endpoint(self, request: requests.PreparedRequest) -> str:
        """The API endpoint `request` asks of the checked URL (OneUrl); PrometheusAnswerError for any other URL."""
        target = urllib3.util.parse_url(request.url or "")
        prefix = f"{self.url.path}/api/v1/"
        port = target.port or {"http": 80, "https": 443}.get(target.scheme or "", 0)
        if ((target.scheme, (target.host or "").strip("[]"), port) != (self.url.scheme, self.url.host, self.url.port)
                or not (target.path or "").startswith(prefix) or (target.path or "")[len(prefix):] not in _READS):
            raise PrometheusAnswerError(PrometheusFailure.ADDRESS_REFUSED, f"a request for another URL than {self.url}'s query API; nothing was sent")
        return (target.path or "")[len(prefix):]

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None, verify: bool | str = True,
             cert: Any = None, proxies: Mapping[str, str] | None = None) -> requests.Response:
        """The library's request, within the bounds: a 200's body checked and held, another status's body never read."""
        endpoint = self._endpoint(request)
        if proxies:
            raise PrometheusAnswerError(PrometheusFailure.ADDRESS_REFUSED, "a proxy was asked for; only the URL's host is connected to")
        exchange = QueryDeadline(self.limits)
        token = _EXCHANGE.set(exchange)
        response: requests.Response | None = None
        try:
            response = super().send(request, stream=True, timeout=exchange.left_s(), verify=verify, cert=cert, proxies=None)
            body = self._body(response)
            if response.status_code == 200:
                _READS[endpoint](body, depth=self.limits.depth)     # CheckedFirst: PrometheusAnswerError (INVALID)
        except PrometheusAnswerError:
            if not exchange.cut.is_set():
                raise
        except (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            if not exchange.cut.is_set():
                raise _named(exc, self.url.authority, self.limits) from None
        finally:
            exchange.finish()
            _EXCHANGE.reset(token)
            if response is not None:
                response.close()
            self.poolmanager.clear()     # one connection per query (Connection: close), never one the server may have closed
        if exchange.cut.is_set():
            raise exchange.timeout()
        assert response is not None
        response._content, response._content_consumed = body, True    # what .json() parses: the bytes checked above
        response.encoding = "utf-8"
        return response

    def _body(self, response: requests.Response) -> bytes:
        """The body of a 200 (the operator client's `capped_body`: StreamedCap, a 3xx refused by NoRedirect); b"" for
        another status, its body never read (NoServerText): the library raises on the status and range_query names it."""
        body = capped_body(response.raw, cap_bytes=self.limits.answer_bytes)
        return b"" if body is None else body


def system_cas() -> str | bool:
    """The system's CA bundle as requests' `verify` (a file or a folder); True (requests' own bundle) where it has none."""
    paths = ssl.get_default_verify_paths()
    return paths.cafile or paths.capath or True


class LibraryPrometheus:
    """Range queries of one checked Prometheus URL through prometheus-api-client, within the bounds of the module docstring."""

    def __init__(self, url: PrometheusUrl, *, limits: ReadLimits | None = None, ca_file: str | None = None,
                 client_cert: tuple[str, str] | None = None) -> None:
        self.url, self.limits = url, limits or ReadLimits()
        session = requests.Session()
        session.trust_env = False
        session.max_redirects = 0
        session.headers = requests.structures.CaseInsensitiveDict({
            "Accept": "application/json", "Accept-Encoding": "identity", "Connection": "close",
            "User-Agent": "servingtopology-calibrate"})
        session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        session.verify = ca_file if ca_file is not None else system_cas()
        session.cert = client_cert
        no_retry = Retry(total=0, redirect=0, raise_on_redirect=True)
        self.client = PrometheusConnect(str(url), session=session, retry=no_retry, timeout=self.limits.query_s)  # type: ignore[arg-type]
        self.adapter = BoundedAdapter(url, self.limits)
        for prefix in (str(url), "http://", "https://"):     # over the library's own HTTPAdapter at the URL (NoRetry)
            session.mount(prefix, self.adapter)
        self.session = session

    def range_query(self, query: str, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        """The range vector of `query` (see parse_matrix); PrometheusAnswerError with a named reason otherwise (NoServerText)."""
        try:
            result = self.client.custom_query_range(query, start_time=datetime.fromtimestamp(start_s, tz=UTC),
                                                    end_time=datetime.fromtimestamp(end_s, tz=UTC), step=f"{step_s:g}")
        except PrometheusAnswerError:
            raise
        except PrometheusApiClientException as exc:
            code = _STATUS.search(str(exc)[:40])
            raise PrometheusAnswerError(PrometheusFailure.UNAVAILABLE, f"HTTP {code[1] if code else 'error'}") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            raise _named(exc, self.url.authority, self.limits) from None
        if not isinstance(result, list):
            raise invalid_answer("data.result is not a list")
        return result

    def close(self) -> None:
        self.client.close()
