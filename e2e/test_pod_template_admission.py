"""Pod templates drawn from the live API server's PodSpec schema (e2e/podspec_strategy.py), 500 of them, each put into a
ServingTopology with a fixed pinned PD plan (prefill 1×TP1, decode 1×TP2, a router) and run through what the operator
does with it: the CRD's own validation (a server-side dry-run of the resource), the operator's parse, its pod-template
policy with the chart's grants (render/tenancy.py), and its render path (pass_context.blueprint_for, build_workloads).
A template the policy refuses must name field paths inside it; for one it admits, every rendered object goes through
the operator's own server-side dry-run (KubeCluster.admit), and every rendered pod through a dry-run create in a
namespace whose Pod Security admission enforces the level the chart states (operator.podTemplatePolicy.podSecurityLevel).
Each pod the API server accepts must request exactly the plan's GPUs and hold nothing the grants do not allow, read from
the pod as the server returns it (its admission plugins' defaults included) against the same plan's pods without a
template: the GPUs, extended resources and claims, priority, scheduler, runtime class, node name, ServiceAccount and
tokens, host namespaces and paths, privilege, capabilities, profiles and their annotations."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.cluster.cluster import ClusterError, KubeCluster
from servingtopology.operator.pass_context import blueprint_for, problem_from_spec, template_inputs
from servingtopology.operator.render.manifests import ROLE_LABEL, build_workloads
from servingtopology.operator.render.object_size import oversized
from servingtopology.operator.render.tenancy import SAFE_SYSCTLS, TenancyPolicy, parse_grants, parse_namespace_grant, pod_template_refusals
from servingtopology.spec import SpecError

from .cluster import LocalCluster
from .kubetools import REPO_ROOT
from .objects import topology
from .podspec_strategy import definitions, pod_templates
from .processes import wait_until

TEMPLATES = 500
NAME = "drawn"
GPU = "nvidia.com/gpu"
HOST_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
# The Pod Security Standards' restricted volume kinds (kubernetes.io/docs/concepts/security/pod-security-standards).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
PROFILE_ANNOTATIONS = ("container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/pod",
                       "container.seccomp.security.alpha.kubernetes.io/")
RUNTIME_ANNOTATIONS = ("io.kubernetes.cri-o.", "io.kubernetes.cri.", "io.katacontainers.", "io.containerd.")
# Pod fields whose value in a rendered pod is the plan's or a grant's: with no grant, as in the pod rendered without a template.
# (automountServiceAccountToken: false gives up a token; the tokens a pod gets are compared below.)
GRANTED_POD_FIELDS = ("priorityClassName", "priority", "preemptionPolicy", "schedulerName", "runtimeClassName", "nodeName",
                      "serviceAccountName", "hostNetwork", "hostPID", "hostIPC", "hostUsers", "overhead", "resources", "resourceClaims")
OUTCOMES = ("invalid spec: refused by the CRD", "invalid spec: the CRD admits, the operator's parse refuses",
            "policy-refused (PodTemplateRefused)", "admitted", "admitted: ObjectTooLarge", "admission-refused: rendered objects",
            "admission-refused: pods", "dry-run accepted")
# Where a drawn template goes: every engine pod, the decode pods only, or the router pods (their own rules: a token, `router`).
PLACES = ("podTemplate", "podTemplate", "rolePodTemplates.decode", "rolePodTemplates.router")


def chart_values() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO_ROOT / "charts" / "servingtopology" / "values.yaml").read_text()))


def chart_policy(values: Mapping[str, Any]) -> TenancyPolicy:
    """The pod-template grants of the chart's values, as operator/entry/main.py reads its flags."""
    policy = values["operator"]["podTemplatePolicy"]
    return TenancyPolicy(pod_grants=frozenset(parse_grants(policy["allow"])),
                         namespace_grants=tuple(parse_namespace_grant(f"{n['label']}:{','.join(n['allow'])}") for n in policy["namespaces"]))


