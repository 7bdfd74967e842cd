"""The prefill:decode ratio as a decision of its own: how many prefill and decode instances a PD layout
runs for a load, and why.

Called by the funnel (the balanced bound that prunes PD pairs), by `decide` (the chosen PD layout's
ratio and its reason, shown in the decision record and status) and by replanning when only the load moved
(the same roles at new counts). Both roles' capacities are linear in their instance counts, so the ratio
that balances them is μd/μp prefill instances per decode instance; whole counts, the SLOs and the GPU
budget pick the nearest that works. Pure; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from servingtopology.planner.figure_text import gpus_text, per_gpu_text
from servingtopology.planner.layout import Layout, LayoutKind, Role, RoleLayout
from servingtopology.planner.perf.analytic import estimate_decode, estimate_prefill, load_shape
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.perf.predict import predict_figures, slo_capacity_rps
from servingtopology.planner.problem import PdRatio, Problem
from servingtopology.planner.slo import LOAD_MARGIN, SLO_MARGIN, meets_slo_and_load
from servingtopology.planner.workload import Objective

__all__ = ["PdRatio", "balanced_per_gpu", "choose_pd_ratio", "rescale_pd", "COUNT_SPAN", "SLO_MARGIN", "LOAD_MARGIN"]

COUNT_SPAN = 16     # counts tried above each role's minimum for the load
RANK_TOLERANCE = 0.03  # capacities per GPU within 3 % of the best tie (decide.RANK_TOLERANCE)


def balanced_per_gpu(prefill_rps: Any, prefill_gpus: Any, decode_rps: Any, decode_gpus: Any) -> Any:
    """The highest capacity per GPU any prefill:decode ratio reaches, from per-instance capacities (req/s)
    and GPUs: min(cp·μp, cd·μd)/(cp·gp + cd·gd) peaks where cp·μp = cd·μd, at μp·μd/(μd·gp + μp·gd)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = prefill_rps * decode_rps / (decode_rps * prefill_gpus + prefill_rps * decode_gpus)
    return np.nan_to_num(out, nan=0.0, posinf=0.0)


def _per_instance_rps(problem: Problem, prefill: RoleLayout, decode: RoleLayout) -> tuple[float, float]:
    shape = load_shape(problem.workload, ttft_percentile=problem.slo.ttft_percentile, tpot_percentile=problem.slo.tpot_percentile)
    m, g, pe, en = problem.model, problem.gpu, problem.precision, problem.engine
    pp, dd = prefill.parallelism, decode.parallelism
    ep = estimate_prefill(m, g, precision=pe, engine=en, kv=prefill.knobs.kv_dtype, shape=shape, rate_rps=1.0, tp=pp.tp, pp=pp.pp,
                          dp=pp.dp, count=1, max_num_batched_tokens=float(prefill.knobs.max_num_batched_tokens), moe_ep=pp.moe_ep)
    pool = kv_pool_tokens(m, g, engine=en, precision=pe, parallelism=dd, knobs=decode.knobs)
    ed = estimate_decode(m, g, precision=pe, engine=en, kv=decode.knobs.kv_dtype, shape=shape, rate_rps=1.0, tp=dd.tp, pp=dd.pp,
                         dp=dd.dp, count=1, max_num_seqs=float(decode.knobs.max_num_seqs), pool_tokens=float(pool), moe_ep=dd.moe_ep)
    return float(ep.capacity_rps), float(ed.capacity_rps)


