"""Safety on a real API server: an existing object named like the resource is left alone (a Conflict condition, no
owner reference, its selector kept), and the rendered pods pass the API server's own Pod Security admission —
engines and routers in a `restricted` namespace once the template names a non-root user (the engines' images run
as root), and engines as rendered in a `baseline` one. A tenant's pod template gets only what its plan grants (a 7-GPU
sidecar at a system priority is refused by name, and another namespace's pods are untouched), and what the API server
itself refuses is named with its reason (AdmissionRefused, from the server-side dry-run before every apply), with
nothing applied and no dry-run again until the spec changes."""

from __future__ import annotations

import json
import time
import uuid
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


def _pod_states(kube: Kube, namespace: str) -> dict[str, tuple[str, str, bool]]:
    """name -> (uid, phase, terminating) of every pod of a namespace."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["status"].get("phase", ""), "deletionTimestamp" in p["metadata"])
            for p in kube.items("pods", namespace)}


def test_a_one_gpu_tenant_s_seven_gpu_sidecar_at_system_priority_is_refused_by_name_and_other_tenants_keep_their_pods(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    started = time.monotonic()
    other = f"e2e-other-{uuid.uuid4().hex[:6]}"       # another tenant, already serving on the GPUs
    cluster.kubectl("create", "namespace", other)
    try:
        serving = topology("serving", other, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=2)
        serving["spec"]["pinned"] = {"kind": "replicas", "replicas": 2, "tp": 1}
        _apply(cluster, serving)
        kube.wait_condition(other, "serving", "Ready", "True", timeout_s=120, log=operator.log_tail)
        before = _pod_states(kube, other)
        assert len(before) == 2 and all(phase == "Running" and not gone for _, phase, gone in before.values()), before

        # The tenant: its resource says 1 GPU; its template adds a 7-GPU sidecar at the node's critical priority.
        hostile = topology("greedy", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1)
        hostile["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
        hostile["spec"]["podTemplate"] = {"spec": {
            "priorityClassName": "system-node-critical",
            "containers": [{"name": "miner", "image": "busybox:1.36", "command": ["sleep", "infinity"],
                            "resources": {"limits": {"nvidia.com/gpu": 7}, "requests": {"nvidia.com/gpu": 7}}}]}}
        _apply(cluster, hostile)
        ready = lambda: kube.condition(namespace, "greedy", "Ready") or {}  # noqa: E731
        wait_until(lambda: ready().get("reason") == "PodTemplateRefused", timeout_s=60, what="Ready=False PodTemplateRefused",
                   on_timeout=lambda: json.dumps(ready()) + operator.log_tail())
        message = ready()["message"]
        for path in ('spec.podTemplate.spec.containers[0].resources.limits["nvidia.com/gpu"]',
                     'spec.podTemplate.spec.containers[0].resources.requests["nvidia.com/gpu"]',
                     "spec.podTemplate.spec.priorityClassName"):
            assert path in message, message
        assert [e["type"] for e in kube.events(namespace, reason="PodTemplateRefused")] == ["Warning"]
        time.sleep(2 * operator.timer_interval_s)       # two more passes of the refused resource
        for kind in ("deployments", "services", "pods", "serviceaccounts,roles,rolebindings"):
            left = [o["metadata"]["name"] for o in kube.items(kind, namespace) if o["metadata"]["name"] != "default"]
            assert not left, f"nothing of the refused resource may be applied: {kind} {left}"
        assert _pod_states(kube, other) == before, "another namespace's serving pods must be untouched"
        print(f"\nrefused in {time.monotonic() - started:.0f} s (after the other tenant was Ready): {message[:300]}...")
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


DRY_RUN_REFUSED = "server-side dry-run refused"   # operator/cluster/cluster.py logs each dry-run the API server refused


def _operator_lines(operator: Operator, *needles: str) -> int:
    """Lines of the operator's log holding every needle."""
    return sum(all(n in line for n in needles) for line in operator.log_tail(chars=50_000_000).splitlines())


