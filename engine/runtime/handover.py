"""A prompt's KV made on one node and used on another (prefill here, decode there): the
prefill side runs the model over the prompt with a fresh cache, a chunk at a time, and
writes the cache as mlx-lm's prompt-cache file (safetensors, the KV's own dtype, Shoal's
quantized KV as the QuantizedKVCache it extends); the decode side reads such a file,
checks it is this model's cache for exactly those tokens, and keeps it in its prefix
cache, where the request's own lookup then finds all of its prompt but the last token.
The node moves the file between them over the authenticated node channel
(engine/node/handover.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from engine.errors import BadRequest

CHUNK = 512  # tokens a prefill step runs (the Batcher's default chunk on the CPU)


class Cancelled(Exception):
    pass


def prefill_file(model: Any, kv: Any, tokens: list[int], path: Path,
                 cancel: threading.Event, chunk: int = CHUNK, made_by: str = ""
                 ) -> tuple[int, float]:
    """Run `model` over `tokens` into a fresh cache (`kv`: engine.runtime.quant_kv.KV) and
    write it to `path`, named as made by `made_by` (the checkpoint's and KV bits'
    fingerprint, engine.runtime.disk_cache.fingerprint); (the file's bytes, seconds the
    prefill took)."""
    import mlx.core as mx
    from mlx_lm.models.cache import save_prompt_cache

    from engine.runtime.disk_cache import _plain

    t0 = time.perf_counter()
    cache = kv.make(model)
    for i in range(0, len(tokens), chunk):
        if cancel.is_set():
            raise Cancelled
        model(mx.array([tokens[i:i + chunk]]), cache=cache)
        mx.eval([c.state for c in cache])
    took = time.perf_counter() - t0
    _tighten(cache)
    tmp = path.with_name(path.name + ".tmp.safetensors")
    save_prompt_cache(str(tmp), _plain(cache), {"tokens": json.dumps(tokens),
                                                "made_by": made_by})
    tmp.replace(path)
    return path.stat().st_size, took


def _tighten(cache: list[Any]) -> None:
    """Plain and quantized KV layers down to the tokens they hold: mlx-lm's buffers grow
    256 tokens at a time, and a hand-over shouldn't carry the unused end."""
    from mlx.utils import tree_map

    for c in cache:
        off, keys = getattr(c, "offset", None), getattr(c, "keys", None)
        if type(c).__name__ in ("KVCache", "QuantKV", "QuantizedKVCache") \
                and isinstance(off, int) and keys is not None:
            c.keys = tree_map(lambda a, n=off: a[..., :n, :], c.keys)
            c.values = tree_map(lambda a, n=off: a[..., :n, :], c.values)


def layout_of(model: Any, kv: Any) -> list[list[tuple[Any, ...]]]:
    """Each layer's cache arrays as this model makes them (shape without the tokens' axis,
    and dtype), from one token through a fresh cache: what a handed-over cache must
    match. Run once, where the model is loaded (before requests run on other threads)."""
    import mlx.core as mx

    cache = kv.make(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    return [_layout(c) for c in cache]


def _layout(c: Any) -> list[tuple[Any, ...]]:
    return [(tuple(d for i, d in enumerate(a.shape) if not (a.ndim == 4 and i == 2)),
             str(a.dtype)) for a in _arrays(c.state)]


def read_file(model: Any, kv: Any, tokens: list[int], path: Path, made_by: str = "",
              layout: list[list[tuple[Any, ...]]] | None = None) -> list[Any]:
    """The cache in `path`, checked to be what this model (`made_by`: its fingerprint, as
    prefill_file names it; `layout`: layout_of's) keeps for exactly `tokens` (a 400
    saying what doesn't match otherwise)."""
    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache

    from engine.runtime.disk_cache import _ours

    try:
        cache, meta = load_prompt_cache(str(path), return_metadata=True)
        cache = _ours(cache)
        mx.eval([c.state for c in cache])
    except Exception as e:  # truncated, not safetensors, not a prompt cache
        raise BadRequest(f"The handed-over KV can't be read: {str(e)[:160]}") from None
    if meta.get("made_by") != made_by:
        raise BadRequest("The handed-over KV was made by another model (or the same one "
                         "with other files or KV bits): the prefill node must hold the "
                         "same checkpoint as this node.")
    fresh = kv.make(model)
    if [type(c).__name__ for c in cache] != [type(c).__name__ for c in fresh]:
        raise BadRequest("The handed-over KV is not this model's: its layers are "
                         f"{len(cache)} caches of other kinds than the {len(fresh)} it keeps.")
    try:
        said = json.loads(meta.get("tokens", "null"))
    except ValueError:
        said = None
    if said != tokens:
        raise BadRequest("The handed-over KV holds other tokens than the prompt's.")
    for i, c in enumerate(cache):
        offset = getattr(c, "offset", None)
        if isinstance(offset, int) and offset != len(tokens):
            raise BadRequest(f"The handed-over KV's layer {i} holds {offset} tokens, not "
                             f"the prompt's {len(tokens)}.")
        if layout is not None and _layout(c) != layout[i]:
            _cast(c, layout[i])  # a Mac's float16 KV for a CPU node's float32, and back
        if layout is not None and _layout(c) != layout[i]:
            raise BadRequest(f"The handed-over KV's layer {i} is shaped {_layout(c)}, not "
                             f"as this model keeps it ({layout[i]}).")
    return cache


def _cast(c: Any, want: list[tuple[Any, ...]]) -> None:
    """A layer's floating-point KV in the dtype this node keeps it in (the shapes must
    match already; packed quantized values are integers and stay)."""
    import mlx.core as mx
    from mlx.utils import tree_map

    floats = [d for _, d in want if "float" in d]
    if not floats or getattr(c, "keys", None) is None:
        return
    dtype = getattr(mx, floats[0].split(".")[-1], None)
    if dtype is None:
        return

    def cast(a: Any) -> Any:
        return a.astype(dtype) if isinstance(a, mx.array) and \
            mx.issubdtype(a.dtype, mx.floating) else a

    c.keys, c.values = tree_map(cast, c.keys), tree_map(cast, c.values)
    mx.eval(c.keys, c.values)


def _arrays(x: Any) -> list[Any]:
    import mlx.core as mx
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (list, tuple)):
        return [a for v in x for a in _arrays(v)]
    return []
