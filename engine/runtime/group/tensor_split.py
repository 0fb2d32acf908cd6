"""Tensor parallel splits mlx-lm lacks, as small adapters: a vision checkpoint's wrapper
Model (gemma3, mistral3, qwen2_vl, qwen3_vl, qwen3_vl_moe) has no shard() though its
language model is split as any other (mistral3's llama or ministral3 and Qwen-VL's qwen2,
qwen3 or qwen3_moe have one; gemma3_text gets llama's split, its attention
and MLP named alike). Rank 0's vision tower and the token embedding stay whole."""

from __future__ import annotations

from typing import Any

from engine.placement.families import SPLIT_BY_SHOAL as WRAPPERS  # mlx-lm modules split here


def add_shard(model: Any) -> None:
    """Give `model` a shard(group) where mlx-lm has none but its language model can be
    split; nothing where it has one, or none can be given (the caller then refuses)."""
    if hasattr(model, "shard"):
        return
    lm = getattr(model, "language_model", None)
    if lm is None or type(model).__module__.rsplit(".", 1)[-1] not in WRAPPERS:
        return
    if hasattr(lm, "shard"):
        object.__setattr__(model, "shard", lm.shard)
    elif type(lm).__module__.endswith(".gemma3_text"):
        object.__setattr__(model, "shard", lambda group=None: _shard_gemma3(lm, group))


def _shard_gemma3(lm: Any, group: Any = None) -> None:
    """mlx-lm's llama split over gemma3_text's layers: q, k, v and the MLP's gate and up
    by output rows, o and down by input columns (their outputs summed); each rank keeps
    its heads (the per-head q and k norms need no split)."""
    import mlx.core as mx
    from mlx.nn.layers.distributed import shard_linear

    group = group or mx.distributed.init()
    n = group.size()
    for layer in lm.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        att.q_proj = shard_linear(att.q_proj, "all-to-sharded", group=group)
        att.k_proj = shard_linear(att.k_proj, "all-to-sharded", group=group)
        att.v_proj = shard_linear(att.v_proj, "all-to-sharded", group=group)
        att.o_proj = shard_linear(att.o_proj, "sharded-to-all", group=group)
        att.n_heads //= n
        att.n_kv_heads //= n
        mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
        mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
        mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)
