"""Only the shard you need: which files of a sharded checkpoint hold a pipeline rank's
layers, read from model.safetensors.index.json. Pure functions, no I/O."""

from __future__ import annotations

import re

# "model.layers.12.mlp...", "language_model.model.layers.3...", "transformer.h.7..."
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_EMBED = ("embed_tokens", "wte", "word_embeddings", "tok_embeddings", "embedding.")
_HEAD = ("lm_head", "output.weight", "embed_out")
_NORM = re.compile(r"(?:^|\.)(?:norm|final_layernorm|ln_f|final_norm)\.")

# Small files every rank needs: configuration, tokenizer, chat template, custom code.
SIDE_PATTERNS = ("*.json", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model",
                 "*.txt", "*.jsonl", "*.jinja")


_NOT_TEXT = ("vision", "visual", "mm_projector", "multi_modal_projector", "audio")


def tensor_role(name: str) -> tuple[str, int | None]:
    """("layer", i) for a tensor of the language model's decoder layer i, else ("embed" |
    "head" | "norm" | "other", None). A vision tower's own numbered blocks are "other"."""
    if any(k in name for k in _NOT_TEXT):
        return "other", None
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


def rank_keeps(name: str, start: int, end: int, first: bool) -> bool:
    """Whether a pipeline rank holding layers [start, end) keeps this tensor: its layers',
    and on the first rank everything outside the layers (embedding, final norm, head:
    rank 0 runs the head; vision towers, which the text model drops)."""
    role, i = tensor_role(name)
    if role == "layer":
        return i is not None and start <= i < end
    return first


def files_for_layers(weight_map: dict[str, str], layers: tuple[int, int], total_layers: int,
                     first: bool) -> set[str]:
    """The weight files a pipeline rank holding layers [start, end) must have (see
    rank_keeps). ValueError when the range is outside the model or the index names no
    tensor of some layer in it. Config and tokenizer files are not weight files: see
    SIDE_PATTERNS."""
    start, end = layers
    if not (0 <= start < end <= total_layers):
        raise ValueError(f"layers [{start}, {end}) is not inside 0..{total_layers}")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError("the index has no weight_map")
    files: set[str] = set()
    seen: set[int] = set()
    for name, file in weight_map.items():
        role, i = tensor_role(name)
        if role == "layer" and i is not None:
            seen.add(i)
        if rank_keeps(name, start, end, first):
            files.add(str(file))
    missing = sorted(set(range(start, end)) - seen)
    if missing:
        raise ValueError(f"the checkpoint has no weights for layers {missing}")
    return files
