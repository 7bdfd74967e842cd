"""Reading a deployment calibration (CAL.yaml, `servingtopology calibrate`) and showing predictions with their intervals.

Shared by plan, simulate and sweep (`--calibration CAL.yaml`) and by calibrate itself; bounded reads, every failure an
InvalidSpec naming the file and the field (exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servingtopology.calibration_file import MAX_CALIBRATION_BYTES, check_calibration, deployment_of, parse_calibration
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.figure_text import UNBOUNDED
from servingtopology.planner.layout import Layout
from servingtopology.planner.live import error_bars
from servingtopology.planner.perf.deployment_fit import Deployment, DeploymentCalibration, refuse_other
from servingtopology.planner.problem import Problem

__all__ = ["MAX_CALIBRATION_BYTES", "read_bytes", "read_calibration", "read_calibration_of", "deployment_of", "prediction_intervals", "add_calibration_arg",
           "calibration_summary", "interval_text"]


def read_bytes(path: Path, cap: int, field: str) -> bytes:
    try:
        with path.open("rb") as fh:
            raw = fh.read(cap + 1)
    except OSError as exc:
        raise InvalidSpec(field, f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > cap:
        raise InvalidSpec(field, f"{path} is over {cap:,} bytes")
    return raw


def read_calibration(path: str, problem: Problem, *, field: str = "--calibration") -> DeploymentCalibration:
    """A CAL.yaml, bounded, checked against the problem's deployment (model, GPU, engine, release): the reader the
    operator's spec.calibration shares (servingtopology/calibration_file.py). A file that is missing or unreadable is
    an InvalidSpec naming `field` and the path (exit 2), never a prediction without it."""
    raw = read_bytes(Path(path), MAX_CALIBRATION_BYTES, field)
    cal = parse_calibration(raw, name=Path(path).name, field=field)
    check_calibration(cal, problem, name=Path(path).name, field=field)
    return cal


def read_calibration_of(path: str, deployment: Deployment, *, field: str = "--calibration") -> DeploymentCalibration:
    """`read_calibration` for a deployment without a spec (a recorded run's, `simulate --replay`): refused when the file
    is of another model, GPU, engine or release (planner.perf.deployment_fit.refuse_other)."""
    raw = read_bytes(Path(path), MAX_CALIBRATION_BYTES, field)
    cal = parse_calibration(raw, name=Path(path).name, field=field)
    d = cal.deployment
    refuse_other(deployment, Deployment(d.model, d.gpu, d.engine, d.release), field=f"{field} {Path(path).name} deployment")
    return cal


def prediction_intervals(problem: Problem, layout: Layout, ttft_ms: float, tpot_ms: float,
                         calibration: DeploymentCalibration | None) -> dict[str, Any]:
    """The nominal 80 % intervals of a TTFT and a TPOT prediction (planner.live.error_bars), JSON-ready."""
    ivs = error_bars.figure_intervals(problem, layout, ttft_ms=ttft_ms, tpot_ms=tpot_ms, calibration=calibration)
    return {f"{m}_ms": iv.to_dict() for m, iv in ivs.items()}


def add_calibration_arg(p: Any) -> None:
    """The `--calibration CAL.yaml` option of plan, simulate and sweep."""
    p.add_argument("--calibration", metavar="CAL.yaml", help="a deployment's calibration (servingtopology calibrate): predictions are shown "
                   "calibrated beside uncalibrated, each with its nominal 80 %% interval")


def calibration_summary(cal: DeploymentCalibration, path: str) -> dict[str, Any]:
    """What a command's JSON says of the calibration it applied."""
    return {"file": path, "deployment": cal.deployment.to_dict(), "factors": {k: round(v, 4) for k, v in cal.factors.items()},
            "points_used": cal.points_used, "at_bound": list(cal.at_bound), "misses": cal.misses,
            "residual_before": {k: round(v, 4) for k, v in cal.residual_before.items()},
            "residual_after": {k: round(v, 4) for k, v in cal.residual_after.items()}}


def interval_text(iv: Mapping[str, Any]) -> str:
    """`55.5 [35.4–87.1]`; a figure with no finite value (nothing finished, or a queue without end) reads `unbounded`."""
    value, lo, hi = iv.get("value"), iv.get("low"), iv.get("high")
    if value is None or not math.isfinite(value):
        return f"{UNBOUNDED} [no interval]"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{value:.1f} [no interval]"
    return f"{iv['value']:.1f} [{lo:.1f}–{hi:.1f}]"
