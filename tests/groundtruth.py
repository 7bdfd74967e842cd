"""Where the shared ground truth (public measurements, model configs) is for tests.

$SERVINGTOPOLOGY_SHARED, else the repository's sibling `shared/`, else /work/shared (the team's machines).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SHARED", "GROUNDTRUTH"]


def _find() -> Path:
    candidates = [os.environ.get("SERVINGTOPOLOGY_SHARED", ""), str(Path(__file__).resolve().parents[2] / "shared"), "/work/shared"]
    for c in candidates:
        if c and (Path(c) / "groundtruth").is_dir():
            return Path(c)
    return Path("/work/shared")


SHARED = _find()
GROUNDTRUTH = SHARED / "groundtruth"
