"""Everything a loaded model holds, computed before another thread runs it.

MLX streams belong to the thread that made them: a lazy array built in the loading thread
can't be evaluated from the batcher's thread ("There is no Stream(cpu, 0) in current
thread"). `parameters()` only covers public weights; models also keep private arrays made
at construction (mlx-lm's RoPE frequency tables for llama3, yarn, longrope, ...) and plain
objects holding arrays. `realize` walks all of it and evaluates every array it finds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast


def flat(tree: Any) -> list[tuple[str, Any]]:
    """mlx.utils.tree_flatten as (dotted path, leaf) pairs."""
    from mlx.utils import tree_flatten
    return cast(list[tuple[str, Any]], tree_flatten(tree))


def arrays(root: Any, skip: frozenset[int] = frozenset()) -> Iterator[tuple[str, Any]]:
    """(path, array) for every mx.array reachable from `root`: module entries public and
    private, plain attributes, lists, tuples and dicts, each object once; none whose id is
    in `skip`."""
    import mlx.core as mx

    seen: set[int] = set(skip)
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen:
            continue
        if isinstance(obj, mx.array):
            seen.add(id(obj))
            yield path, obj
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):  # an nn.Module is a dict of its children and arrays
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(obj))
        if _walkable(obj):
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in vars(obj).items())


def _walkable(obj: Any) -> bool:
    """Objects of model code (not functions, classes or modules of Python itself)."""
    import types

    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                        types.MethodType)):
        return False
    return hasattr(obj, "__dict__")


def realize(model: Any, skip: frozenset[int] = frozenset()) -> int:
    """Evaluate every array `model` holds, in this thread, but those in `skip` (weights a
    pipeline rank doesn't hold and never reads); the number of arrays evaluated."""
    import mlx.core as mx

    found = [a for _, a in arrays(model, skip)]
    for i in range(0, len(found), 512):  # one graph per batch keeps eval's overhead low
        mx.eval(*found[i:i + 512])
    return len(found)
