"""A scripted HTTP server on loopback that answers like a hostile (or broken) Prometheus, byte for byte.

Used by the metrics-path tests (tests/operator/test_metrics_bounds.py, test_metrics_fuzz.py) and
e2e/test_hostile_prometheus.py: each connection gets the answer the test set, written as raw pieces with optional
pauses (so a test can send malformed HTTP, truncated or chunked bodies, a one-byte drip or an endless body). It
records every request head it got and counts the bytes it sent. With `tls` it serves https (a handshake failure is
recorded, and nothing is read from that connection).
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

__all__ = ["Answer", "HostileServer", "json_answer", "raw_answer", "drip_answer", "endless_answer", "redirect_answer"]

Pieces = Callable[[], Iterable[tuple[float, bytes]]]   # (pause before, bytes) in order
MAX_ANSWER_S = 20.0    # no answer writes for longer than this, whatever the client does


@dataclass(frozen=True)
class Answer:
    pieces: Pieces


def raw_answer(data: bytes) -> Answer:
    return Answer(lambda: [(0.0, data)])


def json_answer(body: bytes, *, status: int = 200, chunked: bool = False, length: int | None = None,
                extra_headers: str = "") -> Answer:
    """A status line, headers and `body` (Content-Length `length`, default the true one; or chunked in 3 pieces)."""
    if chunked:
        third = max(1, len(body) // 3)
        parts = [body[i:i + third] for i in range(0, len(body), third)]
        coded = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n{extra_headers}\r\n"
        return raw_answer(head.encode() + coded)
    n = len(body) if length is None else length
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n{extra_headers}\r\n"
    return raw_answer(head.encode() + body)


def drip_answer(*, every_s: float, head_too: bool = False) -> Answer:
    """Headers at once (or dripped too), then one byte of a never-ending JSON body every `every_s`."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"

    def pieces() -> Iterator[tuple[float, bytes]]:
        if head_too:
            for b in head:
                yield every_s, bytes([b])
        else:
            yield 0.0, head
        yield 0.0, b'{"status":"success","data":{"resultType":"vector","result":['
        while True:
            yield every_s, b" "
    return Answer(pieces)


def endless_answer(*, total_bytes: int, content_length: bool = True) -> Answer:
    """A body of `total_bytes` (valid JSON start, then filler), streamed in 64 KiB pieces, never held whole."""
    def pieces() -> Iterator[tuple[float, bytes]]:
        length = f"Content-Length: {total_bytes}\r\n" if content_length else ""
        yield 0.0, f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n".encode()
        block = b" " * 65536
        sent = 0
        while sent < total_bytes:
            piece = block[: min(len(block), total_bytes - sent)]
            sent += len(piece)
            yield 0.0, piece
    return Answer(pieces)


def redirect_answer(location: str, *, status: int = 302) -> Answer:
    return raw_answer(f"HTTP/1.1 {status} Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())


@dataclass
class HostileServer:
    """`with HostileServer(answer) as server:` serves `answer` (or `answer_for(request_head)`) on 127.0.0.1:`port`."""

    answer: Answer | None = None
    port: int = 0
    answer_for: Callable[[bytes], Answer] | None = None
    tls: ssl.SSLContext | None = None      # a server context: https, each connection's handshake first
    heads: list[bytes] = field(default_factory=list)
    handshake_failures: list[str] = field(default_factory=list)
    sent_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: socketserver.ThreadingTCPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HostileServer:
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        server = socketserver.ThreadingTCPServer(("127.0.0.1", self.port), Handler, bind_and_activate=False)
        server.daemon_threads = True
        server.allow_reuse_address = True
        try:
            server.server_bind()
            server.server_activate()
        except OSError:
            server.server_close()
            raise
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def handshake_failed(self, timeout_s: float = 5.0) -> bool:
        """Whether a handshake has failed on the server's side, waiting up to `timeout_s` for the serving thread: the
        client may read the server's alert and give up before that thread has recorded it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self.handshake_failures:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(5.0)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                with self._lock:
                    self.handshake_failures.append(str(getattr(exc, "reason", "") or type(exc).__name__))
                return
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = sock.recv(4096)
                if not data:
                    break
                head += data
        except OSError:
            return
        with self._lock:
            self.heads.append(head)
        answer = self.answer_for(head) if self.answer_for is not None else self.answer
        if answer is None:
            return
        started = time.monotonic()
        try:
            for pause_s, data in answer.pieces():
                if pause_s:
                    time.sleep(pause_s)
                if time.monotonic() - started > MAX_ANSWER_S:
                    break
                sock.sendall(data)
                with self._lock:
                    self.sent_bytes += len(data)
        except OSError:      # the client closed: what a bounded reader does
            pass
