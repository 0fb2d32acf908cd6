"""Images a user attaches to a chat message, from a file, the clipboard or a drop: checked
here before anything is kept or sent (a PNG, JPEG, WebP or GIF picture Qt can read, within
the bounds the node takes), then kept beside the conversations (app/conversations.py,
which also makes them OpenAI image_url parts).

Reading checks the header first (format and size, no pixels decoded), so a file that
claims 30,000 x 30,000 pixels is refused before it costs memory."""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QBuffer, QIODevice, QMimeData
from PySide6.QtGui import QImage, QPixmap

from app.common import fmt_bytes

# The node's own bounds (engine/api/images.py), so the app refuses what it would refuse.
MAX_BYTES = 20 * 2**20
MAX_PIXELS = 50_000_000
MAX_SIDE = 16_384
MAX_IMAGES = 8  # per message: more is rarely meant, and each one costs the model context
# A larger picture is sent reduced: vision models read far fewer pixels than a photo has,
# and a conversation resends its images each turn (base64 adds a third; a node takes
# bodies up to 32 MB by default, --max-body-mb).
SEND_BYTES = int(2.5 * 2**20)
SEND_SIDES = (2048, 1536, 1024, 768)
FORMATS = {"png": ("image/png", "png"), "jpeg": ("image/jpeg", "jpg"), "jpg": ("image/jpeg", "jpg"),
           "webp": ("image/webp", "webp"), "gif": ("image/gif", "gif")}
KINDS = "PNG, JPEG, WebP or GIF"
DIALOG_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif)"


class Refused(Exception):
    """An image the app won't attach; str() is the sentence the user reads."""


@dataclass(frozen=True)
class Image:
    data: bytes  # the file's bytes, as sent
    mime: str  # image/png, image/jpeg, image/webp, image/gif
    label: str  # what the user knows it as: the file name, or "Pasted image"
    width: int
    height: int
    reduced_from: tuple[int, int] | None = None  # the original's size, when sent smaller

    @property
    def name(self) -> str:
        """The name it is kept under: its sha256 and extension (the same picture twice is
        one file)."""
        ext = next(e for m, e in FORMATS.values() if m == self.mime)
        return f"{hashlib.sha256(self.data).hexdigest()}.{ext}"


def from_bytes(data: bytes, label: str) -> Image:
    """`data` as an attachable image, or Refused saying why, in the app's words. Pillow
    reads the header, then decodes a small copy (JPEG) or checks every chunk (PNG), so a
    file cut short is refused here, not at the node; Qt only ever sees good files."""
    from PIL import Image as Pillow
    from PIL import UnidentifiedImageError
    if len(data) > MAX_BYTES:
        raise Refused(f"{label} is {fmt_bytes(len(data))}: Shoal attaches images up to "
                      f"{MAX_BYTES // 2**20} MB. Save a smaller copy and attach that.")
    damaged = f"{label} can't be read: the file is damaged or cut short."
    try:
        with _open(data) as im:
            kind, (w, h) = str(im.format).lower(), im.size
            if max(w, h) > MAX_SIDE or w * h > MAX_PIXELS:
                raise Refused(
                    f"{label} is {w:,} x {h:,} pixels: Shoal attaches pictures up to "
                    f"{MAX_SIDE:,} pixels a side and {MAX_PIXELS // 1_000_000} million in "
                    "all. Save a smaller copy and attach that.")
            if kind == "jpeg":
                im.draft("RGB", (64, 64))  # decoded at 1/8 scale: cheap, and whole
            im.load()
    except Pillow.DecompressionBombError:  # raised on opening, before the size is seen
        raise Refused(f"{label} has far too many pixels: Shoal attaches pictures up to "
                      f"{MAX_SIDE:,} pixels a side and {MAX_PIXELS // 1_000_000} million "
                      "in all.") from None
    except UnidentifiedImageError:
        raise Refused(f"{label} isn't a {KINDS} picture, so it can't be attached.") from None
    except (OSError, ValueError, SyntaxError):
        raise Refused(damaged) from None
    if kind not in FORMATS or w < 1 or h < 1:
        raise Refused(f"{label} isn't a {KINDS} picture, so it can't be attached.")
    image = Image(data, FORMATS[kind][0], label, w, h)
    return image if len(data) <= SEND_BYTES else _reduced(image)


