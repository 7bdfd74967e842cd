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

from servingtopology.cli.output_paths import plot_format, write_output
from servingtopology.planner.figure_text import gpus_text
from servingtopology.planner.problem import Candidate, Decision, Problem
from servingtopology.planner.search.decide import envelope_point
from servingtopology.planner.search.pd_ratio import RANK_TOLERANCE
from servingtopology.planner.search.record_facts import Family, family_of
from servingtopology.planner.workload import Slo

__all__ = ["X_LABEL", "Y_LABEL", "ttft_label", "Point", "Series", "plan_figure", "compare_figure", "sweep_figure", "off_frontier_note",
           "save", "MAX_LABELS", "FAMILY_COLOURS", "HEADROOM"]

X_LABEL = "tokens/s per user (1000 / mean TPOT ms)"
Y_LABEL = "output tokens/s per GPU"
MAX_LABELS = 10   # frontier labels drawn; the rest are left to the legend and the table
LABEL_GAP = 0.06  # no label within this fraction of the plotted span (both axes) of another: none overlap


def ttft_label(percentile: float) -> str:
    return f"p{percentile:g} TTFT (ms)"


@dataclass(frozen=True, slots=True)
class Point:
    """One plotted layout or run at one operating point (a layout at its SLO capacity, a run at its concurrency): x
    tokens/s per user, y output tokens/s per GPU, its TTFT (ms) and a label."""

    per_user_tok_s: float
    per_gpu_tok_s: float
    ttft_ms: float
    label: str
    family: Family = Family.REPLICAS


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
        if any(_texts_overlap(p, k, x_span=max(xs) * HEADROOM, y_span=max(ys) * HEADROOM) for k in kept):
            continue
        kept.append(p)
        if len(kept) - len(taken) >= limit:
            break
    return kept[len(taken):]


CHAR_WIDTH = 0.011    # one character of a 7-point label, as a share of an axis' width on the 13 × 6.5 in figure
TEXT_HEIGHT = 0.035   # one line of it, as a share of the height


def _texts_overlap(a: Point, b: Point, *, x_span: float, y_span: float) -> bool:
    """Whether two labels, each written rightwards from its point, would cover each other on axes from 0."""
    left, right = (a, b) if a.per_user_tok_s <= b.per_user_tok_s else (b, a)
    wide = (right.per_user_tok_s - left.per_user_tok_s) < len(left.label) * CHAR_WIDTH * (x_span or 1.0)
    return wide and abs(a.per_gpu_tok_s - b.per_gpu_tok_s) < TEXT_HEIGHT * (y_span or 1.0)


def _frontier(points: Sequence[Point]) -> list[Point]:
    """Points no other beats on both axes, from the most tokens/s per user down."""
    out: list[Point] = []
    best_y = float("-inf")
    for p in sorted(points, key=lambda p: (-p.per_user_tok_s, -p.per_gpu_tok_s)):
        if p.per_gpu_tok_s > best_y:
            out.append(p)
            best_y = p.per_gpu_tok_s
    return out


# One colour per layout family (planner.search.record_facts.Family), the same in every figure; candidates that miss an SLO
# are drawn hollow in their family's colour.
FAMILY_COLOURS = {
    Family.REPLICAS: "tab:blue",
    Family.TP: "tab:brown",
    Family.DP: "tab:olive",
    Family.TP_PP: "tab:purple",
    Family.PD: "tab:orange",
}
HEADROOM = 1.12   # the axes run from 0 to 12 % past the largest figure: a 3 % spread stays a 3 % spread


def plan_points(decision: Decision, problem: Problem) -> tuple[list[Point], list[Point], Point]:
    """(candidates meeting the SLOs, candidates missing them, the chosen one): each at its SLO capacity."""
    out_tok = problem.workload.output_tokens.expected_tokens

    def point(c: Any) -> Point:
        p = c.prediction
        per_user, ttft_ms = envelope_point(problem, c.layout, p.capacity_rps) if p.capacity_rps > 0 else (0.0, p.ttft_ms)
        return Point(per_user, p.capacity_rps * out_tok / max(c.layout.gpus, 1), ttft_ms, c.layout.label, family_of(c.layout))
    meeting: list[Point] = []
    missing: list[Point] = []
    for c in decision.evaluated:
        pt = point(c)
        if pt.per_gpu_tok_s > 0 and pt.per_user_tok_s > 0:
            (meeting if c.prediction.meets_slo else missing).append(pt)
    return meeting, missing, point(decision.best)


