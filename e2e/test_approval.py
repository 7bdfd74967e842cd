"""Approving a proposal (issue 29) on the real API server: a DryRun resource shows its proposal's id and predicted figures
in Ready and in `kubectl get`; `kubectl annotate stopo NAME servingtopology.io/approve=<id>` with an id not shown is refused
(Approved=False, ProposalNotShown, one Warning, nothing applied, the annotation removed); with the current id exactly that
proposal is applied (its layout, its engine Deployments) and stays applied; Auto with `policy.approval: Required` waits for
the same. An approval armed for a future id (p2 while p1 is current) never applies p2 once an edit makes it (issue 38).
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .stack import Operator
from .tables import table

APPROVE = "servingtopology.io/approve"


def _apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))


def _annotate(cluster: LocalCluster, namespace: str, name: str, proposal_id: str) -> None:
    cluster.kubectl("annotate", "stopo", name, "-n", namespace, "--overwrite", f"{APPROVE}={proposal_id}")


def _proposal(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def proposed() -> bool:
        found[:] = [kube.topology(namespace, name).get("status", {}).get("proposal") or {}]
        return bool(found[0].get("id"))

    wait_until(proposed, timeout_s=180, what=f"{name}: a proposal with an id")
    return found[0]


def test_a_dry_run_proposal_is_applied_only_by_its_current_id(cluster: LocalCluster, operator: Operator, kube: Kube,
                                                              namespace: str) -> None:
    _apply(cluster, topology("dry", namespace, prometheus_url=cluster.prometheus_url, mode="DryRun", arrival_rate=4))
    proposal = _proposal(kube, namespace, "dry")
    ready = kube.condition(namespace, "dry", "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "AwaitingApproval"), ready
    assert f"proposal {proposal['id']} ({proposal['layout']}" in ready["message"] and f"{APPROVE}={proposal['id']}" in ready["message"]
    _, rows = table(cluster.kubectl("get", "stopo", "dry", "-n", namespace, "-o", "wide").stdout)
    row = rows[0]
    assert (row["READY"], row["REASON"], row["LAYOUT"], row["PROPOSAL"]) == (
        "False", "AwaitingApproval", f"{proposal['layout']} (proposed)", f"{proposal['id']}: {proposal['layout']}"), row
    assert row["TTFT"].startswith("- / ") and row["TTFT"] != "- / -", row   # the proposal's predicted figure

    # An id never shown (no such proposal): refused by name, nothing applied, the annotation removed.
    _annotate(cluster, namespace, "dry", "p99")
    kube.wait_condition(namespace, "dry", "Approved", "False", timeout_s=120, log=operator.log_tail)
    stale = kube.condition(namespace, "dry", "Approved") or {}
    assert stale["reason"] == "ProposalNotShown" and f"the current proposal is {proposal['id']}" in stale["message"], stale
    warnings = [e for e in kube.events(namespace, reason="ProposalNotShown") if e.get("type") == "Warning"]
    assert len(warnings) == 1 and not kube.items("deployments", namespace)
    assert APPROVE not in (kube.topology(namespace, "dry")["metadata"].get("annotations") or {})

    # The current id: exactly that proposal runs.
    _annotate(cluster, namespace, "dry", proposal["id"])
    kube.wait_condition(namespace, "dry", "Approved", "True", timeout_s=120, log=operator.log_tail)
    wait_until(lambda: bool(kube.items("deployments", namespace)), timeout_s=120, what="the approved workloads")
    kube.wait_condition(namespace, "dry", "Ready", "True", timeout_s=180, log=operator.log_tail)
    status = kube.topology(namespace, "dry")["status"]
    assert status["plan"]["layout"] == proposal["layout"] and status["plan"]["gpus"] == proposal["gpus"], status["plan"]
    assert status["approval"]["id"] == proposal["id"]
    layouts = {d["metadata"]["annotations"]["servingtopology.io/layout"] for d in kube.items("deployments", namespace)}
    assert layouts == {proposal["layout"]}, layouts
    assert len(kube.events(namespace, reason="ProposalApproved")) == 1
    print(f"\napproved {proposal['id']} ({proposal['layout']}, GPUs {proposal['gpus']}) after a stale p99 was refused "
          f"({stale['message'][:120]}...)")


def test_auto_with_approval_required_waits_for_the_approval(cluster: LocalCluster, operator: Operator, kube: Kube,
                                                            namespace: str) -> None:
    obj = topology("gated", namespace, prometheus_url=cluster.prometheus_url, mode="Auto", arrival_rate=4)
    obj["spec"]["policy"]["approval"] = "Required"
    _apply(cluster, obj)
    proposal = _proposal(kube, namespace, "gated")
    assert not kube.items("deployments", namespace)
    _annotate(cluster, namespace, "gated", proposal["id"])
    kube.wait_condition(namespace, "gated", "Ready", "True", timeout_s=180, log=operator.log_tail)
    assert kube.topology(namespace, "gated")["status"]["plan"]["layout"] == proposal["layout"]


def test_an_approval_armed_for_a_future_id_never_applies_the_proposal_an_edit_makes_later(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    started = time.monotonic()
    obj = topology("armed", namespace, prometheus_url=cluster.prometheus_url, mode="DryRun", arrival_rate=4, allowed_layouts=["replicas"])
    _apply(cluster, obj)
    first = _proposal(kube, namespace, "armed")
    assert first["id"] == "p1", first
    _annotate(cluster, namespace, "armed", "p2")         # nobody has seen p2: it does not exist yet
    kube.wait_condition(namespace, "armed", "Approved", "False", timeout_s=60, log=operator.log_tail)
    refused = kube.condition(namespace, "armed", "Approved") or {}
    assert refused["reason"] == "ProposalNotShown" and "the current proposal is p1" in refused["message"], refused
    assert "the annotation was removed" in refused["message"], refused
    wait_until(lambda: APPROVE not in (kube.topology(namespace, "armed")["metadata"].get("annotations") or {}), timeout_s=30,
               what="the armed approval removed")

    # The next edit makes p2: it waits for an approval like any proposal.
    obj["spec"]["workload"]["arrivalRate"] = 6
    _apply(cluster, obj)
    wait_until(lambda: (kube.topology(namespace, "armed").get("status", {}).get("proposal") or {}).get("id") == "p2", timeout_s=60,
               what="proposal p2", on_timeout=operator.log_tail)
    time.sleep(3 * operator.timer_interval_s)           # passes that would have applied it
    status = kube.topology(namespace, "armed")["status"]
    assert "plan" not in status and "approval" not in status, status
    assert not kube.items("deployments", namespace) and not kube.events(namespace, reason="ProposalApproved")
    assert (kube.condition(namespace, "armed", "Ready") or {}).get("reason") == "AwaitingApproval"
    print(f"\napprove=p2 armed while p1 was current: refused and removed; p2 proposed and left waiting "
          f"({time.monotonic() - started:.0f} s)")
