"""What the operator would apply for a ServingTopology, computed without a cluster: `servingtopology plan --manifests`.

Called by the CLI. Runs the reconcile's own steps for a resource seen for the first time: the problem as a pass builds
it (pass_context.problem_from_spec: the pin, policy.allowedLayouts), the operator's planner (cluster/plan_worker:
stage 6 as the operator runs it), the blueprint (pass_context.blueprint_for) and the builders
(render/manifests.build_workloads). Never talks to a cluster; the only difference from the applied objects is the
owner reference, which names the resource's uid, unknown until the resource exists.

It refuses what the operator would refuse before it applies anything (OfflineChecksAsOperator): a namespace that is no
DNS-1123 label, pod templates the tenancy policy does not grant (render/tenancy.py, the chart's strict policy unless
grants are given: PodTemplateRefused) and objects over the API server's size limits (render/object_size.py:
ObjectTooLarge). What the API server's own admission would refuse is for `kubectl apply --dry-run=server`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servingtopology.operator.api.resource import Mode, TopologySpec, check_namespace
from servingtopology.operator.cluster.plan_worker import plan_with_simulator
from servingtopology.operator.pass_context import blueprint_for, problem_from_spec, template_inputs
from servingtopology.operator.render.manifests import build_workloads
from servingtopology.operator.render.object_size import oversized
from servingtopology.operator.render.tenancy import STRICT, PodGrant, pod_template_refusals
from servingtopology.planner.layout import Layout
from servingtopology.planner.problem import Decision, Problem
from servingtopology.spec import SpecError

__all__ = ["OfflinePlan", "plan_offline", "file_name"]


@dataclass(frozen=True, slots=True)
class OfflinePlan:
    problem: Problem
    decision: Decision
    layout: Layout              # what the operator would run: the pin under Pinned, else the decision's best
    objects: tuple[dict[str, Any], ...]


def plan_offline(spec: TopologySpec, *, name: str, namespace: str, gpus_per_node_default: int = 8,
                 planner: Callable[[Problem], Decision] = plan_with_simulator,
                 granted: frozenset[PodGrant] = STRICT.pod_grants) -> OfflinePlan:
    """Plan `spec` as the operator's first pass would and build the objects it would apply, in apply order, without
    ownerReferences. Raises InvalidSpec (naming the resource's field) and Infeasible as the operator's pass would meet them;
    a spec.modelConfigMap (read from the cluster by the operator) is an InvalidSpec here. Raises SpecError, naming each
    field, for a namespace that is no DNS-1123 label and for templates asking for more than `granted` (before planning),
    and for objects over the API server's limits (after building them)."""
    check_namespace(namespace)
    refused = pod_template_refusals(template_inputs(spec), granted=granted)
    if refused:
        raise SpecError([(r.field, f"PodTemplateRefused: {r.found}; " + (f"needs grant {r.grant.value} (given: "
                                                                           f"{', '.join(sorted(granted)) or 'none, the strict policy'})"
                                                                           if r.grant is not None else f"allowed: {r.allowed}"))
                         for r in refused])
    if spec.modelConfigMap is not None:
        from servingtopology.planner.errors import InvalidSpec

        raise InvalidSpec("spec.modelConfigMap", "names a ConfigMap in the cluster; offline, give spec.modelConfig (a path to "
                          "the config.json) instead")
    problem = problem_from_spec(spec, None)
    decision = planner(problem)
    layout = problem.pinned if spec.policy.mode is Mode.PINNED and problem.pinned is not None else decision.best.layout
    bp = blueprint_for(spec, layout, name=name, namespace=namespace, uid="", gpus_per_node=spec.hardware.gpusPerNode or gpus_per_node_default)
    objects = build_workloads(bp)
    for obj in objects:
        obj["metadata"].pop("ownerReferences", None)
    too_large = [why for obj in objects for why in oversized(obj)]
    if too_large:
        raise SpecError([("spec.podTemplate", f"ObjectTooLarge: {why}; the templates' fields are copied into every rendered "
                                              "pod template, shorten them") for why in too_large])
    return OfflinePlan(problem=problem, decision=decision, layout=layout, objects=tuple(objects))


def file_name(index: int, obj: dict[str, Any]) -> str:
    """`03-deployment-llama-s1a2b3c-aggregated.yaml`: apply order first, so `kubectl apply -f DIR` keeps it."""
    return f"{index:02d}-{str(obj['kind']).lower()}-{obj['metadata']['name']}.yaml"
