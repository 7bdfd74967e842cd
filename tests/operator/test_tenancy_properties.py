"""For every pod template the tenancy policy admits, the pods the operator renders hold only what the plan and the grants
give: the plan's GPUs and no other extended resource, no claim, no priority, scheduler or runtime class, node name or
volume kind beyond the grants (operator/render/tenancy.py, operator/render/manifests.py).

The checker below spells the rules from the Kubernetes side (the restricted volume list, the host resource names) rather
than from the policy's own constants, so that a rule the policy forgets shows as a rendered pod that breaks it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from cases import blueprint
from hypothesis import HealthCheck, event, given, settings
from pod_strategies import grants, pod_templates

from servingtopology.operator.render.manifests import ROLE_LABEL, build_workloads
from servingtopology.operator.render.tenancy import PodGrant, TemplateInput, pod_template_refusals
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role, RoleLayout

GPU = "nvidia.com/gpu"
HOST = {"cpu", "memory", "ephemeral-storage"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
PROJECTED = {"configMap", "secret", "downwardAPI"}
PROFILE_ANNOTATIONS = ("container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/pod",
                       "container.seccomp.security.alpha.kubernetes.io/")
# Small plans: one GPU per pod, two GPUs per pod, and PD (whose router pods hold none).
LAYOUTS = {"2xTP1": Layout.replicas(2, Parallelism(tp=1)), "1xTP2": Layout.replicas(1, Parallelism(tp=2)),
           "PD-1P1D": Layout.pd(RoleLayout(1, Parallelism(tp=1)), RoleLayout(1, Parallelism(tp=2)))}


def rendered_pods(layout: Layout, template: Mapping[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(the plan's GPUs per pod, the pod template) of every workload the real render path builds for `layout`."""
    for obj in build_workloads(blueprint(Engine.VLLM, layout, pod_template=template)):
        if obj["kind"] == "Deployment":
            pod = obj["spec"]["template"]
            role = pod["metadata"]["labels"][ROLE_LABEL]
            yield (layout.roles[Role(role)].parallelism.gpus if role != "router" else 0), pod


def breaches(pod: Mapping[str, Any], *, plan_gpus: int, granted: frozenset[PodGrant]) -> list[str]:
    """What a rendered pod holds beyond the plan's GPUs and the grants, spelled from the Kubernetes side."""
    spec, out = pod["spec"], []
    containers, inits = spec.get("containers", []), spec.get("initContainers", [])
    gpus = {k: sum(int((c.get("resources") or {}).get(k, {}).get(GPU, 0)) for c in containers) for k in ("requests", "limits")}
    if gpus != {"requests": plan_gpus, "limits": plan_gpus}:
        out.append(f"{gpus} GPUs where the plan gives {plan_gpus}")
    for c in containers + inits:
        resources = c.get("resources") or {}
        for key in ("requests", "limits"):
            for name in resources.get(key) or {}:
                if name not in HOST and not name.startswith("hugepages-") and not (name == GPU and c["name"] == "engine"):
                    out.append(f"{c['name']} {key} {name}")
        if "claims" in resources:
            out.append(f"{c['name']} claims")
    names = [c["name"] for c in containers + inits]
    if len(set(names)) != len(names) or {"engine", "router"} & {c["name"] for c in inits}:
        out.append(f"container names {names}")
    for key in ("resourceClaims", "resources", "nodeName", "overhead", "ephemeralContainers"):
        if key in spec:
            out.append(key)
    if str(spec.get("priorityClassName", "")).startswith("system-"):
        out.append(f"priority class {spec['priorityClassName']}")
    for key, grant in (("priorityClassName", PodGrant.PRIORITY), ("priority", PodGrant.PRIORITY), ("preemptionPolicy", PodGrant.PRIORITY),
                       ("schedulerName", PodGrant.SCHEDULER), ("runtimeClassName", PodGrant.RUNTIME_CLASS)):
        if key in spec and grant not in granted:
            out.append(f"{key} without {grant}")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        allowed = RESTRICTED_VOLUMES | ({"hostPath"} if PodGrant.HOST_PATH in granted else set())
        if len(kinds) > 1 or kinds - allowed:
            out.append(f"volume {v['name']}: {sorted(kinds)}")
        sources = {k for s in (v.get("projected") or {}).get("sources", []) for k in s}
        if sources - PROJECTED - ({"serviceAccountToken"} if PodGrant.SERVICE_ACCOUNT in granted else set()):
            out.append(f"projected {sorted(sources)}")
    for key, value in (pod.get("metadata") or {}).get("annotations", {}).items():
        if key.startswith(PROFILE_ANNOTATIONS) and str(value).lower() == "unconfined" and PodGrant.PRIVILEGED not in granted:
            out.append(f"annotation {key}={value}")
    return out


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=pod_templates(), granted=grants)
def test_every_admitted_template_renders_pods_with_the_plans_gpus_and_nothing_the_grants_do_not_allow(
        template: dict[str, Any], granted: frozenset[PodGrant]) -> None:
    refused = pod_template_refusals([TemplateInput("spec.podTemplate", template)], granted=granted)
    event("refused" if refused else "admitted")
    if refused:
        assert all(r.field.startswith("spec.podTemplate.") and (r.grant is None or r.grant not in granted) for r in refused)
        return
    for label, layout in LAYOUTS.items():
        for plan_gpus, pod in rendered_pods(layout, template):
            assert breaches(pod, plan_gpus=plan_gpus, granted=granted) == [], (label, template)


def test_the_checker_sees_the_high_case_when_the_policy_is_bypassed() -> None:
    """The property can fail: rendered without the policy, the issue's 7-GPU sidecar at a system priority breaks it."""
    hostile = {"spec": {"priorityClassName": "system-node-critical",
                        "containers": [{"name": "miner", "image": "busybox", "resources": {"limits": {GPU: "7"}, "requests": {GPU: "7"}}}]}}
    (plan_gpus, pod), = rendered_pods(Layout.replicas(1, Parallelism(tp=1)), hostile)
    assert breaches(pod, plan_gpus=plan_gpus, granted=frozenset(PodGrant)) == [
        "{'requests': 8, 'limits': 8} GPUs where the plan gives 1", f"miner requests {GPU}", f"miner limits {GPU}",
        "priority class system-node-critical"]


@pytest.mark.parametrize("volume", [{"name": "n", "nfs": {"server": "x", "path": "/"}},
                                    {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"audience": "a", "path": "t"}}]}}])
def test_the_checker_sees_a_volume_outside_the_grants(volume: dict[str, Any]) -> None:
    (plan_gpus, pod), = rendered_pods(Layout.replicas(1, Parallelism(tp=1)), {"spec": {"volumes": [volume]}})
    assert breaches(pod, plan_gpus=plan_gpus, granted=frozenset()) != []
