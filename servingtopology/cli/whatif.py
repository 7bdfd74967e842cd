"""Flags for a quick what-if without a file (`plan --model … --gpu … --rate …`), mapped onto the spec's own fields.

Each flag sets one field of the planning spec (the file's when one is given, else the embedded default scenario)
before the spec is validated, so a flag is held to exactly the checks a YAML field is, and an error names the flag
and the field (`--max-gpus (hardware.maxGPUs): ...`). Used by `plan`, `sweep` and `compare`; owns no validation.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Flag", "FLAGS", "SLO_PERCENTILES", "add_whatif_flags", "whatif_overrides", "apply_overrides", "flag_errors", "flagged"]

# The percentiles the spec's SLO keys name (spec.SloSpec: exactly one per metric): one what-if flag each.
SLO_PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9")


@dataclass(frozen=True, slots=True)
class Flag:
    """One what-if flag: the spec field it sets (dotted path) and how its text becomes that field's value."""

    option: str
    path: str
    help: str
    shape: str = "scalar"     # scalar | list (comma-separated) | percentile ({percentile: value})
    percentile: str = ""      # the SLO key a percentile flag sets (p50 … p99.9)
    catalog: str = ""         # the catalog whose ids complete its value: gpu | model | engine (cli/completion.py)


FLAGS = (
    Flag("--model", "model", "model: catalog id or Hugging Face id (replaces the file's model or modelConfig)", catalog="model"),
    Flag("--gpu", "hardware.gpu", "GPU kind from the catalog, e.g. h100_sxm, a100_sxm", catalog="gpu"),
    Flag("--max-gpus", "hardware.maxGPUs", "GPU budget for the whole deployment"),
    Flag("--gpus-per-node", "hardware.gpusPerNode", "GPUs in one node"),
    Flag("--engine", "engine", "vllm or sglang", catalog="engine"),
    Flag("--precision", "precision", "weights: bf16, fp8, fp4, int4"),
    Flag("--rate", "workload.arrivalRate", "arrival rate in requests/s (replaces the file's load)"),
    Flag("--isl", "workload.inputTokens", "prompt length in tokens (input sequence length; a fixed length)"),
    Flag("--osl", "workload.outputTokens", "output length in tokens (output sequence length; a fixed length)"),
    Flag("--prefix-share", "workload.prefixShare", "fraction of each prompt shared with earlier requests, 0..1"),
    *(Flag(f"--{metric}-{p}", f"slo.{metric}Ms", f"{p} {metric.upper()} bound in ms (the spec's one {metric.upper()} percentile)",
           "percentile", percentile=p) for metric in ("ttft", "tpot") for p in SLO_PERCENTILES),
    Flag("--objective", "objective", "goodput-per-gpu or min-gpus"),
    Flag("--layouts", "search.layouts", "layout kinds to search, comma-separated: replicas,pd", "list"),
)


def _dest(flag: Flag) -> str:
    return "whatif_" + flag.option.lstrip("-").replace("-", "_").replace(".", "_")


def add_whatif_flags(parser: argparse.ArgumentParser) -> None:
    """Add the what-if flags (strings: the spec validates them) under their own heading."""
    group = parser.add_argument_group("what-if (each flag sets one spec field; without SPEC, over the embedded default scenario)")
    for f in FLAGS:
        action = group.add_argument(f.option, dest=_dest(f), metavar=f.path.rsplit(".", 1)[-1].upper(), help=f"{f.help} [{f.path}]")
        if f.catalog:
            action.catalog = f.catalog  # type: ignore[attr-defined]  # read by cli/completion.py


def _number(text: str) -> Any:
    """'8' → 8, '0.5' → 0.5, anything else as given: the spec's validation names what it expected."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def whatif_overrides(args: argparse.Namespace, *, strict: bool = True) -> dict[str, Any]:
    """Dotted spec path → value, for each what-if flag given. Two percentile flags of one metric (`--ttft-p95 200
    --ttft-p99 400`) are a SpecError naming both: the spec carries one percentile per metric (`strict=False`, for
    naming the flags in an error already raised: the first one given)."""
    from servingtopology.spec import SpecError

    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for f in FLAGS:
        text = getattr(args, _dest(f), None)
        if text is None:
            continue
        if f.path in given and not strict:
            continue
        if f.path in given:
            raise SpecError([(f"{given[f.path]} and {f.option} ({f.path})",
                              f"give one of them: the spec carries exactly one percentile of {f.path.split('.')[-1]}")])
        given[f.path] = f.option
        if f.shape == "list":
            out[f.path] = [x.strip() for x in str(text).split(",") if x.strip()]
        elif f.shape == "percentile":
            out[f.path] = {f.percentile: _number(str(text))}
        else:
            out[f.path] = _number(str(text))
    return out


# A flag replaces what the file said about the same thing, not only the one key: a model id replaces a config.json, a
# rate replaces a concurrency.
_REPLACES = {"model": ("modelConfig", "modelConfigMap"), "workload.arrivalRate": ("workload.concurrency",)}


def apply_overrides(data: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of the parsed spec mapping with each override set (missing sections are created); `data` that is not a
    mapping is returned as is, for the spec's own error."""
    if not overrides or not isinstance(data, dict):
        return data
    out = copy.deepcopy(data)
    for path, value in overrides.items():
        for other in _REPLACES.get(path, ()):
            *parents, leaf = other.split(".")
            holder: Any = out
            for key in parents:
                holder = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(holder, dict):
                holder.pop(leaf, None)
        *parents, leaf = path.split(".")
        node = out
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[leaf] = value
    return out


def flag_errors(errors: list[tuple[str, str]], overrides: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Spec errors with the flag named in front of each field a flag set (`--max-gpus (hardware.maxGPUs)`)."""
    by_path = {f.path: f.option for f in FLAGS if f.path in overrides
               and (f.shape != "percentile" or f.percentile in overrides[f.path])}
    out = []
    for field, message in errors:
        flag = next((opt for path, opt in by_path.items() if field == path or field.startswith(path + ".")), None)
        out.append((f"{flag} ({field})" if flag else field, message))
    return out


def flagged(exc: Exception, overrides: Mapping[str, Any]) -> Any:
    """A spec error (SpecError or the planner's InvalidSpec) with the flag named where a flag set the field."""
    from servingtopology.planner.errors import InvalidSpec
    from servingtopology.spec import SpecError

    if isinstance(exc, SpecError):
        return SpecError(flag_errors(list(exc.errors), overrides))
    if isinstance(exc, InvalidSpec):
        ((field, message),) = flag_errors([(exc.field, exc.message)], overrides)
        return InvalidSpec(field, message)
    return exc
