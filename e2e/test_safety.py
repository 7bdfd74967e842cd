"""Safety on a real API server: an existing object named like the resource is left alone (a Conflict condition, no
owner reference, its selector kept), and the rendered pods pass the API server's own Pod Security admission —
engines and routers in a `restricted` namespace once the template names a non-root user (the engines' images run
as root), and engines as rendered in a `baseline` one."""

from __future__ import annotations

import json
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .stack import Emulator, Operator

INSTANCE = "app.kubernetes.io/instance"


def _apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))


def test_an_existing_service_named_like_the_resource_keeps_its_selector_and_gets_no_owner(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken", "namespace": namespace},
              "spec": {"selector": {"app": "their-app"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    _apply(cluster, theirs)
    _apply(cluster, topology("taken", namespace, prometheus_url=cluster.prometheus_url))
    kube.wait_condition(namespace, "taken", "Conflict", "True", timeout_s=180, log=operator.log_tail)
    conflict = kube.condition(namespace, "taken", "Conflict") or {}
    assert conflict["reason"] == "ObjectNotOwned" and "Service/taken" in conflict["message"], conflict
    service = kube.get("services", namespace, "taken")
    assert service["spec"]["selector"] == {"app": "their-app"}
    assert not service["metadata"].get("ownerReferences"), service["metadata"]
    assert not kube.items("deployments", namespace), "nothing of the pass may be applied"
    assert kube.events(namespace, reason="ObjectNotOwned")


def _label(cluster: LocalCluster, namespace: str, level: str) -> None:
    cluster.kubectl("label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}",
                    "pod-security.kubernetes.io/enforce-version=latest", "--overwrite")


def _pods_by_container(kube: Kube, namespace: str, name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in kube.items("pods", namespace, selector=f"{INSTANCE}={name}"):
        for c in pod["spec"]["containers"]:
            out[c["name"]] = out.get(c["name"], 0) + 1
    return out


def _refusals(kube: Kube, namespace: str) -> str:
    return json.dumps([e["message"] for e in kube.events(namespace) if e.get("reason") == "FailedCreate"], indent=1)


def test_pd_engines_and_routers_are_admitted_in_a_restricted_namespace_with_a_non_root_template(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    _label(cluster, namespace, "restricted")
    obj = topology("strict", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=2)
    obj["spec"]["pinned"] = {"kind": "pd", "prefill": {"count": 1, "tp": 1}, "decode": {"count": 1, "tp": 1}}
    # The engines' images run as root; a non-root UID with a writable HOME is the template's choice.
    obj["spec"]["podTemplate"] = {"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
                                           "containers": [{"name": "engine", "env": [{"name": "HOME", "value": "/tmp"}]}]}}
    _apply(cluster, obj)
    kube.wait_condition(namespace, "strict", "Ready", "True", timeout_s=240,
                        log=lambda: _refusals(kube, namespace) + operator.log_tail())
    pods = _pods_by_container(kube, namespace, "strict")
    assert pods.get("engine") == 2 and pods.get("router") == 2, pods


def test_engines_as_rendered_are_admitted_in_a_baseline_namespace_and_refused_only_for_root_in_a_restricted_one(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    _label(cluster, namespace, "baseline")
    obj = topology("plain", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1)
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    _apply(cluster, obj)
    kube.wait_condition(namespace, "plain", "Ready", "True", timeout_s=240,
                        log=lambda: _refusals(kube, namespace) + operator.log_tail())
    assert _pods_by_container(kube, namespace, "plain").get("engine") == 1
    # The same pods under `restricted`: the admission refuses them for runAsNonRoot alone.
    dry = cluster.kubectl("label", "--dry-run=server", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                          "--overwrite", check=False)
    warnings = dry.stderr
    assert "runAsNonRoot" in warnings, warnings
    for rule in ("allowPrivilegeEscalation", "capabilities", "seccompProfile"):
        assert rule not in warnings, warnings


def test_pods_refused_by_pod_security_are_named_in_status_not_rolling_out_for_ever(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    _label(cluster, namespace, "restricted")      # the engines' images run as root: the ReplicaSet cannot create them
    obj = topology("rooted", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1)
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    _apply(cluster, obj)
    ready = lambda: kube.condition(namespace, "rooted", "Ready") or {}  # noqa: E731
    wait_until(lambda: ready().get("reason") == "PodsRefused", timeout_s=180, what="Ready=False PodsRefused",
               on_timeout=lambda: json.dumps(ready()) + _refusals(kube, namespace) + operator.log_tail())
    assert "FailedCreate" in ready()["message"] and "runAsNonRoot" in ready()["message"], ready()
    assert (kube.condition(namespace, "rooted", "Progressing") or {}).get("reason") == "PodsRefused"


def test_a_hostile_pod_template_is_refused_by_the_operator_and_annotations_alone_are_admitted(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    obj = topology("hostile", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1)
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    # Annotations without labels: the CRD's label rule once failed with "no such key: labels".
    obj["spec"]["podTemplate"] = {"metadata": {"annotations": {"example.com/team": "a"}},
                                  "spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}], "hostIPC": True}}
    _apply(cluster, obj)
    cond = kube.wait_condition(namespace, "hostile", "Ready", "False", timeout_s=120, log=operator.log_tail)
    wait_until(lambda: (kube.condition(namespace, "hostile", "Ready") or {}).get("reason") == "PodTemplateRefused", timeout_s=60,
               what="Ready=False PodTemplateRefused", on_timeout=lambda: json.dumps(cond) + operator.log_tail())
    message = (kube.condition(namespace, "hostile", "Ready") or {})["message"]
    assert "spec.podTemplate.spec.volumes[0].hostPath" in message and "spec.podTemplate.spec.hostIPC" in message, message
    assert not kube.items("deployments", namespace), "nothing may be applied"
