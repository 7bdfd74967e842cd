"""The chart's PodMonitors as `helm template` renders them, and a small evaluator of Prometheus relabelling.

Used by e2e/test_podmonitors.py: the Prometheus Operator (built by e2e/build_control_plane.sh, run by e2e/cluster.py)
turns the chart's PodMonitors into scrape jobs, and the relabel rules of those jobs are run here over the targets
Prometheus' Kubernetes discovery would make of the pods the operator renders, to check which pods are scraped and with
which labels. This module translates nothing itself: the rules are the Prometheus Operator's.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from .kubetools import REPO_ROOT, tool

__all__ = ["chart_pod_monitors", "relabel", "sanitize"]

CHART = REPO_ROOT / "charts" / "servingtopology"


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' discovery spells it in `__meta_kubernetes_pod_label_<name>`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def chart_pod_monitors(*sets: str, release: str = "st", namespace: str = "servingtopology-system") -> list[dict[str, Any]]:
    """The PodMonitors `helm template` renders from charts/servingtopology (plus `sets`) for a cluster that serves
    monitoring.coreos.com/v1 PodMonitor."""
    args = [str(tool("helm")), "template", release, str(CHART), "--namespace", namespace,
            "--api-versions", "monitoring.coreos.com/v1/PodMonitor"]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") == "PodMonitor"]


def _hashmod(value: str, modulus: int) -> str:
    """Prometheus' hashmod: the MD5 sum's last 8 bytes as a big-endian integer, modulo `modulus`."""
    return str(int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus)


def _expand(template: str, match: re.Match[str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: match.group(int(m.group(1))) if m.group(1).isdigit() else "", template)


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Apply Prometheus relabel rules (replace, keep, drop, labelmap, hashmod) to one target; None when dropped.

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
                    out[_expand(str(rule.get("replacement", "$1")), match)] = label_value
        elif action == "hashmod":
            out[rule["target_label"]] = _hashmod(value, int(rule["modulus"]))
        elif action == "replace":
            match = regex.match(value)
            if match:
                target = rule["target_label"]
                result = _expand(str(rule.get("replacement", "$1")), match)
                if result:
                    out[target] = result
                else:
                    out.pop(target, None)
        else:
            raise ValueError(f"relabel action {action!r} is not evaluated here (replace, keep, drop, labelmap, hashmod)")
    return {k: v for k, v in out.items() if not k.startswith("__")}
