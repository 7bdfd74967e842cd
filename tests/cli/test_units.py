"""Text tables carry their units, and each column shows what it names (not the offered load on every row)."""

import json

from servingtopology.cli.main import main

from .test_json_keys import SPEC


def test_plan_table_headers_have_units_and_capacity_per_row(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["plan", str(spec), "--json", "--no-simulate"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main(["plan", str(spec), "--no-simulate", "--no-progress"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "layout" in line and "GPUs" in line and "TTFT" in line)
    header = lines[at]
    for unit in ("p95 TTFT ms", "p95 TPOT ms", "tok/s/user", "SLO cap. req/s", "req/s/GPU", "tok/s/GPU"):
        assert unit in header
    rows = [line.split() for line in lines[at + 1:at + 2 + len(d["alternatives"])]]
    shown = [float(r[-2]) for r in rows]                       # tok/s/GPU, the column before `source`
    expected = [round(c["prediction"]["slo_capacity_tok_s_per_gpu"]) for c in (d["best"], *d["alternatives"])]
    assert shown == expected
    assert len(set(shown)) > 1                                 # not one offered load repeated on every row


def test_sweep_table_headers_have_units(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["sweep", str(spec), "--concurrency", "1,4"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    for unit in ("clients", "out tok/s/GPU", "tok/s/user", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "goodput req/s"):
        assert unit in header


def test_the_table_and_the_json_round_tok_s_per_gpu_from_one_figure():
    # 3149.46 tok/s/GPU: the JSON keeps 3149.5 (→ 3150 when read back as a whole number) while formatting the raw
    # float gave "3149" in the table; both now come from the one rounded figure.
    from servingtopology.cli.plan import _tok_s_per_gpu

    # (raw, the JSON's figure, the table's text): the table is the JSON's figure formatted, never the raw float's
    # (which prints 3149 and 3151 for the first two).
    cases = [(3149.46, 3149.5, "3150"), (3150.54, 3150.5, "3150"), (2.449, 2.4, "2"), (10.05, 10.1, "10"), (999.95, 1000.0, "1000")]
    for raw, json_figure, table in cases:
        fig = _tok_s_per_gpu(raw, 1.0, 1)
        assert fig == json_figure and f"{fig:.0f}" == table, (raw, fig)
