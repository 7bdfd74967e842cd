"""Every path the CLI writes, checked before any work (CheckedUpFront) and written exactly as given (WrittenAsGiven).

Called by the subcommands at the top of `run`: `plan --record/--plot/--manifests`, `plan --pool --record/--plot`,
`compare --plot`, `sweep --plot`, `calibrate --out`, `emulate --status`. A path that cannot be written is InvalidSpec
naming the option (exit 2), never an OSError after minutes of planning (exit 3). It owns no output format.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from servingtopology.planner.errors import InvalidSpec

__all__ = ["OutputKind", "RECORD_SUFFIXES", "PLOT_SUFFIXES", "check_output", "write_output", "plot_format"]

# A record is markdown; a spec given after `--record` would otherwise be overwritten (plan SPEC --record reads well).
RECORD_SUFFIXES = (".md", ".markdown", ".txt")
# The formats a plot is drawn in, by suffix; matplotlib would append ".png" to a name without one and write elsewhere
# than the command says, so the suffix is required and the format is passed as it names (WrittenAsGiven).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


class OutputKind(StrEnum):
    FILE = "file"
    DIRECTORY = "directory"   # created with its missing parents (plan --manifests)


def _probe(option: str, folder: Path) -> None:
    """Create and remove a file in `folder`: what `os.access` cannot say as root or on a read-only mount."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".servingtopology-probe-")
    except OSError as exc:
        raise InvalidSpec(option, f"cannot write in {str(folder)!r} ({exc.strerror or exc}); give a path in a writable "
                                  "folder") from None
    os.close(fd)
    os.unlink(name)


def check_output(option: str, path: str | os.PathLike[str] | None, *, kind: OutputKind = OutputKind.FILE,
                 suffixes: tuple[str, ...] = ()) -> Path | None:
    """Check that `path` can be written as given, before any work; return it as a Path (None for no path).

    A FILE: not a folder, its parent an existing writable folder, an existing file writable, its suffix one of
    `suffixes` (when given). A DIRECTORY: a folder or nothing yet, its nearest existing ancestor a writable folder.
    Raises InvalidSpec naming `option` and what is allowed."""
    if path is None:
        return None
    text = os.fspath(path)
    if not text or "\x00" in text:
        raise InvalidSpec(option, f"expected a path, got {text!r}")
    target = Path(text)
    try:
        if kind is OutputKind.DIRECTORY:
            if target.exists() and not target.is_dir():
                raise InvalidSpec(option, f"{text!r} exists and is not a folder; give a folder (created if missing)")
            ancestor = target
            while not ancestor.exists():
                ancestor = ancestor.parent
            if not ancestor.is_dir():
                raise InvalidSpec(option, f"{text!r} cannot be created: {str(ancestor)!r} is not a folder")
            _probe(option, ancestor)
            return target
        if suffixes and target.suffix.lower() not in suffixes:
            raise InvalidSpec(option, f"expected a file ending in {' or '.join(suffixes)}, got {text!r} (the suffix is the format "
                                      "written, and the file is written under exactly the name given)")
        if target.is_dir():
            raise InvalidSpec(option, f"{text!r} is a folder; give a file name")
        parent = target.parent
        if not parent.is_dir():
            raise InvalidSpec(option, f"the folder {str(parent)!r} does not exist (it is not created); give a path in an existing folder")
        if target.exists() and not os.access(target, os.W_OK):
            raise InvalidSpec(option, f"{text!r} exists and is not writable")
        _probe(option, parent)
    except OSError as exc:   # a name too long, a loop of links: what the file system says, named by the option
        raise InvalidSpec(option, f"cannot write {text!r} ({exc.strerror or exc})") from None
    return target


def write_output(option: str, path: str | os.PathLike[str], write: Callable[[Path], object]) -> None:
    """Run `write(path)`; an OSError (the folder removed or the disk filled since the check) is InvalidSpec naming `option`."""
    try:
        write(Path(path))
    except OSError as exc:
        raise InvalidSpec(option, f"writing {os.fspath(path)!r} failed ({exc.strerror or exc})") from None


def plot_format(path: str | os.PathLike[str]) -> str:
    """The format a checked plot path is drawn in: its suffix without the dot (`png`, `svg`, `pdf`)."""
    return Path(path).suffix.lower().lstrip(".")
