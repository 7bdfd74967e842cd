"""A deployment's own correction of the performance model, fitted from points measured on it (issue #27).

Names, so that the three corrections of this code base are not confused:
  - planner.fidelity.benchmark_cases: the public silicon benchmark rows turned into cases, for the engine-default fit
    (data/perf_params.json) and `servingtopology validate`. Nothing here changes it.
  - this module, `DeploymentCalibration`: one deployment (engine release, GPU, link, model, layout) measured by the
    user's own benchmark client or by the operator (planner.live.calibration: the points its live metrics give), and a
    bounded time factor per step-model term (perf.STEP_TERMS: gemm, weights, attention, communication, overhead) and per
    first-token term (`FIRST_TOKEN_TERMS`: the request's fixed overhead, its per-prompt-token overhead, queueing) fitted
    so that the model reproduces those points. A Problem carries them as `factors` (`problem_factors` applies them).

The fit: least squares of log(predicted / measured) of the mean TTFT and mean TPOT of every point, each metric in units
of the model's typical error of it (METRIC_SCALE), each point weighted by its age (halved every `half_life_s`), plus a
weak prior pulling every log factor to 0 (so a term the points do not inform stays as fitted on the public data);
Levenberg–Marquardt over the log factors with finite differences, every factor held within [1 / MAX_FACTOR, MAX_FACTOR].
A factor at its bound is reported (`at_bound`): the deployment is
further from the model than a correction should carry.

Refusals are `CalibrationRefused` errors (an InvalidSpec: the CLI exits 2, the operator sets a condition) whose
`reason` names them: OtherModel / OtherGpu / OtherEngine / OtherRelease / OtherLayout (a point or a calibration of
another deployment), TooFewPoints (fewer than `min_points`, MIN_POINTS by default), NonFinite (a measured figure that
is not a positive finite number). Pure: the caller reads the files and supplies the predictor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.figure_text import count_text
from servingtopology.planner.perf.step import STEP_TERMS, PerfParams, perf_params, pinned_params, scaled_terms

__all__ = ["FIRST_TOKEN_TERMS", "TERMS", "MAX_FACTOR", "MIN_POINTS", "DEFAULT_HALF_LIFE_S", "REFUSALS", "CalibrationRefused",
           "Deployment", "Point", "Source", "DeploymentCalibration", "fit", "factored_params", "with_factors", "problem_factors", "age_weights", "refuse_other"]

# First-token terms: PerfParams fields each factor multiplies (times; queue_factor scales the modelled queueing delay).
FIRST_TOKEN_TERMS: dict[str, tuple[str, ...]] = {
    "request_overhead": ("ttft_overhead_s", "sglang_ttft_overhead_s", "trtllm_ttft_overhead_s", "disagg_ttft_overhead_s"),
    "prompt_overhead": ("ttft_s_per_input_token", "sglang_ttft_s_per_input_token"),
    "queueing": ("queue_factor",),
}
TERMS: tuple[str, ...] = (*STEP_TERMS, *FIRST_TOKEN_TERMS)
MAX_FACTOR = 2.0            # each term's factor within [1/2, 2]: a bounded correction, not a refit
MIN_POINTS = 2              # measured points (load levels or intervals) below which nothing is fitted
DEFAULT_HALF_LIFE_S = 7 * 86400.0
PRIOR_WEIGHT = 0.01         # per squared log factor, against the age-weighted mean squared log error of the points
FD_STEP = 0.05              # finite-difference step in log factor
MAX_ITERATIONS = 8
REFUSALS = ("OtherModel", "OtherGpu", "OtherEngine", "OtherRelease", "OtherLayout", "TooFewPoints", "NonFinite")
METRICS = ("ttft", "tpot")
# Each metric's log error is counted in units of the model's typical error of it, so that TPOT, which the model predicts
# about twice as closely as TTFT, is not traded away to fit TTFT: vLLM's nominal 80 % half-widths of the
# leave-one-model-out residuals (data/prediction_intervals.json: TTFT 0.44, TPOT 0.19), rounded.
METRIC_SCALE = {"ttft": 0.4, "tpot": 0.2}


class CalibrationRefused(InvalidSpec):
    """A calibration that cannot be made or applied; `reason` is one of REFUSALS, `field` names the input."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        assert reason in REFUSALS, reason
        super().__init__(field, f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Deployment:
    """What a calibration is of. Empty strings are unknown (a result file that does not say) and match anything."""

    model: str
    gpu: str
    engine: str
    release: str = ""
    link: str = ""
    layout: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"model": self.model, "gpu": self.gpu, "engine": self.engine, "release": self.release, "link": self.link,
                "layout": self.layout}


