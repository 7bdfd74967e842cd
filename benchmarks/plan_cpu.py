"""CPU seconds of the operator's plan (issue 17, load): `decide` with stage 6 (the simulator, top K 8) on the e2e load
scenario's specs (Llama-3.1-8B on up to 8 H100s, 2048-in/256-out, p95 TTFT 1 s / TPOT 50 ms, 1 to 13.25 req/s), in
this process and through the operator's plan worker (a child per plan, forked from its warmed forkserver).

--digest prints one sha256 over repr() of every Decision (and of the examples/ specs' Decisions): the same digest
before and after a change to the simulator, the funnel or the ranking proves the plans, their figures and their
alternatives unchanged (under the same perf_params.json).

Last printed (2026-12-01, the shared 2-core machine at load average ~10; before and after run interleaved, 6 plans, twice):
  before (main at fd51ccb): 1.02 / 1.05 CPU s a plan in process, 1.06 / 1.17 CPU s a plan child
  after:                    0.93 / 0.95 CPU s a plan in process, 0.90 / 0.91 CPU s a plan child; the same digest
  (on a quieter machine, in process: 1.02 -> 0.82 CPU s; a plan child 0.85-0.95 -> 0.80 CPU s)
Run: .venv/bin/python benchmarks/plan_cpu.py [--plans N] [--digest]
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import sys
from pathlib import Path
from typing import Any

import yaml

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.cluster.plan_worker import PlanWorker, plan_with_simulator
from servingtopology.planner.errors import Infeasible, InvalidSpec
from servingtopology.planner.problem import Problem
from servingtopology.spec import to_problem

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_spec(rate_rps: float) -> dict[str, Any]:
    """The spec of e2e/objects.py topology() as e2e/test_load.py applies it (allowedLayouts replicas and PD)."""
    return {
        "model": "meta-llama/Llama-3.1-8B-Instruct", "precision": "bf16", "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
        "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
        "workload": {"arrivalRate": rate_rps, "inputTokens": 2048, "outputTokens": 256},
        "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}}, "objective": "goodput-per-gpu",
        "policy": {"mode": "DryRun", "replanInterval": "10m", "cooldown": "10m", "minImprovement": 0.1, "allowedLayouts": ["replicas", "pd"]},
        "metrics": {"prometheusUrl": "http://127.0.0.1:9090"},
    }


def _problem(spec: dict[str, Any]) -> Problem:
    import dataclasses

    problem = to_problem(parse_topology_spec(spec))
    allowed = spec.get("policy", {}).get("allowedLayouts")
    if allowed:   # as operator/pass_context.py build_problem narrows the search
        kinds = tuple(k for k in problem.search.layouts if k in allowed)
        problem = dataclasses.replace(problem, search=dataclasses.replace(problem.search, layouts=kinds))
    return problem


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _examples() -> list[Problem]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ServingTopology":
                try:
                    out.append(_problem(doc["spec"]))
                except (InvalidSpec, ValueError, OSError):
                    continue    # a spec naming a ConfigMap the CLI cannot read
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=10, help="load-scenario specs to plan (rates 1, 1.25, ... req/s)")
    ap.add_argument("--digest", action="store_true", help="also print the sha256 of every Decision's repr")
    args = ap.parse_args(argv)
    problems = [_problem(load_spec(1.0 + 0.25 * i)) for i in range(args.plans)]
    plan_with_simulator(problems[0])   # warm: lazy imports and data files, as the worker's forkserver is
    c0 = _cpu_s()
    decisions = [plan_with_simulator(p) for p in problems]
    in_process = (_cpu_s() - c0) / len(problems)
    worker = PlanWorker(slots=1)
    try:
        for p in problems:
            worker.plan(p, wait_s=None)
    finally:
        worker.close()
    print(f"{len(problems)} plans (topK {problems[0].search.top_k}): {in_process:.3f} CPU s a plan in process, "
          f"{worker.plans_cpu_s / len(problems):.3f} CPU s a plan child; chosen {sorted({d.best.layout.label for d in decisions})}")
    if args.digest:
        h = hashlib.sha256()
        for d in decisions:
            h.update(repr(d).encode())
        for p in _examples():
            try:
                h.update(repr(plan_with_simulator(p)).encode())
            except (Infeasible, InvalidSpec) as exc:
                h.update(f"{type(exc).__name__}: {exc}".encode())
        print(f"digest {h.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
