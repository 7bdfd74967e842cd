"""Every path the CLI writes is checked before any work and written exactly as given (cli/output_paths.py).

Before: an unwritable `--record`, `--plot`, `--manifests` or `calibrate --out` failed after the planning with an
OSError (exit 3, "internal error"), and `--plot PATH` without a suffix wrote PATH.png while saying "written to PATH".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servingtopology.cli import calibrate, compare, plan, sweep
from servingtopology.cli.main import main
from servingtopology.cli.output_paths import OutputKind, check_output
from servingtopology.planner.errors import InvalidSpec

from .test_calibrate_cli import VLLM
from .test_calibrate_cli import _spec as calibrate_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _no_work(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
    """Make `module.name` fail the test if called: the path check must come before it."""
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError(f"{name} ran before the output path was checked")
    monkeypatch.setattr(module, name, refuse)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in out + err, err
    return code, err


@pytest.mark.parametrize(("flag", "name"), [
    # the folder does not exist (was: FileNotFoundError after planning, exit 3)
    ("--record", "missing/r.md"),
    ("--plot", "missing/p.png"),
    # no suffix: matplotlib would write p.png and the command say "p" (the format is the suffix)
    ("--plot", "p"),
    # a suffix matplotlib does not draw (was: ValueError after planning, exit 3)
    ("--plot", "p.bmpx"),
    # a folder where a file is wanted (was: IsADirectoryError, exit 3)
    ("--record", "folder.md"),
])
def test_plan_refuses_an_output_path_it_cannot_write_before_planning(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch, flag: str, name: str) -> None:
    (tmp_path / "folder.md").mkdir()
    _no_work(monkeypatch, plan, "decide")
    code, err = _run(capsys, "plan", "--no-simulate", "--no-progress", flag, str(tmp_path / name))
    assert code == 2 and f"{flag}:" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.md"]   # nothing written anywhere


def test_plan_manifests_refuses_a_file_where_the_folder_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    taken = tmp_path / "out"
    taken.write_text("not a folder")
    _no_work(monkeypatch, plan, "read_spec")
    code, err = _run(capsys, "plan", str(EXAMPLES / "vllm-pinned-pd.yaml"), "--manifests", str(taken), "--no-progress")
    # was: FileExistsError from mkdir after the plan, exit 3
    assert code == 2 and "--manifests:" in err and "not a folder" in err


def test_plan_manifests_under_a_file_is_refused() -> None:
    with pytest.raises(InvalidSpec) as err:
        check_output("--manifests", "/dev/null/out", kind=OutputKind.DIRECTORY)
    assert err.value.field == "--manifests" and "not a folder" in err.value.message


def test_a_plot_is_written_under_exactly_the_name_given_in_its_suffixs_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "envelope.svg"
    code, _ = _run(capsys, "plan", "--no-simulate", "--no-progress", "--plot", str(plot))
    assert code == 0 and plot.read_text().lstrip().startswith("<?xml")
    assert [p.name for p in tmp_path.iterdir()] == ["envelope.svg"]


def test_calibrate_refuses_an_unwritable_out_before_reading_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    spec = calibrate_spec(tmp_path)
    _no_work(monkeypatch, calibrate, "read_spec")
    code, err = _run(capsys, "calibrate", *VLLM, "--spec", spec, "--out", str(tmp_path / "missing" / "cal.yaml"))
    assert code == 2 and "--out:" in err      # was: FileNotFoundError after the fit, exit 3


def test_compare_and_sweep_refuse_a_plot_without_its_format_before_predicting(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _no_work(monkeypatch, compare, "compare_layouts")
    code, err = _run(capsys, "compare", "--layout", "A=8xTP1", "--plot", str(tmp_path / "abc"))
    assert code == 2 and "--plot:" in err and ".png" in err
    _no_work(monkeypatch, sweep, "parse_concurrency")
    code, err = _run(capsys, "sweep", "--plot", str(tmp_path / "missing" / "s.png"))
    assert code == 2 and "--plot:" in err
    assert list(tmp_path.iterdir()) == []


def test_plan_pool_refuses_its_outputs_before_planning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "plan", "--pool", str(tmp_path / "absent.yaml"), "--plot", str(tmp_path / "fleet"))
    assert code == 2 and "--plot:" in err     # the plot is named, not the pool file read after it


def test_emulate_refuses_an_unwritable_status_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "emulate", "--status", str(tmp_path / "missing" / "status.json"))
    assert code == 2 and "--status:" in err
