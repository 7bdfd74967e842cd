"""PodMonitors to Prometheus scrape configs, the way the Prometheus Operator turns them into its Prometheus' config,
and a small evaluator of Prometheus relabelling for the unit tests.

Used by e2e/cluster.py (the e2e Prometheus discovers pods through `kubernetes_sd_configs` against the API server
with the scrape configs built here from the chart's own PodMonitors) and by tests/test_podmonitors.py. The rules
follow the Prometheus Operator's `generatePodMonitorConfig` (pkg/prometheus/promcfg.go): keep the pods the
selector matches and the container port the endpoint names, then set `namespace`, `container`, `pod`, `job`
and `endpoint`, then apply the endpoint's own relabelings. Only the PodMonitor fields the chart uses are
translated; any other field raises, so a chart change cannot be silently ignored here.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from .kubetools import REPO_ROOT, tool

__all__ = ["chart_pod_monitors", "scrape_configs", "relabel", "sanitize"]

CHART = REPO_ROOT / "charts" / "servingtopology"

_SUPPORTED_SPEC = {"namespaceSelector", "selector", "podMetricsEndpoints"}
_SUPPORTED_ENDPOINT = {"port", "path", "interval", "relabelings"}


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' discovery spells it in `__meta_kubernetes_pod_label_<name>`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def chart_pod_monitors(*sets: str, release: str = "st", namespace: str = "servingtopology-system") -> list[dict[str, Any]]:
    """The PodMonitors `helm template` renders from charts/servingtopology with its default values (plus `sets`)."""
    args = [str(tool("helm")), "template", release, str(CHART), "--namespace", namespace]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") == "PodMonitor"]


def _snake(relabeling: Mapping[str, Any]) -> dict[str, Any]:
    """The Prometheus spelling of one PodMonitor relabeling (camelCase → snake_case keys)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in relabeling.items()}


def scrape_configs(pod_monitors: Sequence[Mapping[str, Any]], *, sd_config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One scrape config per PodMonitor endpoint; `sd_config` holds the API server, TLS and credentials."""
    configs = []
    for monitor in pod_monitors:
        meta, spec = monitor["metadata"], monitor["spec"]
        unknown = set(spec) - _SUPPORTED_SPEC
        if unknown:
            raise ValueError(f"PodMonitor {meta['name']}: fields {sorted(unknown)} are not translated by e2e/podmonitor.py")
        namespaces = spec.get("namespaceSelector", {})
        sd: dict[str, Any] = {"role": "pod", **sd_config}
        if not namespaces.get("any"):
            sd["namespaces"] = {"names": list(namespaces.get("matchNames") or [meta["namespace"]])}
        for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
            unknown = set(endpoint) - _SUPPORTED_ENDPOINT
            if unknown:
                raise ValueError(f"PodMonitor {meta['name']}: endpoint fields {sorted(unknown)} are not translated")
            relabels: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
            for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
                relabels.append({"action": "keep",
                                 "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(key)}",
                                                   f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"],
                                 "regex": f"({value});true"})
            relabels += [
                {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"]},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
                {"target_label": "endpoint", "replacement": endpoint["port"]},
            ]
            relabels += [_snake(r) for r in endpoint.get("relabelings", [])]
            config = {"job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}", "honor_labels": False,
                      "kubernetes_sd_configs": [sd], "metrics_path": endpoint.get("path", "/metrics"),
                      "relabel_configs": relabels}
            if "interval" in endpoint:
                config["scrape_interval"] = endpoint["interval"]
            configs.append(config)
    return configs


def _expand(template: str, match: re.Match[str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: match.group(int(m.group(1))) if m.group(1).isdigit() else "", template)


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Apply Prometheus relabel rules (replace, keep, drop, labelmap) to one target; None when dropped.

    Semantics from Prometheus' relabel package: regexes are fully anchored, source values are joined
    with `;`, a missing label reads as empty, and `replace` with an empty result deletes the target label.
    """
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        value = ";".join(out.get(name, "") for name in rule.get("source_labels", []))
        if action == "keep":
            if not regex.match(value):
                return None
        elif action == "drop":
            if regex.match(value):
                return None
        elif action == "labelmap":
            for name, label_value in list(out.items()):
                match = regex.match(name)
                if match:
                    out[_expand(rule.get("replacement", "$1"), match)] = label_value
        elif action == "replace":
            match = regex.match(value)
            if match:
                target = rule["target_label"]
                result = _expand(rule.get("replacement", "$1"), match)
                if result:
                    out[target] = result
                else:
                    out.pop(target, None)
        else:
            raise ValueError(f"relabel action {action!r} is not evaluated here (replace, keep, drop, labelmap)")
    return {k: v for k, v in out.items() if not k.startswith("__")}