def resource(namespace: str, template: dict[str, Any], place: str) -> dict[str, Any]:
    obj = topology(NAME, namespace, prometheus_url=None, mode="Pinned", max_gpus=3)
    obj["spec"]["pinned"] = {"kind": "pd", "prefill": {"count": 1, "tp": 1}, "decode": {"count": 1, "tp": 2}}
    if place == "podTemplate":
        obj["spec"]["podTemplate"] = template
    else:
        obj["spec"]["rolePodTemplates"] = {place.split(".")[1]: template}
    return obj


_SEGMENT = re.compile(r'\.([A-Za-z0-9_]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def names_a_field(path: str, spec: Mapping[str, Any]) -> bool:
    """Whether `path` (`spec.podTemplate.spec.containers[1].resources.limits["nvidia.com/gpu"]`) leads into `spec` to a
    field that is there or whose parent is (a refused profile without its `type`)."""
    rest, node, missing = path.removeprefix("spec"), spec, 0
    for m in _SEGMENT.finditer(rest):
        key: Any = m.group(1) or (int(m.group(2)) if m.group(2) else json.loads(m.group(3)))
        there = (isinstance(key, int) and isinstance(node, list) and key < len(node)) or (
            isinstance(key, str) and isinstance(node, Mapping) and key in node)
        if there:
            node = node[key]
        else:
            missing += 1
    consumed = "".join(m.group(0) for m in _SEGMENT.finditer(rest))
    return consumed == rest and missing <= 1


def _fields(template: Any, path: str = "") -> set[str]:
    """The field paths a template sets, list indices and map keys left out (`spec.containers.resources.limits`)."""
    if isinstance(template, list):
        return {f for item in template for f in _fields(item, path)}
    if not isinstance(template, Mapping) or path.endswith((".limits", ".requests", ".annotations", ".labels", ".nodeSelector")):
        return {path} if path else set()
    return {path} | {f for k, v in template.items() for f in _fields(v, f"{path}.{k}" if path else str(k))}


def off_schema(value: Any, schema: Mapping[str, Any], schemas: Mapping[str, Mapping[str, Any]], path: str = "") -> list[str]:
    """The fields of `value` that its OpenAPI schema (followed through `$ref`/`allOf`, `items`, `additionalProperties`)
    does not name: the strategy's claim that it draws only what the API server's schema holds."""
    refs = [schema.get("$ref")] + [s.get("$ref") for s in schema.get("allOf", [])]
    ref = next((r for r in refs if r), None)
    if ref is not None:
        return off_schema(value, schemas.get(str(ref).rsplit("/", 1)[-1], {}), schemas, path)
    if isinstance(value, list) and "items" in schema:
        return [f for item in value for f in off_schema(item, schema["items"], schemas, f"{path}[]")]
    if isinstance(value, Mapping) and "properties" in schema:
        props = schema["properties"]
        return [f for k, v in value.items() for f in ([f"{path}.{k}"] if k not in props else off_schema(v, props[k], schemas, f"{path}.{k}"))]
    if isinstance(value, Mapping) and "additionalProperties" in schema:
        return [f for k, v in value.items() for f in off_schema(v, schema["additionalProperties"], schemas, f"{path}[{k}]")]
    return []


def _quantity(value: Any) -> float:
    from kubernetes.utils.quantity import parse_quantity

    return float(parse_quantity(value))


def _token_audiences(pod: Mapping[str, Any]) -> list[str]:
    return sorted(str((s.get("serviceAccountToken") or {}).get("audience", "")) for v in pod["spec"].get("volumes", [])
                  for s in (v.get("projected") or {}).get("sources", []) if "serviceAccountToken" in s)


def breaches(pod: Mapping[str, Any], *, plan_gpus: int, bare: Mapping[str, Any]) -> list[str]:
    """What a pod the API server accepted holds beyond the plan's GPUs and the (no) grants, against `bare`: the same role's
    pod rendered without a template, as the server returned it. Spelled from the Kubernetes side, not the policy's."""
    spec, out = pod["spec"], []
    containers, inits = spec.get("containers", []), spec.get("initContainers", [])
    for key in ("requests", "limits"):
        held = sum(_quantity(((c.get("resources") or {}).get(key) or {}).get(GPU, 0)) for c in containers + inits)
        if held != plan_gpus:
            out.append(f"{held:g} GPUs in {key} where the plan gives {plan_gpus}")
    for c in containers + inits:
        resources = c.get("resources") or {}
        for key in ("requests", "limits"):
            for name in resources.get(key) or {}:
                if name not in HOST_RESOURCES and not name.startswith("hugepages-") and not (name == GPU and c["name"] == "engine"):
                    out.append(f"{c['name']}: {key} {name}")
        if resources.get("claims"):
            out.append(f"{c['name']}: resource claims")
        sc = c.get("securityContext") or {}
        for flag in ("privileged", "allowPrivilegeEscalation"):
            if sc.get(flag) is True:
                out.append(f"{c['name']}: {flag}")
        if (sc.get("capabilities") or {}).get("add"):
            out.append(f"{c['name']}: capabilities {sc['capabilities']['add']}")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{c['name']}: procMount {sc['procMount']}")
        for profile in ("seccompProfile", "appArmorProfile"):
            if (sc.get(profile) or {}).get("type") == "Unconfined":
                out.append(f"{c['name']}: {profile} Unconfined")
        for var in c.get("env") or []:
            if var.get("name") == "NVIDIA_VISIBLE_DEVICES":
                out.append(f"{c['name']}: NVIDIA_VISIBLE_DEVICES")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{c['name']}: hostPort {port['hostPort']}")
        for handler in [c.get(p) or {} for p in ("livenessProbe", "readinessProbe", "startupProbe")] + list((c.get("lifecycle") or {}).values()):
            for kind in ("httpGet", "tcpSocket"):
                if (handler.get(kind) or {}).get("host"):
                    out.append(f"{c['name']}: a {kind} host")
    for key in GRANTED_POD_FIELDS:
        if spec.get(key) != bare["spec"].get(key):
            out.append(f"{key} {spec.get(key)!r} where the plan's pod has {bare['spec'].get(key)!r}")
    psc = spec.get("securityContext") or {}
    for profile in ("seccompProfile", "appArmorProfile"):
        if (psc.get(profile) or {}).get("type") == "Unconfined":
            out.append(f"pod {profile} Unconfined")
    bare_sysctls = {s["name"] for s in (bare["spec"].get("securityContext") or {}).get("sysctls", [])}
    unsafe = {s.get("name") for s in psc.get("sysctls") or []} - bare_sysctls - SAFE_SYSCTLS
    if unsafe:
        out.append(f"sysctls {sorted(unsafe)}")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if kinds - RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds)}")
    if spec.get("automountServiceAccountToken") is True and bare["spec"].get("automountServiceAccountToken") is not True:
        out.append("automountServiceAccountToken true where the plan's pod has none")
    if not set(_token_audiences(pod)) <= set(_token_audiences(bare)) or len(_token_audiences(pod)) > len(_token_audiences(bare)):
        out.append(f"ServiceAccount tokens {_token_audiences(pod)} where the plan's pod has {_token_audiences(bare)}")
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if key.startswith(PROFILE_ANNOTATIONS) and str(value).lower() == "unconfined":
            out.append(f"annotation {key}={value}")
        if key.startswith(RUNTIME_ANNOTATIONS):
            out.append(f"runtime annotation {key}")
    return out


