"""Images a client sends, checked once, here, before any worker sees them: a data URL or
raw base64 (or an http(s) URL where the node allows fetching, engine/api/image_fetch.py)
is decoded with Pillow under bounds (pixels, sides, bytes, count), its declared type must
be what the bytes are, and it is passed on as protocol.ImageInput: an RGB PNG with the
sha256 of its size and pixels. Any bad image is a 400 naming its field."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import re
import weakref
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from engine import protocol as wire
from engine.api import image_fetch
from engine.api.image_fetch import MAX_BYTES, Policy
from engine.errors import BadRequest

if TYPE_CHECKING:
    from PIL.Image import Image as Picture

MAX_IMAGES = 16  # per request
MAX_PIXELS = 50_000_000
MAX_SIDE = 16_384  # a 30,000-px strip is no picture a vision tower reads
MAX_DECODES = 2  # at once, per event loop: each may hold ~150 MB of pixels
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG",
           "image/webp": "WEBP", "image/gif": "GIF"}
NAMES = "PNG, JPEG, WebP or GIF"
DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*?);base64,", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    """What a client sent for one image: a data URL, an http(s) URL, or raw base64 (with
    the media type it declared, if any), and the field that holds it, for a 400."""
    value: str
    param: str
    media_type: str | None = None


@dataclass(frozen=True)
class PendingRequest(wire.GenerateRequest):
    """A request whose images are not yet decoded (that needs the event loop's threads, and
    may need the network); common.generation resolves it before the worker sees it."""
    sources: tuple[Source, ...] = field(default=())


def pending(req: wire.GenerateRequest, sources: list[Source]) -> wire.GenerateRequest:
    """`req` carrying `sources` for decoding, or `req` itself when there are none."""
    if not sources:
        return req
    if len(sources) > MAX_IMAGES:
        bad = sources[MAX_IMAGES]
        raise BadRequest(f"'{bad.param}': at most {MAX_IMAGES} images may be sent in one "
                         f"request, got {len(sources)}.", param=bad.param)
    return PendingRequest(**{f.name: getattr(req, f.name) for f in fields(req)},
                          sources=tuple(sources))


async def resolve(req: wire.GenerateRequest,
                  fetching: Policy | None = None) -> wire.GenerateRequest:
    """`req` with its images decoded (a plain GenerateRequest, as the worker takes it).
    `fetching`: whether and where URLs are fetched (None: the node's setting)."""
    if not isinstance(req, PendingRequest):
        return req
    # fetched together (one request waits one fetch's bound, not 16); decodes are gated
    tasks = [asyncio.ensure_future(load(s, fetching)) for s in req.sources]
    try:
        out = [await t for t in tasks]  # the first bad image in order is the 400
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    plain = {f.name: getattr(req, f.name) for f in fields(wire.GenerateRequest)}
    return replace(wire.GenerateRequest(**plain), images=out)


async def load(src: Source, fetching: Policy | None = None) -> wire.ImageInput:
    """One client image as ImageInput, or a BadRequest naming its field."""
    v = src.value.strip()
    low = v[:8].lower()
    if low.startswith(("http://", "https://")):
        policy = fetching or image_fetch.policy_from_env()
        raw, declared = await image_fetch.fetch(v, src.param, policy)
    elif low.startswith("data:"):
        raw, declared = _data_url(v, src.param)
    elif "://" in v[:16]:
        raise BadRequest(f"'{src.param}': only data: URLs (and http(s) URLs where this node "
                         "fetches images) are taken, got a "
                         f"{v.split(':', 1)[0][:16]!r} URL.", param=src.param)
    else:
        raw, declared = _base64(v, src.param), src.media_type
    async with _gate():
        return await asyncio.to_thread(decode, raw, declared, src.param)


_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
    weakref.WeakKeyDictionary()


def _gate() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _GATES:
        _GATES[loop] = asyncio.Semaphore(MAX_DECODES)
    return _GATES[loop]


def _data_url(v: str, param: str) -> tuple[bytes, str]:
    m = DATA_URL.match(v)
    if m is None:
        raise BadRequest(f"'{param}': a data URL must be data:image/<type>;base64,<data> "
                         f"(got {v[:40]!r}...).", param=param)
    return _base64(v[m.end():], param), m.group(1).strip().lower()


def _base64(text: str, param: str) -> bytes:
    if len(text) > (MAX_BYTES + 2) // 3 * 4 + 1024:
        raise BadRequest(f"'{param}': the image is over {MAX_BYTES // 2**20} MiB.",
                         param=param)
    try:  # whitespace (wrapped base64) is allowed; anything else off the alphabet is not
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"'{param}': the image is not valid base64.", param=param) from None


