"""A vision model split over a group (as exo does): rank 0 holds the vision tower and
projector beside its share of the language model, computes an image request's merged
input embeddings when the request joins the group's batch, and feeds them in place of
the token embeddings for the prompt's chunks: to its first pipeline stage (the other
ranks get hidden states as for text), or, tensor parallel, to every rank through an
all_sum of rank 0's array with zeros elsewhere. The other ranks see the prompt as the
prefix cache keys it (each image's tokens as ids from its sha256), never the image.

One request at a time (lockstep, --max-streams 1) has no such path: images get a 400.
Nor, yet, do the families whose language model places image tokens in 3-D (Qwen-VL,
Qwen3.5: their positions would have to reach every rank's attention): a 400 saying so."""

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


M_ROPE = ("Images on this model (its family places an image's tokens in 3-D, as Qwen-VL "
          "and Qwen3.5 do) are served on one node only: here it is split over a group, "
          "which takes text only. Send the request without images, or serve the model on "
          "one node that holds it.")


def has_images(request: GenerateRequest) -> bool:
    return bool(request.images) or any(p.get("type") == "image"
                                       for m in request.messages or ()
                                       for p in m.get("parts") or ())


def refuse_images_in_group(request: GenerateRequest, why: str = LOCKSTEP) -> None:
    """Raise the 400 for a request with images to a vision model whose group can't take
    them (`why` says why and what to do)."""
    if has_images(request):
        raise BadRequest(why, param="messages", code="images_unsupported")


def load_group_vision(folder: Path, lm: Any) -> Any:
    """Rank 0's vision tower and projector (engine.runtime.vision.tower.Vision) beside its
    share of the language model `lm` (which holds the token embedding on rank 0); None
    where mlx-vlm can't load them (the log says why; images then get a 400)."""
    from engine.runtime.vision.tower import Vision

    if group_refusal(folder):
        log.warning("the group serves %s as text only: %s", folder, M_ROPE)
        return None
    try:
        return Vision(folder, lm)
    except (ShoalError, ImportError, NotImplementedError) as e:
        log.warning("the group serves %s as text only: %s", folder,
                    getattr(e, "message", e))
        return None


def group_refusal(folder: Path) -> str | None:
    """Why a group can't take this vision checkpoint's images whatever its streams
    (M_ROPE), or None."""
    from engine.hub.checkpoint import read_config
    from engine.modelconfig import MROPE_FAMILIES

    try:
        kind = str(read_config(folder).get("model_type") or "")
    except (ShoalError, OSError):
        return None
    return M_ROPE if kind in MROPE_FAMILIES else None


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

