"""Prefill attention on the CPU without MLX's slow exp.

On the CPU, mx.fast.scaled_dot_product_attention falls back to plain ops (scores, mask,
softmax, values), and its softmax's exp runs at about 12 ns an element here (numpy's at
0.5): at 4K tokens and more that exp is most of a prefill (docs/benchmarks.md, issue 51).
mx.power(e, x) computes the same function through the C library at about a third of the
cost, so a prompt's chunks attend through this version, their queries in blocks whose
scores stay in cache (rows are independent: the same result bit for bit). Decode steps
(few queries) keep MLX's kernel: there extra ops cost more than they save.
"""

from __future__ import annotations

import os
from typing import Any

from engine.runtime.cpu_exp import exp

# queries at least this many take this path: prefill chunks, not decode steps nor a
# speculative verify (at most MAX_DRAFT + 1 = 17 queries, engine/runtime/speculative.py)
LEAST_QUERIES = 32
# a chunk's queries go in blocks whose scores take about this much: past it (a long
# prompt's later chunks) every pass over them misses the cache (8K keys: 1.4x faster)
SCORES_BYTES = 8 << 20

_installed: list[Any] = []  # MLX's own kernel, once replaced


def install() -> None:
    """Route mx.fast.scaled_dot_product_attention through `attention` (the models of
    mlx-lm look it up at each call). Once per process; a no-op where MLX runs on a GPU.
    SHOAL_CPU_ATTENTION=0 keeps MLX's own (to compare)."""
    import mlx.core as mx

    if _installed or mx.default_device() != mx.cpu or \
            os.environ.get("SHOAL_CPU_ATTENTION") == "0":
        return
    _installed.append(mx.fast.scaled_dot_product_attention)
    mx.fast.scaled_dot_product_attention = attention


def attention(q: Any, k: Any, v: Any, *, scale: float, mask: Any = None,
              sinks: Any = None, force_fused: bool = False, stream: Any = None) -> Any:
    """The same attention as MLX's: softmax(q·kᵀ·scale, masked)·v, grouped-query heads
    as a broadcast (no repeated keys); anything this doesn't cover goes to MLX's own."""
    import mlx.core as mx

    fast = _installed[0] if _installed else mx.fast.scaled_dot_product_attention
    b, h, n, d = q.shape
    kv, keys = k.shape[1], k.shape[2]
    m = _mask_5d(mask, b, h, kv)
    if (sinks is not None or stream is not None or force_fused or n < LEAST_QUERIES
            or h % kv or q.dtype != mx.float32 or m is False):
        return fast(q, k, v, scale=scale, mask=mask, sinks=sinks, force_fused=force_fused,
                    stream=stream)
    if isinstance(mask, str):  # "causal": the queries are the last n of the keys
        m = mx.arange(keys - n, keys)[:, None] >= mx.arange(keys)[None]
    rows = max(LEAST_QUERIES, SCORES_BYTES // (4 * h * keys))
    if rows >= n:
        return _attend(q, k, v, scale, m)
    parts = [_attend(q[:, :, i:i + rows], k, v, scale,
                     m[..., i:i + rows, :] if m is not None and m.shape[-2] == n else m)
             for i in range(0, n, rows)]
    return mx.concatenate(parts, axis=2)


def _attend(q: Any, k: Any, v: Any, scale: float, m: Any) -> Any:
    import mlx.core as mx

    b, h, n, d = q.shape
    kv = k.shape[1]
    s = (q * scale).reshape(b, kv, h // kv, n, d) @ k[:, :, None].swapaxes(-1, -2)
    if m is not None:
        # the lowest finite score, as MLX's own: a left-padded batch row's padding sees
        # no key at all, and -inf there would make it NaN, which the next layer's
        # attention spreads to the real rows (0 x NaN)
        s = mx.where(m, s, mx.finfo(s.dtype).min) if m.dtype == mx.bool_ else s + m
    p = exp(s - s.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v[:, :, None]
    return out.reshape(b, h, n, d)


def _mask_5d(mask: Any, b: int, h: int, kv: int) -> Any:
    """An array mask shaped for (batch, kv heads, group, queries, keys); None where
    there is none or it is "causal"; False where its shape isn't one handled here."""
    if mask is None or isinstance(mask, str):
        return None if mask in (None, "causal") else False
    if mask.ndim < 4:
        return mask  # (queries, keys) or (1, queries, keys): broadcasts as it is
    if mask.ndim == 4 and mask.shape[1] == 1:
        return mask[:, :, None]
    if mask.ndim == 4 and mask.shape[1] == h:
        return mask.reshape(mask.shape[0], kv, h // kv, *mask.shape[2:])
    return False
