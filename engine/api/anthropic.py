"""Anthropic Messages: /v1/messages (plain and streaming, with pings) and
/v1/messages/count_tokens — enough for Claude Code with ANTHROPIC_BASE_URL set to a node."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from engine import protocol as wire
from engine.api.anthropic_bodies import (
    Block,
    ErrorBody,
    Message,
    ThinkingBlock,
    TokenCount,
    ToolUseBlock,
    Usage,
)
from engine.api.anthropic_schemas import (
    CountTokensRequest,
    MessagesRequest,
    dropped_tools,
    stop_reason,
    to_request,
    tool_input,
)
from engine.api.render import Answer, Context, drafts, error_of, sse
from engine.api.serve import Endpoint, handler
from engine.errors import ShoalError

routes = web.RouteTableDef()
PING_EVERY_S = 10.0
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


def error_body(e: ShoalError) -> ErrorBody:
    kind = ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500
                           else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def _usage(done: wire.Done | None, prompt_tokens: int, cached: int = 0) -> Usage:
    """Anthropic counts prompt tokens read from the cache apart from input_tokens."""
    cached = done.cached_tokens if done else cached
    out: Usage = {"input_tokens": prompt_tokens - cached,
                  "output_tokens": done.generation_tokens if done else 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
    if done is not None:
        out["speculative"] = drafts(done)
    return out


class CountRenderer:
    """/v1/messages/count_tokens: the prompt's tokens, as the chat template renders it."""

    media: str = "application/json"
    keepalive_s: float | None = None
    wants_admission: bool = False
    wants_progress: bool = False

    def __init__(self, body: CountTokensRequest, ctx: Context):
        self.ctx = ctx

    def start(self) -> list[bytes]:
        return []

    def keepalive(self) -> bytes:
        return b""

    def event(self, ev: wire.Event) -> list[bytes]:
        return []

    def end(self) -> list[bytes]:
        return []

    def answer(self, a: Answer) -> TokenCount:
        return {"input_tokens": self.ctx.prompt_tokens}


class MessagesRenderer:
    """/v1/messages: message_start (with the cache hit), a ping, content blocks (thinking,
    text, tool_use) opened and closed in order, message_delta, message_stop; pings while
    nothing else is said; an error event if it fails. Or the message object."""

    media: str = "text/event-stream"
    keepalive_s: float | None = PING_EVERY_S
    wants_admission: bool = True
    wants_progress: bool = False

    def __init__(self, body: MessagesRequest, ctx: Context):
        self.ctx, self.mid = ctx, ctx.ids("msg_")
        self.index = -1
        self.open_kind: str | None = None

    def _send(self, kind: str, data: Mapping[str, object]) -> bytes:
        return sse({"type": kind, **data}, event=kind)

    def start(self) -> list[bytes]:
        ctx = self.ctx
        return [self._send("message_start", {"message": {
            "id": self.mid, "type": "message", "role": "assistant", "model": ctx.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**_usage(None, ctx.prompt_tokens, ctx.cached), "output_tokens": 1}}}),
            self._send("ping", {})]

    def keepalive(self) -> bytes:
        return self._send("ping", {})

    def _open(self, kind: str, block: Block) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open_kind = kind
        return out + [self._send("content_block_start", {"index": self.index,
                                                         "content_block": block})]

    def _close(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        out = []
        if self.open_kind == "thinking":  # no real signature: a local model signs nothing
            out.append(self._send("content_block_delta", {"index": self.index, "delta": {
                "type": "signature_delta", "signature": ""}}))
        out.append(self._send("content_block_stop", {"index": self.index}))
        self.open_kind = None
        return out

    def event(self, ev: wire.Event) -> list[bytes]:
        if isinstance(ev, wire.Error):
            return [sse(error_body(error_of(ev)), event="error")]
        if isinstance(ev, wire.Delta) and ev.kind == "reasoning":
            out = [] if self.open_kind == "thinking" else self._open(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return out + [self._send("content_block_delta", {"index": self.index, "delta": {
                "type": "thinking_delta", "thinking": ev.text}})]
        if isinstance(ev, wire.Delta):
            out = [] if self.open_kind == "text" else self._open(
                "text", {"type": "text", "text": ""})
            return out + [self._send("content_block_delta", {"index": self.index, "delta": {
                "type": "text_delta", "text": ev.text}})]
        if isinstance(ev, wire.ToolCall):
            out = self._open("tool_use", {"type": "tool_use", "id": ev.call_id,
                                          "name": ev.name, "input": {}})
            return out + [self._send("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": ev.arguments}})]
        if isinstance(ev, wire.Done):
            return self._close() + [
                self._send("message_delta", {
                    "delta": {"stop_reason": stop_reason(ev),
                              "stop_sequence": ev.stop_sequence},
                    "usage": _usage(ev, ev.prompt_tokens)}),
                self._send("message_stop", {})]
        return []

    def end(self) -> list[bytes]:
        return []

    def answer(self, a: Answer) -> Message:
        assert a.done is not None
        content: list[Block] = []
        if a.reasoning:
            think: ThinkingBlock = {"type": "thinking", "thinking": a.reasoning,
                                    "signature": ""}
            content.append(think)
        if a.content:
            content.append({"type": "text", "text": a.content})
        calls: list[ToolUseBlock] = [{"type": "tool_use", "id": c.call_id, "name": c.name,
                                      "input": tool_input(c)} for c in a.tool_calls]
        content += calls
        return {"id": self.mid, "type": "message", "role": "assistant",
                "model": self.ctx.model, "content": content,
                "stop_reason": stop_reason(a.done), "stop_sequence": a.done.stop_sequence,
                "usage": _usage(a.done, self.ctx.prompt_tokens)}


routes.post("/v1/messages/count_tokens")(handler(Endpoint(
    CountTokensRequest, lambda body: to_request(body, True), CountRenderer,
    extra_hints=dropped_tools)))
routes.post("/v1/messages")(handler(Endpoint(MessagesRequest, to_request, MessagesRenderer,
                                             extra_hints=dropped_tools)))
