"""M-RoPE for the Qwen-VL families on mlx-lm's language model. Their language model
places an image's tokens at 3-D positions (time, row, column; mlx-vlm's get_rope_index
computes them per request), and every token after the last image at its index plus the
request's delta (usually negative: an image's tokens take fewer positions than tokens).
mlx-lm's text model code (qwen2.py, qwen3*.py) rotates by the cache offset alone, so:

- a small adapter sits in place of each attention's rope module: while an image request's
  prompt runs (Placing.current), a chunk holding image tokens is rotated at its 3-D
  positions by mlx-vlm's own rotary embedding, and a later one at offset + delta;
  otherwise it is mlx-lm's rope untouched (text requests stay exactly as they were);
- in the Batcher an image request joins with its rows' BatchKVCache offset shifted by
  its delta (Shifted): that offset is used only for RoPE there (the mask uses _idx and
  left_padding), so it decodes with the rest at offset + delta. A plain KVCache's offset
  is also its write index: it is never shifted;
- Qwen3-VL's deepstack features are added to the first layers' outputs at the image
  tokens, as mlx-vlm's language model does (only those rows: a long prompt holds no
  prompt-sized copy per layer)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MARK = "_shoal_mrope"  # on a language model whose ropes are adapted


@dataclass
class Placed:
    """One request's prompt positions: rows (3, N) from mlx-vlm's get_rope_index, the
    delta, and from which index on every position is index + delta."""
    rows: Any  # numpy int array (3, N)
    delta: int
    plain_from: int
    # (the image tokens' indexes, numpy; per layer their features (n, hidden), MLX)
    deepstack: tuple[Any, list[Any]] | None = field(default=None)

    @classmethod
    def of(cls, rows: Any, delta: int) -> Placed:
        import numpy as np

        n = rows.shape[1]
        placed = np.nonzero(~(rows == np.arange(n)[None, :] + delta).all(axis=0))[0]
        return cls(rows, delta, int(placed[-1]) + 1 if placed.size else 0)

    def wire(self) -> list[int]:
        """The delta and rows as ints, for the plan a group's rank 0 sends."""
        return [self.delta, *(int(x) for x in self.rows.ravel())]

    @classmethod
    def unwire(cls, ints: list[int]) -> Placed:
        import numpy as np

        if len(ints) < 1 or (len(ints) - 1) % 3:
            raise ValueError(f"{len(ints)} ints can't be a delta and 3 rows of positions")
        return cls.of(np.array(ints[1:], dtype=np.int64).reshape(3, -1), ints[0])

    def chunk(self, start: int, n: int) -> Any:
        """Positions (3, 1, n) of prompt tokens start.. (past the prompt: index + delta)."""
        import mlx.core as mx
        import numpy as np

        have = self.rows[:, start:start + n]
        if have.shape[1] < n:
            extra = np.arange(start + have.shape[1], start + n) + self.delta
            have = np.concatenate([have, np.broadcast_to(extra, (3, extra.size))], axis=1)
        return mx.array(have.astype(np.int32))[:, None, :]


class Placing:
    """The request whose prompt the model is running now (None: mlx-lm's rope as is), per
    thread: set around the model calls on the thread that makes them, so a request left
    unfinished on one thread can't misplace another's."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.deep = 0  # the first layers that take deepstack features (Qwen3-VL: 3)

    @property
    def current(self) -> Placed | None:
        return getattr(self._local, "placed", None)

    @current.setter
    def current(self, placed: Placed | None) -> None:
        self._local.placed = placed

    @contextmanager
    def running(self, placed: Placed | None) -> Iterator[None]:
        before, self.current = self.current, placed
        try:
            yield
        finally:
            self.current = before


class Rotary:
    """In place of an attention's rope module (called as rope(x, offset=...))."""

    def __init__(self, rope: Any, mrope: Any, placing: Placing):
        self.rope, self.mrope, self.placing = rope, mrope, placing

    def __call__(self, x: Any, offset: Any = 0) -> Any:
        p = self.placing.current
        if p is None or not isinstance(offset, int):
            return self.rope(x, offset=offset)
        if offset >= p.plain_from:
            return self.rope(x, offset=offset + p.delta)
        pos = p.chunk(offset, x.shape[-2])
        return self.mrope.apply_rotary(x, x, pos, unsqueeze_dim=1)[0]