_CHECKED = (("model", "OtherModel"), ("gpu", "OtherGpu"), ("engine", "OtherEngine"), ("release", "OtherRelease"),
            ("layout", "OtherLayout"))


def _norm(field_name: str, value: str) -> str:
    v = value.strip().lower()
    if field_name == "model":  # a Hugging Face id or the catalog's name: the last path part, without chat-tuning suffixes
        v = v.rsplit("/", 1)[-1]
        for suffix in ("-instruct", "-chat", "-hf", "-it"):
            v = v.removesuffix(suffix)
    return v


def refuse_other(expected: Deployment, given: Deployment, *, field: str, model_aliases: Sequence[str] = ()) -> None:
    """Raise CalibrationRefused when `given` (a result file's or a calibration's deployment) is another deployment than
    `expected`: model (compared by its last path part; `model_aliases` are other names the deployment's model goes by,
    e.g. the name it is served as), GPU, engine, engine release, layout; an empty side matches."""
    for name, reason in _CHECKED:
        a, b = getattr(expected, name), getattr(given, name)
        names = [a, *model_aliases] if name == "model" else [a]
        if a and b and all(_norm(name, x) != _norm(name, b) for x in names if x):
            raise CalibrationRefused(reason, field, f"{name} {b!r}, but the deployment runs {a!r}")


@dataclass(frozen=True, slots=True)
class Point:
    """One measured load level: mean TTFT and TPOT (ms) of `requests` requests at `load` (req/s for "rate", clients
    for "concurrency"), mean prompt and output lengths, how old it is, and where it came from."""

    ttft_ms: float
    tpot_ms: float
    load: float
    load_kind: str
    input_tokens: float
    output_tokens: float
    requests: int
    age_s: float = 0.0
    source: str = ""
    row: str = ""
    percentiles: Mapping[str, float] = field(default_factory=dict)   # "ttft_p50": ms, "tpot_p99": ms, ...

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_ms": _r(self.ttft_ms), "tpot_ms": _r(self.tpot_ms), "load": _r(self.load), "load_kind": self.load_kind,
                "input_tokens": _r(self.input_tokens), "output_tokens": _r(self.output_tokens), "requests": self.requests,
                "age_s": _r(self.age_s), "source": self.source, "row": self.row,
                "percentiles": {k: _r(v) for k, v in self.percentiles.items()}}


@dataclass(frozen=True, slots=True)
class Source:
    """Provenance of the points of one file: its path as given, sha256, the rows used, the tool that wrote it."""

    path: str
    sha256: str
    rows: tuple[str, ...]
    tool: str
    tool_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "rows": list(self.rows), "tool": self.tool, "tool_version": self.tool_version}


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd)


def age_weights(points: Sequence[Point], half_life_s: float) -> Any:
    """Each point's weight: halved every `half_life_s` it is older than the newest point, which weighs 1 (an infinite
    half-life weighs all alike). NewestWeighsOne: counted from the newest, not from now, so points all years old do not
    all underflow to 0 (a weight sum of 0 made every residual NaN); the fit normalises the weights, so this changes
    nothing else."""
    ages = np.array([max(p.age_s, 0.0) for p in points], dtype=float)
    if not math.isfinite(half_life_s) or ages.size == 0:
        return np.ones_like(ages)
    return np.power(0.5, (ages - ages.min()) / max(half_life_s, 1e-9))


def factored_params(factors: Mapping[str, float], base: PerfParams) -> PerfParams:
    """`base` with `factors` applied: each first-token term's fields multiplied, and the step terms' factors carried as
    `step_scales` (in place of any `base` carried) for `step_coefficients` to apply. Given these parameters, every
    prediction (analytic, simulator, closed loop) is the calibrated one."""
    values: dict[str, float] = {}
    for term, names in FIRST_TOKEN_TERMS.items():
        f = float(factors.get(term, 1.0))
        if f != 1.0:
            values.update({n: getattr(base, n) * f for n in names})
    step = {t: float(factors.get(t, 1.0)) for t in STEP_TERMS}
    return scaled_terms(replace(base, **values) if values else base, step)  # type: ignore[arg-type]


@contextmanager
def with_factors(factors: Mapping[str, float], base: PerfParams | None = None) -> Iterator[PerfParams]:
    """Run the model with `factors` applied to `base` (the parameters in use by default) inside the block: code that
    reads `perf_params()` there predicts with `factored_params`."""
    with pinned_params(factored_params(factors, base or perf_params())) as pinned:
        yield pinned


