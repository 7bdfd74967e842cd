"""Hypothesis runs the same examples on every run (`derandomize`), so a CI run cannot fail on a draw no earlier run
made; `HYPOTHESIS_PROFILE=explore` draws fresh random examples (and more of them) to look for new counterexamples,
which then become fixed regression tests."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
