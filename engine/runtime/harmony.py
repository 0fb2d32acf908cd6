"""gpt-oss's Harmony format, which mlx-lm has no tool parser for: every message is
`<|channel|>NAME[ to=functions.TOOL][ <|constrain|>json]<|message|>BODY` ended by <|end|>,
<|call|> or <|return|> (the last two are end-of-sequence tokens, so often just the end).
analysis → reasoning, final → content, a message to=functions.X → a tool call."""

from __future__ import annotations

import json
import re
import uuid
import weakref
from typing import Any

from engine.runtime.toolcalls import ToolCall

CHANNEL, MESSAGE = "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
START = "<|start|>"
_RECIPIENT = re.compile(r"to=functions\.([\w\-.]+)")


_harmony: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def is_harmony(tokenizer: Any) -> bool:
    """Read once per tokenizer: its vocabulary is built anew at each get_vocab (about
    30 ms for 49K tokens, holding the GIL while the batch waits)."""
    try:
        return _harmony[tokenizer]
    except (KeyError, TypeError):  # not seen, or can't be weakly referenced
        pass
    vocab = tokenizer.get_vocab()
    found = all(t in vocab for t in (CHANNEL, MESSAGE, "<|call|>", "<|return|>"))
    try:
        _harmony[tokenizer] = found
    except TypeError:
        pass
    return found


class HarmonySplitter:
    """The OutputSplitter interface (feed/finish/made_calls) for Harmony text."""

    def __init__(self) -> None:
        self._buf = ""
        self._header: str | None = None  # the current message's header, once read
        self.made_calls = 0
        self.failed_calls = 0

    def _kind(self) -> str:
        h = self._header or ""
        if _RECIPIENT.search(h):
            return "tool"
        channel = h.replace("assistant", " ").split()
        return "reasoning" if channel[:1] == ["analysis"] else "content"

    def feed(self, segment: str) -> list[tuple[str, Any]]:
        self._buf += segment
        out: list[tuple[str, Any]] = []
        while True:
            if self._header is None:  # between messages: wait for a whole header
                i, j = self._buf.find(CHANNEL), self._buf.find(MESSAGE)
                if i < 0 or j < i:
                    if MESSAGE in self._buf:  # a body without a header: plain content
                        self._header, self._buf = "final", self._buf.split(MESSAGE, 1)[1]
                        continue
                    return out
                before = self._buf[:i]  # "<|start|>assistant to=functions.x" may lead
                self._header = before + " " + self._buf[i + len(CHANNEL):j]
                self._buf = self._buf[j + len(MESSAGE):]
                continue
            ends = [(self._buf.find(m), m) for m in (*ENDS, START)]
            hit = min(((i, m) for i, m in ends if i >= 0), default=None)
            if hit is None:
                if self._kind() != "tool":  # stream all but what may become a marker
                    keep = self._partial()
                    text, self._buf = self._buf[:len(self._buf) - keep], \
                        self._buf[len(self._buf) - keep:]
                    if text:
                        out.append((self._kind(), text))
                return out
            i, marker = hit
            self._close(self._buf[:i], out)
            self._buf = self._buf[i + len(marker):]

    def _close(self, body: str, out: list[tuple[str, Any]]) -> None:
        kind = self._kind()
        if kind == "tool":
            name = _RECIPIENT.search(self._header or "")
            assert name is not None
            try:
                args = json.loads(body) if body.strip() else {}
                out.append(("tool", ToolCall(f"call_{uuid.uuid4().hex[:24]}", name.group(1),
                                             json.dumps(args, ensure_ascii=False))))
                self.made_calls += 1
            except ValueError:
                self.failed_calls += 1
                out.append(("content", body))
        elif body:
            out.append((kind, body))
        self._header = None

    def _partial(self) -> int:
        best = 0
        for m in (*ENDS, START):
            for n in range(min(len(m) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(m[:n]):
                    best = n
                    break
        return best

    def finish(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if self._header is not None:
            self._close(self._buf, out)
        elif self._buf.strip():
            out.append(("content", self._buf))
        self._buf = ""
        return out
