"""Tiny models from the real published config.json files in tests/fixtures/model-configs:
only the sizes shrink (width, layers keeping their pattern, experts, heads, vocabulary, MLA
ranks, RoPE lists sized by the head width); every other field stays as published: rope
scaling, wrappers, layer types, MTP fields and quantization blocks.

`shrink` is pure. `write_checkpoint` (tests/checkpoints.py) writes the weights in the
format the checkpoint ships in."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "tests" / "fixtures" / "model-configs"  # README.md there: each file's source

WIDTH, HEADS, HEAD_DIM = 64, 4, 16
# field → tiny value (only where the published value is a positive number)
SIZES = {
    "hidden_size": WIDTH, "intermediate_size": 128, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32, "head_dim": HEAD_DIM,
    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "v_head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
}
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
WINDOW = 8  # sliding windows shrink so that a test prompt crosses them


def names() -> list[str]:
    """The reference configs, by file stem (e.g. "meta-llama__Llama-3.1-8B-Instruct")."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def published(name: str) -> dict[str, Any]:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def shrink(config: dict[str, Any], vocab: int) -> dict[str, Any]:
    """A tiny copy of `config` (a whole config.json, wrapper included)."""
    out = copy.deepcopy(config)
    text = out.get("text_config")
    if isinstance(text, dict):
        _shrink_text(text, vocab)
        for k in ("vocab_size",):  # some wrappers repeat it at the top
            if isinstance(out.get(k), int):
                out[k] = vocab
    else:
        _shrink_text(out, vocab)
    layers = (text or out)["num_hidden_layers"]
    for block in ("quantization", "quantization_config"):
        q = out.get(block)
        if isinstance(q, dict):
            out[block] = _shrink_overrides(q, layers)
    return out


def tiny_layers(c: dict[str, Any]) -> int:
    """Layers enough for three uneven pipeline ranks with every layer kind on some rank:
    four, or one whole period of the layer pattern if that is longer."""
    n = 4
    if isinstance(c.get("sliding_window_pattern"), int):
        n = max(n, c["sliding_window_pattern"])
    elif "gemma3" in str(c.get("model_type")) and c.get("sliding_window"):
        n = max(n, 6)  # transformers' default pattern: five sliding, one full
    for key in ("full_attention_interval", "layer_group_size"):
        if isinstance(c.get(key), int) and c[key] > 1:
            n = max(n, c[key])
    return n


def _shrink_text(c: dict[str, Any], vocab: int) -> None:
    old_layers = int(c["num_hidden_layers"])
    heads = int(c.get("num_attention_heads") or 0)
    old_head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads else 0)
    for k, v in SIZES.items():
        if isinstance(v, int) and isinstance(c.get(k), int) and c[k] > 0:
            c[k] = v
    if heads:
        kv = int(c.get("num_key_value_heads") or heads)
        c["num_attention_heads"] = HEADS
        if "num_key_value_heads" in c:
            c["num_key_value_heads"] = HEADS if kv == heads else (1 if kv == 1 else 2)
    c["vocab_size"] = vocab
    layers = tiny_layers(c)
    c["num_hidden_layers"] = layers
    _shrink_layer_lists(c, old_layers, layers)
    _shrink_experts(c)
    _shrink_rope(c, old_head_dim)
    if isinstance(c.get("sliding_window"), int) and c.get("use_sliding_window") is not False \
            and c["sliding_window"] < c.get("max_position_embeddings", 1 << 30):
        c["sliding_window"] = WINDOW  # windows that bite shrink; disabled ones stay
    if isinstance(c.get("max_window_layers"), int):
        c["max_window_layers"] = layers if c["max_window_layers"] >= old_layers else 1
    if isinstance(c.get("first_k_dense_replace"), int) and c["first_k_dense_replace"] > 1:
        c["first_k_dense_replace"] = 1  # one leading dense layer, MoE after it


def _shrink_layer_lists(c: dict[str, Any], old: int, new: int) -> None:
    """Per-layer lists (layer_types, attn_type_list, ...) keep their first `new` entries,
    which keeps a periodic pattern's period whole."""
    for k, v in list(c.items()):
        if isinstance(v, list) and len(v) == old and old > new:
            c[k] = v[:new]
    for k in ("mlp_only_layers",):
        if isinstance(c.get(k), list):
            c[k] = [i for i in c[k] if i < new]


def _shrink_experts(c: dict[str, Any]) -> None:
    key = next((k for k in EXPERT_KEYS if isinstance(c.get(k), int) and c[k] > 0), None)
    if key is None:
        return
    groups = c.get("n_group")
    experts = 8
    c[key] = experts
    for k in TOPK_KEYS:
        if isinstance(c.get(k), int):
            c[k] = 2
    if isinstance(groups, int) and groups > 1:  # grouped routing stays grouped
        c["n_group"] = 2
        if isinstance(c.get("topk_group"), int):
            c["topk_group"] = 1


def _shrink_rope(c: dict[str, Any], old_head_dim: int) -> None:
    """RoPE fields sized by the head width: rotary_dim, longrope's factor lists (one per
    rotated pair), mrope sections (summing to the rotated pairs)."""
    heads = int(c.get("num_attention_heads") or 1)
    head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
    if isinstance(c.get("rotary_dim"), int) and old_head_dim:
        c["rotary_dim"] = max(2, c["rotary_dim"] * head_dim // old_head_dim)
    for block in ("rope_scaling", "rope_parameters"):
        r = c.get(block)
        if not isinstance(r, dict):
            continue
        partial = float(r.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
        pairs = max(1, int(head_dim * partial) // 2)
        for k in ("long_factor", "short_factor"):
            f = r.get(k)
            if isinstance(f, list) and len(f) > pairs:
                step = len(f) / pairs  # keep the curve's shape: every step-th entry
                r[k] = [f[math.floor(i * step)] for i in range(pairs)]
        sec = r.get("mrope_section")
        if isinstance(sec, list) and sum(sec) > pairs:
            scaled = [s * pairs // sum(sec) for s in sec]
            scaled[0] += pairs - sum(scaled)
            r["mrope_section"] = scaled


def _shrink_overrides(q: dict[str, Any], layers: int) -> dict[str, Any]:
    """Per-layer quantization overrides of layers that no longer exist go."""
    import re

    out = {}
    for k, v in q.items():
        m = re.search(r"layers\.(\d+)\.", k)
        if m is None or int(m.group(1)) < layers:
            out[k] = v
    return out