class Server:
    """The API server as the test calls it: the operator's own dry-run (KubeCluster.admit) and plain dry-run creates."""

    def __init__(self, cluster: LocalCluster) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.operator = KubeCluster(config.new_client_from_config(config_file=str(cluster.kubeconfig)))   # it counts its own requests

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *, query: list[tuple[str, str]] | None = None,
                ) -> tuple[int, str, dict[str, Any]]:
        """(the HTTP status, the Status reason of a failure, the answer's JSON)."""
        serialized = self.api.param_serialize(method=method, resource_path=path, query_params=query or [], body=body,
                                              header_params={"Content-Type": "application/json", "Accept": "application/json"},
                                              auth_settings=["BearerToken"])
        answer = self.api.call_api(*serialized, _request_timeout=(5.0, 30.0))
        data = answer.read()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"message": data[:300].decode(errors="replace")}
        return int(answer.status), str(parsed.get("reason") or answer.reason) if answer.status >= 300 else "", dict(parsed)

    def openapi(self) -> dict[str, Any]:
        status, _, document = self.request("GET", "/openapi/v3/api/v1")
        assert status == 200, document
        return document

    def dry_run(self, path: str, obj: Mapping[str, Any]) -> tuple[int, str, dict[str, Any]]:
        """(0, "", the object as the server returns it) or (code, reason, the Status) of a create with dryRun=All."""
        status, reason, answer = self.request("POST", path, obj, query=[("dryRun", "All")])
        return (0, "", answer) if status in (200, 201) else (status, reason, answer)


