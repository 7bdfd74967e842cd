"""The distribution's metadata: a cold `make env` / `make plan` prints no setuptools warnings before the plan.

Reads pyproject.toml with setuptools' own configuration reader (the build backend's code path) and checks the
package list against the folders it maps, the two causes of the ~90 warning lines a cold install used to print.
"""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_metadata_raises_no_setuptools_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message).splitlines()[0] for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"
    assert "LICENSE" in dist.metadata.license_files


def test_every_data_folder_is_a_listed_package() -> None:
    # setuptools' build_py warns ("Package ... is absent from the `packages` configuration") about every folder
    # under a mapped package that holds package data but is not listed.
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    for package, folder in cfg["package-dir"].items():
        for sub in (ROOT / folder).rglob("*"):
            if sub.is_dir() and sub.name != "__pycache__" and any(f.is_file() for f in sub.iterdir()):
                dotted = ".".join([package, *sub.relative_to(ROOT / folder).parts])
                assert dotted in listed, f"{dotted} ({sub.relative_to(ROOT)}) is not in [tool.setuptools] packages"
    for package, patterns in cfg["package-data"].items():
        assert package in listed, package
        assert patterns
