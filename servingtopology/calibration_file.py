"""The one reader of a deployment calibration file (CAL.yaml, as `servingtopology calibrate --out` writes it).

Shared by the CLI (`plan/simulate/sweep --calibration`, servingtopology/cli/calibration_io.py, which reads the file
bounded from disk) and the operator (`spec.calibration`, a ConfigMap key the reconcile reads from the API server):
both hand the bytes here. Every failure is an InvalidSpec naming the field; a calibration of another model, GPU,
engine or release is a `CalibrationRefused` whose `reason` names it (planner/perf/deployment_fit.py). No file or network
I/O here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import yaml

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Layout
from servingtopology.planner.perf.deployment_fit import Deployment, DeploymentCalibration, refuse_other
from servingtopology.planner.problem import Problem

__all__ = ["MAX_CALIBRATION_BYTES", "deployment_of", "parse_calibration", "check_calibration", "calibration_sha256", "factors_of"]

MAX_CALIBRATION_BYTES = 4 * 1024 * 1024   # CAL.yaml; `calibrate` writes a few KiB per point


def deployment_of(problem: Problem, layout: Layout | None) -> Deployment:
    """The deployment a problem plans (model, GPU, engine, release, link; the layout's label when given); the release is the
    one the spec names, the one measured, even when it is planned at the nearest covered release."""
    return Deployment(problem.model.name, problem.gpu.id, problem.engine.value, problem.engine_version_requested or problem.engine_version or "",
                      problem.gpu.scaleup_link.value, layout.label if layout is not None else "")


def calibration_sha256(raw: bytes) -> str:
    """The file's sha256 (hex), its provenance in status and outputs."""
    return hashlib.sha256(raw).hexdigest()


def parse_calibration(raw: bytes, *, name: str, field: str) -> DeploymentCalibration:
    """A CAL.yaml's bytes as a DeploymentCalibration: at most MAX_CALIBRATION_BYTES, UTF-8 YAML, `to_dict`'s layout.

    `name` says where the bytes came from (a file name, a ConfigMap key) in messages; `field` is the input's name
    (`--calibration`, `spec.calibration`)."""
    if len(raw) > MAX_CALIBRATION_BYTES:
        raise InvalidSpec(field, f"{name} is over {MAX_CALIBRATION_BYTES:,} bytes")
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise InvalidSpec(field, f"{name} is not UTF-8 YAML ({str(exc)[:200]})") from None
    return DeploymentCalibration.from_dict(doc, field=f"{field} {name}")


def check_calibration(cal: DeploymentCalibration, problem: Problem, *, name: str, field: str,
                      model_aliases: Sequence[str] = ()) -> None:
    """Refuse a calibration of another deployment than the problem's: CalibrationRefused with reason OtherModel,
    OtherGpu, OtherEngine or OtherRelease (`model_aliases`: other names the problem's model goes by, e.g. the name
    it is served as)."""
    d = cal.deployment
    refuse_other(deployment_of(problem, None), Deployment(d.model, d.gpu, d.engine, d.release), field=f"{field} {name} deployment",
                 model_aliases=model_aliases)


def factors_of(cal: DeploymentCalibration) -> tuple[tuple[str, float], ...]:
    """The calibration's factors as `Problem.factors` carries them (sorted, the 1s left out)."""
    return tuple(sorted((t, float(f)) for t, f in cal.factors.items() if f != 1.0))
