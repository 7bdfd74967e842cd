"""Changes under load: the operator killed mid-rollout, Prometheus going away, and traffic drifting in the emulator.

Each scenario samples the topology's pods throughout and checks the GPU budget (maxGPUs + maxSurgeGPUs) and
a capacity floor (never fewer Ready serving pods than served before the change). The two that need live metrics first
wait for the operator to report `MetricsAvailable=True` from Prometheus, which discovers the engine pods
through the API server with the chart's PodMonitor relabelings (no other discovery).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .sampling import PodSampler
from .stack import Emulator, Operator

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


def test_traffic_drift_in_the_emulator_leads_to_a_replan_and_a_completed_transition(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    emulator.set_profile({"phases": [{"rate_rps": 4, "input_tokens": 2048, "output_tokens": 256}]})
    try:
        _apply(cluster, topology("drift", namespace, prometheus_url=cluster.prometheus_url, arrival_rate=4,
                                 max_gpus=MAX_GPUS, max_surge_gpus=SURGE_GPUS))
        wait_until(lambda: _settled(kube, namespace, "drift"), timeout_s=180, what="first plan settled",
                   on_timeout=operator.log_tail)
        _require_live_metrics(kube, namespace, "drift")
        before = kube.topology(namespace, "drift")["status"]["plan"]
        with PodSampler(cluster.kubeconfig, namespace, "drift") as sampler:
            emulator.set_profile({"phases": [{"rate_rps": 30, "input_tokens": 2048, "output_tokens": 256}]})

            def replanned() -> bool:
                plan = kube.topology(namespace, "drift").get("status", {}).get("plan", {})
                return bool(plan.get("layout") and plan.get("layout") != before["layout"])

            wait_until(replanned, timeout_s=300, what="a replan after the drift", on_timeout=operator.log_tail)
            wait_until(lambda: _settled(kube, namespace, "drift"), timeout_s=240, what="the transition completed", on_timeout=operator.log_tail)
        after = kube.topology(namespace, "drift")["status"]
        assert after["plan"]["gpus"] > before["gpus"], (before, after["plan"])
        assert any(h.get("action") == "Applied" and h.get("layout") == after["plan"]["layout"] for h in after.get("history", []))
        assert sampler.max_gpus_held() <= MAX_GPUS + SURGE_GPUS
        floor = sampler.samples[0].ready_serving_pods  # what served before the drift
        assert sampler.min_ready_after_first_serving() >= floor, f"Ready serving pods dropped below the {floor} before the drift"
        print(f"\ndrift 4 → 30 req/s: {before['layout']} → {after['plan']['layout']}; max GPUs held {sampler.max_gpus_held()} "
              f"(budget {MAX_GPUS}+{SURGE_GPUS}); fewest Ready serving pods {sampler.min_ready_after_first_serving()}")
    finally:
        emulator.set_profile({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 200}]})
