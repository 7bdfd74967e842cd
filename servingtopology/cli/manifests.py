"""`servingtopology plan SPEC --manifests DIR`: the objects the operator would apply for SPEC, one YAML file each.

Called by cli/plan.py, which then prints the same plan. SPEC is a ServingTopology resource (its metadata names the
objects) or its spec alone (named `servingtopology` in `default`). The plan and the objects come from the operator's
own steps (operator/offline.py), so a GitOps review sees what the operator would apply; `kubectl apply
--dry-run=server -f DIR` checks them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from servingtopology.planner.problem import Decision, Problem
from servingtopology.spec import SpecError, read_spec_data

if TYPE_CHECKING:
    from servingtopology.operator.api.resource import TopologySpec
    from servingtopology.operator.offline import OfflinePlan

__all__ = ["write_manifests", "DEFAULT_NAME", "DEFAULT_NAMESPACE"]

DEFAULT_NAME, DEFAULT_NAMESPACE = "servingtopology", "default"


def _resource(data: Any) -> tuple[str, str, Any]:
    """(name, namespace, spec mapping) of a resource document, or the defaults around a bare spec."""
    if isinstance(data, dict) and data.get("kind") == "ServingTopology":
        meta = data.get("metadata") or {}
        return str(meta.get("name") or DEFAULT_NAME), str(meta.get("namespace") or DEFAULT_NAMESPACE), data.get("spec")
    return DEFAULT_NAME, DEFAULT_NAMESPACE, data


def write_manifests(spec_path: str | None, spec: TopologySpec, directory: str, *,
                    planner: Callable[[Problem], Decision] | None = None) -> OfflinePlan:
    """Plan `spec` (read from `spec_path`, what-if flags applied) as the operator would, with `planner` (None: the
    operator's own, stage 6 included), and write its
    objects to `directory` (created; files of an earlier run are replaced). The returned plan is the one `plan` then
    prints, so the table, the record and the objects are one decision (OneDecision).

    Raises SpecError or InvalidSpec (nothing written; the message names the field) and Infeasible (nothing written)."""
    from servingtopology.operator.api.resource import check_resource_name
    from servingtopology.operator.offline import file_name, plan_offline

    if spec_path is None:
        raise SpecError([("spec", "--manifests needs a ServingTopology (or its spec) to render")])
    name, namespace, _ = _resource(read_spec_data(spec_path))
    check_resource_name(name)
    offline = (plan_offline(spec, name=name, namespace=namespace) if planner is None
               else plan_offline(spec, name=name, namespace=namespace, planner=planner))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.yaml"):
        old.unlink()
    header = (f"# What the ServingTopology operator would apply for {namespace}/{name} ({offline.layout.label_for(spec.engine.name)}, "
              f"{offline.layout.gpus} GPUs): `servingtopology plan --manifests`.\n"
              "# The operator also sets an ownerReference to the ServingTopology (its uid exists once it is applied).\n")
    for i, obj in enumerate(offline.objects, start=1):
        (out / file_name(i, obj)).write_text(header + yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))
    print(f"wrote {len(offline.objects)} objects for {offline.layout.label_for(spec.engine.name)} to {out}/ (check them with "
          f"kubectl apply --dry-run=server -f {out})", file=sys.stderr)
    return offline
