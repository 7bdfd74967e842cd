"""The live-replanning demo of e2e/README.md, as a user runs it: examples/demo-replan.yaml with the emulator playing
e2e/demo-traffic.yaml (4 req/s, then 30 req/s). Within five minutes of `kubectl apply` the operator reports the drift
(a DriftDetected Event and condition) and starts moving to a larger layout (TransitionStarted), as the README says.

Only the namespace and the Prometheus URL (the harness picks a free port; `python -m e2e.up` uses 19090, the
example's) are changed. The operator's own /metrics (what the chart's Grafana dashboard reads) then carry the
resource's plan, its predicted and measured TTFT, the prediction error and the transition, and the dashboard's
panels on the engines' vLLM series return data from the harness' Prometheus. The completed transition
under the GPU budget and the serving floor is test_transitions.py's; this scenario stops at the replan to keep the
suite short.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .kubetools import REPO_ROOT
from .processes import wait_until
from .stack import Emulator, Operator

EXAMPLE = REPO_ROOT / "examples" / "demo-replan.yaml"
TRAFFIC = REPO_ROOT / "e2e" / "demo-traffic.yaml"
DASHBOARD = REPO_ROOT / "charts" / "servingtopology" / "dashboards" / "servingtopology.json"
PROMISED_S = 300.0   # e2e/README.md: "within five minutes"


def _operator_metrics(operator: Operator) -> list[str]:
    port = next(a.split("=", 1)[1] for a in operator.argv if a.startswith("--metrics-port="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return [line for line in response.read().decode().splitlines() if not line.startswith("#")]


def _value(lines: list[str], name: str, *labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name + "{") and all(label in line for label in labels))


def _dashboard_engine_queries(namespace: str, name: str) -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "vllm:" in t.get("expr", "")]
    assert len(exprs) >= 3, exprs
    values = {"$namespace": namespace, "$topology": name, "$__rate_interval": "1m"}
    for variable, value in values.items():
        exprs = [e.replace(variable, value) for e in exprs]
    return exprs


def _prometheus_query(url: str, expr: str) -> list[Any]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def _reasons(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    return {e["reason"]: e for e in kube.events(namespace)}


def test_the_demo_example_shows_a_replan_within_five_minutes(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    (topology,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    name = topology["metadata"]["name"]
    assert topology["spec"]["metrics"]["prometheusUrl"] == "http://127.0.0.1:19090"   # what e2e.up serves
    topology["metadata"]["namespace"] = namespace
    topology["spec"]["metrics"] = {"prometheusUrl": cluster.prometheus_url, "selector": {"namespace": namespace}}
    emulator.set_profile(yaml.safe_load(TRAFFIC.read_text()))
    try:
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(topology))
        applied_s = time.monotonic()
        before = kube.wait_condition(namespace, name, "Ready", "True", timeout_s=120, log=operator.log_tail)
        first = kube.topology(namespace, name)["status"]["plan"]
        wait_until(lambda: {"DriftDetected", "TransitionStarted"} <= set(_reasons(kube, namespace)), timeout_s=PROMISED_S,
                   what="DriftDetected and TransitionStarted Events", interval_s=2.0,
                   on_timeout=lambda: "\n".join(f"{r}: {e.get('message', e.get('note'))}" for r, e in _reasons(kube, namespace).items())
                   + "\n" + operator.log_tail())
        replanned_s = time.monotonic() - applied_s
        events = _reasons(kube, namespace)
        drift = kube.condition(namespace, name, "DriftDetected") or {}
        progressing = kube.condition(namespace, name, "Progressing") or {}
        status = kube.topology(namespace, name)["status"]
        target = status.get("proposal") or status.get("plan")
        print(f"\ndemo: planned {first['layout']} ({first['gpus']} GPUs) for 4 req/s; replan {replanned_s:.0f} s after apply: "
              f"{events['TransitionStarted'].get('message', events['TransitionStarted'].get('note'))}")
        assert replanned_s <= PROMISED_S
        assert before["status"] == "True" and first["gpus"] >= 1
        assert drift.get("status") == "True" or progressing.get("status") == "True", (drift, progressing)
        assert target is not None and target["gpus"] > first["gpus"], (first, target)
        # What the chart's dashboard reads: the operator's own /metrics carry this resource's plan and transition.
        mine = (f'topology_namespace="{namespace}"', f'topology="{name}"')
        wanted = ("servingtopology_plan_info", "servingtopology_predicted_ttft_seconds", "servingtopology_observed_ttft_seconds",
                  "servingtopology_prediction_error_ratio", "servingtopology_plan_instances")

        def missing() -> list[str]:   # the pass that posted the Event records its metrics right after it
            metrics = _operator_metrics(operator)
            gone = [s for s in wanted if not any(line.startswith(s + "{") and all(m in line for m in mine) for line in metrics)]
            phases = sum(_value(metrics, "servingtopology_transition_phase", *mine, f'phase="{p}"') for p in ("Progressing", "Draining", "Done"))
            return gone + ([] if _value(metrics, "servingtopology_transitions_total", *mine) >= 1 else ["transitions_total"]) + (
                [] if phases == 1 else [f"transition_phase sum {phases}"])

        wait_until(lambda: not missing(), timeout_s=30, what="the operator's metrics of the demo",
                   on_timeout=lambda: f"missing: {missing()}")
        # The dashboard's panels on the engines' own vLLM series, with its variables set to this resource, return data
        # from the harness' Prometheus: the label names it filters on are the ones the PodMonitor relabelings give.
        empty = [expr for expr in _dashboard_engine_queries(namespace, name) if not _prometheus_query(cluster.prometheus_url, expr)]
        assert not empty, empty
    finally:
        emulator.set_profile({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 200}]})
