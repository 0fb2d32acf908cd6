"""Batching by length and pooling: pure functions, so memory stays flat over thousands of
inputs (a bounded number of padded tokens at a time) and padding stays small (similar
lengths together)."""

from __future__ import annotations

import mlx.core as mx

TOKENS_PER_BATCH = 4096  # padded tokens in one forward pass
MAX_BATCH = 64
# On a CPU a batch saves nothing (the matmuls are already compute-bound at one text) and a
# large one costs more per text (all-MiniLM layer, 30 tokens: 0.069 s/text alone, 0.105 at
# 64, on a shared 2-core machine): small batches there
CPU_BATCH = 4
SPREAD = 1.25  # a batch's longest input is at most this times its shortest (plus SLACK)
SLACK = 4


def buckets(lengths: list[int], tokens: int = TOKENS_PER_BATCH,
            most: int = MAX_BATCH) -> list[list[int]]:
    """The inputs' indices in batches: sorted by length, each batch's padded size (its
    count x its longest) within `tokens`, its count within `most`, its longest within
    SPREAD x its shortest + SLACK (padding is work: on a CPU, all of it); an input longer
    than `tokens` alone. Every index appears exactly once."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    batch: list[int] = []
    for i in order:  # ascending: the input added last is the batch's longest
        if batch and (len(batch) >= most or (len(batch) + 1) * lengths[i] > tokens
                      or lengths[i] > lengths[batch[0]] * SPREAD + SLACK):
            out.append(batch)
            batch = []
        batch.append(i)
    if batch:
        out.append(batch)
    return out


def batch_limit() -> int:
    """The most inputs in one batch on this process's device."""
    return CPU_BATCH if mx.default_device().type == mx.DeviceType.cpu else MAX_BATCH


def pad(rows: list[list[int]], value: int = 0) -> tuple[mx.array, mx.array]:
    """Right-padded ids [B, L] and the attention mask (1 for a real token)."""
    width = max(len(r) for r in rows)
    ids = mx.array([r + [value] * (width - len(r)) for r in rows], dtype=mx.int32)
    mask = mx.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=mx.int32)
    return ids, mask


def pool(h: mx.array, mask: mx.array, how: str) -> mx.array:
    """One vector per row of hidden states `h` [B, L, H] (float32), as sentence-transformers
    pools: the mean of the real tokens, the first token, the last real token, or the max."""
    h = h.astype(mx.float32)
    if how == "cls":
        return h[:, 0]
    if how == "lasttoken":
        last = mask.sum(axis=1) - 1
        return h[mx.arange(h.shape[0]), last]
    m = mask[..., None].astype(mx.float32)
    if how == "max":
        return mx.where(m > 0, h, mx.array(-mx.inf, dtype=mx.float32)).max(axis=1)
    return (h * m).sum(axis=1) / mx.maximum(m.sum(axis=1), 1e-9)


def unit(v: mx.array) -> mx.array:
    """Rows scaled to unit length (a zero row stays zero)."""
    return v / mx.maximum(mx.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
