"""Another node's prefill taken in by a group (engine/node/handover.py). The group's owner
node fetches the frames from the prefill node and passes them on to each member node as
they come; once every copy is whole (and hashes alike), rank 0 puts the adoption in a plan
and every rank reads its own node's copy at the same point (state.apply_adopt): a pipeline
rank keeps its layers, a tensor rank its share of each layer's KV heads.

Every check runs on every layer on every rank, whatever it keeps, so ranks reading the
same bytes reach the same verdict and their prefix caches stay alike.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import BadRequest

ADOPT_WAIT_S = 120.0  # rank 0's request waits this long for its plan (a busy group plans
                      # every step, so this bounds a group that stopped stepping)
Pick = Callable[[int, list[Any]], "list[Any] | None"]


def job_file(job: Any, kind: str = "g") -> str:
    """A hand-over's frames file in a node's hand-over folder: "g" a copy a group takes in
    (`job` from rank 0's plan), "p" a rank's prefill for another node (group/export.py);
    a 400 for a number that isn't one (it comes from another node)."""
    if type(job) is not int or not 0 <= job < 1 << 31:
        raise BadRequest(f"No hand-over is numbered {str(job)[:20]}.")
    return f"{kind}{job}.frames"


def frames_name(job: Any) -> str:
    return job_file(job, "g")


@dataclass
class Adoption:
    """Rank 0's request that the group take a prefill in; answered when its plan ran."""
    tokens: list[int]
    job: int
    why: str | None = None  # None once taken in, else why not
    done: threading.Event = field(default_factory=threading.Event)

    def answer(self, why: str | None) -> None:
        self.why = why
        self.done.set()


def pipeline_pick(start: int, end: int) -> Pick:
    """A pipeline rank keeps its own layers' KV (Adopter moves the others' positions on)."""
    return lambda layer, arrays: arrays if start <= layer < end else None


def tensor_pick(rank: int, world: int) -> Pick:
    """A tensor rank keeps its contiguous share of each layer's KV heads (axis 1, as
    mlx-lm's sharded projections split them); a single head (MLA's latent) stays whole
    on every rank."""
    def pick(layer: int, arrays: list[Any]) -> list[Any]:
        import mlx.core as mx

        out = []
        for a in arrays:
            heads = a.shape[1] if a.ndim == 4 else 0
            if heads == 1:
                out.append(a)
            elif heads and heads % world == 0:
                share = heads // world
                # (a copy: a view would keep every rank's heads alive)
                out.append(mx.contiguous(a[:, rank * share:(rank + 1) * share]))
            else:
                raise BadRequest(f"The handed-over KV's layer {layer} has {heads} heads, "
                                 f"which {world} ranks can't share.")
        return out
    return pick


class Adopter:
    """One rank's reader: the frames its node wrote for hand-over `job`, into this
    rank's cache (fresh from `make_cache`), checked to be `made_by`'s for `tokens`."""

    def __init__(self, folder: Path, made_by: str, make_cache: Callable[[], list[Any]],
                 pick: Pick, layers: tuple[int, int] | None = None):
        self.folder, self.made_by, self.make_cache, self.pick = \
            folder, made_by, make_cache, pick
        self.layers = layers  # a pipeline rank's [start, end): the others' caches hold
                              # positions only, as its stage keeps them (stage.advance)

    def __call__(self, job: int, tokens: list[int]) -> list[Any]:
        from engine.runtime.handover import adopt_stream

        path = self.folder / frames_name(job)
        try:
            with path.open("rb") as f:
                cache = adopt_stream(None, None, tokens, f.read, self.made_by,
                                     fresh=self.make_cache(), pick=self.pick)
            if self.layers is not None:
                _advance_others(cache, self.layers, len(tokens))
            return cache
        except FileNotFoundError:
            raise BadRequest("This rank's node has no copy of the handed-over KV.") \
                from None
        finally:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def _advance_others(cache: list[Any], layers: tuple[int, int], n: int) -> None:
    import mlx.core as mx

    from engine.runtime.stage import advance

    others = [c for i, c in enumerate(cache) if not layers[0] <= i < layers[1]]
    for c in others:
        advance(c, n)
    mx.eval([c.state for c in others])