def test_an_object_the_api_server_refuses_is_named_with_its_reason_and_not_dry_run_again_until_the_spec_changes(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    started = time.monotonic()
    obj = topology("unmounted", namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1)
    obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
    # The CRD and the operator's pod-template policy admit an environment variable named with '='; the API server's
    # validation of the Deployment does not (printable ASCII other than '=').
    obj["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "engine", "env": [{"name": "CACHE=DIR", "value": "/cache"}]}]}}
    _apply(cluster, obj)
    ready = lambda: kube.condition(namespace, "unmounted", "Ready") or {}  # noqa: E731
    wait_until(lambda: ready().get("reason") == "AdmissionRefused", timeout_s=90, what="Ready=False AdmissionRefused",
               on_timeout=lambda: json.dumps(kube.topology(namespace, "unmounted").get("status", {}))[-3000:] + operator.log_tail())
    refused_s = time.monotonic() - started
    message = ready()["message"]
    assert message.startswith("Deployment/unmounted-") and ": Invalid (422): " in message, message
    assert "env[0].name" in message and "CACHE=DIR" in message, message
    for raw in ("HTTP response", "Traceback", "Reason:", "Content-Type"):
        assert raw not in message, message
    reconciled = kube.condition(namespace, "unmounted", "Reconciled") or {}
    assert reconciled.get("status") != "False", reconciled       # the pass completed: not a failure retried for ever
    assert not kube.items("deployments", namespace) and not kube.items("services", namespace), "nothing may be applied"
    assert [e["type"] for e in kube.events(namespace, reason="AdmissionRefused")] == ["Warning"]

    # Passes go on (the timer), the refused object is not dry-run again: its verdict stands until the spec changes it.
    where = f"{namespace}/unmounted"
    dry_runs, passes = _operator_lines(operator, f"{where}-", DRY_RUN_REFUSED), _operator_lines(operator, f"{where}: timer pass")
    assert dry_runs >= 1
    time.sleep(4 * operator.timer_interval_s)
    assert _operator_lines(operator, f"{where}: timer pass") >= passes + 2, "the timer's passes must go on"
    assert _operator_lines(operator, f"{where}-", DRY_RUN_REFUSED) == dry_runs, "no dry-run again while the rendered objects are unchanged"
    assert len(kube.events(namespace, reason="AdmissionRefused")) == 1 and not kube.items("deployments", namespace)

    # The spec changes (the variable renamed): dry-run again at once, admitted, applied.
    obj["spec"]["podTemplate"]["spec"]["containers"][0]["env"][0]["name"] = "CACHE_DIR"
    _apply(cluster, obj)
    kube.wait_condition(namespace, "unmounted", "Ready", "True", timeout_s=90, log=operator.log_tail)
    env = kube.items("deployments", namespace)[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "CACHE_DIR", "value": "/cache"} in env, env
    print(f"\nAdmissionRefused {refused_s:.0f} s after the apply; {4 * operator.timer_interval_s} s of timer passes "
          f"without a dry-run; Ready {time.monotonic() - started:.0f} s after the apply: {message[:200]}...")


# Templates the CRD admits and the API server refuses (issue 38): each ends in a named condition, the operator's own
# refusal (PodTemplateRefused) or the server's (AdmissionRefused), naming the field; never a raw exception in status.
SERVER_REFUSES = {
    "caps-string": {"spec": {"containers": [{"name": "engine", "securityContext": {"capabilities": {"add": "IPC_LOCK"}}}]}},
    "lower-unconfined": {"spec": {"securityContext": {"seccompProfile": {"type": "unconfined"}}}},
    "seccomp-annotation": {"metadata": {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}},
    "init-engine": {"spec": {"initContainers": [{"name": "engine", "image": "busybox:1.36"}]}},
}


def test_templates_the_api_server_refuses_end_in_a_named_condition_never_a_raw_exception(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    for name, template in SERVER_REFUSES.items():
        obj = topology(name, namespace, prometheus_url=cluster.prometheus_url, mode="Pinned", max_gpus=1)
        obj["spec"]["pinned"] = {"kind": "replicas", "replicas": 1, "tp": 1}
        obj["spec"]["podTemplate"] = template
        _apply(cluster, obj)
    named = ("PodTemplateRefused", "AdmissionRefused")
    ready = {name: {} for name in SERVER_REFUSES}

    def all_named() -> bool:
        ready.update({name: kube.condition(namespace, name, "Ready") or {} for name in SERVER_REFUSES})
        return all(r.get("reason") in named for r in ready.values())

    wait_until(all_named, timeout_s=90, what="a named refusal for each template",
               on_timeout=lambda: json.dumps(ready, indent=1) + operator.log_tail())
    for name, cond in ready.items():
        for raw in ("HTTP response", "Traceback", "Content-Type"):
            assert raw not in cond["message"], (name, cond)
        reconciled = kube.condition(namespace, name, "Reconciled") or {}
        assert reconciled.get("status") != "False", (name, reconciled)
    assert not kube.items("deployments", namespace), "nothing may be applied"
    print("\n" + "\n".join(f"{name}: {cond['reason']}: {cond['message'][:160]}" for name, cond in ready.items()))