def install(lm: Any, vlm: Any) -> Placing | None:
    """Adapt mlx-lm's language model `lm` to M-RoPE where mlx-vlm's model `vlm` (before its
    language model is dropped) places tokens in 3-D; None for other families."""
    lang: Any = getattr(vlm, "language_model", None)
    if not hasattr(lang, "get_rope_index"):
        return None
    mrope = next((getattr(getattr(layer, "self_attn", None), "rotary_emb", None)
                  for layer in lang.model.layers
                  if hasattr(getattr(layer, "self_attn", None), "rotary_emb")), None)
    if mrope is None:
        return None
    import mlx.core as mx

    # its tables, evaluated here: MLX runs a graph only on the thread that built it, and
    # the model runs on another (a group's batcher, the Batcher's scheduler)
    mx.eval(mrope.parameters(), [v for v in vars(mrope).values() if isinstance(v, mx.array)])
    placing = getattr(lm, MARK, None) or Placing()
    for layer in map(_held, lm.layers):
        attn: Any = getattr(layer, "self_attn", None)
        rope = getattr(attn, "rope", None)
        if rope is not None and not isinstance(rope, Rotary):
            # kept out of the module tree: it holds no weights
            object.__setattr__(attn, "rope", Rotary(rope, mrope, placing))
            attn.pop("rope", None)
    deep = list(getattr(vlm.config.vision_config, "deepstack_visual_indexes", None) or [])
    for k, layer in enumerate(map(_held, lm.layers[:len(deep)])):
        if layer is not None:
            _stack(layer, k, placing)
    placing.deep = len(deep)
    object.__setattr__(lm, MARK, placing)
    return placing


def _held(layer: Any) -> Any:
    """The layer itself, where a pipeline stage's Slot stands in for it (None where
    another rank holds it)."""
    if type(layer).__name__ != "Slot":
        return layer
    return layer.children().get("layer")


def install_in_group(folder: Any, lm: Any) -> Placing | None:
    """install() on a group rank's share of the language model, from the checkpoint's
    mlx-vlm model loaded lazily (its weights are never read: only its rotary and config
    are used); None for families without 3-D positions."""
    from pathlib import Path

    from mlx_vlm.utils import load_model

    return install(lm, load_model(Path(folder), lazy=True))


def shifted(cache: list[Any], delta: int) -> list[Any]:
    """A request's cache whose merge into a batch rotates its row at offset + delta."""
    return [_shifted(c, delta) for c in cache] if delta else cache


def _stack(layer: Any, k: int, placing: Placing) -> None:
    """The layer's output gets deepstack feature `k` at the image tokens (the class is
    swapped for a subclass, so its weights keep their names)."""
    base = type(layer)
    if getattr(base, "_deepstack", False):
        return

    def call(self: Any, x: Any, mask: Any = None, cache: Any = None) -> Any:
        import mlx.core as mx
        import numpy as np

        h = base.__call__(self, x, mask, cache)
        p = placing.current
        if p is None or p.deepstack is None or k >= len(p.deepstack[1]):
            return h
        n = x.shape[1]
        start = cache.offset - n if cache is not None else 0
        if not isinstance(start, int):
            return h
        at, features = p.deepstack
        lo, hi = np.searchsorted(at, start), np.searchsorted(at, start + n)
        if lo == hi:  # no image token in this chunk
            return h
        rows = mx.array((at[lo:hi] - start).astype(np.uint32))
        return h[0].at[rows].add(features[k][lo:hi].astype(h.dtype))[None]

    layer.__class__ = type(f"Deepstack{base.__name__}", (base,),
                           {"__call__": call, "_deepstack": True})


def deepstack_rows(features: Any) -> tuple[Any, list[Any]] | None:
    """mlx-vlm's deepstack features (per layer, a row per image token) with the image
    tokens' indexes in the prompt; None where the family has none."""
    import mlx.core as mx
    import numpy as np

    deep = getattr(features, "deepstack_visual_embeds", None)
    masks = getattr(features, "visual_pos_masks", None)
    if not deep or masks is None:
        return None
    deep = list(deep)
    mx.eval(deep)
    return np.nonzero(np.array(masks[0]))[0], deep


def joining(model: Any, cache: list[Any], images: Any) -> list[Any]:
    """A request's cache as it joins mlx-lm's batch: on an adapted model each plain
    KVCache layer becomes Shifted (a text request's by 0), so the merged batch cache
    rotates an image request's rows at offset + delta."""
    if getattr(model, MARK, None) is None:
        return cache
    placed = getattr(images, "placed", None)
    delta = placed.delta if placed is not None else 0
    return [_shifted(c, delta) for c in cache]


def _shifted(c: Any, delta: int) -> Any:
    from mlx_lm.models.cache import KVCache

    from engine.runtime.quant_kv import QuantKV

    if type(c) not in (KVCache, QuantKV):  # recurrent state has no positions
        return c
    base: Any = type(c)
    s = _shifted_class(base)()
    s.__dict__.update(c.__dict__)
    s.delta = delta
    return s


@functools.cache
def _shifted_class(base: Any) -> Any:
    import mlx.core as mx

    class Shifted(base):  # type: ignore[misc, valid-type]
        """A request's cache whose row, merged into a batch (BatchKVCache, BatchQuantKV:
        their offset is used only for RoPE), rotates at offset + delta."""
        delta = 0

        def merge(self, caches: list[Any]) -> Any:
            out = super().merge(caches)
            out.offset = out.offset + mx.array([getattr(x, "delta", 0) for x in caches])
            return out
    return Shifted
