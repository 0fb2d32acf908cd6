"""Reading a checkpoint's config.json the same way everywhere: pure functions over the
parsed dict (no I/O), for the planner, the model list, the API and the worker.

Multimodal checkpoints nest the language model in `text_config`; its fields win over the
wrapper's. The context is what the config declares, extended by RoPE scaling where the
scaling block says how far (`factor` x `original_max_position_embeddings`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions",
                "seq_length", "context_length")
_EXTENDING = ("yarn", "linear", "dynamic", "longrope", "su", "llama3")


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: the wrapper's, overlaid by text_config's."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, Mapping) else dict(config)


def _positive_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return None
    return int(v)


def declared_context(config: Mapping[str, Any]) -> int | None:
    """The context config.json states (text_config first), or None."""
    text = config.get("text_config")
    for source in ((text,) if isinstance(text, Mapping) else ()) + (config,):
        for key in CONTEXT_KEYS:
            if (v := _positive_int(source.get(key))) is not None:
                return v
    return None


def scaled_context(config: Mapping[str, Any]) -> int | None:
    """factor x original_max_position_embeddings of a RoPE scaling block, or None."""
    cfg = text_config(config)
    for block in ("rope_scaling", "rope_parameters"):
        r = cfg.get(block)
        if not isinstance(r, Mapping):
            continue
        kind = str(r.get("rope_type") or r.get("type") or "default")
        factor = r.get("factor")
        original = _positive_int(r.get("original_max_position_embeddings")
                                 or cfg.get("original_max_position_embeddings"))
        if kind in _EXTENDING and isinstance(factor, (int, float)) and \
                not isinstance(factor, bool) and factor > 1 and original:
            return int(factor * original)
    return None


def context_length(config: Mapping[str, Any], fallback: int | None = None) -> int:
    """The model's context window: the declared one (or `fallback`, the model code's own
    default, when the config declares none), or what its RoPE scaling reaches if that is
    longer (e.g. Qwen2.5 with yarn added: 32768 -> 131072). 4096 when nothing says."""
    declared = declared_context(config) or fallback
    scaled = scaled_context(config)
    return max(declared or 0, scaled or 0) or 4096


def num_layers(config: Mapping[str, Any]) -> int | None:
    return _positive_int(text_config(config).get("num_hidden_layers"))


# Families whose vision tower Shoal runs (engine/runtime/vision/): the wrapper's model_type.
VISION_FAMILIES = frozenset({"gemma3", "mistral3", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
                             "qwen3_5_moe"})
# Of those, the ones whose language model places an image's tokens in 3-D (M-RoPE,
# engine/runtime/vision/positions.py: rank 0 sends each image prompt's positions to a
# group's other ranks).
MROPE_FAMILIES = frozenset({"qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5_moe"})
# Encoder families served as embedding models (engine/runtime/embedding/, mlx-embeddings).
ENCODER_FAMILIES = frozenset({"bert", "xlm-roberta", "roberta"})


def capabilities(config: Mapping[str, Any], files: frozenset[str] = frozenset(),
                 name: str = "") -> list[str]:
    """What a checkpoint does (protocol.CAPABILITIES), from its config.json and, where
    known, the names of the files beside it and its id or folder `name`: a
    sentence-transformers folder (modules.json) is an embedding model whatever its family;
    a classifier is a reranker (cross-encoder), and so is a causal LM named a reranker
    (Qwen3-Reranker, whose config.json alone says Qwen3ForCausalLM); an encoder alone
    embeds; anything else generates text, and takes images where its family's vision tower
    is one Shoal runs."""
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    kind = str(config.get("model_type") or "")
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return ["rerank"]
    if "reranker" in name.lower() and any(a.endswith("ForCausalLM") for a in archs):
        return ["rerank"]
    if "modules.json" in files or kind in ENCODER_FAMILIES:
        return ["embed", "rerank"]  # rerank by cosine similarity, as vLLM scores them
    out = ["generate"]
    if isinstance(config.get("vision_config"), Mapping) and kind in VISION_FAMILIES:
        out.append("vision")
    return out