def _honest_axes(ax: Any, xs: Sequence[float], ys: Sequence[float], *, x_line: float | None = None, y_line: float | None = None) -> None:
    """Both axes from 0 to a little past the largest value (and past an SLO line), never autoscaled to the spread."""
    finite_x = [x for x in (*xs, *([x_line] if x_line else [])) if x == x and x not in (float("inf"), float("-inf"))]
    finite_y = [y for y in (*ys, *([y_line] if y_line else [])) if y == y and y not in (float("inf"), float("-inf"))]
    ax.set_xlim(0.0, max(finite_x, default=1.0) * HEADROOM or 1.0)
    ax.set_ylim(0.0, max(finite_y, default=1.0) * HEADROOM or 1.0)


def _scatter_by_family(ax_env: Any, ax_ttft: Any, pts: Sequence[Point], *, meets: bool) -> None:
    for fam in Family:
        mine = [p for p in pts if p.family is fam]
        if not mine:
            continue
        colour = FAMILY_COLOURS[fam]
        style: dict[str, Any] = ({"color": colour, "alpha": 0.5, "label": f"{fam.value}: meets the SLOs"} if meets else
                                 {"facecolors": "none", "edgecolors": colour, "alpha": 0.5, "label": f"{fam.value}: misses an SLO"})
        gid = f"{'meets' if meets else 'misses'}:{fam.name}"
        ax_env.scatter([p.per_user_tok_s for p in mine], [p.per_gpu_tok_s for p in mine], s=14, gid=gid, **style)
        ax_ttft.scatter([p.per_gpu_tok_s for p in mine], [p.ttft_ms for p in mine], s=14, gid=gid, **style)


def off_frontier_note(decision: Decision, problem: Problem, chosen: Point, frontier: Sequence[Point]) -> str | None:
    """Why the chosen point is not on the frontier (None when it is): a pin, or the ranking's 3 % tie rule."""
    if any(p.label == chosen.label and p.per_gpu_tok_s == chosen.per_gpu_tok_s for p in frontier):
        return None
    if problem.pinned is not None and decision.best.layout == problem.pinned:
        # A pin that misses the SLOs is off the frontier of those that meet them without another point over it.
        misses = "" if decision.best.prediction.meets_slo else ", and misses the SLOs at the planned load"
        return f"set by the spec, not chosen by the objective{misses}: drawn where its predicted figures put it"
    over = [p for p in frontier if p.per_gpu_tok_s >= chosen.per_gpu_tok_s and p.per_user_tok_s >= chosen.per_user_tok_s]
    if not over:
        return None
    top = max(over, key=lambda p: p.per_gpu_tok_s)
    share = 1.0 - chosen.per_gpu_tok_s / max(top.per_gpu_tok_s, 1e-12)
    alt = next((c for c in decision.alternatives if c.layout.label == top.label), None)
    why = f" ({top.label}: {alt.why})" if alt is not None and alt.why else ""
    return (f"off the frontier by the {RANK_TOLERANCE:.0%} tie rule: {share:.1%} fewer tokens/s per GPU than {top.label}, "
            f"a tie, which goes to fewer GPUs, then replicas, then fewer pipeline stages{why}")


