"""A request's images as the language model takes them: the chat template's text with each
image part expanded to the model's image tokens (mlx-vlm's own processor and
prepare_inputs, so the ids are exactly mlx-vlm's), the pixels for the vision tower, and
the ids the prefix cache keys the prompt by.

An image's tokens are keyed from its sha256 (protocol.ImageInput), as negative ids no
token has: the same image re-sent (a chat's next turn) hits the cache, another image never
matches it."""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass, field
from typing import Any

from engine.errors import BadRequest
from engine.protocol import ImageInput, TemplateMessage

MAX_PIXELS = 50_000_000  # the API checks sizes first; this bounds a worker's decode too
MAX_IMAGES = 16  # image parts in one request (engine/api/images.py takes as many)
KEY_SPAN = (1 << 31) - 2  # negative key ids stay within int32 (the disk tier's index)


def content_lists(msgs: list[TemplateMessage], n_images: int
                  ) -> tuple[list[dict[str, Any]], list[int]]:
    """(the turns with each image turn's content as parts, as Hugging Face vision templates
    take them; the image indexes in the order they appear)."""
    out: list[dict[str, Any]] = []
    order: list[int] = []
    for m in msgs:
        parts = m.get("parts")
        if not parts:
            out.append(dict(m))
            continue
        content: list[dict[str, Any]] = []
        for p in parts:
            if p.get("type") == "image":
                i = p.get("image")
                if not isinstance(i, int) or not 0 <= i < n_images:
                    raise BadRequest(f"An image part points at image {i!r}, but the request "
                                     f"holds {n_images}.", param="messages")
                order.append(i)
                if len(order) > MAX_IMAGES:
                    raise BadRequest(f"At most {MAX_IMAGES} images may be placed in one "
                                     "request.", param="messages")
                content.append({"type": "image"})
            else:
                content.append({"type": "text", "text": str(p.get("text") or "")})
        turn = {k: v for k, v in m.items() if k != "parts"}
        turn["content"] = content
        out.append(turn)
    return out, order


def decode(image: ImageInput) -> Any:
    """The PIL image of an ImageInput (an RGB PNG the API re-encoded); a 400 where it
    isn't one."""
    from PIL import Image

    try:
        raw = base64.b64decode(image["data"], validate=True)
        with Image.open(io.BytesIO(raw)) as im:
            if im.format != "PNG" or im.width * im.height > MAX_PIXELS:
                raise ValueError(f"{im.format} {im.width}x{im.height}")
            return im.convert("RGB")
    except (KeyError, TypeError, ValueError, OSError, binascii.Error,
            Image.DecompressionBombError) as e:
        raise BadRequest(f"An image couldn't be read ({str(e)[:80]}); send a PNG, JPEG, "
                         "GIF or WebP image.", param="messages") from None


def key_ids(ids: list[int], image_ids: frozenset[int], order: list[ImageInput]
            ) -> list[int]:
    """`ids` with each image's tokens (a run of `image_ids`) replaced by ids from its
    sha256. A 400 where the runs aren't one per image (a template that drops images)."""
    keys, run, n = list(ids), -1, 0
    for pos, t in enumerate(ids):
        if t not in image_ids:
            continue
        if pos == 0 or ids[pos - 1] not in image_ids:
            run += 1
            n = 0
            if run >= len(order):
                break
            base = _digest(order[run])
        keys[pos] = -1 - (base + n) % KEY_SPAN
        n += 1
    if run + 1 != len(order):
        raise BadRequest(f"The chat template placed {run + 1} images but the request holds "
                         f"{len(order)}; this model's template doesn't take images where "
                         "they were sent.", param="messages")
    return keys


def _digest(image: ImageInput) -> int:
    """The image's sha256 as a number; a 400 where it isn't a sha256 (the API computes it
    from the pixels; a worker checks what it indexes with)."""
    digest = str(image.get("sha256") or "")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
        raise BadRequest("An image came without its sha256.", param="messages")
    return int(digest[:15], 16)


@dataclass
class ImagePrompt:
    """One request's prompt with images: what generation carries beside its token ids."""
    ids: list[int]  # the model's ids, each image expanded to its tokens
    keys: list[int]  # the same, each image's tokens keyed by its sha256 (prefix cache)
    inputs: dict[str, Any]  # pixel_values and what else the family's embedding takes
    vision: Any  # engine.runtime.vision.tower.Vision
    image_tokens: int = 0
    _last_image: int = field(default=-1)
    placed: Any = None  # positions.Placed: Qwen-VL's 3-D positions and delta, else None

    def __post_init__(self) -> None:
        at = [i for i, (a, b) in enumerate(zip(self.ids, self.keys)) if a != b]
        self.image_tokens = len(at)
        self._last_image = at[-1] if at else -1

    def embeddings(self, start: int) -> Any:
        """The prompt's input embeddings from position `start` on (MLX: call on the thread
        that runs the model), or None where no image token is left to run."""
        if start > self._last_image:
            return None
        out, deep = self.vision.features(self.ids, self.inputs)
        if self.placed is not None:
            self.placed.deepstack = deep
        return out[start:]

    def running(self) -> Any:
        """Around the model calls that run this prompt: the language model places its
        tokens as the family does (positions.py); nothing for other families."""
        from contextlib import nullcontext

        placing = getattr(self.vision, "placing", None)
        return placing.running(self.placed) if placing is not None else nullcontext()