@contextmanager
def problem_factors(factors: Sequence[tuple[str, float]]) -> Iterator[None]:
    """Apply a Problem's factors (`Problem.factors`) inside the block, once: an inner block with the same factors (decide
    predicting its current layout) does not apply them again, for the parameters in use carry them (`applied_factors`).
    An inner block with other non-empty factors is an error (they would compound); empty factors change nothing."""
    active = perf_params().applied_factors
    wanted = tuple((str(t), float(f)) for t, f in factors)
    if not wanted or wanted == active:
        yield
        return
    if active:
        raise ValueError(f"factors {dict(wanted)} inside other factors {dict(active)} would compound")
    unknown = sorted({t for t, _ in wanted} - set(TERMS))
    if unknown:
        raise ValueError(f"unknown calibration terms {unknown}; known: {', '.join(TERMS)}")
    with pinned_params(replace(factored_params(dict(wanted), perf_params()), applied_factors=wanted)):
        yield


@dataclass(frozen=True, slots=True)
class DeploymentCalibration:
    """A fitted, bounded correction of one deployment and what it rests on (see the module's docstring).

    `residual_before` / `residual_after`: the age-weighted RMS of log(predicted / measured) per metric over the points
    used, uncalibrated and calibrated. `own_half_width`: the deployment's own 80 % half-width per metric in log terms
    (the calibrated residual, inflated by √(n / (n − 1)) for the factors fitted); planner.live.error_bars narrows the class
    interval towards it. `misses`: measured results after a move that missed their predicted interval (the operator
    counts them); each widens the deployment's intervals (`widening`)."""

    deployment: Deployment
    factors: Mapping[str, float]
    points: tuple[Point, ...]
    min_points: int
    half_life_s: float
    residual_before: Mapping[str, float]
    residual_after: Mapping[str, float]
    own_half_width: Mapping[str, float]
    at_bound: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()
    misses: int = 0

    @property
    def points_used(self) -> int:
        return len(self.points)

    @property
    def widening(self) -> float:
        """Factor on the deployment's interval half-widths: 1.5 per recorded miss, at most 4."""
        return float(min(1.5 ** self.misses, 4.0))

    @contextmanager
    def applied(self, base: PerfParams | None = None) -> Iterator[PerfParams]:
        with with_factors(self.factors, base) as p:
            yield p

    def with_miss(self) -> DeploymentCalibration:
        return replace(self, misses=self.misses + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "DeploymentCalibration",
            "deployment": self.deployment.to_dict(),
            "factors": {t: _r(self.factors.get(t, 1.0)) for t in TERMS},
            "at_bound": list(self.at_bound),
            "fit": {"points_used": self.points_used, "min_points": self.min_points, "half_life_s": self.half_life_s,
                    "max_factor": MAX_FACTOR, "prior_weight": PRIOR_WEIGHT,
                    "residual_before": {k: _r(v) for k, v in self.residual_before.items()},
                    "residual_after": {k: _r(v) for k, v in self.residual_after.items()},
                    "own_half_width": {k: _r(v) for k, v in self.own_half_width.items()}, "misses": self.misses},
            "points": [p.to_dict() for p in self.points],
            "sources": [s.to_dict() for s in self.sources],
        }

    @staticmethod
    def from_dict(raw: Any, *, field: str = "calibration") -> DeploymentCalibration:
        """Read `to_dict`'s layout back; every wrong type or value is an InvalidSpec naming the field."""
        if not isinstance(raw, Mapping) or raw.get("kind") != "DeploymentCalibration":
            raise InvalidSpec(field, "not a DeploymentCalibration (kind: DeploymentCalibration, as `servingtopology calibrate` writes)")
        dep = _mapping(raw, "deployment", field)
        deployment = Deployment(**{k: _text(dep, k, f"{field}.deployment") for k in ("model", "gpu", "engine", "release", "link", "layout")})
        fac = _mapping(raw, "factors", field)
        unknown = sorted(set(map(str, fac)) - set(TERMS))
        if unknown:
            raise InvalidSpec(f"{field}.factors", f"unknown terms {unknown}; allowed: {', '.join(TERMS)}")
        factors = {t: _number(fac, t, f"{field}.factors", lo=1.0 / MAX_FACTOR, hi=MAX_FACTOR, default=1.0) for t in TERMS}
        fit_ = _mapping(raw, "fit", field)
        f = f"{field}.fit"
        points_used = int(_number(fit_, "points_used", f, lo=0, hi=1e9))
        min_points = int(_number(fit_, "min_points", f, lo=1, hi=1e9, default=MIN_POINTS))
        if points_used < min_points:
            raise CalibrationRefused("TooFewPoints", f"{f}.points_used", f"{count_text(points_used, 'point')}, fewer than the minimum {min_points}")
        half = {m: _number(_mapping(fit_, "own_half_width", f), m, f"{f}.own_half_width", lo=0.0, hi=10.0) for m in METRICS}
        before = {m: _number(_mapping(fit_, "residual_before", f), m, f"{f}.residual_before", lo=0.0, hi=100.0) for m in METRICS}
        after = {m: _number(_mapping(fit_, "residual_after", f), m, f"{f}.residual_after", lo=0.0, hi=100.0) for m in METRICS}
        raw_points = raw.get("points") or []
        if not isinstance(raw_points, list):
            raise InvalidSpec(f"{field}.points", "must be a list")
        points = tuple(_point(p, f"{field}.points[{i}]") for i, p in enumerate(raw_points[:10_000]))
        raw_sources = raw.get("sources") or []
        if not isinstance(raw_sources, list):
            raise InvalidSpec(f"{field}.sources", "must be a list")
        sources = tuple(Source(_text(s, "path", f"{field}.sources[{i}]"), _text(s, "sha256", f"{field}.sources[{i}]"),
                               tuple(str(r) for r in (s.get("rows") or [])[:10_000]), _text(s, "tool", f"{field}.sources[{i}]"),
                               _text(s, "tool_version", f"{field}.sources[{i}]"))
                        for i, s in enumerate(raw_sources[:1000]) if isinstance(s, Mapping))
        at_bound = tuple(str(t) for t in (raw.get("at_bound") or []) if str(t) in TERMS)
        misses = int(_number(fit_, "misses", f, lo=0, hi=1000, default=0))
        return DeploymentCalibration(deployment, factors, points if points else (), min_points,
                                     _number(fit_, "half_life_s", f, lo=1.0, hi=math.inf, default=DEFAULT_HALF_LIFE_S),
                                     before, after, half, at_bound, sources, misses)


