"""`servingtopology plan --pool`: the fleet table, record and plot of a small pool, and bad pools refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servingtopology.cli.main import main
from servingtopology.planner.pool.service_split import per_pod_capacity_rps

MEMBER = {"model": "meta-llama/Llama-3.1-8B-Instruct", "workload": {"arrivalRate": 6, "inputTokens": 1024, "outputTokens": 128},
          "slo": {"ttftMs": {"p95": 800}, "tpotMs": {"p95": 50}}}


def _pool(tmp_path: Path, **over: object) -> Path:
    data: dict[str, object] = {"objective": "min-cost",
                               "inventory": [{"kind": "h100", "gpu": "h100_sxm", "count": 4, "pricePerHour": 3.0},
                                             {"kind": "a100", "gpu": "a100_sxm", "count": 4, "pricePerHour": 1.6}],
                               "members": [{"name": "chat", "priority": 2, "spec": MEMBER},
                                           {"name": "batch", "specFile": "batch.yaml"}]}
    data.update(over)
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump({**MEMBER, "hardware": {"gpu": "a100_sxm", "maxGPUs": 2}}))
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_pool_prints_the_fleet_and_writes_record_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _pool(tmp_path)
    assert main(["plan", "--pool", str(path), "--record", str(tmp_path / "r.md"), "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "chat" in out and "batch" in out and "idle" in out
    record = (tmp_path / "r.md").read_text()
    assert "## Members" in record and "## Marginal value of one more GPU" in record
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_plan_pool_json_keeps_the_member_cap_and_the_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--pool", str(_pool(tmp_path)), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    by = {m["name"]: m for m in d["members"]}
    assert sum(by["batch"]["gpus"].values()) <= 2          # its spec file's maxGPUs is its cap in the pool
    assert all(m["met"] for m in d["members"])
    assert d["used"]["h100"] + d["idle"]["h100"] == 4 and d["used"]["a100"] + d["idle"]["a100"] == 4


@pytest.mark.parametrize(("over", "field"), [
    # a kind without its price
    ({"inventory": [{"kind": "h100", "gpu": "h100_sxm", "count": 4}]}, "inventory.0.pricePerHour"),
    # a GPU the catalog does not know
    ({"inventory": [{"kind": "x", "gpu": "no-such-gpu", "count": 4, "pricePerHour": 1.0}]}, "inventory[0].gpu"),
    # max-goodput without a budget
    ({"objective": "max-goodput"}, "budgetPerHour"),
    # a member without a spec
    ({"members": [{"name": "chat"}]}, "members.0.spec"),
    # a member whose spec names an unknown field
    ({"members": [{"name": "chat", "spec": {**MEMBER, "bogus": 1}}]}, "members[0].spec.bogus"),
    # no GPU kind at all for a member
    ({"maxKindsPerMember": 0}, "maxKindsPerMember"),
    # a count beyond the bound
    ({"inventory": [{"kind": "h100", "gpu": "h100_sxm", "count": 20_000, "pricePerHour": 3.0}]}, "inventory.0.count"),
])
def test_a_bad_pool_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], over: dict[str, object], field: str) -> None:
    assert main(["plan", "--pool", str(_pool(tmp_path, **over))]) == 2
    assert field in capsys.readouterr().err


def test_the_example_pool_is_planned_at_what_one_plain_service_carries_per_entry_pod(capsys: pytest.CaptureFixture[str]) -> None:
    # PlanTheRenderedSplit on examples/pool.yaml: summarise was "met at 100 %" on 1×TP1@l40s + a PD part whose own
    # explanation said the Service leaves it 3.17 of its 8 req/s; every member's capacity is now its parts' per-pod split
    example = Path(__file__).resolve().parents[2] / "examples" / "pool.yaml"
    assert main(["plan", "--pool", str(example), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for m in d["members"]:
        parts = m["parts"]
        split = per_pod_capacity_rps(entry_pods=[p["entry_pods"] for p in parts], capacity_rps=[p["capacity_rps"] for p in parts])
        assert m["capacity_rps"] == pytest.approx(split, abs=1e-3), m
        assert m["met"] is (split >= m["load_rps"] - 1e-6)
    assert all(m["met"] for m in d["members"]) and not d["shortages"]


def test_max_kinds_per_member_keeps_each_member_on_that_many_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--pool", str(_pool(tmp_path, maxKindsPerMember=1)), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(len(m["gpus"]) <= 1 for m in d["members"]), d["members"]


def test_plan_pool_record_alone_prints_the_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--pool", str(_pool(tmp_path)), "--record"]) == 0
    out = capsys.readouterr().out
    assert "# Pool decision record" in out and "## Short" in out


def test_plan_pool_json_is_json_alone_on_stdout_as_a_pipe_reads_it(tmp_path: Path) -> None:
    # `plan --pool --json | python -m json.tool`: the solver library writes below Python's sys.stdout, so only a real
    # process's stdout shows a banner ahead of the JSON (highspy's constructor printed one before output_flag was off).
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "servingtopology", "plan", "--pool", str(_pool(tmp_path)), "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["members"]
    assert "HiGHS" not in done.stdout + done.stderr


def test_a_member_of_a_small_load_keeps_its_digits_in_the_table_and_the_record(tmp_path, capsys):
    # A 0.02 req/s member read "load 0.0, goodput 0.0" beside a met verdict of 100 %.
    pool = tmp_path / "pool.yaml"
    pool.write_text("objective: min-cost\ninventory:\n  - {kind: h100, gpu: h100_sxm, count: 2, pricePerHour: 3.0}\nmembers:\n"
                    "  - name: tiny\n    spec:\n      model: meta-llama/Llama-3.1-8B-Instruct\n"
                    "      workload: {arrivalRate: 0.02, inputTokens: 1024, outputTokens: 256}\n"
                    "      slo: {ttftMs: {p95: 500}, tpotMs: {p95: 40}}\n")
    assert main(["plan", "--pool", str(pool), "--no-progress", "--record", "-"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("tiny "))
    assert row.split()[-3:] == ["0.02", "0.02", "100%"], row
    assert "for 0.02 req/s of goodput" in out and "goodput **0.02 req/s**" in out and " 0.0 " not in row
