"""The chart's PodMonitors, as the real Prometheus Operator turns them into scrape jobs, give engine series the labels
the operator's PromQL filters on, and scrape neither routers as engines nor anyone else's pods.

A pod the operator renders (operator/render/manifests.py) is described the way Prometheus' Kubernetes discovery describes it
(`__meta_kubernetes_pod_*`) and run through the relabel rules of the jobs the Prometheus Operator generated from the
installed chart's PodMonitors (read from its configuration Secret; e2e/podmonitor.py only evaluates them); the resulting
target labels must carry every matcher of `build_queries`. The e2e Prometheus runs that same generated configuration,
and test_lifecycle.py checks its real targets.
"""

from __future__ import annotations

from typing import Any

import yaml

from servingtopology.operator.live.metrics import ROLE_SERIES_LABEL, label_selector, topology_matchers
from servingtopology.operator.render.manifests import build_workloads
from servingtopology.planner.layout import Engine, Layout, Parallelism, RoleLayout
from tests.operator.cases import blueprint

from .cluster import LocalCluster
from .podmonitor import chart_pod_monitors, relabel, sanitize
from .stack import Operator


def _generated_jobs(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The PodMonitor jobs of the Prometheus Operator's configuration, as the local Prometheus runs them."""
    config = yaml.safe_load((cluster.prometheus_dir / "prometheus.yml").read_text())
    jobs = [j for j in config["scrape_configs"] if j["job_name"].startswith("podMonitor/")]
    assert len(jobs) == 2, [j["job_name"] for j in jobs]
    return jobs


def _targets(pod_template: dict[str, Any], *, namespace: str, pod: str, ip: str) -> list[dict[str, str]]:
    """One discovery target per container port, labelled as Prometheus' `role: pod` discovery labels it."""
    labels = pod_template["metadata"]["labels"]
    out = []
    for container in pod_template["spec"]["containers"]:
        for port in container.get("ports", []):
            target = {"__address__": f"{ip}:{port['containerPort']}", "__meta_kubernetes_namespace": namespace,
                      "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_node_name": "gpu-node-0",
                      "__meta_kubernetes_pod_container_name": container["name"],
                      "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                      "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                      "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_ready": "true"}
            for key, value in labels.items():
                target[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
                target[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
            out.append(target)
    return out


def _scraped(jobs: list[dict[str, Any]], targets: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """Per job, the labels of the targets it keeps."""
    kept: dict[str, list[dict[str, str]]] = {}
    for job in jobs:
        for target in targets:
            labels = relabel({**target, "job": job["job_name"]}, job["relabel_configs"])
            if labels is not None:
                kept.setdefault(job["job_name"], []).append(labels)
    return kept


def _pd_workloads() -> list[dict[str, Any]]:
    bp = blueprint(Engine.VLLM, Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(2, Parallelism(tp=2))))
    return [o for o in build_workloads(bp) if o["kind"] == "Deployment"]


def test_helm_renders_an_engine_and_a_router_pod_monitor_that_can_be_turned_off() -> None:
    monitors = chart_pod_monitors()
    assert sorted(m["metadata"]["name"] for m in monitors) == ["st-servingtopology-engines", "st-servingtopology-routers"]
    assert all(m["apiVersion"] == "monitoring.coreos.com/v1" for m in monitors)
    assert chart_pod_monitors("podMonitors.enabled=false") == []
    scoped = chart_pod_monitors("podMonitors.namespaces={team-a}", "podMonitors.labels.release=kps")
    assert all(m["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]} for m in scoped)
    assert all(m["metadata"]["labels"]["release"] == "kps" for m in scoped)


def test_engine_targets_carry_every_label_the_promql_filters_on(cluster: LocalCluster, operator: Operator) -> None:
    jobs = _generated_jobs(cluster)
    engines = next(j["job_name"] for j in jobs if "engines" in j["job_name"])
    for deployment in _pd_workloads():
        template = deployment["spec"]["template"]
        role = template["metadata"]["labels"]["servingtopology.io/role"]
        kept = _scraped(jobs, _targets(template, namespace="serving", pod=f"{role}-0", ip="10.1.2.3"))
        if role == "router":
            assert engines not in kept  # routers are not engines: their series must not count as engine figures
            (routers,) = [labels for job, labels in kept.items() if "routers" in job]
            assert [t["endpoint"] for t in routers] == ["metrics"]
            continue
        (targets,) = kept.values()  # one job, one port: the API port, not NIXL's side channel
        (labels,) = targets
        assert labels["endpoint"] == "http" and labels["pod"] == f"{role}-0" and labels["node"] == "gpu-node-0"
        for key, value in topology_matchers(namespace="serving", name="llama").items():
            assert labels[key] == value, (key, labels)
        assert labels[ROLE_SERIES_LABEL] == role
        # The query's selector names only labels the target has.
        selector = label_selector(topology_matchers(namespace="serving", name="llama"))
        assert all(f'{k}="' in selector for k in ("namespace", "servingtopology_io_topology"))


def test_pods_of_other_owners_are_not_scraped(cluster: LocalCluster, operator: Operator) -> None:
    jobs = _generated_jobs(cluster)
    stranger = {"metadata": {"labels": {"app": "web", "servingtopology.io/role": "router"}},
                "spec": {"containers": [{"name": "web", "ports": [{"name": "http", "containerPort": 80}]}]}}
    assert _scraped(jobs, _targets(stranger, namespace="serving", pod="web-0", ip="10.1.2.4")) == {}
