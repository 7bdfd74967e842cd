"""CRD generation: turns the pydantic API models (operator/api.py) into the ServingTopology
CustomResourceDefinition with a structural OpenAPI v3 schema, printer columns and the status subresource.

Called by `python -m servingtopology.operator.crd --write` (writes crds/ and the chart's copy) and by the
golden test that fails when the committed YAML drifts from the models. Pure apart from `main`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .api import TopologySpec, TopologyStatus
from .manifests import GROUP, KIND

__all__ = ["VERSION", "PLURAL", "SHORT_NAME", "CRD_PATHS", "structural_schema", "build_crd", "render_crd_yaml", "main"]

VERSION = "v1alpha1"
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
    - only scalar defaults are kept, so every default is valid against its own node.
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
        out: dict[str, Any] = {"description": f"{n['description']}; {text}" if "description" in n else text,
                               "x-kubernetes-preserve-unknown-fields": True}
        return out
    out = {}
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
    return out


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
    return [
        {"name": "LAYOUT", "type": "string", "jsonPath": ".status.plan.layout", "description": "the running layout"},
        {"name": "GPUS", "type": "integer", "jsonPath": ".status.plan.gpus", "description": "GPUs of the running layout"},
        {"name": "P:D", "type": "string", "jsonPath": ".status.plan.pd", "description": "prefill:decode instances"},
        {"name": "TTFT", "type": "number", "jsonPath": ".status.plan.predicted.ttftMs", "description": "predicted TTFT (ms) at the SLO percentile"},
        {"name": "TPOT", "type": "number", "jsonPath": ".status.plan.predicted.tpotMs", "description": "predicted TPOT (ms) at the SLO percentile"},
        {"name": "READY", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "MODE", "type": "string", "jsonPath": ".spec.policy.mode", "priority": 1},
        {"name": "PROPOSAL", "type": "string", "jsonPath": ".status.proposal.layout", "priority": 1},
        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object (apiextensions.k8s.io/v1)."""
    root = {
        "type": "object",
        "description": "Keeps an LLM deployment (vLLM or SGLang) in the best serving topology for its traffic.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec_schema(),
            "status": _model_schema(TopologyStatus),
        },
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
    header = "# Generated by `python -m servingtopology.operator.crd --write` from operator/api.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, allow_unicode=True, width=120)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servingtopology.operator.crd", description=render_crd_yaml.__doc__)
    parser.add_argument("--write", action="store_true", help="write the CRD files under the given root")
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    args = parser.parse_args(argv)
    text = render_crd_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    for rel in CRD_PATHS:
        path = Path(args.root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
