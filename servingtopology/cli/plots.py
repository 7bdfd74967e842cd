"""The figures of `plan --plot` and `sweep --plot`, on the same two panels so that one can be laid over the other.

Left: output tokens/s per GPU against tokens/s per user (1000 / mean TPOT ms), the serving-envelope axes of
InferenceMAX and vLLM's benchmarks, with the TPOT SLO as a vertical line (a layout right of it gives each user
tokens faster than the SLO's TPOT). Right: TTFT at the SLO's percentile against output tokens/s per GPU, with
the TTFT SLO as a horizontal line. `plan` draws every evaluated candidate at its SLO capacity, the Pareto frontier
and the chosen layout; `sweep` draws one layout's closed-loop points, labelled by concurrency. Functions return
the matplotlib Figure (tests read its artists); `save` writes it. Only the CLI imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from servingtopology.planner.problem import Decision, Problem
from servingtopology.planner.workload import Slo

__all__ = ["X_LABEL", "Y_LABEL", "ttft_label", "Point", "plan_figure", "sweep_figure", "save", "MAX_LABELS"]

X_LABEL = "tokens/s per user (1000 / mean TPOT ms)"
Y_LABEL = "output tokens/s per GPU"
MAX_LABELS = 10   # frontier labels drawn; the rest are left to the legend and the table
LABEL_GAP = 0.06  # no label within this fraction of the plotted span (both axes) of another: none overlap


def ttft_label(percentile: float) -> str:
    return f"p{percentile:g} TTFT (ms)"


@dataclass(frozen=True, slots=True)
class Point:
    """One plotted layout or run: x tokens/s per user, y output tokens/s per GPU, its TTFT (ms) and a label."""

    per_user_tok_s: float
    per_gpu_tok_s: float
    ttft_ms: float
    label: str


def _slo_lines(ax_env: Any, ax_ttft: Any, slo: Slo) -> None:
    ax_env.axvline(1000.0 / slo.tpot_ms, color="tab:red", ls="--", lw=1,
                   label=f"TPOT SLO: p{slo.tpot_percentile:g} {slo.tpot_ms:g} ms = {1000.0 / slo.tpot_ms:.1f} tok/s per user")
    ax_ttft.axhline(slo.ttft_ms, color="tab:red", ls="--", lw=1, label=f"TTFT SLO: p{slo.ttft_percentile:g} {slo.ttft_ms:g} ms")


def _axes(title: str, slo: Slo) -> tuple[Figure, Any, Any]:
    fig, (ax_env, ax_ttft) = plt.subplots(1, 2, figsize=(13, 6.5))
    ax_env.set_xlabel(X_LABEL)
    ax_env.set_ylabel(Y_LABEL)
    ax_ttft.set_xlabel(Y_LABEL)
    ax_ttft.set_ylabel(ttft_label(slo.ttft_percentile))
    for ax in (ax_env, ax_ttft):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    return fig, ax_env, ax_ttft


def _spread_labels(points: Sequence[Point], *, among: Sequence[Point], limit: int, min_gap: float,
                   taken: Sequence[Point] = ()) -> list[Point]:
    """At most `limit` points to label: one per label text, none within `min_gap` (a fraction of the span of `among`,
    the plotted points) of one already labelled (`taken` first)."""
    if not points:
        return []
    xs = [p.per_user_tok_s for p in among]
    ys = [p.per_gpu_tok_s for p in among]
    dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    kept: list[Point] = list(taken)
    for p in points:
        if any(k.label == p.label for k in kept):
            continue
        if any(abs(p.per_user_tok_s - k.per_user_tok_s) / dx < min_gap and abs(p.per_gpu_tok_s - k.per_gpu_tok_s) / dy < min_gap for k in kept):
            continue
        kept.append(p)
        if len(kept) - len(taken) >= limit:
            break
    return kept[len(taken):]


def _frontier(points: Sequence[Point]) -> list[Point]:
    """Points no other beats on both axes, from the most tokens/s per user down."""
    out: list[Point] = []
    best_y = float("-inf")
    for p in sorted(points, key=lambda p: (-p.per_user_tok_s, -p.per_gpu_tok_s)):
        if p.per_gpu_tok_s > best_y:
            out.append(p)
            best_y = p.per_gpu_tok_s
    return out


def plan_points(decision: Decision, problem: Problem) -> tuple[list[Point], list[Point], Point]:
    """(candidates meeting the SLOs, candidates missing them, the chosen one): each at its SLO capacity."""
    out_tok = problem.workload.output_tokens.expected_tokens

    def point(c: Any) -> Point:
        p = c.prediction
        return Point(p.tokens_per_s_per_user, p.capacity_rps * out_tok / max(c.layout.gpus, 1), p.ttft_ms, c.layout.label)
    meeting: list[Point] = []
    missing: list[Point] = []
    for c in decision.evaluated:
        pt = point(c)
        if pt.per_gpu_tok_s > 0 and pt.per_user_tok_s > 0:
            (meeting if c.prediction.meets_slo else missing).append(pt)
    return meeting, missing, point(decision.best)


def plan_figure(decision: Decision, problem: Problem) -> Figure:
    """Every evaluated candidate at its SLO capacity, the Pareto frontier of those meeting the SLOs, the chosen layout."""
    slo = problem.slo
    meeting, missing, chosen = plan_points(decision, problem)
    fig, ax_env, ax_ttft = _axes(f"{problem.model.name} on {problem.gpu.id} ({problem.engine.value}) at "
                                 f"{problem.workload.arrival_rate_rps:g} req/s: candidates at their SLO capacity", slo)
    for pts, style in ((meeting, {"color": "tab:blue", "label": "meets the SLOs"}), (missing, {"color": "tab:gray", "label": "misses an SLO"})):
        if pts:
            ax_env.scatter([p.per_user_tok_s for p in pts], [p.per_gpu_tok_s for p in pts], s=12, alpha=0.45, **style)
            ax_ttft.scatter([p.per_gpu_tok_s for p in pts], [p.ttft_ms for p in pts], s=12, alpha=0.45, **style)
    frontier = _frontier(meeting)
    ax_env.plot([p.per_user_tok_s for p in frontier], [p.per_gpu_tok_s for p in frontier], "-o", color="tab:orange", ms=4,
                label="Pareto frontier", gid="frontier")
    for p in _spread_labels([q for q in frontier if q.label != chosen.label], among=[*meeting, *missing, chosen], limit=MAX_LABELS - 1,
                            min_gap=LABEL_GAP, taken=[chosen]):
        ax_env.annotate(p.label, (p.per_user_tok_s, p.per_gpu_tok_s), fontsize=7, xytext=(4, 4), textcoords="offset points")
    for ax, xy in ((ax_env, (chosen.per_user_tok_s, chosen.per_gpu_tok_s)), (ax_ttft, (chosen.per_gpu_tok_s, chosen.ttft_ms))):
        ax.plot([xy[0]], [xy[1]], marker="*", ms=16, color="tab:green", ls="none", label=f"chosen: {chosen.label}", gid="chosen")
        ax.annotate(f"chosen: {chosen.label}", xy, fontsize=8, fontweight="bold", xytext=(6, -12), textcoords="offset points")
    _slo_lines(ax_env, ax_ttft, slo)
    _legends(ax_env, ax_ttft)
    fig.tight_layout()
    return fig


def sweep_figure(label: str, gpus: int, points: Sequence[dict[str, Any]], slo: Slo) -> Figure:
    """One layout's closed-loop runs (sweep points), labelled by concurrency, on plan_figure's axes."""
    ttft_key = f"p{slo.ttft_percentile:g}"
    pts = [Point(p["tokens_per_s_per_user"] or 0.0, p["throughput_tok_s_per_gpu"] or 0.0, p["ttft_ms"].get(ttft_key) or 0.0,
                 str(p["concurrency"])) for p in points]
    fig, ax_env, ax_ttft = _axes(f"serving envelope of {label} ({gpus} GPUs), labelled by concurrency", slo)
    ax_env.plot([p.per_user_tok_s for p in pts], [p.per_gpu_tok_s for p in pts], "-o", color="tab:purple", label=label, gid="envelope")
    ax_ttft.plot([p.per_gpu_tok_s for p in pts], [p.ttft_ms for p in pts], "-o", color="tab:purple", label=label, gid="envelope")
    for p in pts:
        ax_env.annotate(p.label, (p.per_user_tok_s, p.per_gpu_tok_s), textcoords="offset points", xytext=(4, 4), fontsize=8)
    _slo_lines(ax_env, ax_ttft, slo)
    _legends(ax_env, ax_ttft)
    fig.tight_layout()
    return fig


def _legends(*axes: Any) -> None:
    """Legends under the axes, where they cover no point or label."""
    for ax in axes:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)


def save(fig: Figure, path: str) -> None:
    """Write the figure (format from the file's extension) and release it."""
    fig.savefig(path, dpi=120)
    plt.close(fig)
