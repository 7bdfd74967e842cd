"""kopf's storages as the operator configures them: a spec above 256 KiB keeps its diff base under the API server's
annotation limit, every change is still a change under `spec`, nothing else is, and a record kopf's own storage wrote
before the upgrade reads as unchanged but for the generation, which makes an edit that reverts a pending one a change;
a handler's requeue delay holds for its generation only, so an edit runs at once."""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
from typing import Any

import kopf
from fake_cluster import FakeCluster
from kopf._cogs.structs import bodies, diffs, patches
from kopf._core.actions import progression
from test_handlers import registered, runtime
from test_reconcile import topology

from servingtopology.operator.entry.kopf_storage import DIGEST_PREFIX, RECORD_LIMIT_BYTES, compact_essence
from servingtopology.operator.render.object_size import TOTAL_ANNOTATION_BYTES, annotation_bytes

ENV_VALUE_CHARS = 32_768     # the CRD's most for one environment value
PREFIX = "kopf.servingtopology.io"


def configured() -> kopf.OperatorSettings:
    """The settings after the operator's start-up handler ran."""
    settings = kopf.OperatorSettings()
    registered(runtime(FakeCluster()), "register.<locals>.configure")(settings=settings)
    return settings


def large(values: int = 10, *, last: str = "x") -> dict[str, Any]:
    """A ServingTopology whose pod template carries `values` environment values of 32 KiB (10: a 321 KiB spec)."""
    body = topology()
    env = [{"name": f"BLOB_{i}", "value": ("x" * (ENV_VALUE_CHARS - 1)) + (last if i == values - 1 else "x")} for i in range(values)]
    body["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "engine", "env": env}]}}
    body["metadata"].update(uid="u1", resourceVersion="1", annotations={"example.com/team": "a"})
    return body


def stored(settings: kopf.OperatorSettings, raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with the diff base kopf would write after handling it."""
    body = bodies.Body(raw)
    patch = patches.Patch()
    storage = settings.persistence.diffbase_storage
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    out = copy.deepcopy(raw)
    out["metadata"]["annotations"] = {**out["metadata"]["annotations"], **patch["metadata"]["annotations"]}
    return out


def diff_of(settings: kopf.OperatorSettings, handled: dict[str, Any], now: dict[str, Any]) -> diffs.Diff:
    """The diff kopf's change detection computes for `now` against the diff base stored with `handled`."""
    body = bodies.Body({**now, "metadata": {**now["metadata"], "annotations": {**now["metadata"]["annotations"],
                       **{k: v for k, v in handled["metadata"]["annotations"].items() if k.startswith(PREFIX)}}}})
    storage, progress = settings.persistence.diffbase_storage, settings.persistence.progress_storage
    old, new = storage.fetch(body=body), storage.build(body=body)
    assert old is not None
    return diffs.diff(progress.clear(essence=old), progress.clear(essence=new))


def test_a_321_kib_spec_keeps_the_diff_base_and_all_annotations_under_the_api_servers_limit() -> None:
    raw = large()
    assert len(json.dumps(raw["spec"])) > 320 * 1024
    annotations = stored(configured(), raw)["metadata"]["annotations"]
    record = annotations[f"{PREFIX}/last-handled-configuration"]
    assert len(record) < 4096, len(record)
    assert annotation_bytes(annotations) < TOTAL_ANNOTATION_BYTES


def test_an_edit_deep_in_a_large_spec_is_a_change_under_spec_and_nothing_else_is() -> None:
    settings = configured()
    handled = stored(settings, large())
    assert not diff_of(settings, handled, large())                  # the same object: no change
    edited = diff_of(settings, handled, large(last="y"))           # one character of the tenth 32 KiB value
    assert edited and diffs.reduce(edited, ("spec",)), edited
    rate = large()
    rate["spec"]["workload"]["arrivalRate"] = 41.0
    changed = diff_of(settings, handled, rate)
    assert [(op, field, old, new) for op, field, old, new in changed] == [("change", ("spec", "workload", "arrivalRate"), 40, 41.0)]
    relabelled = large()
    relabelled["metadata"]["annotations"]["example.com/team"] = "b"
    assert not diffs.reduce(diff_of(settings, handled, relabelled), ("spec",))   # kopf's update handlers watch spec only


def test_a_diff_base_written_before_the_upgrade_reads_as_unchanged() -> None:
    legacy = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX)
    raw = topology()
    raw["metadata"].update(uid="u1", resourceVersion="1", annotations={"example.com/note": "n" * 500})
    body = bodies.Body(raw)
    patch = patches.Patch()
    legacy.store(body=body, patch=patch, essence=legacy.build(body=body))
    handled = {**raw, "metadata": {**raw["metadata"], "annotations": {**raw["metadata"]["annotations"], **patch["metadata"]["annotations"]}}}
    assert list(diff_of(configured(), handled, raw)) == [("add", ("metadata", "generation"), None, 1)]   # one pass, nothing else


def test_an_edit_that_reverts_a_pending_one_is_still_a_change() -> None:
    settings = configured()
    handled = stored(settings, large())      # generation 1: the last essence kopf stored (a pass of generation 2 still waits)
    reverted = large()
    reverted["metadata"]["generation"] = 3   # the spec of generation 1 again
    assert list(diff_of(settings, handled, reverted)) == [("change", ("metadata", "generation"), 1, 3)]


def test_thousands_of_short_annotations_still_give_a_bounded_record_that_sees_their_changes() -> None:
    settings = configured()
    raw = topology()
    raw["metadata"].update(uid="u1", resourceVersion="1", annotations={f"example.com/a{i}": "v" for i in range(3000)})
    handled = stored(settings, raw)
    record = handled["metadata"]["annotations"][f"{PREFIX}/last-handled-configuration"]
    assert len(record) < RECORD_LIMIT_BYTES
    assert json.loads(record)["metadata"]["annotations"].startswith(DIGEST_PREFIX)
    assert not diff_of(settings, handled, raw)
    edited = copy.deepcopy(raw)
    edited["metadata"]["annotations"]["example.com/a7"] = "w"
    assert diff_of(settings, handled, edited)


def test_a_record_compacts_to_itself() -> None:
    essence = {"spec": large()["spec"], "metadata": {"annotations": {f"k{i}": "v" * i for i in range(200)}}}
    once = compact_essence(essence)
    assert compact_essence(once) == once and compact_essence(compact_essence(essence)) == once


def _handler_state(settings: kopf.OperatorSettings, raw: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """kopf's view of the update handler's progress on `raw`: whether it waits (is not run on this event), and the record
    kopf would write back for it unchanged."""
    async def read() -> tuple[bool, dict[str, Any]]:
        record = settings.persistence.progress_storage.fetch(key="reconcile-update", body=bodies.Body(raw))
        state = progression.HandlerState.from_storage(record, basetime=progression._get_basetime())
        assert state.sleeping != state.awakened
        return state.sleeping, state.as_in_storage()
    return asyncio.run(read())


def test_a_requeue_holds_for_its_generation_and_an_edit_wakes_the_handler_at_once() -> None:
    settings = configured()
    raw = topology()
    raw["metadata"].update(uid="u1", resourceVersion="7", generation=2, annotations={})
    now = datetime.datetime.now(datetime.UTC)
    record = {"started": progression.format_iso8601(now), "delayed": progression.format_iso8601(now + datetime.timedelta(seconds=15)),
              "purpose": "update", "retries": 1, "success": False, "failure": False}     # as kopf writes a Requeue(15)
    patch = patches.Patch()
    settings.persistence.progress_storage.store(key="reconcile-update", record=record, body=bodies.Body(raw), patch=patch)
    raw["metadata"]["annotations"] = dict(patch["metadata"]["annotations"])

    sleeping, as_stored = _handler_state(settings, raw)    # the pass's own status write: still waits its 15 s
    assert sleeping and as_stored == record                # and reads back as kopf wrote it: no patch to rewrite it
    edited = copy.deepcopy(raw)
    edited["metadata"].update(generation=3, resourceVersion="8")
    sleeping, as_stored = _handler_state(settings, edited)  # the user's edit: runs on this event
    assert not sleeping and as_stored == {k: v for k, v in record.items() if k != "delayed"}
