"""`plan --plot` and `sweep --plot`: the figures' data (matplotlib artists), not their pixels."""

import json

from servingtopology.cli.main import main
from servingtopology.cli.plots import LABEL_GAP, X_LABEL, Y_LABEL, plan_figure, plan_points, sweep_figure
from servingtopology.cli.sweep import sweep_points
from servingtopology.planner.search.decide import decide, envelope_point
from servingtopology.spec import load_spec, to_problem

from .test_json_keys import SPEC


def _lines_by_gid(ax, gid):
    return [line for line in ax.get_lines() if line.get_gid() == gid]


def _slo_lines(ax_env, ax_ttft):
    vertical = [line for line in ax_env.get_lines() if len(set(line.get_xdata())) == 1 and line.get_linestyle() == "--"]
    horizontal = [line for line in ax_ttft.get_lines() if len(set(line.get_ydata())) == 1 and line.get_linestyle() == "--"]
    return vertical, horizontal


def test_plan_figure_marks_the_chosen_layout_and_draws_the_slos():
    problem = to_problem(load_spec(None))
    decision = decide(problem)
    fig = plan_figure(decision, problem)
    ax_env, ax_ttft = fig.axes
    _, _, chosen = plan_points(decision, problem)
    (star,) = _lines_by_gid(ax_env, "chosen")
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (chosen.per_user_tok_s, chosen.per_gpu_tok_s)
    assert chosen.label == decision.best.layout.label
    (star_ttft,) = _lines_by_gid(ax_ttft, "chosen")
    assert star_ttft.get_ydata()[0] == chosen.ttft_ms == envelope_point(problem, decision.best.layout, decision.best.prediction.capacity_rps)[1]
    vertical, horizontal = _slo_lines(ax_env, ax_ttft)
    assert [line.get_xdata()[0] for line in vertical] == [1000.0 / problem.slo.tpot_ms]
    assert [line.get_ydata()[0] for line in horizontal] == [problem.slo.ttft_ms]
    texts = [a.get_text() for a in ax_env.texts]
    assert f"chosen: {chosen.label}" in texts
    labels = [t.removeprefix("chosen: ") for t in texts]
    assert len(labels) == len(set(labels))                         # no layout labelled twice


def test_plan_labels_do_not_overlap():
    problem = to_problem(load_spec(None))
    fig = plan_figure(decide(problem), problem)
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    at = [a.xy for a in ax.texts]
    for i, (xa, ya) in enumerate(at):
        for xb, yb in at[i + 1:]:
            near_x = abs(xa - xb) / (x1 - x0) < LABEL_GAP * 0.5
            near_y = abs(ya - yb) / (y1 - y0) < LABEL_GAP * 0.5
            assert not (near_x and near_y), ((xa, ya), (xb, yb))


def test_plan_and_sweep_share_axes_and_units(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    problem = to_problem(load_spec(str(spec)))
    decision = decide(problem)
    points = sweep_points(problem, decision.best.layout, [1, 4], seed=1, per_client=50)
    plan_fig, sweep_fig = plan_figure(decision, problem), sweep_figure(decision.best.layout.label, decision.best.layout.gpus, points, problem.slo)
    assert [(a.get_xlabel(), a.get_ylabel()) for a in plan_fig.axes] == [(a.get_xlabel(), a.get_ylabel()) for a in sweep_fig.axes]
    assert (plan_fig.axes[0].get_xlabel(), plan_fig.axes[0].get_ylabel()) == (X_LABEL, Y_LABEL)
    (envelope,) = _lines_by_gid(sweep_fig.axes[0], "envelope")
    assert list(envelope.get_ydata()) == [p["throughput_tok_s_per_gpu"] for p in points]
    assert list(envelope.get_xdata()) == [p["tokens_per_s_per_user"] for p in points]
    vertical, horizontal = _slo_lines(*sweep_fig.axes)
    assert [line.get_xdata()[0] for line in vertical] == [1000.0 / problem.slo.tpot_ms]
    assert [line.get_ydata()[0] for line in horizontal] == [problem.slo.ttft_ms]


def test_plan_plot_says_where_it_wrote(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["plan", "--no-simulate", "--no-progress", "--plot", str(out)]) == 0
    assert f"plot written to {out}" in capsys.readouterr().out and out.stat().st_size > 0
    out.unlink()
    assert main(["plan", "--no-simulate", "--json", "--plot", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["plot"] == str(out) and out.exists()
