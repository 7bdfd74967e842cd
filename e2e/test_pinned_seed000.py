"""Seed 000 on a real API server: GLM-5 NVFP4 on SGLang (its config.json in a ConfigMap), 510,012-token prompts.

- The seed's blocker: a pinned PD layout whose TP4/DP4-attention prefill rank cannot hold the prompt is refused at plan
  time with `PinRefused` naming `spec.pinned.prefill`, the prompt and the rank's pool, and nothing is applied: no
  Deployment, no pod, no Service, no status.plan, however many passes run.
- The seed's scenario unpinned (a DryRun: the search, stage 6 on) is planned by the operator's plan worker inside its
  default budget (PlanBudget: 30 s wall, 768 MiB), as the operator reports each plan's cost (PlanCost in its log, the
  plan counters and servingtopology_plan_seconds on its /metrics)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from servingtopology.operator.cluster.plan_worker import PlanBudget

from .cluster import LocalCluster
from .conftest import Kube
from .processes import wait_until
from .stack import Operator

GLM5 = Path(__file__).resolve().parents[1] / "tests" / "planner" / "data" / "model_configs" / "glm-5-nvfp4.json"
PROMPT = 510_012


def _seed000(name: str, namespace: str) -> dict[str, Any]:
    """The seed's deployment as a resource: three TP4/DP4-attention prefill workers (memoryFraction 0.7: a rank pool
    of about 300k tokens, the seed's 328k-token starting point) and one TP8 decoder, 20 B200s, 510,012-token prompts
    under the 524,288-token context cap."""
    return {
        "apiVersion": "servingtopology.io/v1alpha1", "kind": "ServingTopology",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "modelConfigMap": {"name": f"{name}-config"}, "modelSource": "zai-org/GLM-5-NVFP4", "servedModelName": "glm-5",
            "precision": "fp4", "kvCacheDtype": "fp8", "engine": {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23"},
            "hardware": {"gpu": "b200_sxm", "gpusPerNode": 8, "maxGPUs": 24},
            "workload": {"arrivalRate": 0.02, "inputTokens": PROMPT, "outputTokens": 8_192},
            "slo": {"ttftMs": {"p95": 600_000}, "tpotMs": {"p95": 100}},
            "policy": {"mode": "Pinned"},
            "pinned": {"kind": "pd", "dpAttention": True, "engineArgs": {"memoryFraction": 0.6},
                       "prefill": {"count": 3, "tp": 4, "dp": 4, "engineArgs": {"memoryFraction": 0.7}},
                       "decode": {"count": 1, "tp": 8}},
        },
    }


def test_seed000s_pinned_pd_layout_is_pin_refused_by_name_and_nothing_is_applied(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    config = json.loads(GLM5.read_text())
    config["max_position_embeddings"] = 524_288   # the seed's context cap: the prompt fits the context, not the rank
    cluster.kubectl("create", "configmap", "glm5-config", "-n", namespace, f"--from-literal=config.json={json.dumps(config)}")
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_seed000("glm5", namespace)))
    def refused() -> bool:
        cond = kube.condition(namespace, "glm5", "Planned") or {}
        return (cond.get("status"), cond.get("reason")) == ("False", "PinRefused")
    wait_until(refused, timeout_s=180, what="Planned=False PinRefused",
               on_timeout=lambda: json.dumps(kube.topology(namespace, "glm5").get("status", {}), indent=1)[-3000:] + operator.log_tail())
    planned = kube.condition(namespace, "glm5", "Planned") or {}
    message = planned["message"]
    assert "spec.pinned.prefill" in message and f"{PROMPT:,}" in message and "KV tokens" in message, message
    assert "nothing was applied" in message, message
    ready = kube.condition(namespace, "glm5", "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "PinRefused"), ready
    events = kube.events(namespace, reason="PinRefused")
    assert events and "spec.pinned.prefill" in (events[0].get("message") or events[0].get("note") or ""), events
    time.sleep(20)   # more passes (the operator's timer and requeues) still apply nothing
    for kind in ("deployments", "pods", "services"):
        assert not kube.items(kind, namespace), f"nothing may be applied for a refused pin: {kind} exist"
    assert kube.topology(namespace, "glm5").get("status", {}).get("plan") is None
    assert len(kube.events(namespace, reason="PinRefused")) == 1


def _metrics(operator: Operator) -> dict[str, float]:
    """The operator's /metrics as {sample name with its labels: value}."""
    port = next(a.split("=", 1)[1] for a in operator.argv if a.startswith("--metrics-port="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(servingtopology_plan\S*) ([0-9.e+-]+)$", text, re.M)}


# operator/cluster/plan_worker.py logs each answered plan's PlanCost at DEBUG (the e2e chart runs the operator at DEBUG)
PLAN_COST_LINE = re.compile(r"plan ([0-9a-f]{12}): (\w+) after ([0-9.]+) s wall, ([0-9.]+) CPU s, ([0-9.]+) MiB")


def test_seed000s_unpinned_scenario_is_planned_by_the_operator_inside_its_default_budget(
        cluster: LocalCluster, operator: Operator, kube: Kube, namespace: str) -> None:
    budget = PlanBudget()   # the operator's defaults: the chart passes no other --plan-timeout-s / --plan-memory-mib
    config = json.loads(GLM5.read_text())
    config["max_position_embeddings"] = 524_288
    cluster.kubectl("create", "configmap", "glm5-config", "-n", namespace, f"--from-literal=config.json={json.dumps(config)}")
    spec = _seed000("glm5", namespace)
    del spec["spec"]["pinned"]
    spec["spec"]["policy"]["mode"] = "DryRun"
    log_from = len(operator.log_tail(chars=1 << 30))
    before = _metrics(operator)
    started_s = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(spec))

    def proposal() -> dict[str, Any] | None:
        obj = kube.topology(namespace, "glm5")
        found = obj.get("status", {}).get("proposal")
        return found if found and found.get("generation") == obj["metadata"]["generation"] else None
    wait_until(lambda: proposal() is not None, timeout_s=2 * budget.wall_s + 15, what="status.proposal of the unpinned seed",
               on_timeout=lambda: json.dumps(kube.topology(namespace, "glm5").get("status", {}), indent=1)[-3000:] + operator.log_tail())
    waited_s = time.monotonic() - started_s
    plan = proposal()
    assert plan is not None
    assert 0 < plan["gpus"] <= 24 and plan["layout"], plan
    planned = kube.condition(namespace, "glm5", "Planned") or {}
    assert (planned.get("status"), planned.get("reason")) != ("False", "PlanBudgetExceeded"), planned
    assert planned.get("status") == "True", planned
    assert not kube.events(namespace, reason="PlanBudgetExceeded")
    after = _metrics(operator)
    grew = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert grew["servingtopology_plans_started_total"] >= 1, grew
    assert grew["servingtopology_plans_failed_total"] == 0, grew
    plans = grew["servingtopology_plan_seconds_count"]
    assert plans >= 1 and grew[f'servingtopology_plan_seconds_bucket{{le="{budget.wall_s:.1f}"}}'] == plans, grew
    assert 0 < grew["servingtopology_plan_cpu_seconds_total"] < budget.wall_s, grew
    costs = [m for m in PLAN_COST_LINE.finditer(operator.log_tail(chars=1 << 30)[log_from:]) if m.group(2) == "ok"]
    assert costs, "the plan worker logged no answered plan's cost"
    for m in costs:   # each answered plan inside the default budget: wall seconds and MiB of address space grown
        wall_s, cpu_s, grew_mib = float(m.group(3)), float(m.group(4)), float(m.group(5))
        assert wall_s < budget.wall_s and cpu_s < budget.wall_s and grew_mib < budget.memory_mib, m.group(0)
    print(f"\nseed 000 unpinned: proposal {plan['layout']} on {plan['gpus']} GPUs after {waited_s:.1f} s; plans "
          + "; ".join(f"{m.group(3)} s wall, {m.group(4)} CPU s, {m.group(5)} MiB" for m in costs)
          + f" (budget {budget.wall_s:g} s, {budget.memory_mib} MiB)")
