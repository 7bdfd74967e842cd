"""What planning a GPU pool together is worth (planner/pool/plan.py), and where prefill on one kind with decode on another pays.

1. Shifting traffic: four models share 24 H100 and 24 A100 through three phases of traffic. The pool plan (min-cost,
   re-planned each phase) against a static split: each model keeps the GPUs of the phase-0 pool plan plus a share of
   the idle ones in proportion to its phase-0 load, and is planned alone there each phase (one-member pool). Printed:
   goodput (req/s within the SLOs), $/hour of the GPUs in use, and requests within the SLOs per $ of the pool (both
   hold the same 48 GPUs, $110.16/hour, whether they use them or not), per phase and overall. Targets: the pool plan
   serves at least the static split's goodput in every phase, and more requests per $ of the pool overall.
2. Mixed kinds: Llama-3.1-8B, 2048-token prompts and 2048-token answers at 20 req/s, p95 TTFT 1 s / TPOT 40 ms, on
   H100 ($2.99/h, 400 Gb/s) and A100 ($1.60/h, 200 Gb/s). $ per 1,000 requests at the SLO capacity of the best layout of
   each single kind against H100 prefill + A100 decode; the mixed layout simulated at the load (planner/sim through
   planner.sim.stage.simulate_mixed); then the same pool on 10 Gb/s NICs, where the transfer floor refuses it. Target:
   the mixed layout is the cheaper per request and its simulation meets both SLOs; at 10 Gb/s it is refused by name.
Prices are illustrative on-demand list prices per GPU-hour (assumptions, not quotes); they are inputs of the pool.

Last printed (2026-12-03, the shared 2-core machine under load):
  see benchmarks/README.md ("Pool planning")
Run: .venv/bin/python benchmarks/pool_benefit.py [--records DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Role
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import GpuKind, PoolDecision, PoolObjective, PoolProblem, plan_pool
from servingtopology.planner.pool.record import fleet_table, render_pool_record
from servingtopology.planner.problem import Problem
from servingtopology.planner.sim.stage import simulate_mixed
from servingtopology.spec import parse_spec, to_problem

H100 = GpuKind("h100", resolve_gpu("h100_sxm"), 24, 2.99, 400.0)
A100 = GpuKind("a100", resolve_gpu("a100_sxm"), 24, 1.60, 200.0)
POOL_COST = H100.count * H100.price_per_hour + A100.count * A100.price_per_hour

MODELS = {   # name: (model, prompt, answer, p95 TTFT ms, p95 TPOT ms)
    "chat": ("meta-llama/Llama-3.1-8B-Instruct", 1024, 256, 800, 40),
    "rag": ("Qwen/Qwen3-8B", 4096, 256, 1500, 50),
    "code": ("Qwen/Qwen3-32B", 2048, 512, 1500, 60),
    "agent": ("meta-llama/Llama-3.1-70B", 2048, 256, 2000, 70),
}
PHASES = (   # req/s per model: the traffic moves from chat to rag and code, then to the agent
    {"chat": 40.0, "rag": 6.0, "code": 3.0, "agent": 1.0},
    {"chat": 12.0, "rag": 14.0, "code": 8.0, "agent": 1.0},
    {"chat": 10.0, "rag": 4.0, "code": 3.0, "agent": 5.0},
)


def problem_for(model: str, prompt: int, answer: int, rate: float, ttft_ms: float, tpot_ms: float) -> Problem:
    return to_problem(parse_spec({"model": model, "hardware": {"gpu": "h100_sxm", "maxGPUs": 64},
                                  "workload": {"arrivalRate": rate, "inputTokens": prompt, "outputTokens": answer},
                                  "slo": {"ttftMs": {"p95": ttft_ms}, "tpotMs": {"p95": tpot_ms}}}))


def requests(phase: dict[str, float]) -> list[MemberRequest]:
    return [MemberRequest(name, problem_for(m, p, a, phase[name], t, o), 48) for name, (m, p, a, t, o) in MODELS.items()]


def static_split(first: PoolDecision, phase0: dict[str, float]) -> dict[str, dict[str, int]]:
    """Each member's GPUs by kind: its phase-0 allocation plus idle GPUs in proportion to its phase-0 load (largest remainder)."""
    total = sum(phase0.values())
    split = {a.name: {k.name: a.gpus.get(k.name, 0) for k in (H100, A100)} for a in first.members}
    for k in (H100, A100):
        idle = first.idle[k.name]
        shares = {n: idle * phase0[n] / total for n in split}
        for n in split:
            split[n][k.name] += int(shares[n])
        left = idle - sum(int(s) for s in shares.values())
        for n in sorted(shares, key=lambda n: (-(shares[n] - int(shares[n])), n))[:left]:
            split[n][k.name] += 1
    return split