def _reduced(image: Image) -> Image:
    """`image` made small enough to send: at most 2048 pixels a side (less if need be),
    JPEG unless it has transparency. The original file is left as it was."""
    with _open(image.data) as im:
        im.load()
        alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
        source = im.convert("RGBA" if alpha else "RGB")
    for side in SEND_SIDES:
        copy = source.copy()
        copy.thumbnail((side, side))
        out = io.BytesIO()
        copy.save(out, "PNG" if alpha else "JPEG", quality=90)
        if out.tell() <= SEND_BYTES:
            break
    mime = "image/png" if alpha else "image/jpeg"
    return Image(out.getvalue(), mime, image.label, copy.width, copy.height,
                 reduced_from=(image.width, image.height))


def from_file(path: str | Path) -> Image:
    """The image file at `path` (its size checked before it is read)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise Refused(f"{p.name} is {fmt_bytes(size)}: Shoal attaches images up to "
                          f"{MAX_BYTES // 2**20} MB. Save a smaller copy and attach that.")
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise Refused(f"{p.name} couldn't be opened ({e.strerror or e}).") from None
    return from_bytes(data, p.name)


def from_qimage(image: QImage, label: str = "Pasted image") -> Image:
    """A picture from the clipboard or a drag, kept as PNG."""
    if image.isNull():
        raise Refused("The clipboard's picture couldn't be read.")
    w, h = image.width(), image.height()
    if max(w, h) > MAX_SIDE or w * h > MAX_PIXELS:
        raise Refused(f"The pasted picture is {w:,} x {h:,} pixels: Shoal attaches pictures "
                      f"up to {MAX_SIDE:,} pixels a side.")
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")
    return from_bytes(bytes(buf.data().data()), label)


def mime_sources(mime: QMimeData) -> tuple[list[str], QImage | None]:
    """What a paste or a drop holds, read on the GUI thread (QMimeData lives there): its
    local files, or else its picture (a QImage, which any thread may then use)."""
    files = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()] if mime.hasUrls() else []
    picture = QImage(mime.imageData()) if not files and mime.hasImage() else None
    return files, picture


def read_all(files: list[str], picture: QImage | None = None
             ) -> tuple[list[Image], list[str]]:
    """The images among `files` (and `picture`), and the sentences for what was refused;
    off the GUI thread (a large picture takes a second to check and reduce)."""
    images, refused = [], []
    for path in files:
        try:
            images.append(from_file(path))
        except Refused as e:
            refused.append(str(e))
    if picture is not None:
        try:
            images.append(from_qimage(picture))
        except Refused as e:
            refused.append(str(e))
    return images, refused


def carries_images(mime: QMimeData) -> bool:
    """Does a paste or drag hold files or a picture (for the app, not text for the box)?"""
    return mime.hasImage() or (mime.hasUrls() and any(u.isLocalFile() for u in mime.urls()))


def thumbnail(data: bytes, side: int) -> QPixmap:
    """A picture at most `side` pixels a side; a null pixmap when the bytes can't be read
    (a kept file damaged since). Pillow decodes, so a bad file never reaches Qt's readers."""
    from PIL import Image as Pillow
    try:
        with _open(data) as im:
            w, h = im.size
            if max(w, h) > MAX_SIDE or w * h > MAX_PIXELS:
                return QPixmap()
            im.draft("RGB", (side, side))  # JPEG: decoded near the size wanted
            im.thumbnail((side, side))
            rgba = im.convert("RGBA")
    except (OSError, ValueError, SyntaxError, Pillow.DecompressionBombError):
        return QPixmap()
    raw = rgba.tobytes()
    image = QImage(raw, rgba.width, rgba.height, 4 * rgba.width,
                   QImage.Format.Format_RGBA8888)
    return QPixmap.fromImage(image.copy())  # copy: `raw` goes when this returns


def _open(data: bytes):  # noqa: ANN202 - a PIL image, imported late
    """Pillow's reader for one of the four formats; its bomb warning (a picture over 89
    million pixels) is not needed: the size is checked against MAX_PIXELS next."""
    from PIL import Image as Pillow
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Pillow.DecompressionBombWarning)
        return Pillow.open(io.BytesIO(data), formats=["PNG", "JPEG", "WEBP", "GIF"])
