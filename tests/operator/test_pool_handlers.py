"""The ServingPool handlers' kopf wiring: a pass whose API requests fail sets ApiUnavailable beside the pool's last
Planned condition and asks kopf to run it again after a bounded back-off (1, 2, 4, 8, then 15 s), logged once without a
traceback; the next completed pass plans the pool again and drops the condition."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from fake_cluster import FakeCluster
from test_handlers import Patch, runtime
from test_pool_pass import NODES, _member, _pool

from servingtopology.operator.cluster.cluster import ClusterError
from servingtopology.operator.entry.handlers import DECISIONS_LOGGER
from servingtopology.operator.entry.pool_handlers import API_RETRY_S, register_pool


class Outage(FakeCluster):
    """A cluster seam whose API server is down while `down` is set: every list fails as KubeCluster's does."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.nodes = NODES

    def list_nodes(self) -> list[Any] | None:
        if self.down:
            raise ClusterError("discovery: HTTPSConnectionPool(host='127.0.0.1'): connection refused")
        return super().list_nodes()


def pool_timer(cluster: Outage) -> Any:
    """The registered pool timer, callable like kopf calls it, and the index it reads members from."""
    registry = kopf.OperatorRegistry()
    index = register_pool(registry, runtime(cluster), timer_interval_s=30)
    for member in (_member("chat", 10.0, priority=2), _member("batch", 4.0)):
        index.seen("ADDED", member)
    fn = next(h.fn for h in registry._spawning.get_all_handlers() if h.id == "pool-timer")
    return lambda body, patch: asyncio.run(fn(body=body, patch=patch, logger=logging.getLogger("test")))


def test_an_api_outage_is_a_condition_and_a_bounded_back_off_not_kopfs_60_s_and_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Outage()
    timer = pool_timer(cluster)
    body = _pool()
    body["metadata"]["uid"] = "pool-uid"
    patch = Patch()
    timer(body, patch)
    planned = patch.status["conditions"]
    assert [c["reason"] for c in planned] == ["PoolPlanned"]
    body["status"] = patch.status

    cluster.down = True
    delays = []
    with caplog.at_level(logging.DEBUG, logger=DECISIONS_LOGGER):
        for _ in range(7):
            patch = Patch()
            with pytest.raises(kopf.TemporaryError) as raised:
                timer(body, patch)
            delays.append(raised.value.delay)
            conditions = {c["type"]: c for c in patch.status["conditions"]}
            assert conditions["Planned"] == planned[0]                  # the last plan's condition stays as it was
            assert (conditions["Reconciled"]["status"], conditions["Reconciled"]["reason"]) == ("False", "ApiUnavailable")
            assert "connection refused" in conditions["Reconciled"]["message"]
    assert delays == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0] and max(delays) == API_RETRY_S[-1]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and loud[0].exc_info is None, [r.getMessage() for r in loud]

    cluster.down = False
    patch = Patch()
    with caplog.at_level(logging.INFO, logger=DECISIONS_LOGGER):
        timer(body, patch)
    assert [c["type"] for c in patch.status["conditions"]] == ["Planned"]
    assert any("completed again after 7 failed passes" in r.getMessage() for r in caplog.records)
    cluster.down = True
    with pytest.raises(kopf.TemporaryError) as raised:   # a new outage starts the back-off again
        timer(body, Patch())
    assert raised.value.delay == 1.0
