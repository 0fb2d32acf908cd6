"""One pipeline rank's share of any mlx-lm model, run by the model's own code.

The model object stays whole: its own embedding, masks, cache objects, layer loop, final
norm and head. Only the entries of `model.layers` are replaced by `Slot`s, so every family
keeps its own indexing (layer types, sliding windows, linear-attention layers):
- layers this rank holds run as they are;
- the first of them swaps the loop's input for the hidden state received from the
  previous rank (its embedding is a `ZeroEmbed` that only gives the shape);
- the last of them ends the forward pass by raising `Captured` with its output;
- the other layers are husks that keep the original's plain attributes (is_linear,
  use_sliding, ...) and no weights.
Rank 0 also runs the head: a pass in which every layer is skipped and the last slot
returns the final hidden state, so the model's own norm, head and logit scaling apply.
Layers of other ranks keep empty caches whose positions advance as if they had run, so
masks built from any layer's cache are right on every rank.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger(__name__)


class Captured(Exception):
    """Raised by the last slot of a rank with that rank's output hidden state."""

    def __init__(self, h: Any):
        super().__init__("stage output")
        self.h = h


class Control:
    """What the slots do on the current pass; shared by every slot of one stage."""

    def __init__(self, start: int, end: int, n: int):
        self.start, self.end, self.n = start, end, n
        self.head = False   # the head pass: skip every layer, emit `inject` at the end
        self.inject: Any = None


def _plain_attrs(layer: Any) -> dict[str, Any]:
    """The layer's own non-array, non-module attributes (flags the model's loop reads)."""
    return {k: v for k, v in vars(layer).items() if not k.startswith("_")}


def _make_slot_class() -> type:
    import mlx.nn as nn

    class Slot(nn.Module):
        """Stands in for model.layers[i]."""

        def __init__(self, index: int, layer: Any, held: bool, ctl: Control):
            super().__init__()
            object.__setattr__(self, "_ctl", ctl)
            object.__setattr__(self, "_index", index)
            object.__setattr__(self, "_attrs", _plain_attrs(layer))
            if held:
                self.layer = layer

        def __getattr__(self, key: str) -> Any:
            try:
                return super().__getattr__(key)
            except AttributeError:
                attrs = object.__getattribute__(self, "_attrs")
                if key in attrs:
                    return attrs[key]
                raise

        def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            ctl, i = self._ctl, self._index
            if ctl.head:
                return ctl.inject if i == ctl.n - 1 else x
            if not ctl.start <= i < ctl.end:
                return x
            if i == ctl.start and ctl.inject is not None:
                x = ctl.inject
            out = self.layer(x, *args, **kwargs)
            if i == ctl.end - 1:
                raise Captured(out)
            return out

    return Slot


def _make_zero_embed_class() -> type:
    import mlx.nn as nn

    class ZeroEmbed(nn.Module):
        """An embedding that gives zeros of the right shape: on ranks past the first, the
        loop's real input is injected at the rank's first layer."""

        def __init__(self, dims: int):
            super().__init__()
            object.__setattr__(self, "_dims", dims)
            object.__setattr__(self, "dtype", None)

        def __call__(self, tokens: Any) -> Any:
            import mlx.core as mx
            return mx.zeros((*tokens.shape, self._dims), self.dtype or mx.float32)

        def as_linear(self, x: Any) -> Any:  # never reached: the head is rank 0's
            raise RuntimeError("the head runs on rank 0")

    return ZeroEmbed


def _embeddings(model: Any, layers: list[Any]) -> list[tuple[Any, str, Any]]:
    """(parent, attribute, module) of every token embedding outside the layers."""
    import mlx.nn as nn

    inside = {id(m) for layer in layers for _, m in layer.named_modules()}
    found = []
    for _, parent in model.named_modules():
        if id(parent) in inside:
            continue
        for key, child in parent.children().items():
            if isinstance(child, (nn.Embedding, nn.QuantizedEmbedding)):
                found.append((parent, key, child))
    return found


def layer_list(model: Any) -> list[Any]:
    """The list object that holds the model's layers (`model.layers` may be a property
    returning a slice of it, as for families with mlx-lm's PipelineMixin)."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise ValueError("the model's layers are not a list")
    ids = [id(x) for x in layers]
    for _, m in model.named_modules():
        own = m.get("layers") if isinstance(m, dict) else None
        if isinstance(own, list) and [id(x) for x in own] == ids:
            return own
    raise ValueError("the model's layers list is not one of its modules")


def advance(cache: Any, n: int, batch: int = 1) -> None:
    """Move an unused layer cache's position on by n tokens (for each of `batch` rows, as
    in a batched cache), holding nothing."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, CacheList

    if isinstance(cache, CacheList):
        for c in cache.caches:
            advance(c, n, batch)
    elif isinstance(cache, ArraysCache) or not hasattr(cache, "update_and_fetch"):
        return  # recurrent state: no positions
    else:
        empty = mx.zeros((batch, 1, n, 0))
        cache.update_and_fetch(empty, empty)


