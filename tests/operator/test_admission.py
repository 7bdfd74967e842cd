"""The API server's admission as the last check (issue #38 item 2): every rendered object goes through a server-side
dry-run before the first apply; a refusal is Ready=False AdmissionRefused with the server's reason and message only,
nothing of the pass is applied or pruned, and the verdict is remembered per rendered object, so an unchanged refused
object is not dry-run again every pass (checked again with back-off, or at once when the spec changes it)."""

from __future__ import annotations

import copy
import json

import pytest
from fake_cluster import FakeCluster
from test_reconcile import REPLICAS, R, ScriptedPlanner, bump, cond, decision, run, topology

from servingtopology.operator.cluster.admission import (
    MESSAGE_CHARS,
    AdmissionMemo,
    AdmissionRefusal,
    is_refusal,
    object_digest,
    recheck_after_s,
    refusal_from_answer,
)

ENGINE = f"llama-8b-{R}-aggregated"
INVALID = ("Invalid", 'Deployment.apps "x" is invalid: spec.template.spec.containers[0].env[0].name: Invalid value: "A=B": '
                      "a valid environment variable name must consist only of printable ASCII characters other than '='")


def test_a_refused_object_is_named_with_the_server_s_reason_and_nothing_of_the_pass_is_applied() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    cluster.admission_refusals[ENGINE] = INVALID
    out = run(obj, cluster, planner)
    assert cluster.objects == {} and cluster.applies == 0 and out.applied == () and out.pruned == ()
    assert out.error == "AdmissionRefused"
    ready = cond(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AdmissionRefused")
    assert ready["message"].startswith(f"Deployment/{ENGINE}: Invalid (422): {INVALID[1]}. The API server refused what 4×TP2 "
                                       "renders (a server-side dry-run before anything is applied): nothing was applied")
    assert "Traceback" not in ready["message"] and "HTTP response" not in ready["message"]
    assert [e.type for e in cluster.events if e.reason == "AdmissionRefused"] == ["Warning"]
    assert {r.kind for r in cluster.dry_runs} >= {"Deployment", "Service"}    # every object checked, not only the first
    for minute in (1, 2, 3):     # the same refusal: no Event again, nothing applied, and the pass completes (no retry storm)
        out = run(obj, cluster, planner, minutes=minute)
        assert out.error == "AdmissionRefused" and out.requeue_after_s is None
    assert [e.reason for e in cluster.events].count("AdmissionRefused") == 1 and cluster.applies == 0


def test_running_workloads_are_left_as_they_are_when_a_spec_edit_renders_a_refused_object() -> None:
    obj, cluster, planner = topology(), FakeCluster(), ScriptedPlanner(decision(REPLICAS))
    run(obj, cluster, planner)
    running, applies = copy.deepcopy(cluster.objects), cluster.applies
    bump(obj, engine={**obj["spec"]["engine"], "extraArgs": ["--enforce-eager"]})
    cluster.admission_refusals[ENGINE] = INVALID
    run(obj, cluster, planner, minutes=1)
    assert cluster.objects == running and cluster.applies == applies   # nothing applied, nothing pruned
    assert cond(obj, "Ready")["reason"] == "AdmissionRefused"
    del cluster.admission_refusals[ENGINE]                             # the cause is fixed: the next pass applies
    run(obj, cluster, planner, minutes=2)
    assert cond(obj, "Ready")["reason"] == "WorkloadsReady" and cluster.applies > applies


def test_the_memo_keeps_a_refusal_for_its_back_off_and_an_admission_until_the_object_changes() -> None:
    memo, refusal = AdmissionMemo(), AdmissionRefusal("Deployment/x", 422, *INVALID)
    assert memo.standing("a", now_s=0.0) == (False, None)                     # never seen: dry-run it
    memo.record("a", refusal, now_s=0.0)
    assert memo.standing("a", now_s=59.0) == (True, refusal)                  # not again within its back-off
    assert memo.standing("a", now_s=60.0) == (False, None)                    # then once more
    memo.record("a", refusal, now_s=60.0)
    assert memo.standing("a", now_s=179.0) == (True, refusal) and memo.standing("a", now_s=180.0) == (False, None)
    memo.record("b", None, now_s=0.0)
    assert memo.standing("b", now_s=1e9) == (True, None)                      # admitted: until the object changes
    memo.record("a", None, now_s=200.0)
    memo.record("a", refusal, now_s=300.0)
    assert memo.standing("a", now_s=359.0) == (True, refusal)                 # a refusal after an admission starts at 60 s


@pytest.mark.parametrize(("refusals", "seconds"), [
    (1, 60.0),       # the first refusal stands a minute
    (2, 120.0),
    (4, 480.0),
    (5, 900.0),      # capped at 15 min
    (50, 900.0),
])
def test_a_refusal_is_checked_again_with_bounded_back_off(refusals: int, seconds: float) -> None:
    assert recheck_after_s(refusals) == seconds


def test_the_memo_is_bounded() -> None:
    memo = AdmissionMemo(entries=3)
    for key in "abcd":
        memo.record(key, None, now_s=0.0)
    assert memo.standing("a", now_s=0.0) == (False, None) and memo.standing("d", now_s=0.0) == (True, None)


def test_the_digest_ignores_key_order_and_sees_every_value() -> None:
    one = {"kind": "Deployment", "spec": {"replicas": 1, "template": {"a": 1, "b": [1, 2]}}}
    assert object_digest(one) == object_digest(json.loads(json.dumps(one, sort_keys=True)))
    assert object_digest(one) != object_digest({**one, "spec": {**one["spec"], "replicas": 2}})


def test_a_refusal_shows_the_status_message_only_never_a_page_or_headers() -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
              "message": "admission webhook \"deny.example.com\" denied the request:\n  no   GPUs here"}
    got = refusal_from_answer("Deployment/x", code=403, http_reason="Forbidden", body=json.dumps(status))
    assert str(got) == 'Deployment/x: Forbidden (403): admission webhook "deny.example.com" denied the request: no GPUs here'
    page = refusal_from_answer("Deployment/x", code=400, http_reason="Bad Request", body="<html>proxy says no</html>")
    assert str(page) == "Deployment/x: Bad Request (400): 400 Bad Request"
    long = refusal_from_answer("D/x", code=422, http_reason="", body=json.dumps({**status, "message": "x" * 5000}))
    assert len(long.message) == MESSAGE_CHARS


def test_only_a_verdict_on_the_object_is_a_refusal_a_server_error_is_not() -> None:
    def status(code: int, message: str) -> str:
        return json.dumps({"kind": "Status", "status": "Failure", "code": code, "reason": "X", "message": message})

    assert all(is_refusal(code=code, body=status(code, "no")) for code in (400, 403, 413, 422))
    typed = "Internal error occurred: failed to create typed patch object (apps/v1, Kind=Deployment) d/x: duplicate entries"
    assert is_refusal(code=500, body=status(500, typed))                    # TypedPatchRefused: the same answer every time
    assert not is_refusal(code=500, body=status(500, "etcdserver: request timed out"))
    assert not is_refusal(code=500, body=f"<html>{typed}</html>")          # not the API server's Status
    assert not is_refusal(code=503, body=status(503, typed)) and not is_refusal(code=500, body=None)
