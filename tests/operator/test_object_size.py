"""Rendered objects over the API server's size limits are refused before anything is applied, naming the field that
grew them (ObjectTooLarge), instead of a raw 1 KB apply error retried for ever."""

from __future__ import annotations

from typing import Any

from fake_cluster import FakeCluster
from test_tenancy import cond, run, topology

from servingtopology.operator.render.object_size import MAX_OBJECT_BYTES, TOTAL_ANNOTATION_BYTES, annotation_bytes, oversized


def annotations(count: int, size: int) -> dict[str, str]:
    return {f"example.com/a{i}": "x" * size for i in range(count)}


def test_64_annotations_of_4_kib_fit_the_crd_but_not_the_api_server_and_nothing_is_applied() -> None:
    many = annotations(64, 4096)         # within the CRD: 64 entries of at most 4,096 characters
    assert annotation_bytes(many) > TOTAL_ANNOTATION_BYTES
    obj, cluster = topology(podTemplate={"metadata": {"annotations": many}}), FakeCluster()
    out = run(obj, cluster)
    ready = cond(obj, "Ready")
    assert (ready["reason"], out.error) == ("ObjectTooLarge", "ObjectTooLarge")
    assert "spec.template.metadata.annotations" in ready["message"] and "262,144" in ready["message"]
    assert "spec.podTemplate" in ready["message"]
    assert cluster.objects == {} and cluster.applies == 0
    assert [e.reason for e in cluster.events].count("ObjectTooLarge") == 1
    run(obj, cluster)                    # the next pass says the same, with no new Event and no apply
    assert [e.reason for e in cluster.events].count("ObjectTooLarge") == 1 and cluster.applies == 0


def test_annotations_within_the_limit_are_applied() -> None:
    obj, cluster = topology(podTemplate={"metadata": {"annotations": annotations(50, 4096)}}), FakeCluster()
    run(obj, cluster)
    assert cluster.objects and cond(obj, "Ready")["reason"] != "ObjectTooLarge"


def test_an_object_over_the_size_limit_names_the_field_that_holds_its_bytes() -> None:
    env = [{"name": f"V{i}", "value": "y" * 32_768} for i in range(60)]
    deployment: dict[str, Any] = {"kind": "Deployment", "metadata": {"name": "d"},
                                  "spec": {"template": {"spec": {"containers": [{"name": "engine", "env": env}]}}}}
    (why,) = oversized(deployment)
    assert "Deployment/d" in why and "spec.template.spec.containers[0].env" in why and f"{MAX_OBJECT_BYTES:,}" in why
    assert oversized({"kind": "Service", "metadata": {"name": "s", "annotations": {"a": "b"}}}) == []
