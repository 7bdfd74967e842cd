"""The public config.json copies in tests/planner/data/model_configs, read as a user would give them, and the
engines' cache rule the model tests spell their expected values with. Shared by the planner's model tests."""

import json
from pathlib import Path
from typing import Any

from servingtopology.planner.arch import ModelArch
from servingtopology.planner.model.catalog import from_hf_config

CONFIGS = Path(__file__).parent / "data" / "model_configs"
BF16, FP8 = 2, 1   # bytes a cached value


def raw(name: str) -> dict[str, Any]:
    """The config's JSON as stored."""
    return json.loads((CONFIGS / f"{name}.json").read_text())


def load(name: str) -> ModelArch:
    """The planner's model of a stored config."""
    return from_hf_config(raw(name), name=name)


def full_attention_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """vLLM FullAttentionSpec: K and V of every KV head, per token and layer."""
    return layers * 2 * kv_heads * head_dim * dtype_bytes