class Stage:
    """Layers [start, end) of `model` on one pipeline rank (rank 0 also embeds and runs the
    head). Built from the lazily loaded model: what this rank doesn't hold is dropped before
    anything is read."""

    def __init__(self, model: Any, start: int, end: int):
        from mlx_lm.models.cache import make_prompt_cache

        layers = layer_list(model)
        self.model, self.n = model, len(layers)
        self.start, self.end = start, end
        self.first, self.last = start == 0, end == self.n
        self.ctl = Control(start, end, self.n)
        self.held = layers[start:end]
        if not self.first:
            for parent, key, emb in _embeddings(model, layers):
                setattr(parent, key, _make_zero_embed_class()(emb.weight.shape[-1]))
        slot = _make_slot_class()
        for i in range(self.n):
            layers[i] = slot(i, layers[i], start <= i < end, self.ctl)
        self._cache = make_prompt_cache(model)  # empty: the per-layer kinds
        self.hidden = 0
        self.dtype = "float32"

    @property
    def layers(self) -> list[Any]:
        return self.held

    def held_modules(self) -> Any:
        """Everything this rank keeps, for unpacking and evaluating: its layers, and on
        rank 0 the rest of the model (embedding, norm, head)."""
        import mlx.nn as nn

        if self.first:
            return self.model
        holder = nn.Module()
        holder.layers = self.held
        return holder

    def unheld(self) -> frozenset[int]:
        """Ids of the weights outside this rank's share (on ranks past 0: the final norm and
        head), never read here and so never evaluated."""
        from engine.runtime.realize import flat

        if self.first:
            return frozenset()
        mine = {id(a) for _, a in flat(self.held_modules().parameters())}
        return frozenset(id(a) for _, a in flat(self.model.parameters())
                         if id(a) not in mine)

    def probe(self) -> tuple[int, str]:
        """(hidden size, dtype) of the hidden states, from the embedding (rank 0)."""
        import mlx.core as mx

        emb = _embeddings(self.model, self.held)[0][2]
        out = emb(mx.array([[0]]))
        return int(out.shape[-1]), str(out.dtype).split(".")[-1]

    def set_dtype(self, dtype: str) -> None:
        """The dtype of hidden states between ranks (the ZeroEmbeds produce it)."""
        import mlx.core as mx

        self.dtype = dtype
        for _, m in self.model.named_modules():
            if type(m).__name__ == "ZeroEmbed":
                object.__setattr__(m, "dtype", getattr(mx, dtype))

    def make_cache(self) -> list[Any]:
        return copy.deepcopy(self._cache)

    def quantize_kv(self, kv: Any) -> None:
        """Every cache made from now on keeps its KV as `kv` (engine.runtime.quant_kv.KV)
        says."""
        self._cache = kv.quantize(self._cache)

    def __call__(self, x: Any, cache: list[Any], input_embeddings: Any = None) -> Any:
        """Token ids (rank 0) or the previous rank's hidden states in; this rank's output
        hidden states out. On rank 0 `input_embeddings` (an image prompt's, from the
        vision tower) stand in for the ids' embeddings."""
        import mlx.core as mx

        n = x.shape[1]
        if self.first:
            tokens, self.ctl.inject = x, None
        else:
            tokens, self.ctl.inject = mx.zeros(x.shape[:2], mx.int32), x
        extra = {"input_embeddings": input_embeddings} \
            if self.first and input_embeddings is not None else {}
        try:
            self.model(tokens, cache=cache, **extra)
        except Captured as done:
            out = done.h
        else:
            raise RuntimeError("the model's forward pass never reached this rank's layers")
        finally:
            self.ctl.inject = None
        others = [c for i, c in enumerate(cache) if not self.start <= i < self.end]
        for c in others:
            advance(c, n, x.shape[0])
        # Nothing else ever evaluates these empty caches: without this their lazy graphs
        # would grow with every token, and a prefix cache keeps them for many requests.
        mx.eval([c.state for c in others])
        return out

    def logits(self, h: Any) -> Any:
        """The model's own final norm and head over the last rank's output (rank 0)."""
        import mlx.core as mx

        ctl = self.ctl
        ctl.head, ctl.inject = True, h
        try:
            return self.model(mx.zeros(h.shape[:2], mx.int32))
        finally:
            ctl.head, ctl.inject = False, None
