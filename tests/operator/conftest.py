"""Fixtures of the operator tests: golden-file comparison (regenerate with UPDATE_GOLDENS=1)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """Compare text with tests/operator/golden/<name>; UPDATE_GOLDENS=1 rewrites the file instead."""

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if os.environ.get("UPDATE_GOLDENS") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"missing golden {path}; run with UPDATE_GOLDENS=1 to create it"
        assert text == path.read_text(), f"{name} drifted from its golden file; if intended, rerun with UPDATE_GOLDENS=1"

    return check
