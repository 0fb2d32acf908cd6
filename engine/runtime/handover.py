"""A prompt's KV made on one node and used on another (prefill here, decode there), as
frames (engine/runtime/kv_frames.py) streamed while the prefill runs.

The prefill side runs the model over the prompt with a fresh cache, a chunk at a time;
each plain or quantized KV layer's new rows go out as that layer produces them (so the
hand-over runs beside the prefill, not after it), in the KV's own dtype; a windowed or
recurrent layer, small by nature, goes whole once the last chunk has passed it. The decode
side reads the frames as they arrive, checks each against what this model keeps for
exactly those tokens, and builds the cache its prefix cache then holds: the request's own
lookup finds all of its prompt but the last token. The nodes move the frames between
them over the authenticated node channel (engine/node/handover.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from engine.errors import BadRequest
from engine.runtime.kv_frames import FrameError, Reader, encode

CHUNK = 512  # tokens a prefill step runs (the Batcher's default chunk on the CPU)
ROWS = ("KVCache", "QuantKV")  # layers that only grow: their rows go as they come
WHOLE = ("RotatingKVCache", "ArraysCache")  # bounded by a window or fixed: sent once
IDLE_S = 600.0  # a decode side that reads nothing new this long gives up (the node's
# watchdog and its cancel come much sooner; this bounds a node that forgot)


class Cancelled(Exception):
    pass


def prefill_stream(model: Any, kv: Any, tokens: list[int], out: IO[bytes],
                   cancel: threading.Event, chunk: int = CHUNK, made_by: str = "",
                   progress: Callable[[int], None] | None = None) -> float:
    """Run `model` over `tokens` into a fresh cache (`kv`: engine.runtime.quant_kv.KV),
    writing its frames to `out` as each layer produces them; the seconds it took. The
    frames are named as made by `made_by` (the checkpoint's and KV bits' fingerprint,
    engine.runtime.disk_cache.fingerprint). The caller writes the end frame."""
    import mlx.core as mx

    t0 = time.perf_counter()
    cache = kv.make(model)
    kinds = [type(c).__name__ for c in cache]
    odd = sorted({k for k in kinds if k not in ROWS + WHOLE})
    if odd:
        raise BadRequest(f"This model keeps {odd[0]} layers, which can't be handed to "
                         "another node yet: launch it without a prefill node.")
    out.write(encode({"kind": "begin", "made_by": made_by, "tokens": tokens,
                      "layers": kinds}))
    for i, c in enumerate(cache):
        if kinds[i] in ROWS:
            _send_rows(c, i, out, cancel)
    for start in range(0, len(tokens), chunk):
        if cancel.is_set():
            raise Cancelled
        model(mx.array([tokens[start:start + chunk]]), cache=cache)
        mx.eval([c.state for c in cache])
        out.flush()
        if progress:
            progress(min(start + chunk, len(tokens)))
    for i, c in enumerate(cache):
        if kinds[i] in WHOLE:
            _write(out, {"kind": "state", "layer": i, **_whole(c)}, _layer_arrays(c))
    out.flush()
    return time.perf_counter() - t0


def _send_rows(c: Any, layer: int, out: IO[bytes], cancel: threading.Event) -> None:
    """Have layer `layer`'s cache write the rows each update adds, as it adds them (the
    layer's K and V are computed there and then, before the next layer's)."""
    import mlx.core as mx

    update = c.update_and_fetch

    def rows_out(keys: Any, values: Any) -> Any:
        if cancel.is_set():
            raise Cancelled
        prev = c.offset
        got = update(keys, values)
        rows = [a[..., prev:c.offset, :] for a in _arrays((c.keys, c.values))]
        mx.eval(rows)
        _write(out, {"kind": "rows", "layer": layer, "start": prev, "n": c.offset - prev},
               rows)
        return got

    c.update_and_fetch = rows_out


def _whole(c: Any) -> dict[str, Any]:
    """What a windowed or recurrent layer's frame says beside its arrays."""
    if type(c).__name__ == "RotatingKVCache":
        return {"offset": c.offset, "keep": c.keep, "max_size": c.max_size, "idx": c._idx}
    return {"present": [a is not None for a in c.cache]}


