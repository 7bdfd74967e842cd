"""spec.metrics.prometheusUrl is held to the operator's allow-list (chart value operator.prometheusUrlAllowList):
a URL outside it is MetricsAvailable=False naming the field and the rules, with no Secret read and no request;
the token Secret is only ever read from the resource's own namespace."""

from __future__ import annotations

import pytest
import yaml
from fake_cluster import FakeCluster
from test_live_reconcile import NS, CountingPlanner, ScriptedMetrics, live_topology, run
from test_reconcile import ROOT, cond, reasons

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.live.url_policy import DEFAULT_PROMETHEUS_URLS, UrlAllowList
from servingtopology.spec import SpecError

DEFAULT = UrlAllowList.of(DEFAULT_PROMETHEUS_URLS)


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://prometheus-operated.monitoring.svc:9090", True),              # the examples' URL
    ("http://prometheus-operated.monitoring.svc:9090/", True),             # a trailing slash is the same URL
    ("HTTP://Prometheus-Operated.team-a.svc.cluster.local:9090", True),    # any namespace, fully qualified, any case
    ("http://kps-kube-prometheus-prometheus.monitoring.svc:9090", True),   # kube-prometheus-stack's Service
    ("http://169.254.169.254/latest/meta-data", False),                    # a cloud metadata endpoint
    ("http://prometheus-operated.monitoring.svc:9091", False),             # another port
    ("http://prometheus-operated.monitoring.svc:9090@evil.example", False),  # user info: the host is evil.example
    ("http://user:pw@prometheus-operated.monitoring.svc:9090", False),     # user info
    ("http://prometheus-operated.monitoring.svc:9090/api?x=1", False),     # a query
    ("http://prometheus-operated.evil.example/x.svc:9090", False),         # `*` never crosses a `/`
    ("http://prometheus-operated.monitoring.svc:9090/../admin", False),    # a path the rule does not allow
    ("file:///etc/passwd", False),                                         # not http(s)
])
def test_the_default_rules_allow_the_in_cluster_prometheus_services_only(url: str, allowed: bool) -> None:
    assert DEFAULT.allows(url) is allowed


def test_a_double_star_rule_allows_a_prefix_and_a_single_star_one_segment() -> None:
    rules = UrlAllowList.of(["https://prom.example.com/**", "http://127.0.0.1:*"])
    assert rules.allows("https://prom.example.com/tenant/a/") and not rules.allows("https://prom.example.com.evil.io/")
    assert rules.allows("http://127.0.0.1:39123") and not rules.allows("http://127.0.0.1:39123/x")


def test_a_url_outside_the_allow_list_reads_no_secret_and_sends_no_request() -> None:
    obj, cluster, planner, metrics = live_topology(), FakeCluster(), CountingPlanner(), ScriptedMetrics()
    obj["spec"]["metrics"] |= {"prometheusUrl": "http://169.254.169.254/latest", "bearerTokenSecret": {"name": "prom"}}
    cluster.secrets[(NS, "prom")] = {"token": "s3cret"}
    read: list[tuple[str, str]] = []
    real_read = cluster.read_secret
    cluster.read_secret = lambda ns, name, key: read.append((ns, name)) or real_read(ns, name, key)  # type: ignore[method-assign]
    for minute in range(3):
        run(obj, cluster, planner, metrics, minute, allow=DEFAULT)
    available = cond(obj, "MetricsAvailable")
    assert (available["status"], available["reason"]) == ("False", "PrometheusUrlNotAllowed")
    assert "spec.metrics.prometheusUrl" in available["message"] and "http://prometheus-operated.*.svc:9090" in available["message"]
    assert metrics.requests == [] and read == []
    assert reasons(cluster).count("PrometheusUrlNotAllowed") == 1       # one Event, not one per interval
    assert obj["status"]["plan"]                                         # planning from the spec goes on


def test_an_allowed_url_is_queried_as_before() -> None:
    obj, cluster, planner, metrics = live_topology(), FakeCluster(), CountingPlanner(), ScriptedMetrics()
    run(obj, cluster, planner, metrics, 0, allow=DEFAULT)
    run(obj, cluster, planner, metrics, 1, allow=DEFAULT)
    assert metrics.requests and cond(obj, "MetricsAvailable")["status"] == "True"


def test_the_token_secret_cannot_name_another_namespace() -> None:
    spec = live_topology()["spec"]
    spec["metrics"]["bearerTokenSecret"] = {"name": "prom", "namespace": "kube-system"}
    with pytest.raises(SpecError) as err:
        parse_topology_spec(spec)
    assert any("bearerTokenSecret.namespace" in f for f, _ in err.value.errors)


def test_every_cluster_example_names_a_url_the_default_rules_allow() -> None:
    # examples/demo-replan.yaml is for the local stack, whose Prometheus is on loopback (e2e/up.py allows it).
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            url = ((doc or {}).get("spec") or {}).get("metrics", {}).get("prometheusUrl") if isinstance(doc, dict) else None
            if url and path.name != "demo-replan.yaml":
                assert DEFAULT.allows(url), (path.name, url)
