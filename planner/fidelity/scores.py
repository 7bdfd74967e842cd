"""Fidelity scores of predictions against measurements: percentage errors, skip reasons and ranking agreement.

Called by `servingtopology validate` and the benchmarks after planner.fidelity.benchmark_cases has predicted the rows.
Ranking: among rows with the same model, weight precision, system, backend, input/output lengths and
concurrency but different topologies (precision is the user's choice, not the planner's, so an FP4 and an
FP8 deployment of one checkpoint are not ranked against each other), is the predicted best (lowest TPOT; separately highest output tokens/s per GPU) the
measured best? `top1_agreement` is that strict share over both criteria; `top1_within_5pct` also counts a pick
measured within 5 % of the best. Duplicate measurements of one topology are averaged first.

Beside them: the trivial ranking baseline (most GPUs wins on TPOT, fewest GPUs wins on tokens/s per GPU) and the
pairwise ordering accuracy. The baseline's rule says nothing about topologies of equal GPU count (TP8, TP8·EP8,
DP8), so `baseline_top1` is its expected score under a uniformly random tie-break: the rule's own information and
no more. `baseline_top1_first_listed` gives every tie to the topology listed first in the data, which is how the
issue's 0.896 was scored; it rides on the file's order (the sweeps list plain TP first, and plain TP often is the
best), information a ranker does not have, so it is reported, not used as the bar. Pairwise: over every pair of
topologies within a group whose measured figures differ, the share the prediction orders as measured (both
criteria pooled). Groups mix engine releases where a sweep ran some topologies on one release and others on another
(the schema's `backend_version`); `same_release` scores the groups of one release alone, and `cross_release_groups`
counts the mixed ones. Pure; no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from servingtopology.planner.fidelity.benchmark_cases import BenchmarkCase, Prediction, Skip

__all__ = ["ape_stats", "decision_quality", "e2e_latency_ms", "equal_gpu_pairs", "layout_kind", "ranking_score", "summarize",
           "tokens_per_gpu_s"]

Result = Prediction | Skip
_NEAR = 0.05


def ape_stats(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float | None]:
    """Median and mean absolute percentage error (in %) and the share of rows within ±20 % (0–1)."""
    if not predicted:
        return {"median_ape": None, "mape": None, "within_20pct": None}
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    ape = np.abs(p / m - 1.0) * 100.0
    return {"median_ape": round(float(np.median(ape)), 2), "mape": round(float(np.mean(ape)), 2),
            "within_20pct": round(float(np.mean(ape <= 20.0)), 4)}


def tokens_per_gpu_s(case: BenchmarkCase, ttft_ms: float, tpot_ms: float) -> float:
    """Output tokens per second per GPU of a closed loop: N clients each emitting osl tokens per request."""
    cycle_s = e2e_latency_ms(case, ttft_ms, tpot_ms) / 1e3
    return case.concurrency * case.osl / max(cycle_s, 1e-9) / case.gpus


def e2e_latency_ms(case: BenchmarkCase, ttft_ms: float, tpot_ms: float) -> float:
    """End-to-end request latency of a row: TTFT + (osl − 1) · TPOT (the issue's definition; robust to where a
    release counts the first token, which moves time between the two columns but not their sum)."""
    return ttft_ms + max(case.osl - 1, 0) * tpot_ms


# Decision quality (issue #24): within a benchmark group the pick is the topology with the best predicted figure;
# its regret is how much worse its measured figure is than the best measured one (0 = the best was picked). A
# trivial rule is scored the same way, its ties (topologies of equal GPU count) averaged.
OBJECTIVES = ("tokens_per_gpu", "tpot")


def _group_figures(topos: dict[str, list[tuple[BenchmarkCase, Prediction]]]) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """Per objective, the measured and the predicted figure of each topology of a group (duplicates averaged)."""
    return {
        "tpot": ({t: float(np.mean([c.tpot_ms for c, _ in v])) for t, v in topos.items()},
                 {t: float(np.mean([r.tpot_ms for _, r in v])) for t, v in topos.items()}),
        "tokens_per_gpu": ({t: float(np.mean([tokens_per_gpu_s(c, c.ttft_ms, c.tpot_ms) for c, _ in v])) for t, v in topos.items()},
                           {t: float(np.mean([tokens_per_gpu_s(c, r.ttft_ms, r.tpot_ms) for c, r in v])) for t, v in topos.items()}),
    }


def _regret(measured: float, best: float, *, lowest: bool) -> float:
    """How much worse `measured` is than `best`, as a fraction: TPOT pick/best − 1; tokens/s per GPU best/pick − 1."""
    return measured / best - 1.0 if lowest else best / max(measured, 1e-12) - 1.0


def decision_quality(groups: Sequence[dict[str, list[tuple[BenchmarkCase, Prediction]]]]) -> dict[str, Any]:
    """Per objective: the share of groups whose pick measured within 5 % of the best, the trivial rule's share
    (fewest GPUs for tokens/s per GPU, most GPUs for TPOT; ties averaged), and the median and worst regrets."""
    out: dict[str, Any] = {"groups": len(groups)}
    for objective in OBJECTIVES:
        lowest = objective == "tpot"
        regrets: list[float] = []
        rule_regrets: list[float] = []
        near = rule_near = 0.0
        for topos in groups:
            meas, pred = _group_figures(topos)[objective]
            best = min(meas.values()) if lowest else max(meas.values())
            regret = _regret(meas[_best(pred, lowest=lowest)], best, lowest=lowest)
            regrets.append(regret)
            near += regret <= _NEAR + 1e-12
            gpus = {t: v[0][0].gpus for t, v in topos.items()}
            target = max(gpus.values()) if lowest else min(gpus.values())
            tied = [t for t in topos if gpus[t] == target]
            tied_regrets = [_regret(meas[t], best, lowest=lowest) for t in tied]
            rule_regrets.append(float(np.mean(tied_regrets)))
            rule_near += float(np.mean([r <= _NEAR + 1e-12 for r in tied_regrets]))
        n = len(groups)
        out[objective] = {
            "within_5pct": round(near / n, 4) if n else None,
            "rule_within_5pct": round(rule_near / n, 4) if n else None,
            "margin_over_rule": round((near - rule_near) / n, 4) if n else None,
            "median_regret_pct": round(float(np.median(regrets)) * 100, 2) if n else None,
            "worst_regret_pct": round(float(np.max(regrets)) * 100, 2) if n else None,
            "rule_median_regret_pct": round(float(np.median(rule_regrets)) * 100, 2) if n else None,
            "rule_worst_regret_pct": round(float(np.max(rule_regrets)) * 100, 2) if n else None,
        }
    return out


def _best(values: dict[str, float], *, lowest: bool) -> str:
    return min(values, key=values.__getitem__) if lowest else max(values, key=values.__getitem__)


def _group_by_benchmark(cases: Sequence[BenchmarkCase], results: Sequence[Result], *,
                        by_release: bool) -> list[dict[str, list[tuple[BenchmarkCase, Prediction]]]]:
    """Predicted rows grouped by benchmark (and, with `by_release`, by engine release), then by topology."""
    groups: dict[tuple[Any, ...], dict[str, list[tuple[BenchmarkCase, Prediction]]]] = {}
    for c, r in zip(cases, results, strict=True):
        if isinstance(r, Prediction):
            key: tuple[Any, ...] = (c.model_path, c.precision, c.moe_precision, c.system, c.backend, c.isl, c.osl, c.concurrency,
                                    c.engine_release if by_release else None)
            groups.setdefault(key, {}).setdefault(f"{c.mode}:{c.topology_label}", []).append((c, r))
    return [topos for topos in groups.values() if len(topos) >= 2]


def layout_kind(case: BenchmarkCase) -> str:
    """The layout family a row ran: pd, dp-attention, tp+ep, tp (TP and/or PP) or single-gpu."""
    if case.mode == "disagg":
        return "pd"
    assert case.agg is not None
    if case.agg.dp > 1:
        return "dp-attention"
    if case.agg.moe_ep > 1:
        return "tp+ep"
    return "tp" if case.agg.tp * case.agg.pp > 1 else "single-gpu"


def _equal_gpu_groups(groups: Sequence[dict[str, list[tuple[BenchmarkCase, Prediction]]]]
                      ) -> list[dict[str, list[tuple[BenchmarkCase, Prediction]]]]:
    """Each group split by GPU count, keeping the parts of two topologies or more: layouts a GPU-count rule ties."""
    out: list[dict[str, list[tuple[BenchmarkCase, Prediction]]]] = []
    for topos in groups:
        by_gpus: dict[int, dict[str, list[tuple[BenchmarkCase, Prediction]]]] = {}
        for t, v in topos.items():
            by_gpus.setdefault(v[0][0].gpus, {})[t] = v
        out.extend(part for part in by_gpus.values() if len(part) >= 2)
    return out


def equal_gpu_pairs(groups: Sequence[dict[str, list[tuple[BenchmarkCase, Prediction]]]]) -> dict[str, Any]:
    """Pairs of layouts at equal GPU count within a group (plain TP, TP·EP, DP attention, PD): how well the prediction
    says how much better one is than the other, where a rule of thumb has nothing to go on.

    Per objective (TPOT; tokens/s per GPU): the median of |predicted ratio / measured ratio − 1| over every pair, and
    the share of pairs whose measured figures differ by more than 5 % that the prediction orders as measured
    (`order_right`, both objectives pooled, with its count `ordered_pairs`; `order_right_tpot`,
    `order_right_tokens_per_gpu`). `by_kinds` splits the pairs by the two layout kinds compared ("tp|tp+ep");
    `decision_quality` scores the picks on the equal-GPU sub-groups beside the rules (which tie there, so score their
    average).
    """
    parts = _equal_gpu_groups(groups)
    errors: dict[str, list[float]] = {o: [] for o in OBJECTIVES}
    kinds: dict[str, dict[str, list[float]]] = {}
    order: dict[str, list[float]] = {o: [] for o in OBJECTIVES}
    for topos in parts:
        figures = _group_figures(topos)
        kind = {t: layout_kind(v[0][0]) for t, v in topos.items()}
        names = sorted(topos)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                key = "|".join(sorted((kind[a], kind[b])))
                slot = kinds.setdefault(key, {"tpot": [], "tokens_per_gpu": [], "order": []})
                for objective in OBJECTIVES:
                    meas, pred = figures[objective]
                    r_meas, r_pred = meas[a] / meas[b], pred[a] / pred[b]
                    err = abs(r_pred / r_meas - 1.0)
                    errors[objective].append(err)
                    slot[objective].append(err)
                    if abs(r_meas - 1.0) > _NEAR:
                        ok = float((r_pred > 1.0) == (r_meas > 1.0))
                        order[objective].append(ok)
                        slot["order"].append(ok)

    def med(xs: list[float]) -> float | None:
        return round(float(np.median(xs)) * 100, 2) if xs else None

    def share(xs: list[float]) -> float | None:
        return round(float(np.mean(xs)), 4) if xs else None

    return {
        "groups": len(parts), "pairs": len(errors["tpot"]),
        "tpot_ratio_error_pct": med(errors["tpot"]), "tokens_per_gpu_ratio_error_pct": med(errors["tokens_per_gpu"]),
        "ordered_pairs": len(order["tpot"]) + len(order["tokens_per_gpu"]),
        "order_right": share(order["tpot"] + order["tokens_per_gpu"]),
        "order_right_tpot": share(order["tpot"]), "order_right_tokens_per_gpu": share(order["tokens_per_gpu"]),
        "by_kinds": {k: {"pairs": len(v["tpot"]), "tpot_ratio_error_pct": med(v["tpot"]),
                         "tokens_per_gpu_ratio_error_pct": med(v["tokens_per_gpu"]), "ordered_pairs": len(v["order"]),
                         "order_right": share(v["order"])}
                     for k, v in sorted(kinds.items())},
        "decision_quality": decision_quality(parts),
    }


def _score(groups: Sequence[dict[str, list[tuple[BenchmarkCase, Prediction]]]]) -> dict[str, Any]:
    hits_tpot = hits_tput = near = 0
    n = len(groups)
    base = base_expected = 0.0
    pairs_right = pairs = 0
    for topos in groups:
        figures = _group_figures(topos)
        (meas_tpot, pred_tpot), (meas_tput, pred_tput) = figures["tpot"], figures["tokens_per_gpu"]
        best_tpot, best_tput = _best(meas_tpot, lowest=True), _best(meas_tput, lowest=False)
        pick_tpot, pick_tput = _best(pred_tpot, lowest=True), _best(pred_tput, lowest=False)
        hits_tpot += pick_tpot == best_tpot
        hits_tput += pick_tput == best_tput
        # Within tolerance: the predicted pick measured within 5 % of the measured best (duplicates differ more).
        near += meas_tpot[pick_tpot] <= min(meas_tpot.values()) * (1 + _NEAR)
        near += meas_tput[pick_tput] >= max(meas_tput.values()) * (1 - _NEAR)
        gpus = {t: v[0][0].gpus for t, v in topos.items()}
        most = [t for t in topos if gpus[t] == max(gpus.values())]
        fewest = [t for t in topos if gpus[t] == min(gpus.values())]
        base += (most[0] == best_tpot) + (fewest[0] == best_tput)
        base_expected += (best_tpot in most) / len(most) + (best_tput in fewest) / len(fewest)
        names = list(topos)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                for meas, pred in ((meas_tpot, pred_tpot), (meas_tput, pred_tput)):
                    if meas[a] != meas[b]:
                        pairs += 1
                        pairs_right += (meas[a] < meas[b]) == (pred[a] < pred[b])
    if n == 0:
        return {"groups": 0, "top1_agreement": None, "top1_tpot": None, "top1_tokens_per_gpu": None, "top1_within_5pct": None,
                "baseline_top1": None, "baseline_top1_first_listed": None, "pairs": 0, "pairwise_ordering": None}
    return {"groups": n, "top1_agreement": round((hits_tpot + hits_tput) / (2 * n), 4),
            "top1_tpot": round(hits_tpot / n, 4), "top1_tokens_per_gpu": round(hits_tput / n, 4),
            "top1_within_5pct": round(near / (2 * n), 4),
            "baseline_top1": round(base_expected / (2 * n), 4), "baseline_top1_first_listed": round(base / (2 * n), 4),
            "pairs": pairs, "pairwise_ordering": round(pairs_right / pairs, 4) if pairs else None}


def ranking_score(cases: Sequence[BenchmarkCase], results: Sequence[Result]) -> dict[str, Any]:
    """Top-1 agreement over topology groups, for lowest TPOT and for highest tokens/s per GPU.

    `equal_gpu`: layouts of equal GPU count within one release compared pair by pair (`equal_gpu_pairs`).

    Beside the figures: `cross_release_groups`, the groups whose topologies were measured on more than one recorded
    engine release (a release left blank counts as one more), and `same_release`, the same scores over groups that
    also share the engine release, where a ranking compares topologies and not releases.
    """
    groups = _group_by_benchmark(cases, results, by_release=False)
    crossing = sum(len({c.engine_release for v in topos.values() for c, _ in v}) > 1 for topos in groups)
    by_release = _group_by_benchmark(cases, results, by_release=True)
    same = _score(by_release)
    return _score(groups) | {"cross_release_groups": crossing, "same_release": same,
                             "decision_quality": decision_quality(by_release), "decision_quality_mixed_releases": decision_quality(groups),
                             "equal_gpu": equal_gpu_pairs(by_release)}


def _block(cases: Sequence[BenchmarkCase], results: Sequence[Result], skipped_at_parse: Counter[str]) -> dict[str, Any]:
    ok = [(c, r) for c, r in zip(cases, results, strict=True) if isinstance(r, Prediction)]
    skipped: Counter[str] = Counter(skipped_at_parse)
    skipped.update(r.kind for r in results if isinstance(r, Skip))
    total = len(cases) + sum(skipped_at_parse.values())
    return {
        "rows": total,
        "predicted": len(ok),
        "skipped": {"count": sum(skipped.values()), "share": round(sum(skipped.values()) / max(total, 1), 4), "by_reason": dict(skipped)},
        "ttft": ape_stats([r.ttft_ms for _, r in ok], [c.ttft_ms for c, _ in ok]),
        "tpot": ape_stats([r.tpot_ms for _, r in ok], [c.tpot_ms for c, _ in ok]),
        "e2e": ape_stats([e2e_latency_ms(c, r.ttft_ms, r.tpot_ms) for c, r in ok], [e2e_latency_ms(c, c.ttft_ms, c.tpot_ms) for c, _ in ok]),
        "ranking": ranking_score([c for c, _ in ok], [r for _, r in ok]),
    }


def summarize(cases: Sequence[BenchmarkCase], results: Sequence[Result], *, skipped_at_parse: Counter[str] | None = None,
              key: Callable[[BenchmarkCase], str] | None = None) -> dict[str, Any]:
    """Overall block plus one block per (backend, mode, system) (or per `key`)."""
    parse_skips: Counter[str] = skipped_at_parse or Counter()
    out = _block(cases, results, parse_skips)
    keyfn = key or (lambda c: f"{c.backend}/{c.mode}/{c.system}")
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(keyfn(c), []).append(i)
    out["groups"] = {k: _block([cases[i] for i in idx], [results[i] for i in idx], Counter()) for k, idx in sorted(groups.items())}
    return out