def _write(out: IO[bytes], header: dict[str, Any], arrays: list[Any]) -> None:
    import mlx.core as mx
    import numpy as np

    raws = []
    for a in arrays:
        name = _dtype(a)
        # numpy has no bfloat16: its bits go as uint16
        raws.append(np.ascontiguousarray(np.array(a.view(mx.uint16) if name == "bfloat16"
                                                  else a)))
        header.setdefault("arrays", []).append([name, list(a.shape)])
    out.write(encode(header))
    for r in raws:
        out.write(r.data)


def layout_of(model: Any, kv: Any) -> list[list[tuple[Any, ...]]]:
    """Each layer's cache arrays as this model makes them (shape without the tokens' axis,
    and dtype), from one token through a fresh cache: what a handed-over cache must
    match. Run once, where the model is loaded (before requests run on other threads)."""
    import mlx.core as mx

    cache = kv.make(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    return [[_shape(a) for a in _layer_arrays(c)] for c in cache]


def _layer_arrays(c: Any) -> list[Any]:
    if type(c).__name__ == "ArraysCache":
        return [a for a in c.cache if a is not None]
    return _arrays((c.keys, c.values))


def _shape(a: Any) -> tuple[Any, ...]:
    """An array's shape without the tokens' axis (a KV array's third), and its dtype."""
    return (tuple(d for i, d in enumerate(a.shape) if not (len(a.shape) == 4 and i == 2)),
            _dtype(a))


def _dtype(a: Any) -> str:
    """An MLX array's dtype as the frames name it ("float32", "bfloat16", ...)."""
    return str(a.dtype).split(".")[-1]


def adopt_stream(model: Any, kv: Any, tokens: list[int], read: Callable[[int], bytes],
                 made_by: str = "", layout: list[list[tuple[Any, ...]]] | None = None,
                 progress: Callable[[int], None] | None = None,
                 fresh: list[Any] | None = None,
                 pick: Callable[[int, list[Any]], list[Any] | None] | None = None
                 ) -> list[Any]:
    """The cache the frames `read` gives (b"" at their end) hold, checked to be what this
    model (`made_by`: its fingerprint; `layout`: layout_of's) keeps for exactly `tokens`
    (a 400 saying what doesn't match otherwise), built as the frames arrive. A group's
    rank passes its own `fresh` cache and `pick`: per layer, the arrays it keeps (its
    share of them), or None for a layer it doesn't hold."""
    reader = Reader()
    got = _Assembly(fresh if fresh is not None else kv.make(model), tokens, made_by, layout,
                    progress, pick)
    while True:
        data = read(1 << 20)
        if not data:
            raise BadRequest("The handed-over KV ended before its last layer came.")
        try:
            frames = reader.feed(data)
        except FrameError as e:
            raise BadRequest(f"The handed-over KV can't be read: {e}.") from None
        for header, payload in frames:
            if got.take(header, payload):
                return got.cache


def tail(path: Path, cancel: threading.Event, idle_s: float = IDLE_S
         ) -> Callable[[int], bytes]:
    """`read` for adopt_stream over a file another process is still writing: waits for
    more bytes until `cancel` (Cancelled) or `idle_s` without any (b"")."""
    f = path.open("rb")

    def read(n: int) -> bytes:
        quiet = time.monotonic()
        while not (data := f.read(n)):
            if cancel.is_set():
                f.close()
                raise Cancelled
            if time.monotonic() - quiet > idle_s:
                f.close()
                return b""
            time.sleep(0.005)
        return data

    return read


class _Assembly:
    """A cache put together from checked frames."""

    def __init__(self, fresh: list[Any], tokens: list[int], made_by: str,
                 layout: list[list[tuple[Any, ...]]] | None,
                 progress: Callable[[int], None] | None,
                 pick: Callable[[int, list[Any]], list[Any] | None] | None = None):
        self.cache, self.tokens, self.made_by = fresh, tokens, made_by
        self.pick = pick
        self.held: set[int] = set()  # layers whose arrays a pick kept
        self.kinds = [type(c).__name__ for c in fresh]
        self.layout, self.progress = layout, progress
        self.begun = False
        self.rows: list[list[list[Any]]] = [[] for _ in fresh]
        self.count = [0] * len(fresh)
        self.whole: set[int] = set()
        # the last plain layer's rows mark a chunk that has all come
        self.last = max((i for i, k in enumerate(self.kinds) if k in ROWS), default=-1)

    def take(self, header: dict[str, Any], payload: bytes) -> bool:
        """One frame in; True once the last has come and the cache is built."""
        kind = header["kind"]
        if kind == "error":
            raise BadRequest(f"The prefill node failed: {str(header.get('message'))[:300]}")
        if not self.begun:
            self._begin(header)
            return False
        if kind == "end":
            self._finish()
            return True
        layer = header.get("layer")
        if type(layer) is not int or not 0 <= layer < len(self.cache):
            raise BadRequest(f"The handed-over KV names layer {str(layer)[:20]}, which this "
                             "model hasn't.")
        arrays = self._arrays(layer, header, payload)
        if kind == "rows" and self.kinds[layer] in ROWS:
            self._rows(layer, header, arrays)
        elif kind == "state" and self.kinds[layer] in WHOLE and layer not in self.whole:
            _whole_checked(self.cache[layer], header, arrays, len(self.tokens))
            kept = self._pick(layer, arrays)
            if kept is not None:
                _set_whole(self.cache[layer], header, kept, len(self.tokens))
            self.whole.add(layer)
        else:
            raise BadRequest(f"The handed-over KV sends layer {layer} as {str(kind)[:20]}, "
                             f"which isn't how this model keeps it ({self.kinds[layer]}).")
        return False

    def _begin(self, header: dict[str, Any]) -> None:
        if header["kind"] != "begin":
            raise BadRequest("The handed-over KV doesn't say whose it is.")
        if header.get("made_by") != self.made_by:
            raise BadRequest("The handed-over KV was made by another model (or the same "
                             "one with other files or KV bits): the prefill node must hold "
                             "the same checkpoint as this node.")
        if header.get("tokens") != self.tokens:
            raise BadRequest("The handed-over KV holds other tokens than the prompt's.")
        if header.get("layers") != self.kinds:
            raise BadRequest("The handed-over KV is not this model's: its layers are other "
                             f"caches than the {len(self.cache)} it keeps.")
        self.begun = True

    def _arrays(self, layer: int, header: dict[str, Any], payload: bytes) -> list[Any]:
        """The frame's arrays, in this node's dtype where only the float width differs
        (a Mac's float16 KV for a CPU node's float32), their shapes checked."""
        import mlx.core as mx
        import numpy as np

        np_of = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
                 "uint32": np.uint32}
        want = self.layout[layer] if self.layout is not None else None
        specs = header.get("arrays", [])
        if want is not None and len(specs) != len(want):
            raise BadRequest(f"The handed-over KV's layer {layer} has {len(specs)} arrays, "
                             f"not the {len(want)} this model keeps.")
        out, at = [], 0
        for j, (dtype, shape) in enumerate(specs):
            n = int(np.prod(shape)) if shape else 1
            a = mx.array(np.frombuffer(payload, np_of[dtype], n, at).reshape(shape))
            at += n * np.dtype(np_of[dtype]).itemsize
            if dtype == "bfloat16":
                a = a.view(mx.bfloat16)
            if want is not None:
                a = _checked(a, want[j], layer)
            out.append(a)
        return out

    def _rows(self, layer: int, header: dict[str, Any], arrays: list[Any]) -> None:
        n, start = header.get("n"), header.get("start")
        if start != self.count[layer] or type(n) is not int or n <= 0 \
                or self.count[layer] + n > len(self.tokens) \
                or any(a.ndim != 4 or a.shape[0] != 1 or a.shape[2] != n for a in arrays) \
                or not arrays or len(arrays) % 2:
            raise BadRequest(f"The handed-over KV's layer {layer} sends rows out of order "
                             "or shaped unlike what it says.")
        kept = self._pick(layer, arrays)
        if kept is not None:
            self.rows[layer].append(kept)
        self.count[layer] += n
        if self.progress and layer == self.last:
            self.progress(self.count[layer])

    def _pick(self, layer: int, arrays: list[Any]) -> list[Any] | None:
        if self.pick is None:
            return arrays
        kept = self.pick(layer, arrays)
        if kept is not None:
            self.held.add(layer)
        return kept

    def _finish(self) -> None:
        import mlx.core as mx

        n = len(self.tokens)
        for i, c in enumerate(self.cache):
            if self.kinds[i] in WHOLE:
                if i not in self.whole:
                    raise BadRequest(f"The handed-over KV ended without layer {i}.")
                continue
            if self.count[i] != n:
                raise BadRequest(f"The handed-over KV's layer {i} holds {self.count[i]} "
                                 f"tokens, not the prompt's {n}.")
            parts = self.rows[i]
            if not parts:  # a layer another rank holds
                continue
            full = [mx.concatenate([p[j] for p in parts], axis=2) if len(parts) > 1
                    else parts[0][j] for j in range(len(parts[0]))]
            half = len(full) // 2
            c.keys = full[0] if half == 1 else tuple(full[:half])
            c.values = full[half] if half == 1 else tuple(full[half:])
            c.offset = n
            self.rows[i] = []
        mx.eval([_layer_arrays(c) for c in self.cache])


