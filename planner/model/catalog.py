"""The model catalog and the entry points for a model: a catalog id or a Hugging Face config.json.

ModelArch (planner.arch) is built from the config's fields by planner.model.hf_config, with no list of
architecture names: dense, GQA/MQA, MoE, MLA, sparse-attention indexers, sliding-window, hybrid linear
attention and state-space layers, multi-token prediction and quantised checkpoints. Called by the spec
conversion, the memory and performance models. Pure: parses dicts; reading a user's file is the caller's job.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from importlib import resources

from servingtopology.planner.arch import CheckpointQuant, ModelArch, ModuleGroup, StateKind
from servingtopology.planner.errors import InvalidSpec, did_you_mean
from servingtopology.planner.model.hf_config import from_hf_config

__all__ = ["ModelArch", "CheckpointQuant", "ModuleGroup", "StateKind", "from_hf_config", "model_catalog", "resolve_model", "catalog_hf_id"]


def _norm(name: str) -> str:
    return name.strip().lower()


@cache
def _catalog_index() -> dict[str, tuple[str, str]]:
    """Lower-cased id, HF id or alias -> (catalog id, data file)."""
    raw = tomllib.loads(resources.files("servingtopology.planner").joinpath("data/models.toml").read_text())
    index: dict[str, tuple[str, str]] = {}
    for mid, e in raw.items():
        for key in (mid, e["hf_id"], *e.get("aliases", [])):
            index[_norm(key)] = (mid, str(e["file"]))
            index[_norm(key.split("/")[-1])] = (mid, str(e["file"]))
    return index


@cache
def _load_catalog_model(mid: str, file: str) -> ModelArch:
    text = resources.files("servingtopology.planner").joinpath(f"data/models/{file}").read_text()
    return from_hf_config(json.loads(text), name=mid)


def model_catalog() -> dict[str, ModelArch]:
    """Every catalog model, by catalog id."""
    seen = {mid: file for mid, file in _catalog_index().values()}
    return {mid: _load_catalog_model(mid, file) for mid, file in sorted(seen.items())}


def resolve_model(name: str, *, field: str = "model") -> ModelArch:
    """Find a catalog model by id, Hugging Face id or alias (case-insensitive)."""
    hit = _catalog_index().get(_norm(name)) or _catalog_index().get(_norm(name.split("/")[-1]))
    if hit is None:
        allowed = ", ".join(sorted(model_catalog()))
        near = did_you_mean(name, [*model_catalog(), *(h for h in map(catalog_hf_id, model_catalog()) if h)])
        raise InvalidSpec(field, f"unknown model {name!r}{near}; use a catalog id ({allowed}) or give modelConfig: a config.json path")
    return _load_catalog_model(*hit)


def catalog_hf_id(name: str) -> str | None:
    """The Hugging Face id of a catalog model named by id, Hugging Face id or alias; None when not in the catalog."""
    hit = _catalog_index().get(_norm(name)) or _catalog_index().get(_norm(name.split("/")[-1]))
    if hit is None:
        return None
    raw = tomllib.loads(resources.files("servingtopology.planner").joinpath("data/models.toml").read_text())
    return str(raw[hit[0]]["hf_id"])
