"""Only the shard you need: which files of a sharded checkpoint hold a pipeline rank's
layers, read from model.safetensors.index.json. Pure functions, no I/O."""

from __future__ import annotations

import re
from typing import Any

# "model.layers.12.mlp...", "language_model.model.layers.3...", "transformer.h.7..."
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_EMBED = ("embed_tokens", "wte", "word_embeddings", "tok_embeddings", "embedding.")
_HEAD = ("lm_head", "output.weight", "embed_out")
_NORM = re.compile(r"(?:^|\.)(?:norm|final_layernorm|ln_f|final_norm)\.")

# Small files every rank needs: configuration, tokenizer, chat template, custom code.
SIDE_PATTERNS = ("*.json", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model",
                 "*.txt", "*.jsonl", "*.jinja")


def tensor_role(name: str) -> tuple[str, int | None]:
    """("layer", i) for a tensor of decoder layer i, else ("embed"|"head"|"norm"|"other",
    None)."""
    m = _LAYER.search(name)
    if m:
        return "layer", int(m.group(1))
    if any(k in name for k in _EMBED):
        return "embed", None
    if any(name.startswith(k) or f".{k}" in name for k in _HEAD):
        return "head", None
    if _NORM.search(name):
        return "norm", None
    return "other", None


def files_for_layers(index: dict[str, Any], layers: tuple[int, int], total_layers: int,
                     first: bool, last: bool) -> set[str]:
    """The weight files a pipeline rank holding layers [start, end) must have.

    The first rank also needs the embeddings; the last rank the final norm and the head,
    and the embeddings too when the head is tied to them (no lm_head tensor). Tensors
    Shoal can't place (vision towers, projectors, ...) go to every rank, so a load never
    misses one. Config and tokenizer files are not weight files: see SIDE_PATTERNS.
    """
    start, end = layers
    if not (0 <= start < end <= total_layers):
        raise ValueError(f"layers [{start}, {end}) is not inside 0..{total_layers}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError("the index has no weight_map")
    tied = not any(tensor_role(k)[0] == "head" for k in weight_map)
    files: set[str] = set()
    for name, file in weight_map.items():
        role, i = tensor_role(name)
        wanted = (role == "layer" and i is not None and start <= i < end
                  or role == "embed" and (first or (last and tied))
                  or role in ("head", "norm") and last
                  or role == "other")
        if wanted:
            files.add(str(file))
    return files
