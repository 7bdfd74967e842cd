"""CRD generation: turns the pydantic API models (operator/api/resource.py) into the ServingTopology
CustomResourceDefinition with a structural OpenAPI v3 schema, printer columns and the status subresource.

Called by `python -m servingtopology.operator.api.crd --write` (writes crds/ and the chart's copy) and by the
golden test that fails when the committed YAML drifts from the models. Pure apart from `main`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from servingtopology.operator.api.resource import GROUP, KIND, MAX_RESOURCE_NAME, RESOURCE_NAME_PATTERN, VERSION, TopologySpec, TopologyStatus

__all__ = ["VERSION", "PLURAL", "SHORT_NAME", "CRD_PATHS", "structural_schema", "unguarded_fields", "build_crd", "render_crd_yaml", "write_generated",
           "main"]

PLURAL = "servingtopologies"
SHORT_NAME = "stopo"
# Relative to the repository root: the canonical file and the Helm chart's copy (Helm installs crds/ first).
CRD_PATHS = ("crds/servingtopology.yaml", "charts/servingtopology/crds/servingtopology.yaml")

# Fields of the planning spec that a ServingTopology does not accept: spec.pinned replaces `layout`, and
# spec.modelConfigMap replaces `modelConfig` (a path on the operator's disk means nothing to a user).
_SPEC_ONLY_FOR_CLI = ("layout", "modelConfig")
_DROP_KEYS = {"title", "$defs"}
_KEPT_ON_MERGE = ("description", "default", "x-kubernetes-preserve-unknown-fields")


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(node)
    while "$ref" in out:
        target = defs[out.pop("$ref").rsplit("/", 1)[-1]]
        out = {**target, **out}
    return out


def structural_schema(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite one pydantic JSON-schema node into a Kubernetes structural schema node.

    - `$ref` is inlined; `anyOf [X, null]` becomes X with `nullable: true`;
    - a union of different types (a token count or a distribution) becomes a node that preserves unknown
      fields: the API server stores it as is and the operator's pydantic model validates it;
    - `additionalProperties: false` is dropped (Kubernetes forbids it beside `properties`; pruning does the job);
    - numeric `exclusiveMinimum` becomes `minimum` + `exclusiveMinimum: true` (OpenAPI v3.0 spelling);
    - only scalar defaults are kept, so every default is valid against its own node;
    - a map's key constraints (`propertyNames`, `patternProperties`) become a CEL rule on the map;
    - the models' CEL rules (`x-kubernetes-validations`, from `json_schema_extra`) pass through as they are, and a
      rule that reads an optional field without `has()` is refused (`unguarded_fields`);
    - a description gets what the node enforces appended in words (`_explained`), as `kubectl explain` shows nothing else.
    """
    n = _resolve(node, defs)
    if "anyOf" in n:
        every = n.pop("anyOf")
        branches = [b for b in every if b.get("type") != "null"]
        nullable = len(branches) < len(every)
        if len(branches) == 1:
            merged = structural_schema({**_resolve(branches[0], defs), **{k: v for k, v in n.items() if k in _KEPT_ON_MERGE}}, defs)
            if nullable:
                merged["nullable"] = True
            return merged
        shapes = []
        for b in branches:
            r = _resolve(b, defs)
            shapes.append("{" + ", ".join(r.get("properties", {})) + "}" if r.get("type") == "object" else str(r.get("type")))
        text = f"one of: {' | '.join(shapes)}"
        out: dict[str, Any] = {"description": n.get("description", text),
                               "x-kubernetes-preserve-unknown-fields": True}
        return out
    out = {}
    rules: list[dict[str, str]] = []
    if "propertyNames" in n or "patternProperties" in n:
        # A map with constrained keys: pydantic writes the key pattern as patternProperties and the key length as
        # propertyNames, neither of which a Kubernetes schema has: the values' schema and a CEL rule on the keys.
        n = dict(n)
        names = dict(n.pop("propertyNames", {}))
        patterns = n.pop("patternProperties", {})
        if patterns:
            (pattern, values), = patterns.items()
            names["pattern"] = pattern
            n["additionalProperties"] = values
        rules.append(_key_rule(names))
    for key, value in n.items():
        if key in _DROP_KEYS:
            continue
        if key == "properties":
            out["properties"] = {k: structural_schema(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = structural_schema(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out["additionalProperties"] = structural_schema(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default":
            if isinstance(value, str | int | float | bool) and value is not None:
                out["default"] = value
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if rules:
        out["x-kubernetes-validations"] = [*out.get("x-kubernetes-validations", []), *rules]
    unguarded = unguarded_fields(out)
    if unguarded:
        raise ValueError(f"CEL rules read optional fields without has(): {unguarded}; the API server refuses an object without "
                         "them ('no such key'); guard each with !has(self.<field>) || ...")
    if "description" in out:
        out["description"] = _explained(out)
    return out


def unguarded_fields(node: Mapping[str, Any]) -> list[str]:
    """`rule: field` for each field a node's CEL rule reads (`self.<field>`) that the object may lack (not required, no
    schema default) and the rule never tests with `has(self.<field>)`: CEL fails such a rule with "no such key" when
    the field is absent, so the API server would refuse an object the operator's own model accepts (a
    podTemplate.metadata with annotations and no labels)."""
    props, required = node.get("properties") or {}, set(node.get("required") or ())
    out = []
    for rule in (r["rule"] for r in node.get("x-kubernetes-validations") or ()):
        for name in dict.fromkeys(re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)", rule)):
            if name in props and name not in required and "default" not in props[name] and f"has(self.{name})" not in rule:
                out.append(f"{rule!r}: {name}")
    return out


def _key_rule(names: Mapping[str, Any]) -> dict[str, str]:
    """A CEL rule for a map's key constraints (Kubernetes schemas have no `propertyNames`); a raw CEL string keeps the
    pattern's backslashes as written (Python's and CEL's (RE2) patterns agree on the ones used here)."""
    checks = []
    if "maxLength" in names:
        checks.append(f"size(k) <= {names['maxLength']}")
    if "pattern" in names:
        checks.append(f"k.matches(r'{names['pattern']}')")
    what = f"at most {names['maxLength']} characters" if "maxLength" in names else ""
    if "pattern" in names:
        what = f"{what}, matching {names['pattern']}" if what else f"matching {names['pattern']}"
    return {"rule": f"self.all(k, {' && '.join(checks)})", "message": f"every key must be {what}"}


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{value:g}"


def _explained(node: Mapping[str, Any]) -> str:
    """The node's description followed by what the schema enforces, in words (`kubectl explain` shows only the
    description): allowed values, the range, the size limit and the default."""
    text = str(node["description"]).rstrip()
    notes = []
    if "enum" in node:
        notes.append("Allowed: " + ", ".join(str(v) for v in node["enum"]) + ".")
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None or high is not None:
        if low is not None and high is not None and not node.get("exclusiveMinimum") and not node.get("exclusiveMaximum"):
            notes.append(f"Range: {_number(low)} to {_number(high)}.")
        else:
            parts = []
            if low is not None:
                parts.append(f"{'more than' if node.get('exclusiveMinimum') else 'at least'} {_number(low)}")
            if high is not None:
                parts.append(f"{'less than' if node.get('exclusiveMaximum') else 'at most'} {_number(high)}")
            notes.append("Range: " + ", ".join(parts) + ".")
    if "maxLength" in node:
        notes.append(f"At most {_number(node['maxLength'])} characters.")
    if "maxItems" in node:
        notes.append(f"At most {_number(node['maxItems'])} items.")
    if "maxProperties" in node:
        notes.append(f"At most {_number(node['maxProperties'])} entries.")
    if "default" in node:
        value = node["default"]
        shown = str(value).lower() if isinstance(value, bool) else ('""' if value == "" else _number(value) if isinstance(value, int | float) else str(value))
        notes.append(f"Default: {shown}.")
    if not notes:
        return text
    return f"{text}{'' if text.endswith('.') else '.'} {' '.join(notes)}"


def _model_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    return structural_schema(raw, raw.get("$defs", {}))


def _spec_schema() -> dict[str, Any]:
    schema = _model_schema(TopologySpec)
    for name in _SPEC_ONLY_FOR_CLI:
        schema["properties"].pop(name, None)
    # PlanSpec needs exactly one of model / modelConfig; the CR may also use modelConfigMap. The
    # operator checks the combination (it names the fields); the schema only says what each one is.
    return schema


def _printer_columns() -> list[dict[str, Any]]:
    """`kubectl get stopo`: readiness and why, the mode, what runs, measured against predicted, a transition's phase;
    `-o wide` (priority 1) adds the proposal and the prediction error. Texts come from status.summary (readout.py)."""
    ready = '.status.conditions[?(@.type=="Ready")]'
    return [
        {"name": "READY", "type": "string", "jsonPath": f"{ready}.status", "description": "the Ready condition"},
        {"name": "REASON", "type": "string", "jsonPath": f"{ready}.reason",
         "description": "the Ready condition's reason (WorkloadsReady, ServingFloorHeld, DryRun, InvalidSpec, Infeasible, ...)"},
        {"name": "MODE", "type": "string", "jsonPath": ".status.summary.mode", "description": "policy.mode in effect"},
        {"name": "LAYOUT", "type": "string", "jsonPath": ".status.summary.layout", "description": "the running layout; from → to in a transition"},
        {"name": "P:D", "type": "string", "jsonPath": ".status.summary.pd", "description": "prefill:decode instances"},
        {"name": "GPUS", "type": "string", "jsonPath": ".status.summary.gpus", "description": "GPUs of the running layout"},
        {"name": "TTFT", "type": "string", "jsonPath": ".status.summary.ttft",
         "description": "TTFT at the SLO percentile: measured / predicted, with units"},
        {"name": "TPOT", "type": "string", "jsonPath": ".status.summary.tpot",
         "description": "TPOT at the SLO percentile: measured / predicted, with units"},
        {"name": "PHASE", "type": "string", "jsonPath": ".status.summary.phase",
         "description": "Steady, or the transition's phase with the traffic split"},
        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "PROPOSAL", "type": "string", "jsonPath": ".status.summary.proposal", "priority": 1,
         "description": "the proposed layout (DryRun) or a transition's target"},
        {"name": "ERROR", "type": "string", "jsonPath": ".status.summary.error", "priority": 1,
         "description": "prediction error at the observed load: measured / predicted - 1"},
    ]


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object (apiextensions.k8s.io/v1)."""
    root = {
        "type": "object",
        "description": "Keeps an LLM deployment (vLLM or SGLang) in the best serving topology for its traffic. Creating one has "
                       "the operator create engine and router pods, Services, a ServiceAccount and a Role in its namespace; its pod "
                       "templates may not ask for privileged or host access, extra capabilities or a ServiceAccount token unless "
                       "the operator's podTemplatePolicy grants them (spec.podTemplate), and its metrics selector and token "
                       "Secret stay in its namespace (spec.metrics).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "servingtopology.io/v1alpha1"},
            "kind": {"type": "string", "description": "ServingTopology"},
            "metadata": {"type": "object"},  # Kubernetes forbids anything else here (kubectl explain shows ObjectMeta's)
            "spec": _spec_schema(),
            "status": _model_schema(TopologyStatus),
        },
        # The name is the client Service's (a DNS-1035 label) and the app.kubernetes.io/instance label's value (at most
        # 63); api.check_resource_name is the operator's copy of this rule (for resources admitted before it).
        "x-kubernetes-validations": [
            {"rule": f"size(self.metadata.name) <= {MAX_RESOURCE_NAME}",
             "message": f"metadata.name: at most {MAX_RESOURCE_NAME} characters (it names the client Service)"},
            {"rule": f"self.metadata.name.matches(r'{RESOURCE_NAME_PATTERN}')",
             "message": "metadata.name must be a DNS-1035 label (it names the client Service): lowercase letters, digits and "
                        "'-', starting with a letter, no dots"},
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "servingtopology"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": [SHORT_NAME]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": _printer_columns(),
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as the YAML committed under crds/ (generated; do not edit by hand)."""
    header = "# Generated by `python -m servingtopology.operator.api.crd --write` from operator/api/resource.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, allow_unicode=True, width=120)


def write_generated(argv: Sequence[str] | None, *, prog: str, description: str, render: Callable[[], str],
                    paths: Sequence[str]) -> int:
    """A CRD generator's command line (this module's and operator/api/pool.py's): print the YAML, or with --write
    write it to each of `paths` under --root."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--write", action="store_true", help="write the CRD files under the given root")
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    args = parser.parse_args(argv)
    text = render()
    if not args.write:
        sys.stdout.write(text)
        return 0
    for rel in paths:
        path = Path(args.root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return write_generated(argv, prog="python -m servingtopology.operator.api.crd", description=render_crd_yaml.__doc__ or "",
                           render=render_crd_yaml, paths=CRD_PATHS)

if __name__ == "__main__":
    sys.exit(main())
