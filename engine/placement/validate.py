"""Checks on a user-given placement, before anything starts. Pure: numbers in, a reason
out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

STRATEGIES = ("pipeline", "tensor")


def max_lanes(strategy: str, world: int) -> int:
    """The micro-batches a group can keep in flight: one per rank for a pipeline (each
    rank past 0 holds one at most), one for tensor (its ranks run every step together)."""
    return world if strategy == "pipeline" else 1


class PlacementError(ValueError):
    """The placement can't run; the message says exactly why."""


class NotEnoughMemory(PlacementError):
    """A node would need more memory than it may use (the message has the numbers);
    force=True runs it anyway, with a warning."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    heads: int
    kv_heads: int
    has_shard: bool  # the mlx-lm class can split every layer (tensor parallel)
    vocab: int = 0
    tied: bool = True


def check_pipeline(ranges: Sequence[Sequence[int]], layers: int) -> None:
    """Every layer exactly once, in order, each rank at least one layer."""
    expect = 0
    for i, r in enumerate(ranges):
        if len(r) != 2 or not all(isinstance(v, int) for v in r):
            raise PlacementError(f"rank {i}: layers must be [start, end], got {list(r)}")
        start, end = r
        if start != expect:
            what = "overlaps the previous rank" if start < expect else \
                f"leaves layers {expect}-{start - 1} on no rank"
            raise PlacementError(f"rank {i}: layers [{start}, {end}) {what}")
        if end <= start:
            raise PlacementError(f"rank {i}: layers [{start}, {end}) is empty")
        expect = end
    if expect != layers:
        if expect > layers:
            raise PlacementError(f"the model has {layers} layers; the placement goes to "
                                 f"{expect}")
        raise PlacementError(f"layers {expect}-{layers - 1} are on no rank (the model has "
                             f"{layers})")


def check_strategy(model_type: str, strategy: str) -> None:
    """The family rule (engine/placement/families.py) as a PlacementError."""
    from engine.placement.families import strategy_refusal

    why = strategy_refusal(model_type, strategy)
    if why:
        raise PlacementError(why)


def check_tensor(shape: ModelShape, ranks: int, model_type: str) -> None:
    if not shape.has_shard:
        check_strategy(model_type, "tensor")
        raise PlacementError(f"'{model_type}' can't be split for tensor parallel; use "
                             "pipeline")
    from engine.placement.families import VOCAB_SHARDED, resolve

    for name, n in (("attention heads", shape.heads), ("key/value heads", shape.kv_heads)):
        if n % ranks:
            raise PlacementError(f"the model's {n} {name} don't divide by {ranks} ranks")
    if resolve(model_type) in VOCAB_SHARDED and not shape.tied and shape.vocab % ranks:
        raise PlacementError(f"{model_type} splits its head by vocabulary: the "
                             f"{shape.vocab} tokens don't divide by {ranks} ranks")


def even_split(layers: int, ranks: int) -> list[list[int]]:
    """Contiguous ranges as even as possible (the first ranks take the extra layers)."""
    if not 1 <= ranks <= layers:
        raise PlacementError(f"can't split {layers} layers over {ranks} ranks")
    base, extra = divmod(layers, ranks)
    out, start = [], 0
    for i in range(ranks):
        end = start + base + (1 if i < extra else 0)
        out.append([start, end])
        start = end
    return out
