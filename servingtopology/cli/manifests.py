"""`servingtopology plan SPEC --manifests DIR`: the objects the operator would apply for SPEC, one YAML file each.

Called by cli/plan.py, which then prints the same plan. SPEC is a ServingTopology resource (its metadata names the
objects) or its spec alone (named `servingtopology` in `default`). The plan and the objects come from the operator's
own steps (operator/offline.py), so a GitOps review sees what the operator would apply; `kubectl apply
--dry-run=server -f DIR` checks them. What the operator would refuse (a namespace that is no DNS-1123 label, pod templates
beyond the grants of `--grant`, the chart's strict policy by default, objects over the API server's limits) is refused
here too, naming the field, and nothing is written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.figure_text import gpus_text
from servingtopology.planner.problem import Decision, Problem
from servingtopology.spec import SpecError, read_spec_data

if TYPE_CHECKING:
    from servingtopology.operator.api.resource import TopologySpec
    from servingtopology.operator.offline import OfflinePlan
    from servingtopology.operator.render.tenancy import PodGrant

__all__ = ["write_manifests", "read_grants", "DEFAULT_NAME", "DEFAULT_NAMESPACE"]

DEFAULT_NAME, DEFAULT_NAMESPACE = "servingtopology", "default"


def _resource(data: Any) -> tuple[str, str, Any]:
    """(name, namespace, spec mapping) of a resource document, or the defaults around a bare spec; a name or namespace
    that is not a string is refused naming it (str() of a list would pass as text)."""
    if isinstance(data, dict) and data.get("kind") == "ServingTopology":
        meta = data.get("metadata") or {}
        if not isinstance(meta, dict):
            raise SpecError([("metadata", "expected a mapping with name and namespace")])
        for key in ("name", "namespace"):
            if meta.get(key) is not None and not isinstance(meta[key], str):
                raise SpecError([(f"metadata.{key}", f"expected a string, got {type(meta[key]).__name__}")])
        return str(meta.get("name") or DEFAULT_NAME), str(meta.get("namespace") or DEFAULT_NAMESPACE), data.get("spec")
    return DEFAULT_NAME, DEFAULT_NAMESPACE, data


def read_grants(words: list[str] | None) -> frozenset[PodGrant]:
    """`--grant` values (repeated or comma-separated) as the tenancy policy's grants; raises InvalidSpec naming the allowed."""
    from servingtopology.operator.render.tenancy import parse_grants

    try:
        return frozenset(parse_grants(w for word in words or () for w in word.split(",")))
    except ValueError as exc:
        raise InvalidSpec("--grant", str(exc)) from None


def write_manifests(spec_path: str | None, spec: TopologySpec, directory: str, *,
                    planner: Callable[[Problem], Decision] | None = None,
                    granted: frozenset[PodGrant] = frozenset()) -> OfflinePlan:
    """Plan `spec` (read from `spec_path`, what-if flags applied) as the operator would, with `planner` (None: the
    operator's own, stage 6 included), and write its
    objects to `directory` (created; files of an earlier run are replaced). The returned plan is the one `plan` then
    prints, so the table, the record and the objects are one decision (OneDecision).

    `granted` are the pod-template grants the operator's chart gives the namespace (none: the strict default).
    Raises SpecError or InvalidSpec (nothing written; the message names the field) and Infeasible (nothing written)."""
    from servingtopology.operator.api.resource import check_resource_name
    from servingtopology.operator.offline import file_name, plan_offline

    if spec_path is None:
        raise SpecError([("spec", "--manifests needs a ServingTopology (or its spec) to render")])
    name, namespace, _ = _resource(read_spec_data(spec_path))
    check_resource_name(name)
    offline = (plan_offline(spec, name=name, namespace=namespace, granted=granted) if planner is None
               else plan_offline(spec, name=name, namespace=namespace, planner=planner, granted=granted))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.yaml"):
        old.unlink()
    header = (f"# What the ServingTopology operator would apply for {namespace}/{name} ({offline.layout.label_for(spec.engine.name)}, "
              f"{gpus_text(offline.layout.gpus)}): `servingtopology plan --manifests`.\n"
              "# The operator also sets an ownerReference to the ServingTopology (its uid exists once it is applied).\n")
    for i, obj in enumerate(offline.objects, start=1):
        (out / file_name(i, obj)).write_text(header + yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))
    print(f"wrote {len(offline.objects)} objects for {offline.layout.label_for(spec.engine.name)} to {out}/ (check them with "
          f"kubectl apply --dry-run=server -f {out})", file=sys.stderr)
    return offline
