"""`servingtopology calibrate --prometheus URL --since 24h --spec SPEC.yaml --out CAL.yaml`: fit a deployment's correction
from its Prometheus history, no benchmark run needed.

Called by servingtopology/cli/calibrate.py when --prometheus is given. The series are the ones the operator reads: its
PromQL (operator/live/metrics.py `build_queries`, at the spec's SLO percentiles) asked as range queries
(operator/live/history.py) through prometheus-api-client, within the operator client's bounds
(servingtopology/cli/prometheus_reader.py), one point per window; each window's workload is estimated as the operator estimates
an interval's (planner.live.observe), and the fit is the operator's live fit (planner.live.calibration `fit_points`:
the LIVE_TERMS factors, each point predicted at its own load and lengths). Must not write anything but --out.

Rules it names:
- HistoryWindows: the history is cut into at most MAX_WINDOWS windows of at least MIN_WINDOW_S (--step sets one); a
  window is a point when it holds MIN_REQUESTS requests and both latencies (quiet windows are counted, not fitted).
- OperatorSeries: with --topology NAMESPACE/NAME the matchers are the operator's for that resource and request figures
  read aggregated and decode engines only (PD prefill engines see every request too); without it, every engine series
  matching --selector counts, as for engines the operator does not run.
- NamedOptions: a URL that is refused, unreachable or answers badly names --prometheus and the failure's reason
  (PrometheusTimeout, PrometheusCertificateUntrusted, ...); a history without enough points names --since; a CA file
  that cannot be used names --prometheus-ca (a client certificate or key --prometheus-cert / --prometheus-key). Exit 2 then, and nothing is written.
The calling user's own machine runs the queries, so any address is allowed (no operator allow-list applies), and an
https URL is verified against the system's CAs or --prometheus-ca.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servingtopology.cli.calibration_io import read_bytes
from servingtopology.cli.prometheus_reader import LibraryPrometheus
from servingtopology.operator.api.resource import duration_s
from servingtopology.operator.live.history import fetch_history
from servingtopology.operator.live.metrics import MetricsUnavailable, build_queries, topology_matchers
from servingtopology.operator.live.prometheus_http import PrometheusAnswerError, ReadLimits
from servingtopology.operator.live.prometheus_tls import (
    CA_FIELD,
    CERT_FIELD,
    KEY_FIELD,
    MAX_PEM_BYTES,
    TlsConfigInvalid,
    TlsMaterial,
    client_context,
)
from servingtopology.operator.live.url_policy import UrlRefused, parse_prometheus_url
from servingtopology.planner.errors import InsufficientData, InvalidSpec
from servingtopology.planner.layout import Layout
from servingtopology.planner.live.calibration import LivePoint
from servingtopology.planner.live.observe import MIN_REQUESTS, MetricSample, estimate_workload
from servingtopology.planner.perf.deployment_fit import Source
from servingtopology.planner.problem import Problem

__all__ = ["History", "read_history", "MAX_WINDOWS", "MIN_WINDOW_S", "MAX_SINCE_S", "QUERY_S"]

MAX_WINDOWS = 48               # HistoryWindows: 24 h in half-hour windows; the fit predicts each point ~50 times
MIN_WINDOW_S = 60              # a rate over less than a minute of 15 s scrapes is noise
MAX_SINCE_S = 31 * 86400       # a month: Prometheus's usual retention is 15 days
QUERY_S = 30.0                 # one range query: a month of a histogram quantile takes Prometheus a few seconds


@dataclass(frozen=True, slots=True)
class History:
    """The points read from a Prometheus, what was skipped, and their provenance."""

    points: tuple[LivePoint, ...]
    windows: int                  # windows with any figure
    quiet: int                    # of those, without MIN_REQUESTS requests or a latency (HistoryWindows)
    window_s: int
    end_s: float
    source: Source


def _option_error(option: str, message: str) -> InvalidSpec:
    return InvalidSpec(option, message)


def _window_s(since_s: int, step: str | None) -> int:
    if step is not None:
        try:
            window = duration_s(step)
        except ValueError as exc:
            raise _option_error("--step", str(exc)) from None
        if not MIN_WINDOW_S <= window <= since_s:
            raise _option_error("--step", f"{step!r} must be from {MIN_WINDOW_S} s to --since ({since_s} s)")
        if since_s / window > MAX_WINDOWS:
            raise _option_error("--step", f"{since_s // window} windows in --since; at most {MAX_WINDOWS} (a longer --step)")
        return window
    return max(MIN_WINDOW_S, -(-since_s // MAX_WINDOWS))


def _matchers(topology: str | None, selector: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if topology is not None:
        namespace, sep, name = topology.partition("/")
        if not sep or not namespace or not name:
            raise _option_error("--topology", f"{topology!r} must be NAMESPACE/NAME of the ServingTopology")
        out |= topology_matchers(namespace=namespace, name=name)
    for item in selector:
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise _option_error("--selector", f"{item!r} must be LABEL=VALUE with a Prometheus label name")
        out[key] = value
    return out


def _pem_file(option: str, path: str | None) -> str | None:
    return None if path is None else read_bytes(Path(path), MAX_PEM_BYTES, option).decode("utf-8", "replace")


def _client(url_text: str, ca_file: str | None, cert_file: str | None = None, key_file: str | None = None) -> tuple[str, LibraryPrometheus]:
    try:
        url = parse_prometheus_url(url_text)
    except UrlRefused as why:
        raise _option_error("--prometheus", f"{url_text!r} is refused: {why}; spell it scheme://host[:port][/path]") from None
    given = [o for o, f in (("--prometheus-ca", ca_file), ("--prometheus-cert", cert_file), ("--prometheus-key", key_file)) if f]
    if given and url.scheme != "https":
        raise _option_error(given[0], "is for an https:// --prometheus URL")
    if (cert_file is None) != (key_file is None):
        raise _option_error("--prometheus-cert" if cert_file is None else "--prometheus-key", "give --prometheus-cert and --prometheus-key together")
    if given:
        if ca_file is None:
            raise _option_error("--prometheus-ca", "give the CA with a client certificate (the system's CAs are used only without one)")
        # NamedOptions: the files are checked as the operator checks spec.metrics.tls (ConfigNamed) before any request;
        # the session then reads them as requests' `verify` and `cert` (servingtopology/cli/prometheus_reader.py).
        material = TlsMaterial(ca_pem=_pem_file("--prometheus-ca", ca_file) or "", cert_pem=_pem_file("--prometheus-cert", cert_file),
                               key_pem=_pem_file("--prometheus-key", key_file))
        try:
            client_context(material)
        except TlsConfigInvalid as exc:
            option = {CA_FIELD: "--prometheus-ca", CERT_FIELD: "--prometheus-cert", KEY_FIELD: "--prometheus-key"}[exc.field]
            raise _option_error(option, str(exc).split(": ", 1)[-1]) from None
    client_cert = (cert_file, key_file) if cert_file is not None and key_file is not None else None
    return str(url), LibraryPrometheus(url, limits=ReadLimits(query_s=QUERY_S), ca_file=ca_file, client_cert=client_cert)


def _point(sample: MetricSample, layout: Layout) -> LivePoint | None:
    """A window's point (HistoryWindows), or None for a quiet one."""
    if sample.ttft_ms is None or sample.tpot_ms is None or sample.ttft_ms <= 0 or sample.tpot_ms <= 0:
        return None
    try:
        observed = estimate_workload([sample], min_samples=1, min_requests=MIN_REQUESTS)
    except InsufficientData:
        return None
    return LivePoint(sample.at_s, layout, observed.workload, sample.ttft_ms, sample.tpot_ms)