def _checked(a: Any, want: tuple[Any, ...], layer: int) -> Any:
    import mlx.core as mx

    shape, dtype = _shape(a)
    if dtype != want[1] and "float" in dtype and "float" in want[1]:
        a = a.astype(getattr(mx, want[1]))
        dtype = want[1]
    if (shape, dtype) != tuple(want):
        raise BadRequest(f"The handed-over KV's layer {layer} is shaped {(shape, dtype)}, "
                         f"not as this model keeps it ({tuple(want)}).")
    return a


def _whole_checked(c: Any, header: dict[str, Any], arrays: list[Any], tokens: int) -> None:
    """A windowed layer's state (its bounds this model's own) or a recurrent layer's,
    checked against the fresh cache `c` (a 400 where it isn't its)."""
    if type(c).__name__ == "ArraysCache":
        present = header.get("present")
        if not isinstance(present, list) or len(present) != len(c.cache) \
                or sum(1 for p in present if p is True) != len(arrays):
            raise BadRequest("The handed-over KV's recurrent state isn't this model's.")
        return
    offset, keep, size, idx = (header.get(k) for k in ("offset", "keep", "max_size", "idx"))
    held = arrays[0].shape[2] if len(arrays) == 2 and arrays[0].ndim == 4 \
        and arrays[1].ndim == 4 and arrays[1].shape[2] == arrays[0].shape[2] else -1
    if (offset, keep, size) != (tokens, c.keep, c.max_size) or type(idx) is not int \
            or not 0 <= idx <= held or held > tokens:
        raise BadRequest("The handed-over KV's windowed layer isn't this model's window "
                         "over the prompt.")


def _set_whole(c: Any, header: dict[str, Any], arrays: list[Any], tokens: int) -> None:
    """A windowed or recurrent layer's state into `c`, checked."""
    _whole_checked(c, header, arrays, tokens)
    if type(c).__name__ == "ArraysCache":
        it = iter(arrays)
        c.cache = [next(it) if p is True else None for p in header["present"]]
        return
    c.keys, c.values, c.offset, c._idx = arrays[0], arrays[1], tokens, header["idx"]


def _arrays(x: Any) -> list[Any]:
    import mlx.core as mx
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (list, tuple)):
        return [a for v in x for a in _arrays(v)]
    return []
