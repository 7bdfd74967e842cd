"""Changes under load: the operator killed mid-rollout, Prometheus going away, and traffic drifting in the emulator.

Each scenario samples the topology's pods throughout and checks the GPU budget (maxGPUs + maxSurgeGPUs) and
a capacity floor (never fewer Ready serving pods than served before the change). The two that need live metrics first
wait for the operator to report `MetricsAvailable=True` from Prometheus, which discovers the engine pods
through the API server with the chart's PodMonitor relabelings (no other discovery).
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .sampling import PodSampler
from .stack import Emulator, Operator
from .tables import table

MAX_GPUS, SURGE_GPUS = 8, 2


def _apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))


def _patch_spec(cluster: LocalCluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", "stopo", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": patch}))


def _settled(kube: Kube, namespace: str, name: str) -> bool:
    """Converged on the current generation: planned for it, Ready, and no transition in progress."""
    obj = kube.topology(namespace, name)
    status = obj.get("status", {})
    conditions = {c["type"]: c.get("status") for c in status.get("conditions", [])}
    generation = obj["metadata"]["generation"]
    return bool(status.get("observedGeneration") == generation and status.get("plan", {}).get("generation") == generation
                and conditions.get("Ready") == "True" and conditions.get("Progressing") != "True")


def _deployments(kube: Kube, namespace: str, name: str) -> dict[str, tuple[int, int]]:
    """Each Deployment's (generation, spec.replicas)."""
    return {d["metadata"]["name"]: (d["metadata"]["generation"], d["spec"]["replicas"])
            for d in kube.items("deployments", namespace, selector=f"app.kubernetes.io/instance={name}")}


def _require_live_metrics(kube: Kube, namespace: str, name: str, *, true_s: float = 120) -> None:
    """Waits for the operator to read live metrics: Prometheus found the engine pods through the API server and
    scraped them at their own addresses, and the operator's PromQL matched their labels."""
    kube.wait_condition(namespace, name, "MetricsAvailable", "True", timeout_s=true_s)


