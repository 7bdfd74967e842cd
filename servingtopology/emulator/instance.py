"""One emulated engine instance: an HTTP server on loopback serving `/metrics`, `/health` and `/version`, and a
thread that draws its share of the scripted traffic and advances the simulator in real time.

Owned by emulator/fleet.py (one per Ready engine pod) and by `servingtopology emulate --args` (one, for demos).
The clock is injected (`monotonic`), so tests can drive it; the thread only sleeps between ticks.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from servingtopology.emulator.command_parser import EngineConfig
from servingtopology.emulator.exposition import EngineMetrics
from servingtopology.emulator.seam import EngineSimulator
from servingtopology.emulator.traffic import Phase, arrival_gap_s
from servingtopology.planner.layout import Role

__all__ = ["EmulatedInstance", "Share"]


@dataclass(frozen=True, slots=True)
class Share:
    """The traffic this instance receives now: the phase in force and the fraction of its rate."""

    phase: Phase
    fraction: float


class _Handler(http.server.BaseHTTPRequestHandler):
    instance: EmulatedInstance  # set on the subclass made per server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, kind = self.instance.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8"
        elif path in ("/health", "/healthz", "/ready"):
            body, kind = b"ok\n", "text/plain"
        elif path == "/version":
            body, kind = b'{"version": "emulated"}\n', "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


class EmulatedInstance:
    """Serves one engine's metrics and simulates its load until `stop`."""

    def __init__(self, *, name: str, config: EngineConfig, simulator: EngineSimulator,
                 share: Callable[[float], Share], host: str = "127.0.0.1", port: int = 0, tick_s: float = 0.25,
                 seed: int = 0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.config = config
        self.simulator = simulator
        self.share = share
        self.metrics = EngineMetrics(config)
        self.tick_s = tick_s
        self._rng = np.random.default_rng(seed)
        self._monotonic = monotonic
        self._started_s = monotonic()
        self._next_arrival_s = 0.0
        self._last_tick_s = 0.0
        self._stop = threading.Event()
        handler = type("Handler", (_Handler,), {"instance": self})
        self._server = http.server.ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name=f"{name}-http", daemon=True),
            threading.Thread(target=self._run, name=f"{name}-sim", daemon=True),
        ]

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> EmulatedInstance:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._threads[0].is_alive():  # shutdown() waits for serve_forever, so only call it once that runs
            self._server.shutdown()
        self._server.server_close()

    def tick(self) -> None:
        """Draws arrivals up to now and advances the simulator there (one step of the real-time loop)."""
        now_s = self._monotonic() - self._started_s
        window_s = now_s - self._last_tick_s
        self._submit_arrivals(now_s)
        progress = self.simulator.advance(now_s)
        self.metrics.record(progress, self.simulator.gauges(), window_s=window_s)

    def _submit_arrivals(self, now_s: float) -> None:
        """Arrivals at the current share's rate (Poisson, or gamma gaps of the phase's burstiness), drawn up to now plus
        the simulator's lookahead."""
        share = self.share(now_s)
        self.simulator.slowdown = dict(share.phase.slowdown)   # EngineSlowdown: what is simulated from now on
        rate_rps = share.phase.rate_rps * share.fraction
        burstiness = share.phase.burstiness
        if rate_rps > 0:
            if self._next_arrival_s <= self._last_tick_s:
                self._next_arrival_s = self._last_tick_s + arrival_gap_s(self._rng, rate_rps, burstiness)
            cached = int(share.phase.input_tokens * share.phase.prefix_hit_ratio)
            horizon_s = now_s + self.simulator.lookahead_s
            while self._next_arrival_s <= horizon_s:
                self.simulator.submit(arrival_s=self._next_arrival_s, input_tokens=share.phase.input_tokens,
                                      output_tokens=share.phase.output_tokens, cached_tokens=cached)
                self._next_arrival_s += arrival_gap_s(self._rng, rate_rps, burstiness)
        self._last_tick_s = now_s

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.tick()

    @property
    def role(self) -> Role:
        return self.config.role
