"""Conversations kept across restarts, in HOME/conversations.json.

Written atomically (temp file in the same folder, fsync, os.replace) so a crash mid-write
leaves the previous file. A file that can't be read is moved aside, never overwritten, and
the store starts empty with a `warning` the window shows.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "conversations.json"
FORMAT_VERSION = 1


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    # Figures under a reply: wait_s, ttft_s, generation_tps, completion_tokens, stopped,
    # finish_reason.
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a failed reply; shown, never sent back to the model
    reasoning: str = ""  # a thinking model's reasoning: shown folded, never sent back


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    title: str = "New conversation"
    created: float = field(default_factory=time.time)
    model: str | None = None
    messages: list[Message] = field(default_factory=list)
    system: str = ""  # the system prompt, sent first with every request

    def history(self) -> list[dict[str, str]]:
        """The messages to send to the node: the system prompt, then the conversation
        with errors and empty replies left out."""
        head = [{"role": "system", "content": self.system}] if self.system.strip() else []
        return head + [{"role": m.role, "content": m.content} for m in self.messages
                       if m.error is None and m.content]


def _conversation_from(d: dict[str, Any]) -> Conversation:
    msgs = []
    for m in d.get("messages", []):
        stats = dict(m.get("stats") or {})
        # files written before reasoning had its own field kept it in the stats
        reasoning = str(m.get("reasoning") or stats.pop("reasoning", "") or "")
        msgs.append(Message(role=str(m["role"]), content=str(m["content"]), stats=stats,
                            error=m.get("error"), reasoning=reasoning))
    return Conversation(id=str(d["id"]), title=str(d.get("title") or "Conversation"),
                        created=float(d.get("created") or 0.0), model=d.get("model"),
                        messages=msgs, system=str(d.get("system") or ""))


class ConversationStore:
    """All conversations, newest first. Call save() after a change."""

    def __init__(self, home: Path):
        self.path = Path(home) / FILE_NAME
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
