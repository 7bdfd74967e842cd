"""`servingtopology plan SPEC --manifests DIR`: the objects the operator would apply for SPEC, one YAML file each.

Called by cli/plan.py. SPEC is a ServingTopology resource (its metadata names the objects) or its spec alone (named
`servingtopology` in `default`). The plan and the objects come from the operator's own steps (operator/offline.py),
so a GitOps review sees what the operator would apply; `kubectl apply --dry-run=server -f DIR` checks them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.spec import SpecError, read_spec_data

__all__ = ["write_manifests", "DEFAULT_NAME", "DEFAULT_NAMESPACE"]

DEFAULT_NAME, DEFAULT_NAMESPACE = "servingtopology", "default"


def _resource(data: Any) -> tuple[str, str, Any]:
    """(name, namespace, spec mapping) of a resource document, or the defaults around a bare spec."""
    if isinstance(data, dict) and data.get("kind") == "ServingTopology":
        meta = data.get("metadata") or {}
        return str(meta.get("name") or DEFAULT_NAME), str(meta.get("namespace") or DEFAULT_NAMESPACE), data.get("spec")
    return DEFAULT_NAME, DEFAULT_NAMESPACE, data


def write_manifests(spec_path: str | None, directory: str) -> int:
    """Plan as the operator would and write its objects to `directory` (created; files of an earlier run are replaced).

    Returns 0, 1 (no feasible layout) or 2 (invalid spec; the message names the field), the plan command's codes."""
    from servingtopology.cli.spec_input import emit_spec_error
    from servingtopology.operator.api.resource import check_resource_name, parse_topology_spec
    from servingtopology.operator.offline import file_name, plan_offline

    if spec_path is None:
        return emit_spec_error(SpecError([("spec", "--manifests needs a ServingTopology (or its spec) to render")]))
    try:
        name, namespace, raw = _resource(read_spec_data(spec_path))
        check_resource_name(name)
        spec = parse_topology_spec(raw)
        offline = plan_offline(spec, name=name, namespace=namespace)
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(exc)
    except Infeasible as exc:
        print(f"No feasible layout: nothing written to {directory}. Closest miss: {exc.closest_miss}", file=sys.stderr)
        return 1
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.yaml"):
        old.unlink()
    header = (f"# What the ServingTopology operator would apply for {namespace}/{name} ({offline.layout.label}, "
              f"{offline.layout.gpus} GPUs): `servingtopology plan --manifests`.\n"
              "# The operator also sets an ownerReference to the ServingTopology (its uid exists once it is applied).\n")
    for i, obj in enumerate(offline.objects, start=1):
        (out / file_name(i, obj)).write_text(header + yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))
    print(f"wrote {len(offline.objects)} objects for {offline.layout.label} to {out}/ (check them with "
          f"kubectl apply --dry-run=server -f {out})", file=sys.stderr)
    return 0
