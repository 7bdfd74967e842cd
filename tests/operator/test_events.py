"""Events the operator writes: the core/v1 view kubectl reads must carry their time."""

from __future__ import annotations

from datetime import UTC, datetime

from servingtopology.operator.cluster.cluster import build_event

OWNER = {"metadata": {"name": "llama", "namespace": "team-a", "uid": "u-1"}}


def test_event_carries_first_and_last_timestamp_for_kubectl_sorting() -> None:
    now = datetime(2026, 12, 1, 0, 30, 5, 123456, tzinfo=UTC)
    event = build_event(OWNER, type="Normal", reason="PlanApplied", message="m", now=now, instance="op-1")
    assert event["eventTime"] == "2026-12-01T00:30:05.123456Z"
    assert event["apiVersion"] == "v1"
    assert event["firstTimestamp"] == "2026-12-01T00:30:05Z"
    assert event["lastTimestamp"] == "2026-12-01T00:30:05Z"
    assert event["count"] == 1
    # eventTime set: the API server requires these on create
    assert event["reportingComponent"] and event["reportingInstance"] and event["action"] == "PlanApplied"


def test_later_events_sort_after_earlier_ones_by_last_timestamp() -> None:
    times = [datetime(2026, 12, 1, 0, m, s, tzinfo=UTC) for m, s in ((5, 59), (6, 0), (10, 1))]
    stamps = [build_event(OWNER, type="Normal", reason="R", message="m", now=t, instance="op")["lastTimestamp"]
              for t in reversed(times)]
    assert sorted(stamps) == list(reversed(stamps))


def test_event_note_is_cut_to_the_api_limit() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    event = build_event(OWNER, type="Warning", reason="R", message="x" * 5000, now=now, instance="op")
    assert len(event["message"]) == 1024
    assert event["involvedObject"]["name"] == "llama" and event["involvedObject"]["uid"] == "u-1"