def plan_figure(decision: Decision, problem: Problem) -> Figure:
    """Every evaluated candidate at its SLO capacity coloured by layout family, the Pareto frontier of those meeting
    the SLOs (the chosen one among them), the chosen (or pinned) layout, and why it is off the frontier when it is."""
    slo = problem.slo
    meeting, missing, chosen = plan_points(decision, problem)
    pinned = problem.pinned is not None and decision.best.layout == problem.pinned
    word = "pinned" if pinned else "chosen"
    fig, ax_env, ax_ttft = _axes(f"{problem.model.name} on {problem.gpu.id} ({problem.engine.value}) at "
                                 f"{problem.workload.arrival_rate_rps:g} req/s: candidates at their SLO capacity", slo)
    _scatter_by_family(ax_env, ax_ttft, meeting, meets=True)
    _scatter_by_family(ax_env, ax_ttft, missing, meets=False)
    frontier = _frontier([*meeting, *([chosen] if decision.best.prediction.meets_slo else [])])
    ax_env.plot([p.per_user_tok_s for p in frontier], [p.per_gpu_tok_s for p in frontier], "-", color="black", lw=1.2, alpha=0.8,
                label="Pareto frontier (meets the SLOs)", gid="frontier")
    for p in _spread_labels([q for q in frontier if q.label != chosen.label], among=[*meeting, *missing, chosen], limit=MAX_LABELS - 1,
                            min_gap=LABEL_GAP, taken=[chosen]):
        ax_env.annotate(p.label, (p.per_user_tok_s, p.per_gpu_tok_s), fontsize=7, xytext=(4, 4), textcoords="offset points")
    marker = "P" if pinned else "*"
    for ax, xy in ((ax_env, (chosen.per_user_tok_s, chosen.per_gpu_tok_s)), (ax_ttft, (chosen.per_gpu_tok_s, chosen.ttft_ms))):
        ax.plot([xy[0]], [xy[1]], marker=marker, ms=16, color="tab:green", mec="black", ls="none", label=f"{word}: {chosen.label}", gid=word)
        ax.annotate(f"{word}: {chosen.label}", xy, fontsize=8, fontweight="bold", xytext=(6, -12), textcoords="offset points")
    note = off_frontier_note(decision, problem, chosen, frontier)
    if note:
        fig.text(0.01, 0.005, f"{word} {chosen.label} is {note}", fontsize=7, va="bottom", gid="off-frontier", wrap=True)
    everything = [*meeting, *missing, chosen]
    _honest_axes(ax_env, [p.per_user_tok_s for p in everything], [p.per_gpu_tok_s for p in everything], x_line=1000.0 / slo.tpot_ms)
    _honest_axes(ax_ttft, [p.per_gpu_tok_s for p in everything], [min(p.ttft_ms, slo.ttft_ms * 3) for p in everything], y_line=slo.ttft_ms)
    _slo_lines(ax_env, ax_ttft, slo)
    _legends(ax_env, ax_ttft)
    fig.tight_layout()
    return fig


def compare_figure(problem: Problem, named: Sequence[tuple[str, Candidate]]) -> Figure:
    """Named layouts (compare) at their SLO capacity on plan_figure's axes, one marker each, coloured by family."""
    slo = problem.slo
    out_tok = problem.workload.output_tokens.expected_tokens
    fig, ax_env, ax_ttft = _axes(f"{problem.model.name} on {problem.gpu.id} ({problem.engine.value}) at "
                                 f"{problem.workload.arrival_rate_rps:g} req/s: layouts at their SLO capacity, same work", slo)
    pts = []
    for name, c in named:
        p = c.prediction
        per_user, ttft_ms = envelope_point(problem, c.layout, p.capacity_rps) if p.capacity_rps > 0 else (0.0, p.ttft_ms)
        pt = Point(per_user, p.capacity_rps * out_tok / max(c.layout.gpus, 1), ttft_ms, f"{name}: {c.layout.label}", family_of(c.layout))
        pts.append(pt)
        colour = FAMILY_COLOURS[pt.family]
        face = colour if p.meets_slo else "none"
        for ax, xy in ((ax_env, (pt.per_user_tok_s, pt.per_gpu_tok_s)), (ax_ttft, (pt.per_gpu_tok_s, pt.ttft_ms))):
            ax.scatter([xy[0]], [xy[1]], s=70, facecolors=face, edgecolors=colour, gid=f"layout:{name}",
                       label=f"{pt.label} ({gpus_text(c.layout.gpus)}, {pt.family.value}{'' if p.meets_slo else ', misses an SLO'})")
            ax.annotate(name, xy, fontsize=9, fontweight="bold", xytext=(6, 4), textcoords="offset points")
    _honest_axes(ax_env, [p.per_user_tok_s for p in pts], [p.per_gpu_tok_s for p in pts], x_line=1000.0 / slo.tpot_ms)
    _honest_axes(ax_ttft, [p.per_gpu_tok_s for p in pts], [min(p.ttft_ms, slo.ttft_ms * 3) for p in pts], y_line=slo.ttft_ms)
    _slo_lines(ax_env, ax_ttft, slo)
    _legends(ax_env, ax_ttft)
    fig.tight_layout()
    return fig