def decode(raw: bytes, declared: str | None, param: str) -> wire.ImageInput:
    """Check and re-encode one image (blocking: run it in a thread)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if declared and declared not in FORMATS:
        raise BadRequest(f"'{param}': {declared!r} is not an image type taken here ("
                         f"{NAMES}).", param=param)
    if len(raw) > MAX_BYTES:
        raise BadRequest(f"'{param}': the image is over {MAX_BYTES // 2**20} MiB.",
                         param=param)
    try:
        img = Image.open(io.BytesIO(raw), formats=sorted(set(FORMATS.values())))
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError,
            SyntaxError):
        raise BadRequest(f"'{param}': the data is not a {NAMES} image (or is damaged).",
                         param=param) from None
    with img:
        if declared and FORMATS[declared] != img.format:
            raise BadRequest(f"'{param}': declared {declared} but the data is "
                             f"{img.format}.", param=param)
        w, h = img.size
        if max(w, h) > MAX_SIDE or w * h > MAX_PIXELS or min(w, h) < 1:
            raise BadRequest(f"'{param}': {w}x{h} pixels is over this node's bound ("
                             f"{MAX_SIDE} px a side, {MAX_PIXELS // 1_000_000} MP); send a "
                             "smaller image.", param=param)
        try:
            img.seek(0)  # an animation: its first frame
            img.load()
            rgb = _rgb(ImageOps.exif_transpose(img))
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError,
                MemoryError):
            raise BadRequest(f"'{param}': the image is truncated or damaged.",
                             param=param) from None
    w, h = rgb.size
    pixels = rgb.tobytes()
    digest = hashlib.sha256(f"{w}x{h}".encode() + pixels).hexdigest()
    buf = io.BytesIO()
    rgb.save(buf, format="PNG", compress_level=1)  # a local pipe: speed over size
    return {"data": base64.b64encode(buf.getvalue()).decode("ascii"), "sha256": digest,
            "width": w, "height": h}


def _rgb(img: Picture) -> Picture:
    """RGB, transparent areas on white (as a viewer shows them), not black."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        back = Image.new("RGB", rgba.size, (255, 255, 255))
        back.paste(rgba, mask=rgba.getchannel("A"))
        return back
    return img.convert("RGB")


class ImagesUnsupported(BadRequest):
    code = "images_unsupported"


VISION_EXAMPLE = "mlx-community/gemma-3-4b-it-4bit"  # a family Shoal runs images for


def check_vision(target: str | None, models: list[tuple[str, list[str]]],
                 param: str) -> None:
    """A 400 (code images_unsupported, naming `param`) when `target` (the model that would
    answer; None: unknown) doesn't take images; it names the models here that do.
    `models`: (id, capabilities) of each model on this node."""
    vision = [m for m, caps in models if "vision" in caps]
    if target not in {m for m, _ in models}:
        target = None  # another node's, or none: whoever serves it refuses
    if target is not None and target in vision:
        return
    if target is None and vision:
        return  # the node picks the model: its worker refuses if it takes no images
    who = f"{target} doesn't take images" if target else "This node's model takes no images"
    where = (f"models here that do: {', '.join(vision[:8])}" if vision else
             f"none of the models here take images: load a vision model such as "
             f"{VISION_EXAMPLE} (shoal models pull {VISION_EXAMPLE})")
    raise ImagesUnsupported(f"{who}; {where}.", param=param)
