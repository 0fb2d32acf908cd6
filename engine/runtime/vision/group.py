"""A vision model split over a group (as exo does): rank 0 holds the vision tower and
projector beside its share of the language model, computes an image request's merged
input embeddings when the request joins the group's batch, and feeds them in place of
the token embeddings for the prompt's chunks: to its first pipeline stage (the other
ranks get hidden states as for text), or, tensor parallel, to every rank through an
all_sum of rank 0's array with zeros elsewhere. The other ranks see the prompt as the
prefix cache keys it (each image's tokens as ids from its sha256), never the image.

One request at a time (lockstep, --max-streams 1) has no such path: images get a 400.

Qwen2.5-VL, Qwen3-VL and Qwen3.5 place an image's tokens in 3-D: every rank installs the
rope adapter (positions.py) on its share of the layers, and the plan carries each image
request's positions and delta to every rank (group/state.py). Qwen3-VL's deepstack
features enter its first layers: a pipeline's rank 0 must hold them (else a 400 saying
how to place it), tensor ranks get rank 0's through an all_sum (group/batch.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine.errors import BadRequest, ShoalError
from engine.protocol import GenerateRequest

log = logging.getLogger(__name__)

LOCKSTEP = ("Images need this model on one node or in a group that batches requests: "
            "here it is split over a group that serves one request at a time (its "
            "worker runs with --max-streams 1), which takes text only. Send the request "
            "without images, or serve the model with several streams.")


DEEPSTACK = ("Images on this model need its first {need} layers (which take the image's "
             "deepstack features) on the pipeline's first node, which holds {held}: here "
             "it takes text only. Send the request without images, or place the model "
             "with at least {need} layers on its first node.")


def has_images(request: GenerateRequest) -> bool:
    return bool(request.images) or any(p.get("type") == "image"
                                       for m in request.messages or ()
                                       for p in m.get("parts") or ())


def refuse_images_in_group(request: GenerateRequest, why: str = LOCKSTEP) -> None:
    """Raise the 400 for a request with images to a vision model whose group can't take
    them (`why` says why and what to do)."""
    if has_images(request):
        raise BadRequest(why, param="messages", code="images_unsupported")


def load_group_vision(folder: Path, lm: Any, held: int | None = None) -> Any:
    """Rank 0's vision tower and projector (engine.runtime.vision.tower.Vision) beside its
    share of the language model `lm` (which holds the token embedding on rank 0; a
    pipeline's first `held` layers); None where mlx-vlm can't load them or the group
    can't take them (the log says why; images then get a 400)."""
    from engine.runtime.vision.tower import Vision

    why = group_refusal(lm, held)
    if why:
        log.warning("the group serves %s as text only: %s", folder, why)
        return None
    try:
        return Vision(folder, lm)
    except (ShoalError, ImportError, NotImplementedError) as e:
        log.warning("the group serves %s as text only: %s", folder,
                    getattr(e, "message", e))
        return None


def group_refusal(lm: Any, held: int | None) -> str | None:
    """Why a batching group can't take images on its share `lm` of the language model
    (with group_positions' adapter), or None: deepstack layers past rank 0's `held`
    layers of a pipeline (DEEPSTACK)."""
    from engine.runtime.vision.positions import MARK

    placing = getattr(lm, MARK, None)
    if placing is not None and held is not None and placing.deep > held:
        return DEEPSTACK.format(need=placing.deep, held=held)
    return None


def group_positions(folder: Path, lm: Any) -> Any:
    """Every rank of a batching group, for a family that places images in 3-D: the rope
    adapter on its share `lm` of the language model (positions.Placing); else None."""
    from engine.modelconfig import MROPE_FAMILIES
    from engine.runtime.vision.positions import MARK, install_in_group

    if _model_type(folder) not in MROPE_FAMILIES:
        return None
    if getattr(lm, MARK, None) is not None:
        return getattr(lm, MARK)
    try:
        return install_in_group(folder, lm)
    except Exception as e:  # mlx-vlm can't read it: rank 0's tower fails alike (a 400)
        log.warning("no 3-D positions for %s: %s", folder, str(e)[:200])
        return None


def _model_type(folder: Path) -> str:
    from engine.hub.checkpoint import read_config

    try:
        return str(read_config(folder).get("model_type") or "")
    except (ShoalError, OSError):
        return ""


def is_vision_checkpoint(folder: Path) -> bool:
    """The folder's checkpoint takes images (engine.modelconfig.capabilities)."""
    from engine.hub.checkpoint import read_config
    from engine.modelconfig import capabilities

    try:
        config = read_config(folder)
        files = frozenset(p.name for p in folder.iterdir() if p.is_file())
    except (ShoalError, OSError):
        return False
    return "vision" in capabilities(config, files)


def embed_shape(model: Any) -> tuple[int, Any]:
    """(hidden size, dtype) of the model's token embeddings: what an image prompt's
    input embeddings are shared in between tensor parallel ranks."""
    import mlx.core as mx

    from engine.runtime.vision.tower import embed_tokens

    out = embed_tokens(model)(mx.array([[0]]))
    return int(out.shape[-1]), out.dtype



def share_deepstack(placed: Any, k: int, start: int, keys: list[int], embed: tuple[int, Any],
                    all_sum: Any) -> Any:
    """Tensor parallel Qwen3-VL: every rank holds the first `k` layers, which take the
    deepstack features, so rank 0's rows for the image tokens of the chunk `keys` from
    prompt position `start` (k layers x m tokens x hidden) reach the others through
    `all_sum` (zeros elsewhere), as the embeddings do. The chunk's Placed holding just
    those rows; ValueError where rank 0's don't fit the chunk."""
    from dataclasses import replace

    import mlx.core as mx
    import numpy as np

    at = np.array([start + i for i, t in enumerate(keys) if t < 0], dtype=np.int64)
    if not at.size:
        return placed
    hidden, dtype = embed
    x = mx.zeros((k, at.size, hidden), dtype)
    if placed.deepstack is not None:  # rank 0
        whole, features = placed.deepstack
        lo, hi = np.searchsorted(whole, start), np.searchsorted(whole, start + len(keys))
        if hi - lo != at.size or len(features) != k:
            raise ValueError(f"deepstack features for {hi - lo} image tokens of "
                             f"{len(features)} layers, not {at.size} of {k}")
        x = mx.stack([f[lo:hi] for f in features]).astype(dtype)
    x = all_sum(x)
    return replace(placed, deepstack=(at, [x[i] for i in range(k)]))
