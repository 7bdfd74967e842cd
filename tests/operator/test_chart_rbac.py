"""The chart's RBAC and operator pod, rendered with helm: the finalizers subresource granted; with
operator.namespaces set, every write (and Secret read) is a Role per namespace and only a read-only ClusterRole
stays; glob namespaces and an empty Prometheus URL allow-list are refused with a chart error; the operator's own
pod meets the `restricted` Pod Security Standard; the allow-list reaches the operator's arguments."""

from __future__ import annotations

import argparse
import subprocess
from typing import Any

import pytest
import yaml
from test_chart import CHART, HELM, helm_template
from test_pod_security import violations

from servingtopology.operator.entry.main import add_arguments
from servingtopology.operator.live.url_policy import DEFAULT_PROMETHEUS_URLS

WRITES = {"create", "patch", "update", "delete"}


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _one(docs: list[dict[str, Any]], kind: str, namespace: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"].get("namespace") == namespace]
    assert len(found) == 1, [d["metadata"] for d in docs if d["kind"] == kind]
    return found[0]


def test_watching_every_namespace_grants_the_finalizers_subresource_cluster_wide_and_no_secrets() -> None:
    docs = helm_template()
    granted = _granted(_one(docs, "ClusterRole"))
    assert ("servingtopology.io", "servingtopologies/finalizers", "update") in granted
    assert not any(r == "secrets" for _, r, _ in granted)
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]


def test_named_namespaces_get_a_role_each_and_the_cluster_role_only_reads() -> None:
    docs = helm_template("operator.namespaces={team-a,team-b}", "rbac.readSecrets=true")
    cluster = _granted(_one(docs, "ClusterRole"))
    assert not {v for _, _, v in cluster} & WRITES                                         # nothing cluster-wide writes
    assert not any(r in ("secrets", "deployments", "services", "configmaps") for _, r, _ in cluster)
    assert {("", "nodes", "list"), ("", "pods", "list")} <= cluster                        # GPU capacity, read-only
    for ns in ("team-a", "team-b"):
        role = _granted(_one(docs, "Role", ns))
        assert {("", "secrets", "get"), ("apps", "deployments", "create"), ("servingtopology.io", "servingtopologies/finalizers", "update"),
                ("kopf.dev", "kopfpeerings", "patch"), ("", "pods", "watch")} <= role
        binding = _one(docs, "RoleBinding", ns)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": _one(docs, "Role", ns)["metadata"]["name"]}
        assert binding["subjects"][0]["namespace"] == "stopo-system"
        assert _one(docs, "KopfPeering", ns)
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]


def _fails(*sets: str) -> str:
    cmd = [HELM, "template", "stopo", str(CHART), "--namespace", "stopo-system"]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, "the chart rendered"
    return done.stderr


@pytest.mark.parametrize("sets", [("operator.namespaces={team-*}",), ("operator.namespaces={team-*}", "rbac.create=false")])
def test_a_glob_namespace_is_refused_with_a_chart_error(sets: tuple[str, ...]) -> None:
    # It used to render a KopfPeering in a namespace called `team-*` and cluster-wide rules.
    message = _fails(*sets)
    assert "operator.namespaces" in message and '"team-*"' in message and "glob" in message


def test_an_empty_prometheus_url_allow_list_is_refused() -> None:
    assert "operator.prometheusUrlAllowList" in _fails("operator.prometheusUrlAllowList=null")


def test_the_allow_list_reaches_the_operator_and_defaults_to_the_operators_own() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert tuple(values["operator"]["prometheusUrlAllowList"]) == DEFAULT_PROMETHEUS_URLS
    deployment = next(d for d in helm_template("operator.prometheusUrlAllowList={https://prom.example.com/**}") if d["kind"] == "Deployment")
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.allow_prometheus_url == ["https://prom.example.com/**"]


def test_the_prometheus_networks_reach_the_operator_and_default_to_none() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["operator"]["prometheusNetworks"] == []
    deployment = next(d for d in helm_template("operator.prometheusNetworks={10.96.0.0/12}") if d["kind"] == "Deployment")
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.allow_prometheus_network == ["10.96.0.0/12"]


def test_the_operator_pod_meets_the_restricted_pod_security_standard() -> None:
    deployment = next(d for d in helm_template() if d["kind"] == "Deployment")
    assert violations(deployment["spec"]["template"], "restricted") == []