def alone(req: MemberRequest, share: dict[str, int]) -> tuple[float, float]:
    """(goodput, $/hour) of one member planned alone on its share (min-cost within it; the most goodput if short)."""
    kinds = tuple(replace(k, count=share[k.name]) for k in (H100, A100) if share[k.name] > 0)
    if not kinds:
        return 0.0, 0.0
    try:
        pool, _ = build_pool(kinds, [replace(req, cap_gpus=sum(share.values()))], objective=PoolObjective.MIN_COST)
    except Exception as exc:   # the share fits no layout of the model: it serves nothing
        print(f"    {req.name} alone on {share}: {exc}")
        return 0.0, 0.0
    d = plan_pool(pool)
    return d.goodput_rps, d.cost_per_hour


def shifting_traffic(records: Path | None) -> bool:
    print("1. Shifting traffic: 4 models on 24 H100 ($2.99/h) + 24 A100 ($1.60/h), 3 phases")
    pooled_good = pooled_cost = static_good = static_cost = 0.0
    ok = True
    split: dict[str, dict[str, int]] = {}
    for i, phase in enumerate(PHASES):
        t0 = time.process_time()
        pool, found = build_pool((H100, A100), requests(phase), objective=PoolObjective.MIN_COST)
        d = plan_pool(pool)
        cpu = time.process_time() - t0
        if i == 0:
            split = static_split(d, phase)
            print(f"   static split (phase-0 plan + idle by load): {split}")
        sg, sc = 0.0, 0.0
        for req in requests(phase):
            g, c = alone(req, split[req.name])
            sg, sc = sg + g, sc + c
        load = sum(phase.values())
        print(f"   phase {i}: load {load:.0f} req/s {phase}")
        print("   " + fleet_table(pool, d).replace("\n", "\n   "))
        print(f"   pool plan: goodput {d.goodput_rps:.1f} req/s, ${d.cost_per_hour:.2f}/h in use, "
              f"{d.goodput_rps * 3600 / POOL_COST:,.0f} req per $ of the pool ({cpu:.1f} CPU s, {d.solver.method})")
        print(f"   static split: goodput {sg:.1f} req/s, ${sc:.2f}/h in use, {sg * 3600 / POOL_COST:,.0f} req per $ of the pool")
        ok &= d.goodput_rps >= sg - 1e-6
        pooled_good, pooled_cost, static_good, static_cost = pooled_good + d.goodput_rps, pooled_cost + d.cost_per_hour, static_good + sg, static_cost + sc
        if records is not None:
            (records / f"shifting-phase{i}.md").write_text(render_pool_record(pool, d, notes={k: v.notes for k, v in found.items()}))
    pooled = pooled_good * 3600 / (POOL_COST * len(PHASES))
    static = static_good * 3600 / (POOL_COST * len(PHASES))
    print(f"   overall: pool plan {pooled:,.0f} req within the SLOs per $ of the pool ({pooled_good / 3:.1f} req/s mean goodput, "
          f"${pooled_cost / 3:.2f}/h mean in use); static split {static:,.0f} per $ ({static_good / 3:.1f} req/s, ${static_cost / 3:.2f}/h in use); "
          f"ratio {pooled / static:.3f}x")
    ok &= pooled > static
    return ok


