"""Long stages report progress on a terminal and stay quiet otherwise: `plan` counts stage 6's simulations after the
funnel's stages, `sweep` its points, `simulate` the requests of its run; nothing reaches stderr with --json or when
stderr is not a terminal."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from servingtopology.cli.main import main
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.sim import simulate
from servingtopology.planner.workload import LengthDist, Workload


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


SWEEP = ["sweep", "--concurrency", "1,2", "--requests-per-client", "2", "--layout", "A=1xTP1"]
# A pinned spec `simulate` runs 300 requests of (0.3 CPU s).
SPEC = ("model: meta-llama/Llama-3.1-8B-Instruct\nengine: {name: vllm, image: engine:1}\n"
        "hardware: {gpu: h100_sxm, gpusPerNode: 8, maxGPUs: 2}\n"
        "workload: {arrivalRate: 4, inputTokens: 512, outputTokens: 64}\nslo: {ttftMs: {p95: 1000}, tpotMs: {p95: 60}}\n"
        "simulation: {requests: 300, seed: 1}\nlayout: {kind: replicas, replicas: 1, tp: 1}\n")


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return str(path)


@pytest.mark.parametrize("argv, shown", [
    (["plan"], ["funnel", "stage 6 simulation", "layout"]),   # the simulations after the funnel's five stages
    (SWEEP, ["sweep", "2 clients"]),                          # each concurrency's simulation
])
def test_long_stages_report_progress_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                   argv: list[str], shown: list[str]) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    drawn = terminal.getvalue()
    assert all(word in drawn for word in shown), drawn[-400:]


def test_simulate_counts_its_requests_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                    spec: str) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["simulate", spec]) == 0
    drawn = terminal.getvalue()
    assert "simulation" in drawn and "1×TP1" in drawn, drawn[-400:]
    counts = [int(n) for n in re.findall(r"(\d+)/300", drawn)]
    assert counts and max(counts) == 300 and len(set(counts)) > 2, counts   # it moves through the run, to its end


def test_the_simulators_progress_counts_finished_requests_up_to_the_run() -> None:
    heard: list[int] = []
    work = Workload(LengthDist.fixed(256), LengthDist.fixed(32), arrival_rate_rps=8.0)
    result = simulate(Layout.replicas(1, Parallelism()), model=resolve_model("meta-llama/Llama-3.1-8B-Instruct"),
                      gpu=resolve_gpu("h100_sxm"), engine=Engine.VLLM, workload=work, num_requests=500, progress=heard.append)
    assert heard == sorted(heard) and heard[-1] == result.summary(None).finished == 500
    assert 50 <= len(heard) <= 102   # about every 1 % of the requests, and once at the end


@pytest.mark.parametrize("argv", [["plan", "--json"], [*SWEEP, "--json"], ["plan", "--no-progress"], [*SWEEP, "--no-progress"],
                                  ["simulate", "SPEC", "--json"], ["simulate", "SPEC", "--no-progress"]])
def test_json_and_no_progress_draw_nothing_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                         argv: list[str], spec: str) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main([spec if a == "SPEC" else a for a in argv]) == 0
    assert terminal.getvalue() == ""
    if "--json" in argv:
        json.loads(capsys.readouterr().out)


def test_nothing_is_drawn_off_a_terminal(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    assert main(SWEEP) == 0
    assert main(["simulate", spec]) == 0
    assert capsys.readouterr().err == ""


def test_a_simulation_is_shown_from_its_start_before_any_request_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    from servingtopology.cli.progress import StageBar

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bar = StageBar(enabled=True)
    assert bar.requests("simulation", 300, note="3P(TP4·DP4-attn)·1D(TP8)") is not None
    drawn = terminal.getvalue()
    bar.close()
    assert "simulation" in drawn and "0/300" in drawn and "3P(TP4·DP4-attn)·1D(TP8)" in drawn, drawn


def test_plan_manifests_counts_stage_6_and_times_every_stage(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    resource = tmp_path / "r.yaml"
    resource.write_text("apiVersion: servingtopology.io/v1alpha1\nkind: ServingTopology\nmetadata: {name: demo}\nspec:\n"
                        + "".join(f"  {line}\n" for line in SPEC.replace("layout: {kind: replicas, replicas: 1, tp: 1}\n", "")
                                  .replace("simulation: {requests: 300, seed: 1}\n", "").splitlines()))
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["plan", str(resource), "--manifests", str(tmp_path / "out")]) == 0
    assert "stage 6 simulation" in terminal.getvalue(), terminal.getvalue()[-400:]
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["plan", str(resource), "--manifests", str(tmp_path / "out2"), "--json"]) == 0
    funnel = json.loads(capsys.readouterr().out)["funnel"]
    assert sum(s["seconds"] for s in funnel) > 0, funnel   # it read 0.000 for every stage, stage 6's simulations included
