"""Long stages report progress on a terminal and stay quiet otherwise: `plan` counts stage 6's simulations after the
funnel's stages, `sweep` its points; nothing reaches stderr with --json or when stderr is not a terminal."""

from __future__ import annotations

import io
import json
import sys

import pytest

from servingtopology.cli.main import main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


SWEEP = ["sweep", "--concurrency", "1,2", "--requests-per-client", "2", "--layout", "A=1xTP1"]


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


@pytest.mark.parametrize("argv", [["plan", "--json"], [*SWEEP, "--json"], ["plan", "--no-progress"], [*SWEEP, "--no-progress"]])
def test_json_and_no_progress_draw_nothing_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                         argv: list[str]) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    assert terminal.getvalue() == ""
    if "--json" in argv:
        json.loads(capsys.readouterr().out)


def test_nothing_is_drawn_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SWEEP) == 0
    assert capsys.readouterr().err == ""
