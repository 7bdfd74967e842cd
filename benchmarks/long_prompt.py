"""Long prompts (issue 39, seed 000's scenario): CPU seconds and peak RSS of a plan of a GLM-5-class MoE with 510,012-token
prompts on up to 24 B200s under SGLang, pinned to seed 000's PD layout (3 prefill instances of TP1·DP4 with
memoryFraction 0.93, one TP8 decode instance: 20 GPUs) and unpinned (the search).

1. `servingtopology plan --json` in a fresh process per run (stage 6 on, as a user runs it): CPU s and peak RSS from
   the child's getrusage; the median of --repeats runs is judged.
2. The operator's plan worker (operator/cluster/plan_worker.py: a forkserver child under the default PlanBudget, 30 s
   wall and 768 MiB, the chart's and the operator's flags' defaults) on the same spec as a ServingTopology (policy.mode
   Pinned with spec.pinned, and unpinned): the child's CPU s and address-space growth (what the memory budget bounds),
   and whether it answered inside the budget.
Targets: each CLI plan at most 10 CPU s (median) and 1 GB peak RSS; each operator plan answered (no PlanBudgetExceeded)
in at most 10 CPU s. Exits 1 past a target. The model is tests/planner/data/model_configs/glm-5-nvfp4.json with the
seed's 524,288-token context.
Run: .venv/bin/python benchmarks/long_prompt.py [--repeats N] [--no-operator]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from funnel_scaling import plan_in_child

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "planner" / "data" / "model_configs" / "glm-5-nvfp4.json"
PROMPT_TOKENS, OUTPUT_TOKENS = 510_012, 8_192
MAX_CPU_S, MAX_RSS_MB = 10.0, 1024.0
PIN = {"kind": "pd", "engineArgs": {"memoryFraction": 0.6},
       "prefill": {"count": 3, "tp": 1, "dp": 4, "engineArgs": {"memoryFraction": 0.93}}, "decode": {"count": 1, "tp": 8}}


def seed000_spec(config_path: Path) -> dict[str, Any]:
    """Seed 000's scenario as a planning spec (no layout: the search)."""
    return {"modelConfig": str(config_path), "modelSource": "zai-org/GLM-5-NVFP4", "precision": "fp4", "kvCacheDtype": "fp8",
            "engine": {"name": "sglang"}, "hardware": {"gpu": "b200_sxm", "maxGPUs": 24},
            "workload": {"arrivalRate": 0.02, "inputTokens": PROMPT_TOKENS, "outputTokens": OUTPUT_TOKENS},
            "slo": {"ttftMs": {"p95": 600_000}, "tpotMs": {"p95": 100}}}


def _cli(spec_path: Path) -> tuple[dict[str, Any], float, float, int]:
    """`plan --json` in a fresh process: (its JSON, CPU s, peak RSS MB, exit code)."""
    out, cpu, _wall, rss, rc = plan_in_child(["plan", str(spec_path), "--json", "--no-progress"])
    return dict(out), cpu, rss, rc


def _operator(spec: dict[str, Any], *, pinned: bool) -> tuple[str, float, float, float]:
    """The operator's plan worker on the spec as a ServingTopology: (outcome, the child's CPU s, its MiB, wall s)."""
    from servingtopology.operator.api.resource import parse_topology_spec
    from servingtopology.operator.cluster.plan_worker import PlanBudgetExceeded, PlanWorker
    from servingtopology.operator.pass_context import problem_from_spec

    resource_spec = {**spec, "engine": {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23"},
                     "policy": {"mode": "Pinned" if pinned else "DryRun"}, **({"pinned": PIN} if pinned else {})}
    problem = problem_from_spec(parse_topology_spec(resource_spec), None)
    worker = PlanWorker(slots=1)
    t0 = time.perf_counter()
    try:
        decision = worker.plan(problem, wait_s=None)
        outcome = f"planned {decision.best.layout.label_for(problem.engine)} ({decision.best.prediction.source})"
    except PlanBudgetExceeded as exc:
        outcome = f"PlanBudgetExceeded: {exc}"
    finally:
        worker.close()
    grew_mib = worker.last_cost.memory_mib if worker.last_cost is not None else float("nan")
    return outcome, worker.plans_cpu_s, grew_mib, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="CLI runs of each case (the median CPU s is judged)")
    ap.add_argument("--no-operator", action="store_true", help="skip the operator's plan worker")
    args = ap.parse_args(argv)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        config = json.loads(CONFIG.read_text())
        config["max_position_embeddings"] = 524_288   # the seed's context cap
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(config))
        spec = seed000_spec(config_path)
        for name, layout in (("pinned", PIN), ("unpinned", None)):
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**spec, **({"layout": layout} if layout else {})}))
            runs = [_cli(path) for _ in range(max(1, args.repeats))]
            out, _, _, rc = runs[-1]
            cpu = statistics.median(r[1] for r in runs)
            rss = max(r[2] for r in runs)
            best: dict[str, Any] = out["best"] if isinstance(out.get("best"), dict) else {}
            chosen = f"{best.get('label', '—')} ({best.get('prediction', {}).get('source', '—')})"
            print(f"plan, {name:<9} CPU {cpu:6.2f} s (median of {len(runs)}: {', '.join(f'{r[1]:.2f}' for r in runs)})  "
                  f"peak RSS {rss:6.0f} MB  exit {rc}  chosen {chosen}")
            if rc != 0:
                failures.append(f"plan, {name}: exit {rc}")
            if cpu > MAX_CPU_S or rss > MAX_RSS_MB:
                failures.append(f"plan, {name}: {cpu:.2f} CPU s, {rss:.0f} MB (targets {MAX_CPU_S:g} s, {MAX_RSS_MB:g} MB)")
        if not args.no_operator:
            for pinned in (True, False):
                name = "pinned" if pinned else "unpinned"
                outcome, cpu, grew_mib, wall = _operator(spec, pinned=pinned)
                print(f"operator, {name:<9} CPU {cpu:6.2f} s  address space +{grew_mib:4.0f} MiB  wall {wall:6.2f} s  {outcome}")
                if outcome.startswith("PlanBudgetExceeded") or cpu > MAX_CPU_S:
                    failures.append(f"operator, {name}: {outcome}, {cpu:.2f} CPU s (target {MAX_CPU_S:g} s inside the default budget)")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
