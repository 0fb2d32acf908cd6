"""Small named fixes for where a family's mlx-lm code assumes it sees the whole
checkpoint, and a pipeline rank sees only its share (mlx-lm 0.32.2)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx

# MiniMax's sanitize() stacks every layer's experts into switch_mlp only when layer 0's
# experts are there: on a rank without layer 0 they stay one tensor per expert.
_MINIMAX_EXPERT = re.compile(r"^(.*\.block_sparse_moe)\.experts\.(\d+)\.(w[123])\.weight$")
_MINIMAX_NAMES = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def after_sanitize(model: Any, weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """What the family's sanitize() left undone on this rank's share."""
    if type(model).__module__.endswith(".minimax"):
        return _stack_minimax_experts(weights)
    return weights


def _stack_minimax_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    import mlx.core as mx

    groups: dict[tuple[str, str], dict[int, mx.array]] = {}
    out: dict[str, mx.array] = {}
    for k, v in weights.items():
        m = _MINIMAX_EXPERT.match(k)
        if m is None:
            out[k] = v
        else:
            groups.setdefault((m[1], m[3]), {})[int(m[2])] = v
    for (prefix, w), experts in groups.items():
        out[f"{prefix}.switch_mlp.{_MINIMAX_NAMES[w]}.weight"] = \
            mx.stack([experts[e] for e in sorted(experts)])
    return out