@dataclass(frozen=True, slots=True)
class Series:
    """One layout's closed-loop sweep: its name, layout label, GPUs, family and the sweep points."""

    name: str
    label: str
    gpus: int
    family: Family
    points: Sequence[dict[str, Any]]


SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")


def sweep_figure(label: str, gpus: int, points: Sequence[dict[str, Any]], slo: Slo, *, series: Sequence[Series] = ()) -> Figure:
    """Closed-loop runs (sweep points) labelled by concurrency, on plan_figure's axes: one layout, or `series` overlaid
    (the serving envelope of several layouts; throughput per GPU counts every GPU of each layout)."""
    ttft_key = f"p{slo.ttft_percentile:g}"
    many = list(series) or [Series(label, label, gpus, Family.REPLICAS, points)]
    title = (f"serving envelope of {label} ({gpus_text(gpus)}), labelled by concurrency" if not series else
             "serving envelopes, labelled by concurrency: " + ", ".join(f"{s.name} = {s.label} ({gpus_text(s.gpus)})" for s in many))
    fig, ax_env, ax_ttft = _axes(title, slo)
    xs: list[float] = []
    ys: list[float] = []
    ts: list[float] = []
    for i, s in enumerate(many):
        pts = [Point(p["tokens_per_s_per_user"] or 0.0, p["throughput_tok_s_per_gpu"] or 0.0, p["ttft_ms"].get(ttft_key) or 0.0,
                     str(p["concurrency"])) for p in s.points]
        colour: Any = FAMILY_COLOURS[s.family] if series else "tab:purple"
        if series and sum(x.family is s.family for x in many) > 1:   # two layouts of one family: shades of its colour
            colour = plt.get_cmap("tab10")(i % 10)
        marker = SERIES_MARKERS[i % len(SERIES_MARKERS)]
        name = s.label if not series else f"{s.name}: {s.label} ({gpus_text(s.gpus)})"
        ax_env.plot([p.per_user_tok_s for p in pts], [p.per_gpu_tok_s for p in pts], "-", marker=marker, color=colour, label=name,
                    gid=f"envelope:{s.name}" if series else "envelope")
        ax_ttft.plot([p.per_gpu_tok_s for p in pts], [p.ttft_ms for p in pts], "-", marker=marker, color=colour, label=name,
                     gid=f"envelope:{s.name}" if series else "envelope")
        for p in pts:
            ax_env.annotate(p.label, (p.per_user_tok_s, p.per_gpu_tok_s), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
        xs += [p.per_user_tok_s for p in pts]
        ys += [p.per_gpu_tok_s for p in pts]
        ts += [p.ttft_ms for p in pts]
    _honest_axes(ax_env, xs, ys, x_line=1000.0 / slo.tpot_ms)
    _honest_axes(ax_ttft, ys, [min(t, slo.ttft_ms * 5) for t in ts], y_line=slo.ttft_ms)
    _slo_lines(ax_env, ax_ttft, slo)
    _legends(ax_env, ax_ttft)
    fig.tight_layout()
    return fig


def _legends(*axes: Any) -> None:
    """Legends under the axes, where they cover no point or label."""
    for ax in axes:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)


def save(fig: Figure, path: str, *, option: str = "--plot") -> None:
    """Write the figure to `path` exactly (its suffix is the format: cli/output_paths.py, WrittenAsGiven) and release it;
    a write that fails is InvalidSpec naming `option`."""
    try:
        write_output(option, path, lambda target: fig.savefig(target, dpi=120, format=plot_format(target)))
    finally:
        plt.close(fig)
