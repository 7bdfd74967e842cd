"""The pod template: strategic-merge rules, the defaults engines need, and templates the API refuses by field."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from cases import blueprint

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.render.manifests import build_workloads, engine_host_resources
from servingtopology.operator.render.pod_template import merge_pod_template
from servingtopology.planner.layout import Engine, Layout, Parallelism, RoleLayout
from servingtopology.spec import SpecError

RENDERED: dict[str, Any] = {
    "metadata": {"labels": {"servingtopology.io/role": "aggregated"}, "annotations": {"a": "1"}},
    "spec": {
        "containers": [{"name": "engine", "command": ["vllm", "serve"], "env": [{"name": "X", "value": "1"}],
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                        "resources": {"requests": {"cpu": "6", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"gpu": "h100"},
    },
}


def test_env_volumes_and_containers_merge_by_name_and_maps_merge_key_by_key() -> None:
    template = {
        "metadata": {"labels": {"team": "a"}, "annotations": {"b": "2"}},
        "spec": {
            "containers": [
                {"name": "engine", "env": [{"name": "X", "value": "2"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
                 "volumeMounts": [{"name": "cache", "mountPath": "/models"}], "resources": {"requests": {"cpu": "12", "rdma/ib": "1"}}},
                {"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]},
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
                        {"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
                            {"key": "nvidia.com/gpu", "operator": "Exists"}],
            "nodeSelector": {"zone": "z1"},
            "serviceAccountName": "engines",
        },
    }
    out = merge_pod_template(RENDERED, template)
    assert out["metadata"] == {"labels": {"servingtopology.io/role": "aggregated", "team": "a"}, "annotations": {"a": "1", "b": "2"}}
    engine, sidecar = out["spec"]["containers"]
    assert engine["command"] == ["vllm", "serve"] and sidecar["name"] == "sidecar"
    assert engine["env"][0] == {"name": "X", "value": "2"} and engine["env"][1]["name"] == "HF_TOKEN"
    assert [m["mountPath"] for m in engine["volumeMounts"]] == ["/dev/shm", "/models"]
    assert engine["resources"] == {"requests": {"cpu": "12", "nvidia.com/gpu": "1", "rdma/ib": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    assert out["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "64Gi" and out["spec"]["volumes"][1]["name"] == "cache"
    assert len(out["spec"]["tolerations"]) == 2  # the template's are added; the duplicate is not repeated
    assert out["spec"]["nodeSelector"] == {"gpu": "h100", "zone": "z1"}
    assert out["spec"]["serviceAccountName"] == "engines"
    assert RENDERED["spec"]["containers"][0]["env"] == [{"name": "X", "value": "1"}]  # inputs untouched


def test_the_engine_command_cannot_be_replaced_through_the_template() -> None:
    with pytest.raises(ValueError, match="args is the plan's"):
        merge_pod_template(RENDERED, {"spec": {"containers": [{"name": "engine", "args": ["--foo"]}]}})


def _spec(**extra: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
            "hardware": {"gpu": "h100_sxm", "maxGPUs": 8}, "workload": {"arrivalRate": 5, "inputTokens": 1000, "outputTokens": 100},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}}, **extra}


@pytest.mark.parametrize(("template", "field", "words"), [
    # the operator's selector labels
    ({"metadata": {"labels": {"servingtopology.io/role": "x"}}}, "spec.podTemplate.metadata.labels", "the operator's"),
    # the engine's command line belongs to the plan
    ({"spec": {"containers": [{"name": "engine", "args": ["--x"]}]}}, "spec.podTemplate.spec.containers.0", "extraArgs"),
    # a sidecar without an image could never start
    ({"spec": {"containers": [{"name": "side"}]}}, "spec.podTemplate.spec.containers.0", "needs an image"),
    # a request that is not a quantity
    ({"spec": {"containers": [{"name": "engine", "resources": {"requests": {"memory": "lots"}}}]}},
     "spec.podTemplate.spec.containers.0.resources.requests.memory", "quantity"),
    # a field a pod spec does not have
    ({"spec": {"hostNetwrk": True}}, "spec.podTemplate.spec.hostNetwrk", "unknown field"),
])
def test_a_bad_template_is_refused_naming_the_field(template: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_topology_spec(_spec(podTemplate=template))
    assert any(f == field and words in m for f, m in caught.value.errors), caught.value.errors


def test_engine_pods_get_host_resources_no_token_and_probes_and_templates_per_role_validate() -> None:
    bp = blueprint(Engine.VLLM, Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(2, Parallelism(tp=1))),
                   pod_template={"spec": {"containers": [{"name": "engine", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}],
                                          "priorityClassName": "llm", "imagePullSecrets": [{"name": "regcred"}]}},
                   role_templates={"decode": {"spec": {"nodeSelector": {"pool": "decode"}}},
                                   "router": {"spec": {"imagePullSecrets": [{"name": "regcred"}]}}})
    deployments = {d["metadata"]["labels"]["servingtopology.io/role"]: d for d in build_workloads(bp) if d["kind"] == "Deployment"}
    for role in ("prefill", "decode"):
        pod = deployments[role]["spec"]["template"]
        spec = pod["spec"]
        engine = spec["containers"][0]
        gpus = int(engine["resources"]["limits"]["nvidia.com/gpu"])
        assert {k: engine["resources"]["requests"][k] for k in ("cpu", "memory")} == engine_host_resources(bp, gpus)
        assert spec["automountServiceAccountToken"] is False
        assert all(engine[p]["httpGet"]["path"] == "/health" for p in ("startupProbe", "readinessProbe", "livenessProbe"))
        assert engine["startupProbe"]["periodSeconds"] * engine["startupProbe"]["failureThreshold"] >= 1800  # weights load
        assert {"name": "NCCL_DEBUG", "value": "WARN"} in engine["env"]
        assert spec["priorityClassName"] == "llm" and spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec.get("nodeSelector", {}).get("pool") == ("decode" if role == "decode" else None)
        assert pod["metadata"]["labels"]["servingtopology.io/role"] == role
    router = deployments["router"]["spec"]["template"]["spec"]
    assert router["imagePullSecrets"] == [{"name": "regcred"}] and "priorityClassName" not in router  # engine template only
    for obj in build_workloads(bp):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
