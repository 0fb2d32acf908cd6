"""Splitting a model's streamed text into content, reasoning and tool calls.

Markers come from mlx-lm's tokenizer wrapper (think_start/think_end, tool_call_start/end,
chosen from the chat template exactly as mlx-lm chooses them) and each call's text is parsed
by mlx-lm's own tool parser. This works on text, so one process and rank 0 of a group
split the same way. A call that doesn't parse is passed on as text, never an error.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# The generic form for templates that know no tools (as llama-server's generic format):
# the tools are described in a system message and calls come back as JSON in these tags.
GENERIC_START, GENERIC_END = "<tool_call>", "</tool_call>"
GENERIC_PROMPT = (
    "You can call these tools (JSON schemas):\n{tools}\n\nTo call a tool, reply with one "
    "line per call exactly like\n<tool_call>{{\"name\": \"<tool name>\", \"arguments\": "
    "{{<arguments as JSON>}}}}</tool_call>\nand nothing else.")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


def generic_parse(text: str, tools: Any = None) -> Any:
    """The generic form: {"name": ..., "arguments": {...}} (or a list of them)."""
    value = json.loads(text.strip())
    calls = value if isinstance(value, list) else [value]
    for c in calls:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise ValueError("a tool call needs a name")
    return value


def _calls(parsed: Any) -> list[ToolCall]:
    out = []
    for c in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise ValueError(f"not a tool call: {c!r}")
        args = c.get("arguments", {})
        if isinstance(args, str):  # some parsers keep the model's JSON text
            args = json.loads(args) if args.strip() else {}
        cid = c["id"] if isinstance(c.get("id"), str) else f"call_{uuid.uuid4().hex[:24]}"
        out.append(ToolCall(cid, c["name"], json.dumps(args, ensure_ascii=False)))
    return out


class OutputSplitter:
    """Feed text segments; get back ("content" | "reasoning", text) and ("tool", ToolCall)
    pieces. Text that could still become a marker is held back until it can't."""

    def __init__(self, *, think: tuple[str, str] | None = None,
                 tools: tuple[str, str, Callable[..., Any]] | None = None,
                 tool_specs: Any = None, reasoning_first: bool = False,
                 tool_first: bool = False):
        self._think = think
        self._tools = tools
        self._specs = tool_specs
        self._state = "reasoning" if (think and reasoning_first) else "content"
        if tools and tool_first:  # a forced call: the whole answer is the call
            self._state = "tool"
        self._buf = ""
        self._tool_text = ""
        self._ws = ""  # whitespace-only content, held: it is dropped next to a tool call
        self.made_calls = 0
        self.failed_calls = 0

    def _markers(self) -> list[tuple[str, str]]:
        """(marker, next state) pairs that may end the current state."""
        if self._state == "reasoning":
            return [(self._think[1], "content")] if self._think else []
        if self._state == "tool":
            end = self._tools[1] if self._tools else ""
            return [(end, "content")] if end else []
        out = []
        if self._think:
            out.append((self._think[0], "reasoning"))
        if self._tools:
            out.append((self._tools[0], "tool"))
        return out

    def feed(self, segment: str) -> list[tuple[str, Any]]:
        self._buf += segment
        out: list[tuple[str, Any]] = []
        while True:
            found = [(self._buf.find(m), m, nxt) for m, nxt in self._markers() if m]
            found = [f for f in found if f[0] >= 0]
            if found:
                i, marker, nxt = min(found)
                self._emit(self._buf[:i], out)
                self._buf = self._buf[i + len(marker):]
                self._state = nxt
                continue
            if self._state == "tool":  # the call's text is held until its end marker
                return out
            keep = self._partial()
            self._emit(self._buf[:len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep:]
            return out

    def _emit(self, text: str, out: list[tuple[str, Any]]) -> None:
        if self._state == "tool":
            self._tool_text += text
            self._close_call(out)
        elif self._state == "content" and self._tools and not text.strip():
            self._ws += text
        elif text:
            if self._state == "content":
                text, self._ws = self._ws + text, ""
            out.append((self._state, text))

    def _close_call(self, out: list[tuple[str, Any]]) -> None:
        assert self._tools
        start, end, parse = self._tools
        text, self._tool_text = self._tool_text, ""
        try:
            calls = _calls(parse(text, self._specs))
        except Exception as e:  # any parser's failure: the text goes out as text
            log.info("a tool call did not parse (%s): %r", e, text[:200])
            self.failed_calls += 1
            out.append(("content", start + text + end))
            return
        self.made_calls += len(calls)
        self._ws = ""
        out.extend(("tool", c) for c in calls)

    def _partial(self) -> int:
        best = 0
        for m, _ in self._markers():
            for n in range(min(len(m) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(m[:n]):
                    best = n
                    break
        return best

    def finish(self) -> list[tuple[str, Any]]:
        """The rest at the end of generation (a call without an end marker is closed:
        Mistral's has none; a cut-off one fails to parse and comes back as text)."""
        out: list[tuple[str, Any]] = []
        if self._state == "tool":
            self._tool_text += self._buf
            self._close_call(out)
        else:
            self._emit(self._buf, out)
        if self._ws and not self.made_calls:
            out.append(("content", self._ws))
        self._buf = self._ws = ""
        return out
