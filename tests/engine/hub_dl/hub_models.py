"""Sharded tiny models for the download tests and benchmarks/downloads.py."""

from __future__ import annotations

import json
from pathlib import Path

# the repositories the tests' Hub serves, and the one token it knows
TOKEN = "hf_test_token_0123456789"
SHARDED = "test-org/tiny-sharded"
BIG = "test-org/tiny-big"
NOT_MLX = "test-org/torch-only"
GATED = "test-org/tiny-gated"


def shard_model(folder: Path, groups: list[list[str]]) -> Path:
    """Split model.safetensors into model-0000i-of-0000n.safetensors by tensor-name
    prefixes (one list per shard) and write the index mlx-lm and the Hub use."""
    import mlx.core as mx
    weights = mx.load(str(folder / "model.safetensors"))
    n = len(groups)
    weight_map: dict[str, str] = {}
    for i, prefixes in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        part = {k: v for k, v in weights.items() if k.startswith(tuple(prefixes))}
        mx.save_safetensors(str(folder / name), part, metadata={"format": "mlx"})
        weight_map.update({k: name for k in part})
    missing = set(weights) - set(weight_map)
    assert not missing, missing
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=1))
    return folder