def choose_pd_ratio(problem: Problem, *, prefill: RoleLayout, decode: RoleLayout, max_gpus: int | None = None) -> PdRatio:
    """Choose prefill and decode instance counts for these role shapes and knobs at the problem's load.

    Each role needs enough instances to keep the load under LOAD_MARGIN of its capacity; from those
    minimums up to COUNT_SPAN more each, and along the balanced line up to `max_gpus` (the problem's budget
    by default), the counts meeting both SLOs with the margin are ranked by the objective: goodput per GPU
    takes the highest capacity per GPU, a tie within RANK_TOLERANCE going to fewer GPUs; min-gpus the
    fewest GPUs, then the higher capacity per GPU.
    """
    rate = float(problem.workload.arrival_rate_rps or 0.0)
    budget = problem.max_gpus if max_gpus is None else max_gpus
    mu_p, mu_d = _per_instance_rps(problem, prefill, decode)
    gp, gd = prefill.parallelism.gpus, decode.parallelism.gpus
    need_p = max(1, math.ceil(rate / max(LOAD_MARGIN * mu_p, 1e-12))) if mu_p > 0 else 0
    need_d = max(1, math.ceil(rate / max(LOAD_MARGIN * mu_d, 1e-12))) if mu_d > 0 else 0
    base = (f"a {prefill.parallelism.label_for(problem.engine)} prefill instance carries {mu_p:.2f} req/s and a "
            f"{decode.parallelism.label_for(problem.engine)} decode "
            f"instance {mu_d:.2f} req/s (balanced at {mu_d / max(mu_p, 1e-12):.2f} prefill per decode)")
    if need_p == 0 or need_d == 0 or need_p * gp + need_d * gd > budget:
        cp, cd = max(need_p, 1), max(need_d, 1)
        why = (f"{base}; {rate:g} req/s under a {LOAD_MARGIN:.0%} load ceiling needs at least {cp} prefill and {cd} decode "
               f"instances ({gpus_text(cp * gp + cd * gd)}), over the {budget}-GPU budget")
        return PdRatio(cp, cd, prefill.parallelism, decode.parallelism, mu_p, mu_d, False, why)
    # Counts near each role's minimum, and along the balanced line (cp ≈ cd·μd/μp) up to the budget.
    grid = np.meshgrid(np.arange(need_p, need_p + COUNT_SPAN), np.arange(need_d, need_d + COUNT_SPAN), indexing="ij")
    cd_line = np.arange(need_d, max(need_d, (budget - need_p * gp) // gd) + 1)
    line = cd_line * (mu_d / mu_p)
    cps = np.concatenate([grid[0].ravel(), np.floor(line), np.ceil(line)]).astype(np.int64)
    cds = np.concatenate([grid[1].ravel(), cd_line, cd_line]).astype(np.int64)
    pairs = np.unique(np.stack([np.maximum(cps, need_p), cds], axis=1), axis=0)
    cps, cds = pairs[:, 0], pairs[:, 1]
    fits = cps * gp + cds * gd <= budget
    cps, cds = cps[fits], cds[fits]
    layouts = [Layout.pd(replace(prefill, count=int(x)), replace(decode, count=int(y)), problem.precision) for x, y in zip(cps, cds, strict=True)]
    f = predict_figures(problem, layouts, [rate] * len(layouts))
    ok = meets_slo_and_load(problem.slo, ttft_s=np.asarray(f.ttft_s), tpot_s=np.asarray(f.tpot_s), rate_rps=rate,
                            capacity_rps=np.asarray(f.capacity_rps))
    gpus = cps * gp + cds * gd
    # Goodput per GPU as `decide` measures it: the highest load each split carries within the SLOs (with margins), per GPU.
    per_gpu = np.asarray(slo_capacity_rps(problem, layouts, margin=SLO_MARGIN, load_margin=LOAD_MARGIN)) / gpus
    if problem.objective is Objective.MIN_GPUS:
        order = np.lexsort((-per_gpu, gpus, ~ok))
    else:  # as `decide` ranks: within RANK_TOLERANCE of the best is a tie, and a tie goes to fewer GPUs
        top = float(per_gpu[ok].max()) if ok.any() else float(per_gpu.max())
        tied = per_gpu >= top * (1.0 - RANK_TOLERANCE)
        order = np.lexsort((-per_gpu, gpus, ~tied, ~ok))
    i = int(order[0])
    cp, cd, meets = int(cps[i]), int(cds[i]), bool(ok[i])
    util_p, util_d = rate / (cp * mu_p), rate / (cd * mu_d)
    if meets:
        best = int(np.flatnonzero(ok)[np.argmax(per_gpu[ok])])
        if problem.objective is Objective.MIN_GPUS:
            goal = "the fewest GPUs"
        elif best == i:
            goal = f"the most goodput per GPU ({per_gpu_text(float(per_gpu[i]))} req/s)"
        else:
            goal = (f"{per_gpu_text(float(per_gpu[i]))} req/s per GPU, within {RANK_TOLERANCE:.0%} of the best split ({cps[best]}:{cds[best]}, "
                    f"{per_gpu_text(float(per_gpu[best]))}) on fewer GPUs")
        why = (f"{base}; at {rate:g} req/s {cp} prefill and {cd} decode instances ({cp}:{cd} on {cp * gp + cd * gd} GPUs) meet both SLOs "
               f"with {goal}; prefill {util_p:.0%} and decode {util_d:.0%} busy")
    else:
        why = (f"{base}; no split from {need_p}P{need_d}D up to {COUNT_SPAN - 1} more of each, nor along the balanced line, "
               f"within {budget} GPUs meets both SLOs at {rate:g} req/s; {cp}P{cd}D comes closest")
    return PdRatio(cp, cd, prefill.parallelism, decode.parallelism, mu_p, mu_d, meets, why)


def rescale_pd(problem: Problem, layout: Layout, *, max_gpus: int | None = None) -> tuple[Layout, PdRatio]:
    """The same PD roles (shapes and knobs) at the counts `choose_pd_ratio` picks for the problem's load.

    For replanning when only the load moved: the result differs from `layout` in its counts alone, so
    planner.live.transition.in_place holds and the change scales the running sets without restarting an engine.
    """
    if layout.kind is not LayoutKind.PD:
        raise ValueError(f"rescale_pd needs a PD layout, got {layout.kind.value}")
    p, d = layout.roles[Role.PREFILL], layout.roles[Role.DECODE]
    ratio = choose_pd_ratio(problem, prefill=p, decode=d, max_gpus=max_gpus)
    return Layout.pd(replace(p, count=ratio.prefill_count), replace(d, count=ratio.decode_count), layout.precision), ratio
