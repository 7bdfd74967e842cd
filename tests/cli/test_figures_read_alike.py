"""A figure reads alike wherever a user reads it, and a count takes its noun's number: `plan`'s table states the p95
TTFT its summary line states (ms_text), its footer says which capacity carries the search's planning margins (the same
layout reads two capacities in `plan` and `compare` otherwise), the closest miss keeps a small rate's digits, and one GPU
or one point is never "1 GPUs" or "1 points"."""

from __future__ import annotations

import re

import pytest

from servingtopology.cli.main import main
from servingtopology.cli.spec_input import read_spec
from servingtopology.planner.figure_text import count_text, gpus_text
from servingtopology.planner.search.limits import miss_text
from servingtopology.spec import to_problem

SPEC = ("model: meta-llama/Llama-3.1-8B-Instruct\nprecision: bf16\nengine: {{name: vllm}}\nhardware: {{gpu: h100_sxm, maxGPUs: 8}}\n"
        "workload: {{arrivalRate: {rate}, inputTokens: 1024, outputTokens: 256}}\nslo: {{ttftMs: {{p95: 500}}, tpotMs: {{p95: 40}}}}\n"
        "simulation: {{requests: 300}}\n{layout}")


def _spec(tmp_path, rate, layout=""):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(rate=rate, layout=layout))
    return str(path)


@pytest.mark.parametrize("count, noun, said", [(1, "point", "1 point"), (3, "point", "3 points"), (1, "GPU", "1 GPU"),
                                                (1200, "GPU", "1,200 GPUs")])
def test_a_count_takes_its_nouns_number(count, noun, said):
    assert count_text(count, noun) == said


def test_plans_table_states_the_ttft_its_summary_states_and_says_which_capacity_has_margins(tmp_path, capsys):
    # The table printed '64' beside the summary's '64.4' for one layout, and its capacity (with the search's margins,
    # 42.2 req/s) beside compare's 43.7 for the same layout, the footer naming no margin.
    assert main(["plan", _spec(tmp_path, 30), "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if re.match(r"\s*# layout\s+GPUs", line))
    ttft = lines[head + 1].split()[3]   # the chosen layout's row: #, layout, GPUs, TTFT
    summary = next(line for line in out.splitlines() if line.startswith("Decision: "))
    assert f"p95 TTFT {ttft} ≤ 500 ms" in summary, (lines[head + 1], summary)
    assert "with the search's planning margins (latencies × 1.1, the load at most 90% of what the layout serves at all)" in out
    assert "compare and a pinned layout state it without them" in out


def test_a_one_gpu_pin_reads_one_gpu_in_its_record(tmp_path, capsys):
    assert main(["plan", _spec(tmp_path, 2, "layout: {kind: replicas, count: 1, tp: 1}\n"), "--no-progress", "--no-simulate",
                 "--record"]) == 0
    out = capsys.readouterr().out
    assert "**1×TP1** on 1 GPU (" in out and "1 GPUs" not in out
    assert "the pinned layout's without margins, as compare states it" in out


def test_the_closest_miss_keeps_a_small_capacitys_digits_and_one_gpus_number(tmp_path):
    problem = to_problem(read_spec(_spec(tmp_path, 0.02)))
    text = miss_text(problem, label="1×TP1", gpus=1, ttft_s=0.05, tpot_s=0.06, capacity_rps=0.013)
    # read '1×TP1 on 1 GPUs: … capacity 0.0 req/s against the load of 0.02 req/s'
    assert text.startswith("1×TP1 on 1 GPU: ") and "capacity 0.013 req/s against the load of 0.02 req/s" in text, text
    assert gpus_text(1) in text
