"""Uneven pipeline splits: layers in proportion to each node's decode speed, then moved
just enough that every node fits its memory.

Memory of a range only grows when the range grows, so "how far can node i reach from
layer s" and "how early must node i start so that it and the nodes after it cover the
rest" are both found by binary search, and together they bound every boundary exactly:
the split fits whenever any contiguous split of these nodes, in this order, fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

from engine.placement.memory import Sizer, refusal
from engine.placement.model import ModelSpec, NodeSpec
from engine.placement.tables import DEFAULT, Assumptions
from engine.placement.validate import NotEnoughMemory, PlacementError


def speed(model: ModelSpec, node: NodeSpec, a: Assumptions = DEFAULT) -> float:
    """Active parameters a node can process per second while decoding."""
    return 1 / max(model.bytes_per_param / (node.memory_bandwidth_Bps * a.bandwidth_efficiency),
                   2 / (node.compute_flops * a.compute_efficiency))


def proportional(layers: int, weights: Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous ranges with sizes proportional to weights, each at least one layer."""
    n = len(weights)
    if not 1 <= n <= layers:
        raise PlacementError(f"can't split {layers} layers over {n} nodes")
    cum, total = list(accumulate(weights)), sum(weights)
    out, s = [], 0
    for i in range(n):
        e = layers if i == n - 1 else round(layers * cum[i] / total)
        e = max(s + 1, min(e, layers - (n - 1 - i)))
        out.append((s, e))
        s = e
    return out


def split_pipeline(model: ModelSpec, nodes: Sequence[NodeSpec], context: int,
                   force: bool = False, a: Assumptions = DEFAULT,
                   sizer: Sizer | None = None) -> list[tuple[int, int]]:
    """Layer ranges for these nodes in this order; raises NotEnoughMemory (naming the
    nodes that overflow, with numbers) when no split fits, unless force."""
    n, total = len(nodes), model.layers
    size = sizer or Sizer(model, context, a)
    target = proportional(total, [speed(model, nd, a) for nd in nodes])

    def fits(i: int) -> Callable[[int, int], bool]:
        nd, first, last = nodes[i], i == 0, i == n - 1
        return lambda s, e: size.pipeline_fits(nd, s, e, first, last)

    ok = [fits(i) for i in range(n)]
    # start[i]: the earliest layer node i may start at so nodes i.. still cover the rest
    start = [0] * (n + 1)
    start[n] = total
    for i in range(n - 1, -1, -1):
        end = start[i + 1]
        lo, hi = i, end - 1  # smallest s in [lo, hi] with ok[i](s, end)
        if hi < lo or not ok[i](hi, end):
            return _refuse(size, nodes, target, force)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok[i](mid, end) else (mid + 1, hi)
        start[i] = lo
    if start[0] != 0:
        return _refuse(size, nodes, target, force)
    out, s = [], 0
    for i in range(n):
        lo, hi = max(s + 1, start[i + 1]), total - (n - 1 - i)
        if i == n - 1:
            lo = hi = total
        # furthest end that still fits node i from s
        if not ok[i](s, lo):
            return _refuse(size, nodes, target, force)
        a_, b_ = lo, hi
        while a_ < b_:
            mid = (a_ + b_ + 1) // 2
            a_, b_ = (mid, b_) if ok[i](s, mid) else (a_, mid - 1)
        e = min(max(target[i][1], lo), a_)
        out.append((s, e))
        s = e
    return out


def _refuse(size: Sizer, nodes: Sequence[NodeSpec], target: list[tuple[int, int]],
            force: bool) -> list[tuple[int, int]]:
    if force:
        return target
    n = len(nodes)
    over = []
    for i, (nd, r) in enumerate(zip(nodes, target)):
        use = size.pipeline(nd, r, i == 0, i == n - 1)
        if not use.fits:
            over.append(refusal(nd, use, r, size.context))
    if not over:  # the proportional split fits after all
        return target
    raise NotEnoughMemory("; ".join(over))
