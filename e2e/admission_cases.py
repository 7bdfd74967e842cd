"""ServingTopology specs the API server must refuse, each one rule of the CRD (bounds, CEL one-of and cross-field
rules, name rules), with the field its message names.

Shared by e2e/test_crd_admission.py (the real API server refuses each) and tests/operator/test_crd_rules.py (the
operator's own validation refuses each too: the CRD admits nothing the operator would refuse later in status).
Data only; no cluster access.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .objects import topology

__all__ = ["DELETE", "Case", "REFUSED", "REFUSED_WHEN_PLANNED", "valid_topology", "mutated"]

DELETE = object()  # a value meaning "remove this key"


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    changes: tuple[tuple[str, Any], ...]  # (dotted path under the object, value or DELETE)
    field: str                            # the field the refusal names (API server and operator alike)


def valid_topology(name: str = "llama", namespace: str = "default") -> dict[str, Any]:
    """A valid ServingTopology (Llama-3.1-8B on H100s, Auto) every case starts from: e2e/objects.py's, with no
    precision (the checkpoint's own: no case may depend on a default the CRD must not set) and no metrics."""
    return topology(name, namespace, prometheus_url=None, precision=None, replan_interval="1m", cooldown="5m")


def mutated(obj: dict[str, Any], changes: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """A copy of `obj` with each dotted path set to its value (or removed for DELETE)."""
    out = copy.deepcopy(obj)
    for path, value in changes:
        node = out
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = copy.deepcopy(value)
    return out


_PINNED = (("spec.policy.mode", "Pinned"),)
_CONFIG_MAP = {"name": "llama-config"}

REFUSED: tuple[Case, ...] = (
    # one-of and cross-field rules (issue #17: 14 such violations were admitted and only refused later in status)
    Case("model-and-configmap", (("spec.modelConfigMap", _CONFIG_MAP), ("spec.modelSource", "meta-llama/x")), "spec"),
    Case("neither-model-nor-configmap", (("spec.model", DELETE),), "spec"),
    Case("configmap-without-source", (("spec.model", DELETE), ("spec.modelConfigMap", _CONFIG_MAP)), "spec"),
    Case("rate-and-concurrency", (("spec.workload.concurrency", 32),), "spec.workload"),
    Case("neither-rate-nor-concurrency", (("spec.workload.arrivalRate", DELETE),), "spec.workload"),
    Case("two-ttft-percentiles", (("spec.slo.ttftMs", {"p95": 1000, "p99": 2000}),), "spec.slo.ttftMs"),
    Case("no-tpot-percentile", (("spec.slo.tpotMs", {}),), "spec.slo.tpotMs"),
    Case("not-a-percentile", (("spec.slo.ttftMs", {"x95": 1000}),), "spec.slo.ttftMs"),
    Case("percentile-zero", (("spec.slo.ttftMs", {"p0": 1000}),), "spec.slo.ttftMs"),
    Case("slo-bound-of-a-day", (("spec.slo.tpotMs", {"p95": 86_400_000}),), "spec.slo.tpotMs"),
    Case("pinned-mode-without-pinned", _PINNED, "spec"),
    Case("pd-without-decode", (*_PINNED, ("spec.pinned", {"kind": "pd", "prefill": {"count": 1}})), "spec.pinned"),
    # bounds (issue #17: maxNumSeqs 20000000 took one pass 133 s and 1.66 GB; 400-digit durations)
    Case("max-num-seqs-20M", (*_PINNED, ("spec.pinned", {"replicas": 1, "engineArgs": {"maxNumSeqs": 20_000_000}})),
         "spec.pinned.engineArgs.maxNumSeqs"),
    Case("tp-1000", (*_PINNED, ("spec.pinned", {"replicas": 1, "tp": 1000})), "spec.pinned.tp"),
    Case("replan-interval-400-digits", (("spec.policy.replanInterval", "9" * 400 + "s"),), "spec.policy.replanInterval"),
    Case("cooldown-400-digits", (("spec.policy.cooldown", "9" * 400 + "m"),), "spec.policy.cooldown"),
    Case("replan-interval-1s", (("spec.policy.replanInterval", "1s"),), "spec.policy.replanInterval"),
    Case("cooldown-a-month", (("spec.policy.cooldown", "720h"),), "spec.policy.cooldown"),
    Case("max-gpus-20000", (("spec.hardware.maxGPUs", 20_000),), "spec.hardware.maxGPUs"),
    # issue 29: a GPU kind the planner's catalog does not know (CEL generated from planner/data/gpus.toml)
    Case("unknown-gpu-kind", (("spec.hardware.gpu", "h100_pcie_96gb_typo"),), "spec.hardware.gpu"),
    Case("arrival-rate-1e9", (("spec.workload.arrivalRate", 1e9),), "spec.workload.arrivalRate"),
    Case("simulation-requests-1e7", (("spec.simulation", {"requests": 10_000_000}),), "spec.simulation.requests"),
    Case("model-id-of-300-characters", (("spec.model", "m" * 300),), "spec.model"),
    Case("129-extra-args", (("spec.engine.extraArgs", ["--x"] * 129),), "spec.engine.extraArgs"),
    Case("search-tp-list-of-17", (("spec.search", {"tp": [1] * 17}),), "spec.search.tp"),
    # what the API server would refuse only later, in the pods the operator renders (issue #17)
    Case("image-with-spaces", (("spec.engine.image", "vllm/vllm-openai:v0.11.0 --privileged"),), "spec.engine.image"),
    Case("toleration-exists-with-value", (("spec.hardware.tolerations", [{"key": "k", "operator": "Exists", "value": "v"}]),),
         "spec.hardware.tolerations[0]"),
    Case("toleration-seconds-without-noexecute",
         (("spec.hardware.tolerations", [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}]),),
         "spec.hardware.tolerations[0]"),
    Case("bad-node-selector-key", (("spec.hardware.nodeSelector", {"gpu product!": "h100"}),), "spec.hardware.nodeSelector"),
    Case("node-selector-value-of-64", (("spec.hardware.nodeSelector", {"gpu": "v" * 64}),), "spec.hardware.nodeSelector"),
    Case("engine-container-with-command", (("spec.podTemplate", {"spec": {"containers": [{"name": "engine", "command": ["sh"]}]}}),),
         "spec.podTemplate.spec.containers[0]"),
    Case("sidecar-without-image", (("spec.podTemplate", {"spec": {"containers": [{"name": "sidecar"}]}}),),
         "spec.podTemplate.spec.containers[0]"),
    Case("reserved-pod-label", (("spec.podTemplate", {"metadata": {"labels": {"servingtopology.io/role": "x"}}}),),
         "spec.podTemplate.metadata"),
    # names: the name is the client Service's (DNS-1035 label) and a label value (at most 63)
    Case("name-with-a-dot", (("metadata.name", "llama.v2"),), "metadata.name"),
    Case("name-with-a-leading-digit", (("metadata.name", "8b-llama"),), "metadata.name"),
    Case("name-of-64-characters", (("metadata.name", "l" * 64),), "metadata.name"),
)

# Refused by the operator when it plans rather than when it parses the spec (the planner's own budget rule for a pin,
# planner.search.tables.layout_rejection), so the parse-level parity test leaves them out.
REFUSED_WHEN_PLANNED: tuple[Case, ...] = (
    Case("pinned-4xtp8-over-8-gpus", (*_PINNED, ("spec.pinned", {"replicas": 4, "tp": 8})), "spec"),
    Case("pinned-pd-over-8-gpus", (*_PINNED, ("spec.pinned", {"kind": "pd", "prefill": {"count": 2, "tp": 4},
                                                               "decode": {"count": 1, "tp": 2}})), "spec"),
    # DP attention counted as the engine counts it: 2 x TP4 with attention split 4 ways, and a TP2 decoder: 10 GPUs
    Case("pinned-pd-dp-attention-over-8-gpus", (*_PINNED, ("spec.pinned", {"kind": "pd", "dpAttention": True,
                                                                            "prefill": {"count": 2, "tp": 4, "dp": 4},
                                                                            "decode": {"count": 1, "tp": 2}})), "spec"),
)
