"""A Prometheus stand-in for fault scenarios: it answers garbage in turns, or passes every request through to the
real Prometheus, as the scenario says.

Garbage, one kind per request in turn (each is what a broken or impostor endpoint sends):
- `not-json`: 200 with an HTML page;
- `no-data`: 200 with JSON that has no `data` (what prometheus-api-client reads as a KeyError);
- `http-500`: 500 with a text body.
Every garbage body carries `BODY_MARKER`, so a scenario can check that no response body reaches conditions or
Events. `proxy` mode forwards the request (method, path, query, body) to the real Prometheus and returns its answer
unchanged. Serves on 127.0.0.1 in a thread of the test process; used by e2e/test_faults.py.
"""

from __future__ import annotations

import enum
import threading
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BODY_MARKER = "e2e-garbage-body-7f3a"


class Garbage(enum.StrEnum):
    NOT_JSON = "not-json"
    NO_DATA = "no-data"
    HTTP_500 = "http-500"


GARBAGE: dict[Garbage, tuple[int, str, bytes]] = {
    Garbage.NOT_JSON: (200, "text/html", f"<html><body>{BODY_MARKER}: not an API</body></html>".encode()),
    Garbage.NO_DATA: (200, "application/json", f'{{"status": "success", "note": "{BODY_MARKER}"}}'.encode()),
    Garbage.HTTP_500: (500, "text/plain", f"internal error {BODY_MARKER}".encode()),
}


@dataclass
class GarbagePrometheus:
    """`with GarbagePrometheus(upstream) as fake:`; `fake.url` for the resource, `fake.garbage()` / `fake.proxy()`."""

    upstream: str
    hits: Counter[str] = field(default_factory=Counter)
    _garbage: bool = False
    _turn: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def garbage(self) -> None:
        with self._lock:
            self._garbage = True

    def proxy(self) -> None:
        with self._lock:
            self._garbage = False

    def _next(self) -> Garbage | None:
        with self._lock:
            if not self._garbage:
                self.hits["proxy"] += 1
                return None
            kind = list(Garbage)[self._turn % len(Garbage)]
            self._turn += 1
            self.hits[kind.value] += 1
            return kind

    def __enter__(self) -> GarbagePrometheus:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._answer(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                fake._answer(self, self.rfile.read(length))

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="garbage-prometheus", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        kind = self._next()
        if kind is None:
            status, content_type, payload = self._forward(handler, body)
        else:
            status, content_type, payload = GARBAGE[kind]
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> tuple[int, str, bytes]:
        request = urllib.request.Request(self.upstream + handler.path, data=body, method=handler.command)
        if body is not None:
            request.add_header("Content-Type", handler.headers.get("Content-Type", "application/x-www-form-urlencoded"))
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers.get("Content-Type", "application/json"), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Content-Type", "text/plain"), exc.read()
        except OSError as exc:
            return 502, "text/plain", f"upstream unreachable: {exc}".encode()