@pytest.fixture()
def admission_namespace(cluster: LocalCluster, namespace: str) -> str:
    """The test namespace, enforcing the chart's Pod Security level, with the router's ServiceAccount (the ServiceAccount
    admission refuses a pod naming one that does not exist) and the CRD installed."""
    level = chart_values()["operator"]["podTemplatePolicy"]["podSecurityLevel"]
    cluster.kubectl("label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}",
                    "pod-security.kubernetes.io/enforce-version=latest", "--overwrite")
    cluster.kubectl("create", "serviceaccount", f"{NAME}-router", "-n", namespace)
    for crd in sorted((REPO_ROOT / "charts" / "servingtopology" / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=e2e-crds", "-f", str(crd))
    established = ("get", "crd/servingtopologies.servingtopology.io", "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}")
    wait_until(lambda: cluster.kubectl(*established, check=False).stdout.strip() == "True", timeout_s=60, what="the CRD established")
    return namespace


def _rendered(spec: Any, namespace: str) -> list[dict[str, Any]]:
    layout = problem_from_spec(spec, None).pinned
    assert layout is not None
    objects = build_workloads(blueprint_for(spec, layout, name=NAME, namespace=namespace, uid="", gpus_per_node=8))
    for obj in objects:
        obj["metadata"].pop("ownerReferences", None)   # the resource is only dry-run: no uid to own them (as plan --manifests)
    return objects


def _pods(objects: list[dict[str, Any]], namespace: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(role, a Pod of each Deployment's template), as the ReplicaSet controller would create it."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            template = obj["spec"]["template"]
            role = template["metadata"]["labels"][ROLE_LABEL]
            meta = {**template["metadata"], "name": f"{obj['metadata']['name']}-probe", "namespace": namespace}
            yield role, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def test_every_template_the_policy_admits_renders_pods_the_api_server_accepts_with_the_plans_gpus_and_no_more(
        cluster: LocalCluster, admission_namespace: str) -> None:
    started_cpu_s, started_s = time.process_time(), time.monotonic()
    namespace, server, values = admission_namespace, Server(cluster), chart_values()
    policy = chart_policy(values)
    level = values["operator"]["podTemplatePolicy"]["podSecurityLevel"]
    labels = json.loads(cluster.kubectl("get", "namespace", namespace, "-o", "json").stdout)["metadata"].get("labels", {})
    granted = policy.grants_for(labels)
    assert not granted, f"the breach reader spells the rules of no grant; the chart's values grant {sorted(granted)} here"
    schemas = definitions(server.openapi())
    plan_gpus = {"prefill": 1, "decode": 2, "router": 0}

    bare_spec = parse_topology_spec(resource(namespace, {}, "podTemplate")["spec"])
    bare: dict[str, dict[str, Any]] = {}
    for role, pod in _pods(_rendered(bare_spec, namespace), namespace):
        code, reason, answer = server.dry_run(f"/api/v1/namespaces/{namespace}/pods", pod)
        assert code == 0, f"the plan's own {role} pod is refused under {level}: {reason}: {answer.get('message')}"
        bare[role] = answer
        assert breaches(answer, plan_gpus=plan_gpus[role], bare=answer) == []

    outcomes: Counter[str] = Counter({what: 0 for what in OUTCOMES})
    refusals: Counter[str] = Counter()
    defects: list[str] = []
    accepted_fields: Counter[str] = Counter()
    refused_fields: Counter[str] = Counter()

    @settings(max_examples=TEMPLATES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(template=pod_templates(schemas), place=st.sampled_from(PLACES))
    def one(template: dict[str, Any], place: str) -> None:
        outcomes["templates"] += 1
        outside = off_schema(template, schemas["io.k8s.api.core.v1.PodTemplateSpec"], schemas)
        if outside:
            defects.append(f"the strategy drew fields the schema does not name {outside}: {json.dumps(template)}")
        obj = resource(namespace, template, place)
        code, reason, answer = server.dry_run(f"/apis/servingtopology.io/v1alpha1/namespaces/{namespace}/servingtopologies", obj)
        if code:
            outcomes["invalid spec: refused by the CRD"] += 1
            return
        try:
            stored = answer["spec"]
            spec = parse_topology_spec(stored)        # what the operator reads: the stored (pruned, defaulted) spec
        except SpecError as exc:
            outcomes["invalid spec: the CRD admits, the operator's parse refuses"] += 1
            defects.append(f"the CRD admits what the operator's parse refuses ({exc}): {json.dumps(template)}")
            return
        refused = pod_template_refusals(template_inputs(spec), granted=granted)
        if refused:
            outcomes["policy-refused (PodTemplateRefused)"] += 1
            refused_fields.update({re.sub(r"\[\d+\]", "", r.field.removeprefix(f"spec.{place}.")) for r in refused})
            unnamed = [r.field for r in refused if not r.field.startswith(f"spec.{place}.") or not names_a_field(r.field, answer["spec"])]
            if unnamed:
                defects.append(f"refusals name no field of the template {unnamed}: {json.dumps(template)}")
            return
        outcomes["admitted"] += 1
        objects = _rendered(spec, namespace)
        if any(oversized(o) for o in objects):
            outcomes["admitted: ObjectTooLarge"] += 1
            return
        try:
            refusal = next((r for o in objects if (r := server.operator.admit(o)) is not None), None)
        except ClusterError as exc:
            defects.append(f"the operator's dry-run met an error it would retry for ever, not a refusal ({exc}): {json.dumps(template)}")
            return
        if refusal is not None:
            outcomes["admission-refused: rendered objects"] += 1
            refusals[f"{refusal.object.split('/')[0]} {refusal.reason} ({refusal.code}): {refusal.message[:150]}"] += 1
            return
        for role, pod in _pods(objects, namespace):
            code, reason, answer = server.dry_run(f"/api/v1/namespaces/{namespace}/pods", pod)
            if code:
                outcomes["admission-refused: pods"] += 1
                refusals[f"Pod {reason}" + (" (PodSecurity)" if "PodSecurity" in str(answer.get("message")) else "")] += 1
                return
            found = breaches(answer, plan_gpus=plan_gpus[role], bare=bare[role])
            if found:
                defects.append(f"{role} pod accepted by the API server holds {found}: template at {place} {json.dumps(template)}")
        outcomes["dry-run accepted"] += 1
        accepted_fields.update(_fields(stored[place.split(".")[0]] if place == "podTemplate" else stored["rolePodTemplates"][place.split(".")[1]]))

    one()
    cpu_s, wall_s = time.process_time() - started_cpu_s, time.monotonic() - started_s
    print(f"\n{outcomes['templates']} templates from the API server's PodSpec schema ({len(schemas)} definitions), Pod Security "
          f"{level}, grants {sorted(granted) or 'none'}; {cpu_s:.1f} CPU s ({wall_s:.0f} s wall); "
          f"dry-runs by the operator's path {dict(server.operator.dry_runs)}")
    for what, count in sorted(outcomes.items()):
        print(f"  {what}: {count}")
    for what, count in refusals.most_common():
        print(f"    {what}: {count}")
    print(f"  the fields refused (templates refused for each): {dict(refused_fields.most_common(25))}")
    print(f"  the fields of the accepted templates as stored (templates holding each): {dict(accepted_fields.most_common(40))}")
    assert not defects, f"{len(defects)} defects:\n" + "\n".join(defects[:10])
    assert outcomes["templates"] >= TEMPLATES
    # The property can fail only if each branch is taken: refusals, acceptances and the server's own refusals all occur.
    for what in ("policy-refused (PodTemplateRefused)", "dry-run accepted"):
        assert outcomes[what] >= 25, (what, outcomes)


def test_the_field_path_reader_finds_what_a_refusal_names() -> None:
    spec = {"podTemplate": {"spec": {"containers": [{"name": "x", "resources": {"limits": {"nvidia.com/gpu": "7"}}}]}}}
    assert names_a_field('spec.podTemplate.spec.containers[0].resources.limits["nvidia.com/gpu"]', spec)
    assert names_a_field("spec.podTemplate.spec.containers[0].securityContext", spec)       # its parent is there
    assert not names_a_field("spec.podTemplate.spec.containers[1].securityContext.privileged", spec)
    assert not names_a_field("spec.podTemplate.spec.volumes[0].hostPath", spec)


def test_the_breach_reader_sees_the_high_case() -> None:
    """The property can fail: the issue's 7-GPU sidecar at a system priority, as a pod, breaks it."""
    bare = {"spec": {"containers": [{"name": "engine", "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}}], "priority": 0}}
    hostile = {"spec": {**bare["spec"], "priorityClassName": "system-node-critical", "priority": 2000001000,
                        "containers": [*bare["spec"]["containers"], {"name": "miner", "resources": {"limits": {GPU: "7"}, "requests": {GPU: "7"}}}]}}
    assert breaches(hostile, plan_gpus=1, bare=bare) == [
        "8 GPUs in requests where the plan gives 1", "8 GPUs in limits where the plan gives 1", f"miner: requests {GPU}",
        f"miner: limits {GPU}", "priorityClassName 'system-node-critical' where the plan's pod has None",
        "priority 2000001000 where the plan's pod has 0"]


def test_a_template_the_typed_schema_cannot_hold_is_an_admission_refusal_not_an_outage(cluster: LocalCluster, admission_namespace: str) -> None:
    """Two environment variables of one name in a sidecar: the CRD and the policy admit it, and the API server answers the
    server-side apply of the rendered Deployment 500 "failed to create typed patch object" (env is a list keyed by name),
    every time: the operator's dry-run reads it as a refusal (AdmissionRefused, remembered), not as an outage to retry."""
    namespace, server = admission_namespace, Server(cluster)
    sidecar = {"name": "sidecar", "image": "busybox:1.36", "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}
    obj = resource(namespace, {"spec": {"containers": [sidecar]}}, "podTemplate")
    code, reason, stored = server.dry_run(f"/apis/servingtopology.io/v1alpha1/namespaces/{namespace}/servingtopologies", obj)
    assert code == 0, (reason, stored)
    spec = parse_topology_spec(stored["spec"])
    assert pod_template_refusals(template_inputs(spec), granted=chart_policy(chart_values()).pod_grants) == []
    deployment = next(o for o in _rendered(spec, namespace) if o["kind"] == "Deployment")
    refusal = server.operator.admit(deployment)
    assert refusal is not None and refusal.code == 500 and "failed to create typed patch object" in refusal.message, refusal
    assert 'duplicate entries for key [name="A"]' in refusal.message, refusal
    assert server.operator.admit(deployment) == refusal and server.operator.dry_runs == {"refused": 1}   # remembered
    print(f"\n{refusal}")


def test_the_schema_reader_sees_a_field_the_schema_does_not_name() -> None:
    schemas = {"P": {"properties": {"spec": {"allOf": [{"$ref": "#/components/schemas/S"}]}}},
               "S": {"properties": {"containers": {"type": "array", "items": {"$ref": "#/components/schemas/C"}}}},
               "C": {"properties": {"name": {"type": "string"}, "resources": {"type": "object", "additionalProperties": {"type": "string"}}}}}
    assert off_schema({"spec": {"containers": [{"name": "a", "resources": {"x": "1"}}]}}, schemas["P"], schemas) == []
    assert off_schema({"spec": {"containers": [{"name": "a", "devices": []}], "hostX": 1}}, schemas["P"], schemas) == [
        ".spec.containers[].devices", ".spec.hostX"]
