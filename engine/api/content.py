"""The one parser of message content parts that every protocol adapter calls (vLLM's
chat_utils idea): a part in any protocol's shape (OpenAI's text and image_url, the
Responses API's input_text and input_image, Anthropic's text and image blocks) becomes
text or an image Source; `Turns` makes chat-template turns of the pieces, keeping their
order in TemplateMessage.parts and numbering the request's images."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine import protocol as wire
from engine.api.images import Source
from engine.errors import BadRequest

TEXT_TYPES = ("text", "input_text", "output_text")
IMAGE_TYPES = ("image_url", "input_image", "image")
Piece = str | Source  # a run of text, or an image


def piece(p: Mapping[str, Any], where: str) -> Piece | None:
    """A text or image part as a Piece; None for any other type (the adapter's own)."""
    kind = p.get("type")
    if kind in TEXT_TYPES and isinstance(p.get("text"), str):
        return str(p["text"])
    if kind == "image_url":  # OpenAI chat: {"url", "detail"} (some clients: the URL)
        ref = p.get("image_url")
        if isinstance(ref, Mapping):
            return _source(ref.get("url"), f"{where}.image_url.url")
        return _source(ref, f"{where}.image_url")
    if kind == "input_image":  # Responses: image_url (a URL) or file_id
        if p.get("file_id") is not None:
            raise BadRequest(f"'{where}.file_id': this node has no files API; send the "
                             "image inline in 'image_url' as a data: URL.",
                             param=f"{where}.file_id")
        return _source(p.get("image_url"), f"{where}.image_url")
    if kind == "image":  # Anthropic: source {type: base64, media_type, data} or {type: url}
        return _anthropic(p.get("source"), f"{where}.source")
    return None


def _source(value: Any, where: str, media_type: str | None = None) -> Source:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{where}' must be an image: base64 or a data: URL (an http(s) "
                         "URL where this node fetches images).", param=where)
    return Source(value, where, media_type)


def _anthropic(src: Any, where: str) -> Source:
    if not isinstance(src, Mapping):
        raise BadRequest(f"'{where}' is required: {{type: base64, media_type, data}} or "
                         "{type: url, url}.", param=where)
    kind = src.get("type")
    if kind == "base64":
        media = src.get("media_type")
        if not isinstance(media, str):
            raise BadRequest(f"'{where}.media_type' is required.", param=f"{where}.media_type")
        return _source(src.get("data"), f"{where}.data", media.strip().lower())
    if kind == "url":
        return _source(src.get("url"), f"{where}.url")
    raise BadRequest(f"'{where}.type': {kind!r} image sources aren't taken here (base64 or "
                     "url; this node has no files API).", param=f"{where}.type")


def ollama_images(images: Sequence[Any] | None, where: str) -> list[Piece]:
    """Ollama's `images` (base64, no type given: the bytes say it) as pieces."""
    return [_source(v, f"{where}[{j}]") for j, v in enumerate(images or [])]


class Turns:
    """Chat-template turns made of pieces; the images they hold, numbered in order."""

    def __init__(self) -> None:
        self.sources: list[Source] = []

    def turn(self, role: str, pieces: Iterable[Piece]) -> wire.TemplateMessage:
        """A turn: `content` its text joined; `parts` in order where it holds images."""
        parts: list[wire.ContentPart] = []
        for p in pieces:
            if isinstance(p, Source):
                parts.append({"type": "image", "image": len(self.sources)})
                self.sources.append(p)
            elif p:
                parts.append({"type": "text", "text": p})
        msg: wire.TemplateMessage = {
            "role": role, "content": "".join(p.get("text", "") for p in parts)}
        if any(p["type"] == "image" for p in parts):
            msg["parts"] = parts
        return msg


def text_only(msgs: list[wire.TemplateMessage], where: str = "messages") -> None:
    """For routes that take no images (a raw prompt, /tokenize): a 400 naming the turn."""
    for i, m in enumerate(msgs):
        if "parts" in m:
            raise BadRequest(f"'{where}[{i}]': images aren't taken on this route.",
                             param=f"{where}[{i}]")


def image_hints(parts: Iterable[Any]) -> list[str]:
    """`detail` on an image part: a hint (the model's processor sizes images itself)."""
    for p in parts:
        ref = p.get("image_url") if isinstance(p, Mapping) else getattr(p, "image_url", None)
        if isinstance(p, Mapping) and p.get("type") == "input_image" and p.get("detail"):
            return ["input[].content[].detail"]
        if isinstance(ref, Mapping) and ref.get("detail") is not None:
            return ["messages[].content[].image_url.detail"]
    return []
