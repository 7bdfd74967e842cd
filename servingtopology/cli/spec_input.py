"""Shared CLI pieces: spec reading and errors (exit 2), the layout a spec names, and the stage-6 simulator adapter for `plan`.

Used by every subcommand that reads a spec. Owns no planning logic.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from servingtopology.cli.whatif import apply_overrides, flag_errors
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Layout
from servingtopology.planner.problem import Problem
from servingtopology.planner.search.decide import Simulate
from servingtopology.planner.sim.stage import stage6_figures
from servingtopology.spec import DEFAULT_SPEC, PlanSpec, SpecError, parse_spec, read_spec_data, to_layout, to_problem

__all__ = ["emit_spec_error", "read_spec", "plan_problem", "layout_for", "simulator_for"]


def read_spec(path: str | None, overrides: Mapping[str, Any] | None = None, *, as_resource: bool = False) -> PlanSpec:
    """A planning spec from a file (None: the embedded default scenario); a ServingTopology resource (kind:
    ServingTopology) is read from its `spec`, as the resource's TopologySpec (so its policy, the pin and
    allowedLayouts, is planned as the operator plans it: `plan_problem`); `as_resource` reads a bare spec so too
    (`--manifests`). `overrides` (cli/whatif.py: dotted field → value) are set before the spec is validated, and an
    error in a field a flag set names the flag."""
    ov = dict(overrides or {})
    data = json.loads(json.dumps(DEFAULT_SPEC)) if path is None else read_spec_data(path)  # bounded: size, UTF-8, depth
    try:
        resource = isinstance(data, dict) and data.get("kind") == "ServingTopology"
        if resource or as_resource:
            from servingtopology.operator.api.resource import parse_topology_spec

            return parse_topology_spec(apply_overrides(data.get("spec") if resource else data, ov))
        return parse_spec(apply_overrides(data, ov))
    except SpecError as exc:
        if not ov:
            raise
        raise SpecError(flag_errors(list(exc.errors), ov)) from None


def plan_problem(spec: PlanSpec) -> Problem:
    """The Problem `plan` decides for `spec`: a resource's as the operator builds it (operator/pass_context
    `problem_from_spec`: policy.mode Pinned pins spec.pinned, policy.allowedLayouts narrows the search), so the table,
    the record and `--manifests` show the one decision the operator would make (OneDecision); a bare spec's `to_problem`."""
    from servingtopology.operator.api.resource import TopologySpec

    if isinstance(spec, TopologySpec):
        from servingtopology.operator.pass_context import problem_from_spec

        return problem_from_spec(spec, None)
    return to_problem(spec)


def layout_for(spec: PlanSpec, problem: Problem) -> Layout:
    """The layout the spec names, or else the planner's best for `problem` (used by `simulate` and `sweep`).

    The best is chosen as `plan` chooses it, stage 6 included, so the three commands name the same layout.
    """
    if spec.layout is not None:
        return to_layout(spec, precision=problem.precision)
    from servingtopology.planner.search.decide import decide

    return decide(problem, simulate=simulator_for(spec)).best.layout


def emit_spec_error(exc: SpecError | InvalidSpec, *, as_json: bool = False) -> int:
    """Print a spec error naming each bad field and the allowed values; return exit code 2."""
    errors = exc.errors if isinstance(exc, SpecError) else [(exc.field, exc.message)]
    if as_json:
        print(json.dumps({"error": "invalid spec", "fields": [{"field": f, "message": m} for f, m in errors]}))
    print("invalid spec:", file=sys.stderr)
    for field, message in errors:
        print(f"  {field}: {message}", file=sys.stderr)
    return 2


def simulator_for(spec: PlanSpec) -> Simulate:
    """Stage 6 for this spec: the step-level simulator; its requests, seed and warm-up are the Problem's (to_problem carries
    simulation.requests, .seed and .warmupRequests; planner.search.stage6_size sizes the count to the work), as the
    operator's stage 6 reads them."""
    return stage6_figures
