"""Planning cases whose funnel ladders, survivors and chosen layouts are pinned in data/funnel_golden.json.

The golden file was written by the funnel before it became named stages over typed tables, so the tests
that read it prove the refactor and the scaling changed no count, no survivor and no choice.
Regenerate only on purpose: `.venv/bin/python -m tests.planner.funnel_cases --write`. The counts depend on
the performance model's calibration, so they are taken, and checked, under the calibration they were written
with (data/funnel_perf_params.json, the shipped parameters of main at 81c182a), not whatever a refit ships.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from servingtopology.planner.errors import Infeasible
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, LayoutKind, layout_to_dict
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import PerfParams, load_params, pinned_params
from servingtopology.planner.problem import Problem, SearchSpace
from servingtopology.planner.search.decide import decide
from servingtopology.planner.search.funnel import LADDER, run_funnel
from servingtopology.planner.workload import LengthDist, Slo, Workload
from servingtopology.spec import load_spec, parse_spec, to_problem

GOLDEN = Path(__file__).parent / "data" / "funnel_golden.json"
CALIBRATION = Path(__file__).parent / "data" / "funnel_perf_params.json"


def golden_params() -> PerfParams:
    """The calibration the golden counts were written with."""
    return load_params(json.loads(CALIBRATION.read_text()))
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WIDE_SIZES = (8, 16, 32, 64, 128)


def _wide(max_gpus: int) -> Problem:
    import yaml

    spec = yaml.safe_load((EXAMPLES / "plan-llama70b-wide.yaml").read_text())
    spec["hardware"]["maxGPUs"] = max_gpus
    return to_problem(parse_spec(spec))


def _wide_2s(max_gpus: int) -> Problem:
    """The wide preset at a 2 s p95 TTFT SLO: at its own 1.5 s no layout fits 32 GPUs once a plan counts the first
    token's delivery (a PD decode instance's admission and delivery steps: 24.6 of its steps under the golden
    calibration), and PD is chosen at 32 and 40 GPUs at two P:D ratios."""
    problem = _wide(max_gpus)
    return replace(problem, slo=replace(problem.slo, ttft_ms=2000.0))


def _small(**over: Any) -> Problem:
    spec: dict[str, Any] = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
                            "workload": {"arrivalRate": 10, "inputTokens": 1000, "outputTokens": 200},
                            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 60}}}
    spec.update(over)
    return to_problem(parse_spec(spec))


def _sampled(n: int) -> dict[str, Problem]:
    """A fixed sample of the property tests' problem space (tests/planner/strategies.py), plus MoE with attention DP."""
    rng = random.Random(15)
    models = ["llama-2-7b", "llama-3.1-8b", "qwen3-8b", "qwen3-32b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"]
    gpus = ["a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "l40s"]
    out = {}
    for i in range(n):
        model = rng.choice(models)
        moe = model in ("mixtral-8x7b", "qwen3-30b-a3b")
        out[f"sample-{i:02d}-{model}"] = Problem(
            model=resolve_model(model), gpu=resolve_gpu(rng.choice(gpus)), engine=rng.choice(list(Engine)), precision=Precision.BF16,
            max_gpus=rng.choice([2, 4, 8, 16, 32]),
            workload=Workload(input_tokens=LengthDist.fixed(rng.choice([128, 1000, 4000])),
                              output_tokens=LengthDist.fixed(rng.choice([64, 300])),
                              arrival_rate_rps=rng.choice([0.5, 2.0, 8.0, 20.0])),
            slo=Slo(ttft_ms=rng.choice([300.0, 1000.0, 3000.0]), tpot_ms=rng.choice([30.0, 60.0, 120.0])),
            search=SearchSpace(layouts=(LayoutKind.REPLICAS, LayoutKind.PD), tp=(1, 2, 4, 8), pp=(1, 2),
                               dp=(1, 2, 4) if moe and rng.random() < 0.7 else (1,),
                               max_num_seqs=(128, 256), max_num_batched_tokens=(2048, 8192), memory_fraction=(0.9,), top_k=4),
        )
    return out


def cases() -> dict[str, Problem]:
    """Every pinned case by name."""
    out: dict[str, Problem] = {"default-scenario": to_problem(load_spec(None))}
    out.update({f"wide-70b-{g}": _wide(g) for g in WIDE_SIZES})
    out.update({f"wide-70b-{g}-ttft-2s": _wide_2s(g) for g in (32, 40)})
    out["small-8b"] = _small()
    out["small-8b-sglang-min-gpus"] = _small(engine="sglang", objective="min-gpus")
    out["pd-long-prompts"] = _small(model="llama-3.1-70b", hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 32},
                                    workload={"arrivalRate": 2, "inputTokens": 16000, "outputTokens": 300},
                                    slo={"ttftMs": {"p95": 4000}, "tpotMs": {"p95": 30}})
    out["infeasible-ttft"] = _small(slo={"ttftMs": {"p95": 1}, "tpotMs": {"p95": 60}})
    out["infeasible-memory"] = _small(model="llama-3.1-405b", hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 4})
    out.update(_sampled(24))
    return out


def _layout_key(layout: Any) -> str:
    d = layout_to_dict(layout)
    kv = [r.knobs.kv_dtype.value for r in layout.roles.values()]
    return json.dumps({**d, "kv": kv}, sort_keys=True)


def summarise(problem: Problem) -> dict[str, Any]:
    """The funnel's ladder, its survivors (digest plus the first 8 in full) and decide's analytical choice."""
    result = run_funnel(problem, ladder=LADDER)  # engine-neutral: the pins predate the releases' rules
    survivors = [_layout_key(s.layout) for s in result.survivors]
    out: dict[str, Any] = {
        "candidates_total": result.candidates_total,
        "ladder": [[s.stage, s.admitted, s.rejected, dict(sorted(s.reasons.items()))] for s in result.stages],
        "survivors_total": result.survivors_total,
        "survivors_kept": len(survivors),
        "survivors_sha256": hashlib.sha256("\n".join(survivors).encode()).hexdigest(),
        "survivors_head": [[k, s.ttft_s, s.tpot_s, s.tpot_mean_s, s.capacity_rps, s.pool_tokens]
                           for k, s in zip(survivors[:8], result.survivors[:8], strict=True)],
        "last_stage": result.last_stage,
        "closest_miss": result.closest_miss,
    }
    try:
        d = decide(problem, ladder=LADDER)
        out["best"] = _layout_key(d.best.layout)
        out["best_label"] = d.best.layout.label
        out["alternatives"] = [a.layout.label for a in d.alternatives]
    except Infeasible as e:
        out["infeasible"] = [e.stage, e.closest_miss]
    return out


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python -m tests.planner.funnel_cases --write   (rewrites the golden file on purpose)")
        return 2
    with pinned_params(golden_params()):
        golden = {name: summarise(p) for name, p in cases().items()}
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(golden)} cases to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
