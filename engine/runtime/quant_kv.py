"""Quantized KV caches (8 or 4 bits) that batch: mlx-lm's QuantizedKVCache holds one
sequence, and mlx-lm has no batched form of it (its server turns batching off with
`kv_bits`). `QuantKV` is mlx-lm's one-sequence cache that its batching can merge;
`BatchQuantKV` is BatchKVCache's layout (left padding, one write index for the batch)
with each of keys and values stored as mlx's (packed, scales, biases) triple, which
mlx-lm's attention already reads (`scaled_dot_product_attention` sees `bits`).

Only plain KV layers are quantized; sliding windows and recurrent state keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    KVCache,
    QuantizedKVCache,
    _BaseCache,
    dynamic_roll,
    make_prompt_cache,
)

from engine.placement.families import BITS, GROUP, kv_group  # noqa: F401 (the rule)


@dataclass(frozen=True)
class KV:
    """How a worker keeps its KV: `bits` 8 or 4 (None: the model's own 16 bits), in
    quantization groups of `group` values."""

    bits: int | None = None
    group: int = GROUP

    @classmethod
    def for_model(cls, model: Any, bits: int | None) -> KV:
        """Checked against the model's heads (a ValueError says why not)."""
        return cls.for_config(getattr(model, "args", None) or {}, bits)

    @classmethod
    def for_config(cls, config: Any, bits: int | None) -> KV:
        return cls(bits, kv_group(config, bits)) if bits else cls()

    def quantize(self, cache: list[Any]) -> list[Any]:
        """`cache` (a fresh one) with its plain KV layers quantized."""
        if self.bits is None:
            return cache
        return [QuantKV(self.group, self.bits) if type(c) is KVCache else c for c in cache]

    def make(self, model: Any) -> list[Any]:
        """A fresh prompt cache for `model`."""
        return self.quantize(make_prompt_cache(model))


def _tree(f: Any, x: Any) -> Any:
    return tuple(f(a) for a in x)


class QuantKV(QuantizedKVCache):
    """One sequence's quantized KV, which mlx-lm's batching can merge."""

    def merge(self, caches: list[Any]) -> BatchQuantKV:
        return BatchQuantKV.merge(caches)


class BatchQuantKV(_BaseCache):
    """Quantized KV for a batch, laid out as mlx-lm's BatchKVCache (see its docs)."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int = GROUP, bits: int = 8):
        self.keys: tuple[Any, ...] | None = None
        self.values: tuple[Any, ...] | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self.group_size, self.bits = group_size, bits
        self._idx = 0
        self._right_padding: Any = None

    def _blank(self, like: Any, dim: int, steps: int) -> tuple[Any, ...]:
        b, h = like.shape[:2]
        per = 32 // self.bits
        return (mx.zeros((b, h, steps, dim // per), dtype=mx.uint32),
                mx.zeros((b, h, steps, dim // self.group_size), dtype=like.dtype),
                mx.zeros((b, h, steps, dim // self.group_size), dtype=like.dtype))

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            steps = (self.step + n - 1) // self.step * self.step
            new_k = self._blank(keys, keys.shape[3], steps)
            new_v = self._blank(values, values.shape[3], steps)
            if self.keys is None or self.values is None:
                self.keys, self.values = new_k, new_v
            else:
                if prev % self.step:
                    self.keys = _tree(lambda x: x[..., :prev, :], self.keys)
                    self.values = _tree(lambda x: x[..., :prev, :], self.values)
                self.keys = tuple(mx.concatenate([a, b], axis=2)
                                  for a, b in zip(self.keys, new_k, strict=True))
                self.values = tuple(mx.concatenate([a, b], axis=2)
                                    for a, b in zip(self.values, new_v, strict=True))
        self.offset = self.offset + n
        self._idx += n
        assert self.keys is not None and self.values is not None
        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for i in range(3):
            self.keys[i][..., prev:self._idx, :] = qk[i]
            self.values[i][..., prev:self._idx, :] = qv[i]
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Any, Any]:
        assert self.keys is not None and self.values is not None
        end = self._idx
        return (_tree(lambda x: x[..., :end, :], self.keys),
                _tree(lambda x: x[..., :end, :], self.values))

    def prepare(self, *, left_padding: Any = None, lengths: Any = None,
                right_padding: Any = None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty cache")
            pad = mx.array(left_padding)
            self.left_padding += pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        if self._right_padding is None:
            return
        pad = self._right_padding
        if self.keys is not None and self.values is not None:
            self.keys = _tree(lambda x: dynamic_roll(x, pad[:, None], axis=2), self.keys)
            self.values = _tree(lambda x: dynamic_roll(x, pad[:, None], axis=2), self.values)
        self.offset = self.offset - pad
        self.left_padding += pad
        self._right_padding = None

    @property
    def state(self) -> Any:
        return self.keys, self.values, self.offset, self.left_padding

    @state.setter
    def state(self, v: Any) -> None:
        self.keys, self.values, self.offset, self.left_padding = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding,
                                  **kwargs)

    def filter(self, batch_indices: Any) -> None:
        if self.keys is not None and self.values is not None:
            self.keys = _tree(lambda x: x[batch_indices], self.keys)
            self.values = _tree(lambda x: x[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        pads: list[int] = self.left_padding.tolist()  # type: ignore[assignment]
        least = min(pads)
        if least > 0:  # drop the padding every row has
            if self.keys is not None and self.values is not None:
                self.keys = _tree(lambda x: x[..., least:, :], self.keys)
                self.values = _tree(lambda x: x[..., least:, :], self.values)
            self._idx -= least
            self.left_padding -= least

    def extend(self, other: BatchQuantKV) -> None:
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        like = next(c for c in (self, other) if c.keys is not None)

        def pad(c: BatchQuantKV) -> tuple[Any, Any, Any, Any]:
            if c.keys is None or c.values is None:  # rows with nothing in them yet
                assert like.keys is not None and like.values is not None
                rows = c.offset.shape[0]
                k = _tree(lambda x: mx.zeros((rows, *x.shape[1:2], 0, x.shape[3]),
                                             x.dtype), like.keys)
                v = _tree(lambda x: mx.zeros((rows, *x.shape[1:2], 0, x.shape[3]),
                                             x.dtype), like.values)
            else:
                k, v = c.keys, c.values
            left = idx - c._idx
            right = size - k[0].shape[2] - left
            if right < 0:
                k = _tree(lambda x: x[..., :right, :], k)
                v = _tree(lambda x: x[..., :right, :], v)
                right = 0
            if left or right:
                width = [(0, 0), (0, 0), (left, right), (0, 0)]
                k = _tree(lambda x: mx.pad(x, width), k)
                v = _tree(lambda x: mx.pad(x, width), v)
            return k, v, c.offset, c.left_padding + left

        (ka, va, oa, la), (kb, vb, ob, lb) = pad(self), pad(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(ka, kb, strict=True))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(va, vb, strict=True))
        self.offset = mx.concatenate([oa, ob])
        self.left_padding = mx.concatenate([la, lb])
        self._idx = idx

    def extract(self, idx: int) -> QuantKV:
        cache = QuantKV(self.group_size, self.bits)
        if self.keys is None or self.values is None:
            return cache
        pad = int(self.left_padding[idx].item())  # type: ignore[arg-type]
        end = self._idx
        cache.keys = _tree(lambda x: mx.contiguous(x[idx:idx + 1, :, pad:end]), self.keys)
        cache.values = _tree(lambda x: mx.contiguous(x[idx:idx + 1, :, pad:end]),
                             self.values)
        cache.offset = end - pad
        return cache

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantKV:
        """One-sequence caches (QuantKV, all of one group size and bits) into a batch."""
        first = caches[0]
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        most = max(lengths)
        out = cls([most - n for n in lengths], first.group_size, first.bits)
        if most == 0:
            return out
        like = next(c for c in caches if c.keys is not None)

        def stack(part: str) -> tuple[Any, ...]:
            arrays = []
            for i in range(3):
                ref = getattr(like, part)[i]
                full = mx.zeros((len(caches), ref.shape[1], most, ref.shape[3]), ref.dtype)
                for row, (c, n) in enumerate(zip(caches, lengths, strict=True)):
                    if n:
                        full[row:row + 1, :, most - n:] = getattr(c, part)[i][..., :n, :]
                arrays.append(full)
            return tuple(arrays)

        out.keys, out.values = stack("keys"), stack("values")
        out.offset = out.offset + most
        out._idx = most
        return out

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(int(x.nbytes) for x in (*self.keys, *self.values))