def read_history(url_text: str, *, problem: Problem, layout: Layout, since: str, step: str | None = None,
                 topology: str | None = None, selector: Sequence[str] = (), ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, now_s: float | None = None) -> History:
    """The deployment's points over the last `since` (NamedOptions for every failure)."""
    try:
        since_s = duration_s(since)
    except ValueError as exc:
        raise _option_error("--since", str(exc)) from None
    if not MIN_WINDOW_S <= since_s <= MAX_SINCE_S:
        raise _option_error("--since", f"{since!r} must be from {MIN_WINDOW_S} s to {MAX_SINCE_S // 3600} h")
    window_s = _window_s(since_s, step)
    matchers = _matchers(topology, selector)
    url, client = _client(url_text, ca_file, cert_file, key_file)
    queries = build_queries(problem.engine, matchers=matchers, window_s=window_s, ttft_quantile=problem.slo.ttft_percentile / 100.0,
                            tpot_quantile=problem.slo.tpot_percentile / 100.0, by_role=topology is not None)
    end_s = float(int(now_s if now_s is not None else time.time()))
    try:
        samples = fetch_history(client, queries, start_s=end_s - since_s + window_s, end_s=end_s, step_s=window_s)
    except (PrometheusAnswerError, MetricsUnavailable) as exc:
        reason = getattr(exc, "reason", "")
        raise _option_error("--prometheus", f"{url}: {reason}: {exc}") from None
    finally:
        client.close()
    points = tuple(p for p in (_point(s, layout) for s in samples) if p is not None)
    digest = hashlib.sha256(repr(samples).encode()).hexdigest()     # of the figures read: the same history, the same digest
    rows = tuple(f"{layout.label} at {p.at_s:.0f} s" for p in points)
    source = Source(url, digest, rows, f"prometheus: the operator's queries, {len(samples)} windows of {window_s} s "
                    f"ending {end_s:.0f} (Unix s)")
    return History(points, len(samples), len(samples) - len(points), window_s, end_s, source)


def no_points_message(history: History, *, since: str, matchers: Mapping[str, Any] | None = None) -> str:
    """Why a history cannot be fitted, naming --since (HistoryWindows)."""
    return (f"{len(history.points)} windows of {history.window_s} s with {MIN_REQUESTS} requests and both latencies in the last "
            f"{since} ({history.windows} windows had any series, {history.quiet} too quiet); a longer --since, or check --topology / "
            "--selector match the engines' series" + (f" ({dict(matchers)})" if matchers else ""))
