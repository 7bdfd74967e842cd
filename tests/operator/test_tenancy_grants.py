"""Pod templates read as grants (operator/render/tenancy.py): what the plan decides (GPUs, every extended resource, claims,
the node) comes only from the plan; priority, scheduler and runtime class only with a grant; volumes by kind; the
annotations that carry security profiles read like their fields; the operator's container names not reused. Each refusal
names its field path and the grant it needs or what is allowed, and the reconcile applies nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cases import decision
from fake_cluster import FakeCluster
from test_tenancy import T0, cond, template, topology

from servingtopology.operator.reconcile import Outcome, reconcile
from servingtopology.operator.render.manifests import build_workloads
from servingtopology.operator.render.tenancy import PodGrant, Refusal, TemplateInput, TenancyPolicy, pod_template_refusals
from servingtopology.planner.layout import Engine, Layout, Parallelism

ONE_GPU = Layout.replicas(1, Parallelism(tp=1))
W = "spec.podTemplate."


def sidecar(**fields: Any) -> dict[str, Any]:
    return {"name": "side", "image": "busybox:1.36", **fields}


def refusals(pod_template: dict[str, Any], *, granted: frozenset[PodGrant] = frozenset(), router: bool = False) -> list[Refusal]:
    where = "spec.rolePodTemplates.router" if router else "spec.podTemplate"
    t = TemplateInput(where, pod_template, rendered_token=router, rendered_containers=("router",) if router else ("engine",))
    return pod_template_refusals([t], granted=granted)


# Each row: a template asking for one thing, the field path its refusal names, the grant it needs (None: no grant allows it).
ROWS: list[tuple[str, dict[str, Any], str, PodGrant | None]] = [
    # the plan's GPUs: in the engine, a sidecar, an init container, requests or limits
    ("engine-gpu", template(containers=[{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]),
     W + 'spec.containers[0].resources.limits["nvidia.com/gpu"]', None),
    ("sidecar-gpu", template(containers=[{"name": "engine"}, sidecar(resources={"requests": {"nvidia.com/gpu": "7"}})]),
     W + 'spec.containers[1].resources.requests["nvidia.com/gpu"]', None),
    ("init-gpu", template(initContainers=[{"name": "warm", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
     W + 'spec.initContainers[0].resources.limits["nvidia.com/gpu"]', None),
    # any other extended resource: another vendor's GPU, a MIG slice, spec.network's RDMA device, a made-up one
    ("amd-gpu", template(containers=[sidecar(resources={"limits": {"amd.com/gpu": "1"}})]),
     W + 'spec.containers[0].resources.limits["amd.com/gpu"]', None),
    ("mig", template(containers=[sidecar(resources={"limits": {"nvidia.com/mig-1g.10gb": "7"}})]),
     W + 'spec.containers[0].resources.limits["nvidia.com/mig-1g.10gb"]', None),
    ("rdma", template(containers=[{"name": "engine", "resources": {"requests": {"rdma/hca": "4"}}}]),
     W + 'spec.containers[0].resources.requests["rdma/hca"]', None),
    # resource claims, per container and per pod; pod-level resources
    ("container-claims", template(initContainers=[{"name": "i", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]),
     W + "spec.initContainers[0].resources.claims", None),
    ("pod-claims", template(resourceClaims=[{"name": "gpu", "resourceClaimName": "all"}]), W + "spec.resourceClaims", None),
    ("pod-resources", template(resources={"limits": {"cpu": "1"}}), W + "spec.resources", None),
    # the node and fields no pod spec of a template carries
    ("node-name", template(nodeName="gpu-node-1"), W + "spec.nodeName", None),
    ("ephemeral-containers", template(ephemeralContainers=[{"name": "dbg", "image": "busybox"}]), W + "spec.ephemeralContainers", None),
    ("unknown-pod-field", template(hostUsers=False), W + "spec.hostUsers", None),
    ("unknown-container-field", template(initContainers=[{"name": "i", "image": "busybox", "devices": ["/dev/nvidia0"]}]),
     W + "spec.initContainers[0].devices", None),
    # priority: a class with the grant, a system class never, the integer and the policy with the grant
    ("priority-class", template(priorityClassName="llm-high"), W + "spec.priorityClassName", PodGrant.PRIORITY),
    ("system-priority", template(priorityClassName="system-node-critical"), W + "spec.priorityClassName", None),
    ("priority", template(priority=1_000_000), W + "spec.priority", PodGrant.PRIORITY),
    ("preemption", template(preemptionPolicy="PreemptLowerPriority"), W + "spec.preemptionPolicy", PodGrant.PRIORITY),
    ("scheduler", template(schedulerName="gpu-sharing"), W + "spec.schedulerName", PodGrant.SCHEDULER),
    ("runtime-class", template(runtimeClassName="runc"), W + "spec.runtimeClassName", PodGrant.RUNTIME_CLASS),
    # volumes by kind; projected per source
    ("nfs", template(volumes=[{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]), W + "spec.volumes[0].nfs", None),
    ("git-repo", template(volumes=[{"name": "g", "gitRepo": {"repository": "https://x"}}]), W + "spec.volumes[0].gitRepo", None),
    ("two-sources", template(volumes=[{"name": "d", "emptyDir": {}, "secret": {"secretName": "s"}}]), W + "spec.volumes[0]", None),
    ("projected-token", template(volumes=[{"name": "t", "projected": {"sources": [{"configMap": {"name": "c"}},
                                                                                  {"serviceAccountToken": {"audience": "any", "path": "t"}}]}}]),
     W + "spec.volumes[0].projected.sources[1].serviceAccountToken", PodGrant.SERVICE_ACCOUNT),
    ("projected-bundle", template(volumes=[{"name": "b", "projected": {"sources": [{"clusterTrustBundle": {"signerName": "x", "path": "b"}}]}}]),
     W + "spec.volumes[0].projected.sources[0].clusterTrustBundle", None),
    # the annotations that stand for profiles; the runtime's own annotations
    ("apparmor-annotation", {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/engine": "unconfined"}}},
     W + 'metadata.annotations["container.apparmor.security.beta.kubernetes.io/engine"]', PodGrant.PRIVILEGED),
    ("apparmor-annotation-spelling", {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/engine": "Unconfined"}}},
     W + 'metadata.annotations["container.apparmor.security.beta.kubernetes.io/engine"]', None),
    ("seccomp-pod-annotation", {"metadata": {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}},
     W + 'metadata.annotations["seccomp.security.alpha.kubernetes.io/pod"]', PodGrant.PRIVILEGED),
    ("seccomp-container-annotation", {"metadata": {"annotations": {"container.seccomp.security.alpha.kubernetes.io/side": "unconfined"}}},
     W + 'metadata.annotations["container.seccomp.security.alpha.kubernetes.io/side"]', PodGrant.PRIVILEGED),
    ("runtime-annotation", {"metadata": {"annotations": {"io.kubernetes.cri-o.Devices": "/dev/nvidia0"}}},
     W + 'metadata.annotations["io.kubernetes.cri-o.Devices"]', PodGrant.PRIVILEGED),
    # profile types as the API server spells them (lowercase is the CRD's to admit and the API server's to refuse)
    ("apparmor-field", template(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
     W + "spec.securityContext.appArmorProfile.type", PodGrant.PRIVILEGED),
    ("seccomp-lowercase", template(containers=[{"name": "engine", "securityContext": {"seccompProfile": {"type": "unconfined"}}}]),
     W + "spec.containers[0].securityContext.seccompProfile.type", None),
    ("capabilities-string", template(containers=[{"name": "engine", "securityContext": {"capabilities": {"add": "SYS_ADMIN"}}}]),
     W + "spec.containers[0].securityContext.capabilities.add", None),
    ("unknown-security-field", template(containers=[sidecar(securityContext={"privilegedMode": True})]),
     W + "spec.containers[0].securityContext.privilegedMode", None),
    # the operator's container names where they would be a second container
    ("init-named-engine", template(initContainers=[{"name": "engine", "image": "busybox"}]), W + "spec.initContainers[0].name", None),
    ("router-in-engine-pods", template(containers=[{"name": "router"}]), W + "spec.containers[0].name", None),
    ("one-name-twice", template(containers=[sidecar()], initContainers=[{"name": "side", "image": "busybox"}]),
     W + "spec.initContainers[0].name", None),
    # one name twice in a list: the merge by name folded the second sidecar into the first, and a command of the
    # second then raised "command is the plan's" in the render, after the policy had admitted it (the e2e admission property)
    ("sidecar-twice", template(containers=[sidecar(), sidecar(command=["sleep", "infinity"])]), W + "spec.containers[1].name", None),
    ("engine-twice", template(containers=[{"name": "engine"}, {"name": "engine"}]), W + "spec.containers[1].name", None),
    ("init-twice", template(initContainers=[{"name": "i", "image": "busybox"}, {"name": "i", "image": "busybox"}]),
     W + "spec.initContainers[1].name", None),
    # a device list the NVIDIA runtime honours; a kubelet connection from the node's network
    ("visible-devices", template(containers=[sidecar(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])]),
     W + "spec.containers[0].env[0]", PodGrant.PRIVILEGED),
    ("probe-host", template(containers=[sidecar(livenessProbe={"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}})]),
     W + "spec.containers[0].livenessProbe.httpGet.host", PodGrant.HOST_NAMESPACES),
    ("hook-host", template(containers=[sidecar(lifecycle={"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}})]),
     W + "spec.containers[0].lifecycle.preStop.tcpSocket.host", PodGrant.HOST_NAMESPACES),
]


@pytest.mark.parametrize(("pod_template", "path", "grant"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_field_outside_the_grants_is_refused_naming_its_path(pod_template: dict[str, Any], path: str, grant: PodGrant | None) -> None:
    found = refusals(pod_template)
    assert [(r.field, r.grant) for r in found] == [(path, grant)]
    words = str(found[0])
    assert words.startswith(f"{path}: ")
    assert (f"needs grant {grant.value}" in words) if grant is not None else ("; allowed: " in words and found[0].allowed)


@pytest.mark.parametrize(("pod_template", "path", "grant"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_every_grant_admits_only_the_rows_a_grant_names(pod_template: dict[str, Any], path: str, grant: PodGrant | None) -> None:
    found = refusals(pod_template, granted=frozenset(PodGrant))
    assert [r.field for r in found] == ([] if grant is not None else [path])
    if grant is not None:
        assert refusals(pod_template, granted=frozenset({grant})) == []


def test_a_gpu_refusal_says_gpus_are_the_plans_and_names_the_host_resources_allowed() -> None:
    (found,) = refusals(template(containers=[sidecar(resources={"limits": {"nvidia.com/gpu": "7"}})]))
    assert str(found) == ('spec.podTemplate.spec.containers[0].resources.limits["nvidia.com/gpu"]: 7, GPUs are the plan\'s: the '
                          "layout's GPUs per pod, within hardware.maxGPUs; allowed: cpu, memory, ephemeral-storage, hugepages-<size>")


def test_a_router_template_may_merge_into_router_but_not_add_an_engine() -> None:
    assert refusals(template(containers=[{"name": "router", "resources": {"limits": {"memory": "4Gi"}}}]), router=True) == []
    (found,) = refusals(template(containers=[{"name": "engine"}]), router=True)
    assert found.field == "spec.rolePodTemplates.router.spec.containers[0].name" and "'router' (merged into" in str(found)


def test_templates_within_the_grants_pass_the_default_policy() -> None:
    ok = {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/engine": "runtime/default",
                                       "container.seccomp.security.alpha.kubernetes.io/side": "localhost/side.json",
                                       "seccomp.security.alpha.kubernetes.io/pod": "runtime/default", "example.com/team": "a"}},
          "spec": {"containers": [{"name": "engine", "resources": {"requests": {"cpu": "12", "memory": "64Gi", "ephemeral-storage": "20Gi",
                                                                               "hugepages-2Mi": "1Gi"}, "limits": {"hugepages-2Mi": "1Gi"}},
                                   "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "e.json"}}},
                                  sidecar(readinessProbe={"httpGet": {"path": "/", "port": 80}}, env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])],
                   "initContainers": [{"name": "fetch", "image": "busybox", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}],
                   "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}, {"name": "tmp", "emptyDir": {}},
                               {"name": "cfg", "configMap": {"name": "c"}}, {"name": "s", "secret": {"secretName": "s"}},
                               {"name": "d", "downwardAPI": {"items": []}}, {"name": "csi", "csi": {"driver": "secrets-store.csi.k8s.io"}},
                               {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                               {"name": "p", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "s"}},
                                                                       {"downwardAPI": {"items": []}}]}}],
                   "nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                   "affinity": {"nodeAffinity": {}}, "imagePullSecrets": [{"name": "regcred"}], "terminationGracePeriodSeconds": 120,
                   "automountServiceAccountToken": False, "hostIPC": False, "securityContext": {"runAsNonRoot": True, "fsGroup": 1000}}}
    assert refusals(ok) == []


def test_the_engine_keeps_the_plans_gpus_even_where_the_render_path_is_handed_a_template_that_sets_them() -> None:
    from cases import blueprint

    bp = blueprint(Engine.VLLM, ONE_GPU, pod_template=template(containers=[{"name": "engine", "resources": {
        "requests": {"nvidia.com/gpu": "8", "cpu": "32"}, "limits": {"nvidia.com/gpu": "8"}}}]))
    engine = build_workloads(bp)[0]["spec"]["template"]["spec"]["containers"][0]
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert engine["resources"]["requests"]["cpu"] == "32"     # what a template may raise, it raises


# ---- through the reconcile: nothing is applied ----

def run_one_gpu(obj: dict[str, Any], cluster: FakeCluster, **kw: Any) -> Outcome:
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=lambda problem: decision(ONE_GPU), now=T0, **kw)
    obj["status"] = {k: v for k, v in out.status.items() if v is not None}
    return out


def the_high_case() -> dict[str, Any]:
    """The issue's tenant: `maxGPUs: 1`, and a template adding a 7-GPU sidecar at the node's own critical priority."""
    obj = topology(podTemplate=template(priorityClassName="system-node-critical",
                                        containers=[{"name": "hog", "image": "busybox:1.36", "command": ["sleep", "inf"],
                                                     "resources": {"limits": {"nvidia.com/gpu": "7"}, "requests": {"nvidia.com/gpu": "7"}}}]))
    obj["spec"]["hardware"]["maxGPUs"] = 1
    obj["spec"]["policy"]["maxSurgeGPUs"] = 0
    return obj


@pytest.mark.parametrize("policy", [TenancyPolicy(), TenancyPolicy(pod_grants=frozenset(PodGrant))], ids=["strict", "every-grant"])
def test_a_one_gpu_tenants_seven_gpu_sidecar_at_system_priority_is_refused_by_name_and_nothing_is_applied(policy: TenancyPolicy) -> None:
    other = topology()
    other["metadata"] |= {"namespace": "team-b", "uid": "uid-b", "name": "other"}
    cluster = FakeCluster()
    run_one_gpu(other, cluster)
    theirs = copy.deepcopy(cluster.objects)
    applies = cluster.applies
    assert theirs, "the other namespace's workloads run"
    obj = the_high_case()
    for _ in range(2):   # a second pass (the timer's) refuses as the first did
        out = run_one_gpu(obj, cluster, tenancy=policy)
    assert cluster.applies == applies and cluster.objects == theirs, "nothing applied; the other namespace's objects untouched"
    ready = cond(obj, "Ready")
    assert (ready["status"], ready["reason"], out.error) == ("False", "PodTemplateRefused", "PodTemplateRefused")
    assert 'spec.podTemplate.spec.containers[0].resources.limits["nvidia.com/gpu"]: 7, GPUs are the plan\'s' in ready["message"]
    assert 'spec.podTemplate.spec.containers[0].resources.requests["nvidia.com/gpu"]: 7' in ready["message"]
    assert "spec.podTemplate.spec.priorityClassName: 'system-node-critical' is a system priority" in ready["message"]
    assert "Nothing was applied" in ready["message"] and "plan" not in obj["status"]
    assert [e.reason for e in cluster.events if e.regarding.endswith(obj["metadata"]["name"])] == ["PodTemplateRefused"]


def test_an_init_container_named_engine_is_a_named_condition_and_not_an_api_error() -> None:
    obj, cluster = topology(podTemplate=template(initContainers=[{"name": "engine", "image": "busybox"}])), FakeCluster()
    run_one_gpu(obj, cluster)
    assert cluster.objects == {} and cluster.applies == 0
    ready = cond(obj, "Ready")
    assert ready["reason"] == "PodTemplateRefused"
    assert "spec.podTemplate.spec.initContainers[0].name: 'engine' is the name of the operator's container; allowed: another name" in ready["message"]


def test_a_running_one_gpu_layout_stays_as_it_is_when_its_template_asks_for_gpus() -> None:
    obj, cluster = topology(), FakeCluster()
    obj["spec"]["hardware"]["maxGPUs"] = 1
    run_one_gpu(obj, cluster)
    before, applies = copy.deepcopy(cluster.objects), cluster.applies
    obj["spec"]["podTemplate"] = template(containers=[{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "8"}}}])
    obj["metadata"]["generation"] += 1
    run_one_gpu(obj, cluster)
    assert cluster.objects == before and cluster.applies == applies and cond(obj, "Ready")["reason"] == "PodTemplateRefused"


def test_a_message_of_many_long_refusals_keeps_within_the_conditions_bound_and_still_says_nothing_was_applied() -> None:
    sidecars = [sidecar(name=f"s{i}", resources={"limits": {f"example.com/device-{i}": "1"}}) for i in range(12)]
    obj = topology(podTemplate=template(containers=sidecars))
    run_one_gpu(obj, FakeCluster())
    message = cond(obj, "Ready")["message"]
    assert len(message) <= 1024 and message.endswith("running workloads are left as they are")
    shown = message.count("an extended resource")
    assert 1 <= shown < 12 and f"; and {12 - shown} more." in message
