"""Sigmoid and logsumexp on the CPU without MLX's slow exp.

MLX's CPU exp runs at about 12 ns an element here (cpu_attention.py); mx.power(e, x) gives
the same function at about a third of that. A decode step at 16 answers spends about a
seventh of its time in two such places: the SwiGLU gate of every layer (silu, through
mx.sigmoid) and the normalising of the logits over the whole vocabulary (mx.logsumexp,
mlx-lm's batch step). Both are replaced here for float32 arrays on the CPU, where the
models look them up at each call; anything else goes to MLX's own.
"""

from __future__ import annotations

import math
import os
from typing import Any

_own: dict[str, Any] = {}  # MLX's own functions, once replaced


def exp(x: Any) -> Any:
    """e ** x through the C library (a Python e takes x's dtype: no array made per call)."""
    import mlx.core as mx
    return mx.power(math.e, x)


def install() -> None:
    """Replace mx.sigmoid and mx.logsumexp. Once per process, before the model's first
    call (nn.silu is compiled at its first call, with whatever mx.sigmoid is then); a
    no-op where MLX runs on a GPU. SHOAL_CPU_EXP=0 keeps MLX's own (to compare)."""
    import mlx.core as mx

    if _own or mx.default_device() != mx.cpu or os.environ.get("SHOAL_CPU_EXP") == "0":
        return
    _own.update(sigmoid=mx.sigmoid, logsumexp=mx.logsumexp)
    mx.sigmoid, mx.logsumexp = sigmoid, logsumexp


def _mlx(name: str) -> Any:
    import mlx.core as mx
    return _own.get(name) or getattr(mx, name)


def _ours(a: Any, stream: Any) -> bool:
    import mlx.core as mx
    return stream is None and isinstance(a, mx.array) and a.dtype == mx.float32


def sigmoid(a: Any, /, *, stream: Any = None) -> Any:
    """1 / (1 + e^-a): past |a| = 88 the power over- or underflows, which gives 0 and 1,
    within 1e-38 of the answer."""
    if not _ours(a, stream):
        return _mlx("sigmoid")(a, stream=stream)
    return 1 / (1 + exp(-a))


def logsumexp(a: Any, /, axis: Any = None, keepdims: bool = False, *,
              stream: Any = None) -> Any:
    """log(sum(e^(a - max))) + max, as MLX's own: the largest term is e^0, so no sum
    overflows; a row all -inf (every token masked) gives -inf, one with +inf gives +inf."""
    import mlx.core as mx

    if not _ours(a, stream):
        return _mlx("logsumexp")(a, axis=axis, keepdims=keepdims, stream=stream)
    top = mx.max(a, axis=axis, keepdims=True)
    top = mx.where(mx.isinf(top), 0, top)
    out = mx.log(mx.sum(exp(a - top), axis=axis, keepdims=True)) + top
    if keepdims:
        return out
    return out.squeeze() if axis is None else out.squeeze(axis)
