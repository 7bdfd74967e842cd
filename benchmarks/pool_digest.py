"""One sha256 per pool plan, to show that a change to the pool planner's speed left every plan as it was.

Cases: pool_scale.py's sizes (20 × 3 kinds at ×1 and ×10 the load, 40 × 3, 20 × 4), `plan --pool examples/pool.yaml
--json` (less its cpu_s) and the e2e scenarios' pools through the operator's pool pass (operator/pool_pass.py, the
members and inventories of e2e/test_pool.py and e2e/test_pool_auto.py on fake nodes). Each digest covers every
member's options and notes (planner.pool.options.MemberOptions) and the whole PoolDecision, by repr (floats to the
last bit). Run it on two checkouts and compare the lines: a speed-up must print the same ones.

Run: .venv/bin/python benchmarks/pool_digest.py [CASE ...]
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pool_scale

from servingtopology.cli.main import main as cli_main
from servingtopology.operator.pool_pass import pool_pass
from servingtopology.planner.pool.options import build_pool
from servingtopology.planner.pool.plan import PoolObjective, plan_pool

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _bench(n_members: int, n_kinds: int, scale: float) -> str:
    pool, found = build_pool(pool_scale.kinds(n_kinds), pool_scale.members(n_members, scale), objective=PoolObjective.MIN_COST)
    return _sha(repr(sorted(found.items())) + repr(pool) + repr(plan_pool(pool)))


def _example() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["plan", "--pool", str(ROOT / "examples" / "pool.yaml"), "--json"])
    doc = json.loads(out.getvalue())
    doc.pop("cpu_s")
    return _sha(f"{code} " + json.dumps(doc, sort_keys=True))


def _node(name: str, product: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}, "spec": {}}


NODES = [_node("h1", H100), _node("h2", H100), _node("a1", A100), _node("a2", A100)]


def _member(name: str, rate: float, *, priority: int, max_gpus: int, gpu: str = "h100_sxm", layouts: list[str] | None = None,
            pool_field: bool = False) -> dict[str, Any]:
    """e2e/objects.py `topology` as the pool scenarios set it (Llama-3.1-8B, 1024 in / 256 out, p95 TTFT 1 s / TPOT 50 ms)."""
    spec: dict[str, Any] = {"model": "meta-llama/Llama-3.1-8B-Instruct", "precision": "bf16",
                            "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
                            "hardware": {"gpu": gpu, "gpusPerNode": 8, "maxGPUs": max_gpus},
                            "workload": {"arrivalRate": rate, "inputTokens": 1024, "outputTokens": 256},
                            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}}, "objective": "goodput-per-gpu",
                            "policy": {"mode": "Auto", "allowedLayouts": layouts or ["replicas", "pd"]}}
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if pool_field:
        spec["pool"] = {"name": "fleet", "priority": priority}
    else:
        meta["labels"] = {"servingtopology.io/pool": "fleet"}
        meta["annotations"] = {"servingtopology.io/pool-priority": str(priority)}
    return {"metadata": meta, "spec": spec}


def _e2e_pool() -> str:
    """e2e/test_pool.py: chat, rag and batch on H100 (≤ 16) and A100, then chat's traffic moved to rag."""
    pool = {"metadata": {"name": "fleet", "namespace": "ns", "generation": 1}, "status": {},
            "spec": {"objective": "min-cost", "inventory": [{"kind": "h100", "gpu": "h100_sxm", "pricePerHour": 2.99, "maxGPUs": 16},
                                                            {"kind": "a100", "gpu": "a100_sxm", "pricePerHour": 1.6}]}}
    out = []
    for chat, rag in ((60.0, 3.0), (3.0, 60.0)):
        members = [_member("chat", chat, priority=5, max_gpus=16), _member("rag", rag, priority=1, max_gpus=16),
                   _member("batch", 4.0, priority=0, max_gpus=16)]
        out.append(pool_pass(pool, members, NODES, now=NOW).status)
    return _sha(json.dumps(out, sort_keys=True, default=str))


def _e2e_pool_auto() -> str:
    """e2e/test_pool_auto.py: replicas-only members on their own kinds (5 H100, 4 A100), DryRun then Auto, then short."""
    out = []
    for mode, chat in (("DryRun", 5.0), ("Auto", 5.0), ("Auto", 70.0)):
        pool = {"metadata": {"name": "fleet", "namespace": "ns", "generation": 1}, "status": {},
                "spec": {"objective": "min-cost", "mode": mode, "surge": 2,
                         "inventory": [{"kind": "h100", "gpu": "h100_sxm", "pricePerHour": 2.99, "maxGPUs": 5},
                                       {"kind": "a100", "gpu": "a100_sxm", "pricePerHour": 1.6, "maxGPUs": 4}]}}
        members = [_member("chat", chat, priority=1, max_gpus=8, layouts=["replicas"], pool_field=True),
                   _member("rag", 70.0, priority=5, max_gpus=8, layouts=["replicas"], pool_field=True),
                   _member("batch", 5.0, priority=0, max_gpus=8, gpu="a100_sxm", layouts=["replicas"], pool_field=True)]
        out.append(pool_pass(pool, members, NODES, now=NOW).status)
    return _sha(json.dumps(out, sort_keys=True, default=str))


CASES: dict[str, Callable[[], str]] = {
    "20x3": lambda: _bench(20, 3, 1.0),
    "20x3-load10": lambda: _bench(20, 3, 10.0),
    "40x3": lambda: _bench(40, 3, 1.0),
    "20x4": lambda: _bench(20, 4, 1.0),
    "example": _example,
    "e2e-pool": _e2e_pool,
    "e2e-pool-auto": _e2e_pool_auto,
}


def main(argv: list[str]) -> int:
    for name in argv or list(CASES):
        print(f"{name} {CASES[name]()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
