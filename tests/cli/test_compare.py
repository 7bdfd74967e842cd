"""`compare`: named layouts side by side on the same work (seed 002's options A/B/C in one call), predicted exactly as
`plan` predicts each one pinned; and `sweep --layout … --layout …`: several layouts' serving envelopes (seed 000)."""

import json
from pathlib import Path

import pytest

from servingtopology.cli.compare import parse_layout
from servingtopology.cli.main import main
from servingtopology.planner.errors import InvalidSpec

ABC = ["--layout", "A=8xTP1", "--layout", "B=4xTP2", "--layout", "C=2P6D"]
DEFAULT = ("model: meta-llama/Llama-2-7b-hf\nprecision: bf16\nengine: vllm\nhardware: {gpu: a100_sxm, gpusPerNode: 8, maxGPUs: 8}\n"
           "workload: {arrivalRate: 32, inputTokens: 512, outputTokens: 128}\nslo: {ttftMs: {p95: 200}, tpotMs: {p95: 35}}\n"
           "objective: goodput-per-gpu\n")


def test_compare_reproduces_002s_three_options_in_one_call_with_plans_own_figures(tmp_path, capsys):
    assert main(["compare", *ABC, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["layouts"]}
    # 002: A = 8 independent replicas, B = 4 TP=2 pairs over NVLink, C = 2 prefill + 6 decode GPUs; all on the same 8 A100s
    assert [(rows[n]["label"], rows[n]["kind"], rows[n]["gpus"]) for n in "ABC"] == [
        ("8×TP1", "replicas", 8), ("4×TP2", "replicas", 8), ("2P6D@TP1", "pd", 8)]
    assert set(rows["C"]["kv_pool_tokens"]) == {"prefill", "decode"} and set(rows["A"]["kv_pool_tokens"]) == {"aggregated"}
    for name, layout in (("A", "{kind: replicas, replicas: 8, tp: 1}"), ("B", "{kind: replicas, replicas: 4, tp: 2}"),
                         ("C", "{kind: pd, prefill: {count: 2, tp: 1}, decode: {count: 6, tp: 1}}")):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(DEFAULT + f"layout: {layout}\n")
        assert main(["plan", str(spec), "--json", "--no-progress"]) == 0
        pinned = json.loads(capsys.readouterr().out)["best"]
        r, p = rows[name], pinned["prediction"]
        assert (r["label"], r["gpus"]) == (pinned["label"], pinned["gpus"])
        assert (r["ttft_ms"], r["tpot_ms"], r["slo_capacity_rps"], r["goodput_per_gpu"], r["source"]) == (
            p["ttft_ms"], p["tpot_ms"], p["slo_capacity_rps"], p["goodput_per_gpu"], p["source"])
        assert r["slo_capacity_tok_s_per_gpu"] == p["slo_capacity_tok_s_per_gpu"]
    best = max(rows.values(), key=lambda r: r["goodput_per_gpu"])
    assert best["verdict"] == "most req/s per GPU within the SLOs"
    assert all(r["verdict"] != best["verdict"] for r in rows.values() if r is not best)


def test_compare_prints_one_table_and_draws_one_plot_coloured_by_kind(tmp_path, capsys):
    plot = tmp_path / "abc.png"
    assert main(["compare", *ABC, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line[:2] in ("A ", "B ", "C ")]
    assert [line.split()[:3] for line in table] == [["A", "8×TP1", "8"], ["B", "4×TP2", "8"], ["C", "2P6D@TP1", "8"]]
    assert plot.read_bytes()[:4] == b"\x89PNG"

    from servingtopology.cli.compare import compare_layouts
    from servingtopology.cli.plots import compare_figure

    problem, compared = compare_layouts(None, ["A=8xTP1", "B=4xTP2", "C=2P6D"], {})
    ax_env, _ = compare_figure(problem, [(c.name, c.candidate) for c in compared]).axes
    marks = {c.get_gid(): c for c in ax_env.collections}
    assert set(marks) == {"layout:A", "layout:B", "layout:C"}
    colours = {g: tuple(m.get_edgecolor()[0]) for g, m in marks.items()}
    assert len(set(colours.values())) == 3                 # replicas, TP replicas and PD: three kinds, three colours
    out_tok = problem.workload.output_tokens.expected_tokens
    for c in compared:
        (_x, y), = marks[f"layout:{c.name}"].get_offsets()
        assert y == pytest.approx(c.candidate.prediction.capacity_rps * out_tok / c.candidate.layout.gpus)
    assert ax_env.get_ylim()[0] == 0 and ax_env.get_xlim()[0] == 0


@pytest.mark.parametrize(("text", "layout"), [
    ("8xTP1", {"kind": "replicas", "replicas": 8, "tp": 1, "pp": 1, "dp": 1}),
    ("2×TP2·PP2", {"kind": "replicas", "replicas": 2, "tp": 2, "pp": 2, "dp": 1}),
    ("2P6D", {"kind": "pd", "prefill": {"count": 2, "tp": 1, "pp": 1, "dp": 1}, "decode": {"count": 6, "tp": 1, "pp": 1, "dp": 1}}),
    ("1P(TP2·PP2)·3D(TP1)", {"kind": "pd", "prefill": {"count": 1, "tp": 2, "pp": 2, "dp": 1},
                             "decode": {"count": 3, "tp": 1, "pp": 1, "dp": 1}}),
    ("{kind: pd, prefill: {count: 2}, decode: {count: 6}}", {"kind": "pd", "prefill": {"count": 2}, "decode": {"count": 6}}),
])
def test_layout_syntax_reads_plans_own_labels_and_spec_mappings(text, layout):
    assert parse_layout(text, field="--layout[0]") == (None, layout)


def test_a_bad_layout_exits_2_naming_which_one(capsys):
    assert main(["compare", "--layout", "A=8xTP1", "--layout", "B=four pairs"]) == 2
    assert "--layout[1]" in capsys.readouterr().err
    assert main(["compare", "--layout", "A=16xTP1"]) == 2          # over the 8-GPU budget: the spec's own rule
    err = capsys.readouterr().err
    assert "--layout[0]" in err and "maxGPUs" in err
    with pytest.raises(InvalidSpec):
        parse_layout("{kind: pd, kind: replicas}", field="--layout[0]")   # duplicate keys refused here too


def test_sweep_overlays_several_layouts_every_gpu_in_the_denominator(tmp_path, capsys):
    plot = tmp_path / "envelope.png"
    assert main(["sweep", "--layout", "AGG=4xTP2", "--layout", "PD=2P6D", "--concurrency", "1,8", "--requests-per-client", "25",
                 "--json", "--plot", str(plot)]) == 0
    series = json.loads(capsys.readouterr().out)["series"]
    assert [(s["name"], s["layout"], s["gpus"], s["kind"]) for s in series] == [("AGG", "4×TP2", 8, "replicas"), ("PD", "2P6D@TP1", 8, "pd")]
    for s in series:
        assert [p["concurrency"] for p in s["points"]] == [1, 8]
        for p in s["points"]:
            assert p["throughput_tok_s_per_gpu"] == pytest.approx(p["throughput_tok_s"] / s["gpus"], abs=0.11)   # all 8 GPUs
    from servingtopology.cli.plots import Series, sweep_figure
    from servingtopology.planner.search.record_facts import Family
    from servingtopology.spec import load_spec, to_problem

    slo = to_problem(load_spec(None)).slo
    fig = sweep_figure("", 0, [], slo, series=[Series(s["name"], s["layout"], s["gpus"], Family[s["family"]], s["points"]) for s in series])
    ax_env = fig.axes[0]
    lines = {line.get_gid(): line for line in ax_env.get_lines() if (line.get_gid() or "").startswith("envelope:")}
    assert set(lines) == {"envelope:AGG", "envelope:PD"}
    for s in series:
        assert list(lines[f"envelope:{s['name']}"].get_ydata()) == [p["throughput_tok_s_per_gpu"] for p in s["points"]]
    assert sorted(a.get_text() for a in ax_env.texts) == ["1", "1", "8", "8"]     # points labelled by concurrency
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_compare_reads_a_servingtopology_resource_and_predicts_each_layout_as_its_pin(tmp_path, capsys):
    # `compare examples/vllm-replicas.yaml --layout 2xTP1` was refused ("'layout' is for the CLI; in a ServingTopology use
    # 'pinned'") while plan and simulate read the same file: each layout is the resource's pin, as the operator pins it.
    import yaml

    example = Path(__file__).resolve().parents[2] / "examples" / "vllm-replicas.yaml"
    assert main(["compare", str(example), "--layout", "2xTP1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["layouts"]
    doc = yaml.safe_load(example.read_text())
    doc["spec"]["policy"]["mode"] = "Pinned"
    doc["spec"]["pinned"] = {"kind": "replicas", "replicas": 2, "tp": 1}
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(pinned), "--json", "--no-progress"]) == 0
    planned = json.loads(capsys.readouterr().out)
    p = planned["best"]["prediction"]
    assert (row["label"], row["ttft_ms"], row["tpot_ms"], row["slo_capacity_rps"], row["meets_slo"], row["source"]) == (
        planned["best"]["label"], p["ttft_ms"], p["tpot_ms"], p["slo_capacity_rps"], p["meets_slo"], p["source"])
    assert row["slo_verdict"] == planned["reasons"][0]
    assert main(["compare", str(example), "--layout", "{kind: pd, prefill: {count: 9}, decode: {count: 9}}"]) == 2
    assert "--layout[0] (spec.pinned): 9P9D@TP1 needs 18 GPUs" in capsys.readouterr().err


def test_compare_names_each_layouts_engine_args_and_plans_layout_spec_reproduces_plans_figures(tmp_path, capsys):
    # plan's 2×TP1 (its search tuned 2,048 batched tokens) read 64.4 ms p95 TTFT, compare's `--layout 2xTP1` (the spec's
    # 8,192) 61.9 ms: one label, two layouts, and nothing on compare's line said so.
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nprecision: bf16\nengine: {name: vllm}\nhardware: {gpu: h100_sxm, maxGPUs: 8}\n"
                    "workload: {arrivalRate: 30, inputTokens: 1024, outputTokens: 256}\nslo: {ttftMs: {p95: 500}, tpotMs: {p95: 40}}\n"
                    "simulation: {requests: 300}\n")
    assert main(["plan", str(spec), "--json", "--no-progress"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert main(["compare", str(spec), "--layout", best["label"].replace("×", "x"), "--layout", f"plan={json.dumps(best['layout_spec'])}",
                 "--json"]) == 0
    by_label, as_planned = json.loads(capsys.readouterr().out)["layouts"]
    assert (as_planned["ttft_ms"], as_planned["tpot_ms"], as_planned["layout_spec"]) == (
        best["prediction"]["ttft_ms"], best["prediction"]["tpot_ms"], best["layout_spec"])
    args = by_label["layout_spec"]["engineArgs"]
    assert main(["compare", str(spec), "--layout", best["label"].replace("×", "x")]) == 0
    out = capsys.readouterr().out
    assert (f"engine args: maxNumSeqs {args['maxNumSeqs']}, maxNumBatchedTokens {args['maxNumBatchedTokens']}, "
            f"memoryFraction {args['memoryFraction']:g}") in out
    assert "give its --json best.layout_spec as the --layout" in out