def _mapping(raw: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
    v = raw.get(key)
    if not isinstance(v, Mapping):
        raise InvalidSpec(f"{field}.{key}", f"must be a mapping, got {type(v).__name__}")
    return v


def _text(raw: Mapping[str, Any], key: str, field: str) -> str:
    v = raw.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > 512:
        raise InvalidSpec(f"{field}.{key}", "must be a string of at most 512 characters")
    return v


def _number(raw: Mapping[str, Any], key: str, field: str, *, lo: float, hi: float, default: float | None = None) -> float:
    v = raw.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        raise CalibrationRefused("NonFinite", f"{field}.{key}", f"must be a number from {lo:g} to {hi:g}, got {v!r:.40}")
    x = float(v)
    if not math.isfinite(x) and not (x == math.inf and hi == math.inf):
        raise CalibrationRefused("NonFinite", f"{field}.{key}", f"must be a finite number, got {x}")
    if not lo - 1e-9 <= x <= hi + 1e-9:
        raise InvalidSpec(f"{field}.{key}", f"must be from {lo:g} to {hi:g}, got {x:g}")
    return x


def _point(raw: Any, field: str) -> Point:
    if not isinstance(raw, Mapping):
        raise InvalidSpec(field, "must be a mapping")
    num = {k: _number(raw, k, field, lo=0.0, hi=1e12) for k in ("ttft_ms", "tpot_ms", "load", "input_tokens", "output_tokens")}
    kind = _text(raw, "load_kind", field)
    if kind not in ("rate", "concurrency"):
        raise InvalidSpec(f"{field}.load_kind", f"must be rate or concurrency, got {kind!r}")
    pct = raw.get("percentiles") or {}
    percentiles = {str(k): _number(pct, k, f"{field}.percentiles", lo=0.0, hi=1e12) for k in list(pct)[:32]} if isinstance(pct, Mapping) else {}
    return Point(num["ttft_ms"], num["tpot_ms"], num["load"], kind, num["input_tokens"], num["output_tokens"],
                 int(_number(raw, "requests", field, lo=0, hi=1e9)), _number(raw, "age_s", field, lo=0.0, hi=1e12, default=0.0),
                 _text(raw, "source", field), _text(raw, "row", field), percentiles)


def check_points(points: Sequence[Point], *, min_points: int, field: str = "points") -> None:
    """TooFewPoints / NonFinite refusals of a point set (nothing is fitted then)."""
    for i, p in enumerate(points):
        for name in ("ttft_ms", "tpot_ms", "load", "input_tokens", "output_tokens"):
            v = getattr(p, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise CalibrationRefused("NonFinite", f"{field}[{i}].{name}", f"{v!r} is not a positive finite number ({p.source} {p.row})".strip())
    if len(points) < min_points:
        raise CalibrationRefused("TooFewPoints", field, f"{count_text(len(points), 'measured point')}; at least {min_points} are needed to fit a correction")


Predictor = Callable[[Mapping[str, float]], Any]


def _log_errors(pred: Any, meas: Any) -> Any:
    pred = np.asarray(pred, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(pred / meas)
    return np.where(np.isfinite(r), r, 5.0)  # a prediction with no steady state counts as a large error


def fit(deployment: Deployment, points: Sequence[Point], predict: Predictor, *, half_life_s: float = DEFAULT_HALF_LIFE_S,
        min_points: int = MIN_POINTS, sources: Sequence[Source] = (), terms: Sequence[str] = TERMS) -> DeploymentCalibration:
    """Fit the bounded factors of `terms` to `points`.

    `predict(factors)` returns an (n, 2) array of predicted mean TTFT and TPOT (ms) of the n points with `factors`
    applied (`with_factors`); it is called about 10 × (len(terms) + 1) times.
    """
    check_points(points, min_points=min_points)
    if not (half_life_s > 0):   # NaN too: every weight, and so every residual, would be NaN
        raise InvalidSpec("half_life_s", f"{half_life_s!r}: a positive number of seconds, or inf (all points alike)")
    meas = np.array([[p.ttft_ms, p.tpot_ms] for p in points], dtype=float)
    w = age_weights(points, half_life_s)
    w = w / w.sum()
    sw = np.sqrt(w)[:, None] / np.array([METRIC_SCALE[m] for m in METRICS])[None, :]
    names = list(terms)
    bound = math.log(MAX_FACTOR)

    def factors_of(theta: Any) -> dict[str, float]:
        return {t: float(math.exp(x)) for t, x in zip(names, theta, strict=True)}

    def errors(theta: Any) -> Any:
        return _log_errors(predict(factors_of(theta)), meas)

    def residuals(e: Any, theta: Any) -> Any:
        return np.concatenate([(e * sw).ravel(), math.sqrt(PRIOR_WEIGHT) * theta])

    theta = np.zeros(len(names))
    e0 = errors(theta)
    e = e0
    r = residuals(e0, theta)
    cost = float(r @ r)
    lam = 1e-2
    active = list(range(len(names)))   # terms the points inform (a column of zeros in the first Jacobian is dropped)
    data_rows = 2 * len(points)
    for it in range(MAX_ITERATIONS):
        jac = np.zeros((r.size, len(names)))
        for j in active:
            step = FD_STEP if theta[j] + FD_STEP <= bound else -FD_STEP
            t2 = theta.copy()
            t2[j] += step
            jac[:, j] = (residuals(errors(t2), t2) - r) / step
        if it == 0:
            active = [j for j in active if float(np.max(np.abs(jac[:data_rows, j]))) > 1e-6]
            if not active:
                break
        jac[:, [j for j in range(len(names)) if j not in active]] = 0.0
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        for _ in range(4):
            delta = -np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-9), jtr)
            cand = np.clip(theta + delta, -bound, bound)
            ec = errors(cand)
            rc = residuals(ec, cand)
            c = float(rc @ rc)
            if c < cost:
                theta, e, r, cost, lam, improved = cand, ec, rc, c, lam / 3.0, True
                break
            lam *= 4.0
        if not improved or float(np.max(np.abs(delta))) < 1e-3:
            break
    n = len(points)

    # ResidualsFromErrors: the residuals are the log errors themselves (finite: _log_errors counts a prediction with no
    # steady state as 5), never the weighted residuals divided back by √weight, which is 0 / 0 = NaN for a point whose
    # weight underflowed to 0.
    def rms(a: Any) -> dict[str, float]:
        return {m: float(math.sqrt(float(np.sum(w * a[:, i] ** 2)))) for i, m in enumerate(METRICS)}
    res_after = rms(e)
    inflate = math.sqrt(n / max(n - 1, 1))
    own = {m: max(1.2816 * v * inflate, 0.01) for m, v in res_after.items()}  # the normal 80 % half-width, at least 1 %
    factors = factors_of(theta)
    at_bound = tuple(t for t, x in zip(names, theta, strict=True) if abs(x) >= bound - 1e-6)
    full = {t: factors.get(t, 1.0) for t in TERMS}
    return DeploymentCalibration(deployment, full, tuple(points), min_points, half_life_s, rms(e0), res_after, own, at_bound,
                                 tuple(sources))
