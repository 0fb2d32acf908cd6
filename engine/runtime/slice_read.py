"""Tensor parallel ranks read only their slice of each split weight from disk.

mlx-lm's `shard()` slices weights through MLX's `_shard` (nn.layers.distributed), and MLX
reads a lazily loaded tensor whole when any part of it is needed: for Kimi K2 that is the
whole ~600 GB checkpoint on every Mac. Here, while the model loads, the tensors mx.load
returns are remembered (only those, so anything mlx-lm's sanitize() transformed is left
alone); while `shard()` runs, MLX's `_shard` is wrapped so that a remembered tensor is
split by reading just this rank's rows or columns from its safetensors file. Anything
else (transformed, unknown dtype, manual slicing in a model's shard()) is split by MLX as
before.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx

log = logging.getLogger(__name__)

# safetensors dtype → (numpy dtype to read the bytes as, MLX dtype name)
_DTYPES = {"F32": ("float32", "float32"), "F16": ("float16", "float16"),
           "BF16": ("uint16", "bfloat16"), "U32": ("uint32", "uint32"),
           "I32": ("int32", "int32"), "U8": ("uint8", "uint8"), "I8": ("int8", "int8")}


class Sources:
    """id(array) → (file, tensor header) for every tensor mx.load returned."""

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[Path, dict[str, Any], int, Any]] = {}
        self.bytes_read = 0

    def add(self, path: Path, arrays: dict[str, mx.array]) -> None:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, arr in arrays.items():
            h = header.get(name)
            if isinstance(h, dict) and h.get("dtype") in _DTYPES:
                # keep the array referenced so its id stays unique while we look it up
                self.by_id[id(arr)] = (path, h, 8 + n, arr)

    def read(self, weight: Any, axis: int, ranges: list[tuple[int, int]]) -> Any | None:
        """The concatenation of `ranges` along `axis` of `weight`, read from its file;
        None when the weight isn't a remembered file tensor."""
        import mlx.core as mx
        import numpy as np

        src = self.by_id.get(id(weight))
        if src is None:
            return None
        path, h, base, _ = src
        shape = [int(s) for s in h["shape"]]
        if tuple(shape) != tuple(weight.shape):
            return None
        np_dtype, mx_dtype = _DTYPES[h["dtype"]]
        item = np.dtype(np_dtype).itemsize
        axis %= len(shape)
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        start0 = base + int(h["data_offsets"][0])
        width = sum(e - s for s, e in ranges)
        out = np.empty((outer, width, inner), dtype=np_dtype)
        view = memoryview(out.reshape(-1).view(np.uint8).data)
        row = shape[axis] * inner * item  # bytes per outer index
        at = 0
        with path.open("rb", buffering=0) as f:
            for o in range(outer):
                for s, e in ranges:
                    n = (e - s) * inner * item
                    f.seek(start0 + o * row + s * inner * item)
                    got = f.readinto(view[at:at + n])
                    if got != n:
                        raise OSError(f"{path} ended early while reading a tensor slice")
                    at += n
        self.bytes_read += at
        new_shape = shape[:axis] + [width] + shape[axis + 1:]
        arr = mx.array(out.reshape(new_shape))
        return arr.view(getattr(mx, mx_dtype)) if np_dtype != mx_dtype else arr


def _ranges(size: int, segments: Any, n: int, r: int) -> list[tuple[int, int]] | None:
    """Rank r's index ranges along the split axis, as MLX's _shard computes them."""
    if isinstance(segments, int):
        bounds = [size * i // segments for i in range(segments + 1)]
        if size % segments:
            return None
    elif segments and isinstance(segments[0], int):
        bounds = [0, *segments, size]
    else:
        bounds = [0, *(int(s * size) for s in segments), size]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        if (b - a) % n:
            return None
        step = (b - a) // n
        out.append((a + r * step, a + (r + 1) * step))
    return out


@contextlib.contextmanager
def remember_loads(sources: Sources) -> Iterator[None]:
    """While loading: note every tensor mx.load hands out (lazily: nothing is read)."""
    import mlx.core as mx

    real = mx.load

    def load(file: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(file, *args, **kwargs)
        if isinstance(out, dict) and str(file).endswith(".safetensors"):
            try:
                sources.add(Path(file), out)
            except (OSError, ValueError) as e:
                log.info("slice reads off for %s: %s", file, e)
        return out

    mx.load = load
    try:
        yield
    finally:
        mx.load = real


@contextlib.contextmanager
def slice_reads(sources: Sources) -> Iterator[None]:
    """While shard() runs: split remembered tensors by reading only this rank's part."""
    import mlx.core as mx
    from mlx.nn.layers import distributed
    from mlx.utils import tree_map_with_path

    real = distributed._shard

    def shard(parameters: dict, predicate: Any, group: Any = None) -> Any:
        group = group or mx.distributed.init()
        n, r = group.size(), group.rank()

        def one(path: str, weight: Any) -> Any:
            if not isinstance(weight, mx.array):
                return weight
            s = predicate(path, weight)
            if s is None:
                return weight
            axis, segments = (s, 1) if isinstance(s, int) else s
            ranges = _ranges(weight.shape[axis], segments, n, r)
            got = sources.read(weight, axis, ranges) if ranges else None
            if got is not None:
                return got
            return real({"w": weight}, lambda p, w: s, group)["w"]

        return tree_map_with_path(one, parameters)

    # looked up at call time by shard_linear & co (setattr: mypy holds MLX's signature)
    setattr(distributed, "_shard", shard)  # noqa: B010
    try:
        yield
    finally:
        setattr(distributed, "_shard", real)  # noqa: B010
