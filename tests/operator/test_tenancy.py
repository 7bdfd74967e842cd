"""What a ServingTopology's author may make the operator do (operator/render/tenancy.py): pod templates that ask for more than
the rendered pods have are refused by default, naming the field and the grant; an administrator grants them cluster-wide
or per namespace label; a metrics selector stays in its namespace; a token Secret is read only when it opts in."""

from __future__ import annotations

import argparse
import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases import decision
from fake_cluster import FakeCluster

from servingtopology.operator.cluster.cluster import SecretNotOptedIn
from servingtopology.operator.entry.main import add_arguments, tenancy_policy
from servingtopology.operator.reconcile import Outcome, reconcile
from servingtopology.operator.render.tenancy import (
    NamespaceGrant,
    PodGrant,
    TemplateInput,
    TenancyPolicy,
    parse_namespace_grant,
    pod_template_refusals,
    secret_refusal,
)
from servingtopology.planner.layout import Layout, Parallelism

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
REPLICAS = Layout.replicas(4, Parallelism(tp=2))


def topology(**spec_changes: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    obj["metadata"] |= {"uid": "uid-1", "generation": 1, "namespace": "team-a"}
    obj["spec"]["policy"]["mode"] = "Auto"
    obj["spec"].update(spec_changes)
    return obj


def run(obj: dict[str, Any], cluster: FakeCluster, **kw: Any) -> Outcome:
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=lambda problem: decision(REPLICAS), now=T0, **kw)
    obj["status"] = {k: v for k, v in out.status.items() if v is not None}
    return out


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def template(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


# Each row: a template asking for one thing the rendered pods do not have, the field path the refusal names, the grant.
HOSTILE = [
    (template(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), "spec.podTemplate.spec.volumes[0].hostPath", PodGrant.HOST_PATH),
    (template(containers=[{"name": "engine", "securityContext": {"privileged": True}}]),
     "spec.podTemplate.spec.containers[0].securityContext.privileged", PodGrant.PRIVILEGED),
    # a sidecar is held to the same rules as the engine
    (template(containers=[{"name": "side", "image": "busybox", "securityContext": {"allowPrivilegeEscalation": True}}]),
     "spec.podTemplate.spec.containers[0].securityContext.allowPrivilegeEscalation", PodGrant.PRIVILEGED),
    # an init container with privileged settings
    (template(initContainers=[{"name": "fetch", "image": "busybox", "securityContext": {"privileged": True}}]),
     "spec.podTemplate.spec.initContainers[0].securityContext.privileged", PodGrant.PRIVILEGED),
    (template(hostIPC=True), "spec.podTemplate.spec.hostIPC", PodGrant.HOST_NAMESPACES),
    (template(initContainers=[{"name": "p", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 80}]}]),
     "spec.podTemplate.spec.initContainers[0].ports[0].hostPort", PodGrant.HOST_NAMESPACES),
    # IPC_LOCK is what spec.network adds for RDMA; without spec.network it is a capability like any other
    (template(containers=[{"name": "engine", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
     "spec.podTemplate.spec.containers[0].securityContext.capabilities.add", PodGrant.CAPABILITIES),
    (template(serviceAccountName="admin"), "spec.podTemplate.spec.serviceAccountName", PodGrant.SERVICE_ACCOUNT),
    (template(automountServiceAccountToken=True), "spec.podTemplate.spec.automountServiceAccountToken", PodGrant.SERVICE_ACCOUNT),
    (template(securityContext={"seccompProfile": {"type": "Unconfined"}}), "spec.podTemplate.spec.securityContext.seccompProfile.type",
     PodGrant.PRIVILEGED),
    (template(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}), "spec.podTemplate.spec.securityContext.sysctls",
     PodGrant.PRIVILEGED),
    (template(initContainers=[{"name": "i", "image": "busybox", "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]),
     "spec.podTemplate.spec.initContainers[0].securityContext.seLinuxOptions.type", PodGrant.PRIVILEGED),
]


@pytest.mark.parametrize(("pod_template", "where", "grant"), HOSTILE, ids=[h[1].rsplit(".", 2)[-2] + "-" + h[2] for h in HOSTILE])
def test_a_template_asking_for_more_than_the_rendered_pods_is_refused_by_default_naming_the_field(
        pod_template: dict[str, Any], where: str, grant: PodGrant) -> None:
    obj, cluster = topology(podTemplate=pod_template), FakeCluster()
    out = run(obj, cluster)
    assert cluster.objects == {}, "nothing is applied"
    ready = cond(obj, "Ready")
    assert (ready["status"], ready["reason"], out.error) == ("False", "PodTemplateRefused", "PodTemplateRefused")
    assert where in ready["message"] and f"grant {grant.value}" in ready["message"]
    assert "operator.podTemplatePolicy.allow" in ready["message"]     # says how an administrator allows it
    assert cond(obj, "Planned")["reason"] == "PodTemplateRefused"
    assert [e.reason for e in cluster.events] == ["PodTemplateRefused"]


@pytest.mark.parametrize(("pod_template", "where", "grant"), HOSTILE, ids=[h[1].rsplit(".", 2)[-2] + "-" + h[2] for h in HOSTILE])
def test_the_same_template_is_applied_where_the_administrator_grants_it(pod_template: dict[str, Any], where: str, grant: PodGrant) -> None:
    obj, cluster = topology(podTemplate=pod_template), FakeCluster()
    run(obj, cluster, tenancy=TenancyPolicy(pod_grants=frozenset({grant})))
    assert cluster.objects and cond(obj, "Ready")["reason"] != "PodTemplateRefused"


def test_a_namespace_label_grants_only_in_the_namespaces_carrying_it() -> None:
    policy = TenancyPolicy(namespace_grants=(NamespaceGrant("stopo/host-path", "allowed", frozenset({PodGrant.HOST_PATH})),))
    hostpath = template(volumes=[{"name": "cache", "hostPath": {"path": "/mnt/models"}}])
    labelled, other = FakeCluster(namespaces={"team-a": {"stopo/host-path": "allowed"}}), FakeCluster(namespaces={"team-a": {}})
    obj = topology(podTemplate=hostpath)
    run(obj, labelled, tenancy=policy)
    assert labelled.objects and cond(obj, "Ready")["reason"] != "PodTemplateRefused"
    obj = topology(podTemplate=hostpath)
    run(obj, other, tenancy=policy)
    assert other.objects == {} and "in namespaces labelled stopo/host-path=allowed" in cond(obj, "Ready")["message"]


def test_rdma_ipc_lock_is_allowed_because_spec_network_adds_it_and_nothing_more() -> None:
    caps = template(containers=[{"name": "engine", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}])
    obj, cluster = topology(podTemplate=caps, network={"rdma": {"resource": "rdma/hca"}}), FakeCluster()
    run(obj, cluster)
    assert cluster.objects
    # the router pods get no spec.network: there IPC_LOCK is refused
    found = pod_template_refusals([TemplateInput("spec.rolePodTemplates.router", caps)], granted=frozenset())
    assert [r.grant for r in found] == [PodGrant.CAPABILITIES]


def test_a_router_template_may_restate_the_token_routers_have_but_not_name_another_service_account() -> None:
    router = {"router": {"spec": {"automountServiceAccountToken": True}}}
    obj, cluster = topology(rolePodTemplates=router), FakeCluster()
    run(obj, cluster)
    assert cluster.objects
    router["router"]["spec"]["serviceAccountName"] = "cluster-admin-sa"
    obj = topology(rolePodTemplates=router)
    run(obj, FakeCluster())
    assert "spec.rolePodTemplates.router.spec.serviceAccountName" in cond(obj, "Ready")["message"]


def test_a_running_layout_is_left_as_it_is_when_its_template_turns_hostile() -> None:
    obj, cluster = topology(), FakeCluster()
    run(obj, cluster)
    before = copy.deepcopy(cluster.objects)
    obj["spec"]["podTemplate"] = template(volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    obj["metadata"]["generation"] += 1
    run(obj, cluster)
    assert cluster.objects == before and obj["status"]["plan"]["layout"] == "4×TP2"
    assert cond(obj, "Ready")["reason"] == "PodTemplateRefused"


def test_harmless_templates_pass_the_default_policy() -> None:
    ok = template(containers=[{"name": "engine", "env": [{"name": "HF_HOME", "value": "/cache"}],
                               "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False}}],
                  volumes=[{"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}], automountServiceAccountToken=False,
                  securityContext={"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]})
    assert pod_template_refusals([TemplateInput("spec.podTemplate", ok)], granted=frozenset()) == []


# ---- the metrics selector ----

class RecordingFactory:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        raise ValueError("no Prometheus in this test")


def test_a_selector_naming_another_namespace_is_refused_and_no_query_is_sent() -> None:
    factory = RecordingFactory()
    obj = topology(metrics={"prometheusUrl": "http://prometheus-operated.monitoring.svc:9090", "selector": {"namespace": "team-b"}})
    cluster = FakeCluster()
    for _ in range(2):    # the first pass plans; the next reads metrics
        run(obj, cluster, metrics=factory)
    metrics = cond(obj, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "MetricsSelectorRefused")
    assert "spec.metrics.selector.namespace" in metrics["message"] and "'team-a'" in metrics["message"]
    assert factory.requests == [] and cluster.objects, "the rest of the resource is still served"


def test_an_administrator_may_allow_selectors_across_namespaces_and_the_own_namespace_is_always_fine() -> None:
    for selector, policy in (({"namespace": "team-b"}, TenancyPolicy(cross_namespace_selector=True)), ({"namespace": "team-a"}, TenancyPolicy())):
        factory = RecordingFactory()
        obj = topology(metrics={"prometheusUrl": "http://prometheus-operated.monitoring.svc:9090", "selector": selector})
        cluster = FakeCluster()
        for _ in range(2):
            run(obj, cluster, metrics=factory, tenancy=policy)
        assert [r.matchers["namespace"] for r in factory.requests] == [selector["namespace"]]


def test_a_prometheus_internal_label_in_the_selector_is_refused() -> None:
    obj = topology(metrics={"prometheusUrl": "http://prometheus-operated.monitoring.svc:9090", "selector": {"__name__": "up"}})
    run(obj, FakeCluster(), metrics=RecordingFactory())
    assert cond(obj, "MetricsAvailable")["reason"] == "MetricsSelectorRefused"


# ---- the token Secret and the flags ----

def test_a_token_secret_is_readable_only_with_the_opt_in_label_unless_any_is_allowed() -> None:
    strict = TenancyPolicy()
    assert secret_refusal({"servingtopology.io/metrics-token": "true"}, namespace="a", name="t", policy=strict) is None
    why = secret_refusal({"app": "db"}, namespace="a", name="db-password", policy=strict)
    assert why is not None and "servingtopology.io/metrics-token=true" in why and "a/db-password" in why
    assert secret_refusal(None, namespace="a", name="t", policy=TenancyPolicy(token_secret_label=None)) is None


def test_the_chart_flags_build_the_policy_and_bad_grants_name_the_allowed_ones() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = tenancy_policy(parser.parse_args([]))
    assert default == TenancyPolicy()
    policy = tenancy_policy(parser.parse_args(["--allow-pod-template", "HostPath,capabilities", "--allow-pod-template-in",
                                               "team=infra:All", "--metrics-token-label", "", "--allow-cross-namespace-metrics"]))
    assert policy.pod_grants == {PodGrant.HOST_PATH, PodGrant.CAPABILITIES} and policy.token_secret_label is None
    assert policy.namespace_grants == (NamespaceGrant("team", "infra", frozenset(PodGrant)),) and policy.cross_namespace_selector
    with pytest.raises(ValueError, match="HostNamespaces"):
        parse_namespace_grant("team=infra:Root")


class OptInCluster(FakeCluster):
    """A cluster whose Secrets carry these labels, read under the strict policy as KubeCluster reads them."""

    def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        labels = {"db": {"app": "db"}, "prom": {"servingtopology.io/metrics-token": "true"}}.get(name, {})
        refused = secret_refusal(labels, namespace=namespace, name=name, policy=TenancyPolicy())
        if refused is not None:
            raise SecretNotOptedIn(refused)
        return "secret-value"


@pytest.mark.parametrize(("secret", "reason"), [("db", "TokenSecretNotOptedIn"), ("prom", None)])
def test_a_token_secret_that_did_not_opt_in_is_a_named_metrics_condition_and_no_query(secret: str, reason: str | None) -> None:
    factory = RecordingFactory()
    obj = topology(metrics={"prometheusUrl": "http://prometheus-operated.monitoring.svc:9090", "bearerTokenSecret": {"name": secret}})
    cluster = OptInCluster()
    for _ in range(2):
        run(obj, cluster, metrics=factory)
    metrics = cond(obj, "MetricsAvailable")
    if reason is None:
        assert [r.bearer_token for r in factory.requests] == ["secret-value"]
    else:
        assert (metrics["status"], metrics["reason"]) == ("False", reason) and factory.requests == []
        assert "servingtopology.io/metrics-token=true" in metrics["message"]


def test_many_refused_fields_are_named_up_to_a_bound_and_the_rest_counted() -> None:
    volumes = [{"name": f"h{i}", "hostPath": {"path": f"/x{i}"}} for i in range(30)]
    obj = topology(podTemplate=template(volumes=volumes))
    run(obj, FakeCluster())
    message = cond(obj, "Ready")["message"]
    assert "volumes[0].hostPath" in message and "volumes[29]" not in message and "and 22 more" in message


def test_the_operator_refuses_to_start_with_a_grant_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    from servingtopology.operator.entry.main import main

    assert main(["--allow-pod-template", "Root"]) == 2
    assert "'Root' is not a pod-template grant" in capsys.readouterr().err