def test_the_operator_killed_mid_rollout_resumes_and_converges_within_the_budget(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    _apply(cluster, topology("resume", namespace, prometheus_url=cluster.prometheus_url, arrival_rate=5,
                             max_gpus=MAX_GPUS, max_surge_gpus=SURGE_GPUS))
    wait_until(lambda: _settled(kube, namespace, "resume"), timeout_s=180, what="first plan settled",
               on_timeout=operator.log_tail)
    before = kube.topology(namespace, "resume")["status"]["plan"]

    with PodSampler(cluster.kubeconfig, namespace, "resume") as sampler:
        _patch_spec(cluster, namespace, "resume", {"workload": {"arrivalRate": 40}})
        generation = kube.topology(namespace, "resume")["metadata"]["generation"]

        def acting() -> bool:
            status = kube.topology(namespace, "resume").get("status", {})
            progressing = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
            return bool(status.get("plan", {}).get("generation") == generation or progressing.get("status") == "True")

        wait_until(acting, timeout_s=120, what="the operator acting on the new generation", interval_s=0.1,
                   on_timeout=operator.log_tail)
        operator.kill()
        progressing = kube.condition(namespace, "resume", "Progressing") or {}
        rolling = progressing.get("status") == "True" or sampler.samples[-1].ready_serving_pods < sampler.samples[-1].pods
        operator.start()  # kopf peering may hold it back until the dead peer's record expires (about a minute)
        wait_until(lambda: _settled(kube, namespace, "resume"), timeout_s=240, what="convergence after the restart",
                   on_timeout=operator.log_tail)
        wait_until(lambda: sampler.samples[-1].ready_serving_pods == sum(r for _, r in _deployments(kube, namespace, "resume").values()),
                   timeout_s=60, what="every planned pod Ready")

    after = kube.topology(namespace, "resume")["status"]["plan"]
    assert after["gpus"] >= before["gpus"] and after != before, (before, after)
    assert sampler.max_gpus_held() <= MAX_GPUS + SURGE_GPUS, [s for s in sampler.samples if s.gpus_held > MAX_GPUS + SURGE_GPUS]
    floor = sampler.samples[0].ready_serving_pods  # what served before the change
    assert sampler.min_ready_after_first_serving() >= floor, f"Ready serving pods dropped below the {floor} before the change"
    print(f"\nkilled while {'rolling out' if rolling else 'already settled'}; plan {before['layout']} → {after['layout']}; "
          f"max GPUs held {sampler.max_gpus_held()}; {len(sampler.samples)} samples")


def test_with_prometheus_stopped_nothing_changes_and_metrics_are_reported_unavailable(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    _apply(cluster, topology("blind", namespace, prometheus_url=cluster.prometheus_url, arrival_rate=5))
    wait_until(lambda: _settled(kube, namespace, "blind"), timeout_s=180, what="first plan settled",
               on_timeout=operator.log_tail)
    _require_live_metrics(kube, namespace, "blind")
    plan_before = kube.topology(namespace, "blind")["status"]["plan"]
    deployments_before = _deployments(kube, namespace, "blind")
    cluster.stop_prometheus()
    try:
        kube.wait_condition(namespace, "blind", "MetricsAvailable", "False", timeout_s=120, log=operator.log_tail)
        assert kube.topology(namespace, "blind")["status"]["plan"]["layout"] == plan_before["layout"]
        assert _deployments(kube, namespace, "blind") == deployments_before
    finally:
        cluster.start_prometheus()


COLUMNS = ["NAME", "READY", "REASON", "MODE", "LAYOUT", "P:D", "GPUS", "TTFT", "TPOT", "PHASE", "AGE"]
WIDE_COLUMNS = [*COLUMNS, "PROPOSAL", "ERROR"]
DURATION = r"[0-9]+(\.[0-9])?(ms|s)"
MEASURED_OVER_PREDICTED = re.compile(rf"^(-|{DURATION}) / {DURATION}$")


def _get_stopo(cluster: LocalCluster, namespace: str, name: str, *, wide: bool = False) -> tuple[list[str], dict[str, str]]:
    """`kubectl get stopo NAME [-o wide]` as (headers, the row)."""
    args = ["get", "stopo", name, "-n", namespace] + (["-o", "wide"] if wide else [])
    headers, rows = table(cluster.kubectl(*args).stdout)
    assert len(rows) == 1, rows
    return headers, rows[0]


def _check_events_in_time_order(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """`kubectl get events --sort-by=.lastTimestamp`: both timestamps set on the operator's Events, the table in the
    same order as the sorted objects, and those in time order. Returns the topology's Events in that order."""
    sort = "--sort-by=.lastTimestamp"
    headers, rows = table(cluster.kubectl("get", "events", "-n", namespace, sort).stdout)
    assert {"LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"} <= set(headers), headers
    items = json.loads(cluster.kubectl("get", "events", "-n", namespace, sort, "-o", "json").stdout)["items"]
    assert [r["REASON"] for r in rows] == [e["reason"] for e in items], ([r["REASON"] for r in rows], [e["reason"] for e in items])
    mine = [e for e in items if e["involvedObject"]["kind"] == "ServingTopology" and e["involvedObject"]["name"] == name]
    assert mine, items
    for event in mine:
        assert event.get("firstTimestamp") and event.get("lastTimestamp"), event
        assert event["firstTimestamp"] <= event["lastTimestamp"], event
    stamps = [e["lastTimestamp"] for e in items if e.get("lastTimestamp")]
    assert stamps == sorted(stamps), stamps
    return mine


def test_traffic_drift_in_the_emulator_leads_to_a_replan_and_a_completed_transition(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    """Also what a user sees of it: `kubectl get stopo` (and -o wide) before, during and after the transition, and
    `kubectl get events --sort-by=.lastTimestamp` at the end."""
    emulator.set_profile({"phases": [{"rate_rps": 4, "input_tokens": 2048, "output_tokens": 256}]})
    try:
        _apply(cluster, topology("drift", namespace, prometheus_url=cluster.prometheus_url, arrival_rate=4,
                                 max_gpus=MAX_GPUS, max_surge_gpus=SURGE_GPUS))
        wait_until(lambda: _settled(kube, namespace, "drift"), timeout_s=180, what="first plan settled",
                   on_timeout=operator.log_tail)
        _require_live_metrics(kube, namespace, "drift")
        before = kube.topology(namespace, "drift")["status"]["plan"]
        headers, row = _get_stopo(cluster, namespace, "drift")
        assert headers == COLUMNS, headers
        assert (row["READY"], row["REASON"], row["MODE"], row["LAYOUT"], row["GPUS"], row["PHASE"]) == (
            "True", "WorkloadsReady", "Auto", before["layout"], str(before["gpus"]), "Steady"), row
        wait_until(lambda: not _get_stopo(cluster, namespace, "drift")[1]["TTFT"].startswith("- "), timeout_s=60,
                   what="a measured TTFT in the TTFT column")
        _, row = _get_stopo(cluster, namespace, "drift")
        assert MEASURED_OVER_PREDICTED.match(row["TTFT"]) and MEASURED_OVER_PREDICTED.match(row["TPOT"]), row
        seen: list[dict[str, str]] = []
        with PodSampler(cluster.kubeconfig, namespace, "drift") as sampler:
            emulator.set_profile({"phases": [{"rate_rps": 30, "input_tokens": 2048, "output_tokens": 256}]})

            def replanned() -> bool:
                seen.append(_get_stopo(cluster, namespace, "drift")[1])
                plan = kube.topology(namespace, "drift").get("status", {}).get("plan", {})
                return bool(plan.get("layout") and plan.get("layout") != before["layout"])

            wait_until(replanned, timeout_s=300, what="a replan after the drift", interval_s=2.0, on_timeout=operator.log_tail)
            wait_until(lambda: _settled(kube, namespace, "drift"), timeout_s=240, what="the transition completed", on_timeout=operator.log_tail)
        after = kube.topology(namespace, "drift")["status"]
        assert after["plan"]["gpus"] > before["gpus"], (before, after["plan"])
        assert any(h.get("action") == "Applied" and h.get("layout") == after["plan"]["layout"] for h in after.get("history", []))
        assert sampler.max_gpus_held() <= MAX_GPUS + SURGE_GPUS
        floor = sampler.samples[0].ready_serving_pods  # what served before the drift
        assert sampler.min_ready_after_first_serving() >= floor, f"Ready serving pods dropped below the {floor} before the drift"
        events = _check_events_in_time_order(cluster, namespace, "drift")
        reasons = [e["reason"] for e in events]
        started = next(e["message"] for e in events if e["reason"] == "TransitionStarted")
        # During the transition LAYOUT names both layouts, PHASE the phase, and Ready holds while the serving sets carry
        # the floor, so `kubectl wait --for=condition=Ready` would not break. A surge's drain alone lasts a minute, so
        # the table is read mid-transition; an in-place scale-up may finish between two reads.
        moving = [r for r in seen if "→" in r["LAYOUT"]]
        surge = "Surge transition" in started
        assert moving or not surge, seen
        assert all(r["LAYOUT"] == f"{before['layout']} → {after['plan']['layout']}" for r in moving), moving
        assert all(re.match(r"^(Progressing|Draining|RollingBack) \((Surge|InPlace)\)", r["PHASE"]) for r in moving), moving
        assert all((r["READY"], r["REASON"]) == ("True", "ServingFloorHeld") for r in moving), moving
        assert not surge or any(r["PHASE"].startswith("Draining (Surge): ") and r["PHASE"].endswith(" 100%") for r in moving), moving
        headers, row = _get_stopo(cluster, namespace, "drift", wide=True)
        assert headers == WIDE_COLUMNS, headers
        assert (row["LAYOUT"], row["GPUS"], row["PHASE"]) == (after["plan"]["layout"], str(after["plan"]["gpus"]), "Steady"), row
        assert MEASURED_OVER_PREDICTED.match(row["TTFT"]) and MEASURED_OVER_PREDICTED.match(row["TPOT"]), row
        # MetricsGrace: the new topology got no metrics warning before its engines could have been scraped.
        assert "MetricsUnavailable" not in reasons, reasons
        applied = [e["message"] for e in events if e["reason"] == "PlanApplied"][-1]
        # SameLoadFigures: the Event that starts the change and the one that ends it quote one load and one set of figures.
        figures = re.compile(r" at \S+ req/s: p95 TTFT \S+→\S+, TPOT \S+→\S+")
        assert figures.search(started) and figures.search(applied), (started, applied)
        assert figures.search(started).group(0) == figures.search(applied).group(0), (started, applied)  # type: ignore[union-attr]
        print(f"\ndrift 4 → 30 req/s: {before['layout']} → {after['plan']['layout']}; max GPUs held {sampler.max_gpus_held()} "
              f"(budget {MAX_GPUS}+{SURGE_GPUS}); fewest Ready serving pods {sampler.min_ready_after_first_serving()}; "
              f"{len(moving)} table reads mid-transition, e.g. {moving[-1]}")
    finally:
        emulator.set_profile({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 200}]})