def mixed_kinds(records: Path | None) -> bool:
    print("\n2. Mixed kinds: Llama-3.1-8B 2048 in / 2048 out at 20 req/s, p95 TTFT 1 s, TPOT 40 ms; H100 $2.99/h + A100 $1.60/h")
    req = MemberRequest("long", problem_for("meta-llama/Llama-3.1-8B-Instruct", 2048, 2048, 20.0, 1000, 40), 48)
    pool, found = build_pool((H100, A100), [req], objective=PoolObjective.MIN_COST)
    price = {k.name: k.price_per_hour for k in pool.kinds}
    best: dict[str, tuple[float, str]] = {}
    for o in pool.members[0].options:
        per_k = sum(price[k] * v for k, v in o.gpus.items()) / (o.capacity_rps * 3600) * 1000
        if o.group not in best or per_k < best[o.group][0]:
            best[o.group] = (per_k, o.label)
    for g, (v, label) in sorted(best.items(), key=lambda kv: kv[1][0]):
        print(f"   {g:<12} ${v:.3f} per 1,000 requests at SLO capacity ({label})")
    single = min(v for g, (v, _) in best.items() if "→" not in g)
    mixed = best.get("h100→a100", (float("inf"), ""))[0]
    print(f"   H100 prefill + A100 decode: ${mixed:.3f} against the best single kind's ${single:.3f} per 1,000 requests "
          f"({(1 - mixed / single) * 100:+.1f}% cheaper)")
    ok = mixed < single
    only = PoolProblem(pool.kinds, (replace(pool.members[0], options=tuple(o for o in pool.members[0].options if o.group == "h100→a100")),))
    d = plan_pool(only)
    (part,) = d.members[0].parts
    assert part.option.layout is not None
    sim = simulate_mixed(req.problem, part.option.layout, prefill_gpu=H100.gpu, decode_gpu=A100.gpu, link_gbit=200.0, num_requests=600, seed=0)
    s = sim.summary(warmup_requests=100)
    slo = req.problem.slo
    print(f"   simulated {part.option.label} at 20 req/s: p95 TTFT {s.ttft_ms.p95:.0f} ms (SLO {slo.ttft_ms:g}), p95 TPOT {s.tpot_ms.p95:.1f} ms "
          f"(SLO {slo.tpot_ms:g}); {s.finished} of {s.requests} finished (prefill {part.option.layout.roles[Role.PREFILL].gpus} H100, "
          f"decode {part.option.layout.roles[Role.DECODE].gpus} A100)")
    ok &= s.ttft_ms.p95 <= slo.ttft_ms and s.tpot_ms.p95 <= slo.tpot_ms
    d_all = plan_pool(pool)
    if records is not None:
        (records / "mixed-400-200gbps.md").write_text(render_pool_record(pool, d_all, refusals={k: v.refusals for k, v in found.items()}))
    print("   the pool plan (min-cost) picks: " + "; ".join(a.why for a in d_all.members))
    slow = (replace(H100, nic_gbit=10.0), replace(A100, nic_gbit=10.0))
    pool10, found10 = build_pool(slow, [req], objective=PoolObjective.MIN_COST)
    d10 = plan_pool(pool10)
    refused = found10["long"].refusals
    print("   at 10 Gb/s: " + "; ".join(f"{g} {r.rule}: {r.reason}" for g, r in refused[:2]))
    print("   the pool plan at 10 Gb/s picks: " + "; ".join(a.why for a in d10.members))
    ok &= any(r.rule == "transfer-floor" and g == "h100→a100" for g, r in refused)
    ok &= not any("→" in p.option.group for a in d10.members for p in a.parts)
    if records is not None:
        (records / "mixed-10gbps.md").write_text(render_pool_record(pool10, d10, refusals={k: v.refusals for k, v in found10.items()}))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=Path, help="write the pool decision records here")
    args = ap.parse_args()
    if args.records:
        args.records.mkdir(parents=True, exist_ok=True)
    a = shifting_traffic(args.records)
    b = mixed_kinds(args.records)
    print(f"\ntargets: shifting traffic {'met' if a else 'MISSED'}; mixed kinds {'met' if b else 'MISSED'}")
    return 0 if a and b else 1


if __name__ == "__main__":
    sys.exit(main())
