"""Conversations kept across restarts, in HOME/conversations.json; the images attached to
messages beside it, in HOME/images/, each file named by its sha256 (the same picture sent
twice is one file), so the JSON stays small and is rewritten fast after every reply.

Written atomically (temp file in the same folder, fsync, os.replace) so a crash mid-write
leaves the previous file. A file that can't be read is moved aside, never overwritten, and
the store starts empty with a `warning` the window shows.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "conversations.json"
FORMAT_VERSION = 1
IMAGES_DIR = "images"
# A kept image's name: never a path, whatever a hand-edited file says.
IMAGE_NAME = re.compile(r"[0-9a-f]{64}\.(png|jpg|webp|gif)")
MIME_OF_EXT = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp",
               "gif": "image/gif"}
MAX_IMAGE_BYTES = 20 * 2**20  # as app.attachments takes them
MAX_IMAGES = 16  # per message read back (the node takes 16 per request)
PRUNE_AFTER_S = 3600.0


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    # Figures under a reply: wait_s, ttft_s, generation_tps, completion_tokens, stopped,
    # finish_reason.
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a failed reply; shown, never sent back to the model
    reasoning: str = ""  # a thinking model's reasoning: shown folded, never sent back
    images: list[str] = field(default_factory=list)  # kept images' names (HOME/images/)


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    title: str = "New conversation"
    created: float = field(default_factory=time.time)
    model: str | None = None
    messages: list[Message] = field(default_factory=list)
    system: str = ""  # the system prompt, sent first with every request

    def history(self, image: Callable[[str], bytes | None] | None = None
                ) -> list[dict[str, Any]]:
        """The messages to send to the node: the system prompt, then the conversation
        with errors and empty replies left out. A message with images is OpenAI content
        parts (its text, then each image as a data URL); `image` reads a kept image by
        name (one gone since is left out)."""
        head = [{"role": "system", "content": self.system}] if self.system.strip() else []
        out: list[dict[str, Any]] = []
        for m in self.messages:
            if m.error is not None or not (m.content or m.images):
                continue
            found = [(n, image(n)) for n in m.images] if image and m.images else []
            parts = [image_part(data, n) for n, data in found if data is not None]
            if not parts:
                out.append({"role": m.role, "content": m.content})
                continue
            text = [{"type": "text", "text": m.content}] if m.content else []
            out.append({"role": m.role, "content": text + parts})
        return head + out


def image_part(data: bytes, name: str) -> dict[str, Any]:
    """One OpenAI content part: the image as a base64 data URL of its type."""
    mime = MIME_OF_EXT[name.rsplit(".", 1)[-1]]
    url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _conversation_from(d: dict[str, Any]) -> Conversation:
    msgs = []
    for m in d.get("messages", []):
        stats = dict(m.get("stats") or {})
        # files written before reasoning had its own field kept it in the stats
        reasoning = str(m.get("reasoning") or stats.pop("reasoning", "") or "")
        images = [n for n in m.get("images") or [] if isinstance(n, str)
                  and IMAGE_NAME.fullmatch(n)][:MAX_IMAGES]
        msgs.append(Message(role=str(m["role"]), content=str(m["content"]), stats=stats,
                            error=m.get("error"), reasoning=reasoning, images=images))
    return Conversation(id=str(d["id"]), title=str(d.get("title") or "Conversation"),
                        created=float(d.get("created") or 0.0), model=d.get("model"),
                        messages=msgs, system=str(d.get("system") or ""))


class ConversationStore:
    """All conversations, newest first. Call save() after a change."""

    def __init__(self, home: Path):
        self.path = Path(home) / FILE_NAME
        self.images_dir = Path(home) / IMAGES_DIR
        self.conversations: list[Conversation] = []
        self.warning: str | None = None
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            convs = [_conversation_from(c) for c in data["conversations"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self._set_aside(e)
            return
        self.conversations = sorted(convs, key=lambda c: c.created, reverse=True)
        self._prune_images()

    def _prune_images(self) -> None:
        """Delete kept images no conversation names any more (their conversations were
        deleted in an earlier run), so attached photos don't fill the disk. Only files
        an hour old: one another window is sending now isn't in the file yet."""
        used = {n for c in self.conversations for m in c.messages for n in m.images}
        try:
            files = list(self.images_dir.iterdir()) if self.images_dir.is_dir() else []
        except OSError:
            return
        for f in files:
            try:
                if (IMAGE_NAME.fullmatch(f.name) and f.name not in used
                        and time.time() - f.stat().st_mtime > PRUNE_AFTER_S):
                    f.unlink()
            except OSError as e:
                log.info("Couldn't delete the unused image %s: %s", f, e)

    def _set_aside(self, error: Exception) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            log.warning("Couldn't move %s aside: %s", self.path, e)
            aside = self.path
        self.warning = (f"Your saved conversations couldn't be read ({error}). The file was kept "
                        f"as {aside}; new conversations are saved to a fresh file.")
        log.warning(self.warning)

    def new(self, model: str | None = None) -> Conversation:
        conv = Conversation(model=model)
        self.conversations.insert(0, conv)
        return conv

    def get(self, conv_id: str) -> Conversation | None:
        return next((c for c in self.conversations if c.id == conv_id), None)

    def delete(self, conv_id: str) -> None:
        self.conversations = [c for c in self.conversations if c.id != conv_id]

    def restore(self, conv: Conversation, index: int) -> None:
        """Put a deleted conversation back where it was (Undo)."""
        if self.get(conv.id) is None:
            self.conversations.insert(min(max(index, 0), len(self.conversations)), conv)

    def keep_image(self, data: bytes, name: str) -> None:
        """Write an attached image under its name (sha256.ext), once; atomically, so a
        crash leaves no half picture. Raises OSError (e.g. disk full)."""
        if not IMAGE_NAME.fullmatch(name):
            raise ValueError(f"not an image name: {name!r}")
        target = self.images_dir / name
        if target.is_file():
            return
        self.images_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.images_dir, prefix=".image-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def image(self, name: str) -> bytes | None:
        """A kept image's bytes; None when the name isn't one or the file is gone or
        larger than any image the app keeps."""
        if not IMAGE_NAME.fullmatch(name):
            return None
        try:
            with open(self.images_dir / name, "rb") as f:
                data = f.read(MAX_IMAGE_BYTES + 1)
        except OSError:
            return None
        return data if len(data) <= MAX_IMAGE_BYTES else None

    def save(self) -> None:
        """Write every conversation atomically. Raises OSError (e.g. disk full); the
        previous file is then still intact."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": FORMAT_VERSION,
                "conversations": [asdict(c) for c in self.conversations]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".conversations-",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
