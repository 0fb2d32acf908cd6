"""Anthropic Messages: /v1/messages (plain and streaming, with pings) and
/v1/messages/count_tokens — enough for Claude Code with ANTHROPIC_BASE_URL set to a node."""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api import common, hints
from engine.api.anthropic_schemas import (
    CountTokensRequest,
    MessagesRequest,
    dropped_tools,
    stop_reason,
    to_request,
    tool_input,
)
from engine.errors import ShoalError

routes = web.RouteTableDef()
PING_EVERY_S = 10.0
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


def error_body(e: ShoalError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500
                           else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def _usage(done: wire.Done | None, prompt_tokens: int, cached: int = 0) -> dict[str, int]:
    """Anthropic counts prompt tokens read from the cache apart from input_tokens."""
    cached = done.cached_tokens if done else cached
    return {"input_tokens": prompt_tokens - cached,
            "output_tokens": done.generation_tokens if done else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = common.parse(CountTokensRequest, raw)
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    req = to_request(body, True)
    hints.note(request, body.hints() + dropped_tools(body))
    async with common.generation(request, body.model, req) as g:
        await g.answer()
        return web.json_response({"input_tokens": g.accepted.prompt_tokens})


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = common.parse(MessagesRequest, raw)
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    req = to_request(body)
    hints.note(request, body.hints() + dropped_tools(body))
    async with common.generation(request, body.model, req) as g:
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        if body.stream:
            return await _stream(request, g, mid)
        a = await g.answer()
        assert a.done is not None
        content: list[dict[str, Any]] = []
        if a.reasoning:
            content.append({"type": "thinking", "thinking": a.reasoning, "signature": ""})
        if a.content:
            content.append({"type": "text", "text": a.content})
        content += [{"type": "tool_use", "id": c.call_id, "name": c.name,
                     "input": tool_input(c)} for c in a.tool_calls]
        return web.json_response({
            "id": mid, "type": "message", "role": "assistant", "model": g.model,
            "content": content, "stop_reason": stop_reason(a.done),
            "stop_sequence": a.done.stop_sequence,
            "usage": _usage(a.done, g.accepted.prompt_tokens)})


async def _stream(request: web.Request, g: common.Generation, mid: str) -> web.StreamResponse:
    resp = await common.sse(request)

    async def send(kind: str, data: dict[str, Any]) -> None:
        await resp.write(f"event: {kind}\ndata: "
                         f"{json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"
                         .encode())

    cached = await g.admitted()  # message_start reports the cache hit, as Anthropic's does
    await send("message_start", {"message": {
        "id": mid, "type": "message", "role": "assistant", "model": g.model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {**_usage(None, g.accepted.prompt_tokens, cached), "output_tokens": 1}}})
    await send("ping", {})
    index, open_kind = -1, None

    async def open_block(kind: str, block: dict[str, Any]) -> None:
        nonlocal index, open_kind
        await close_block()
        index += 1
        open_kind = kind
        await send("content_block_start", {"index": index, "content_block": block})

    async def close_block() -> None:
        nonlocal open_kind
        if open_kind is None:
            return
        if open_kind == "thinking":  # no real signature: a local model signs nothing
            await send("content_block_delta", {"index": index, "delta": {
                "type": "signature_delta", "signature": ""}})
        await send("content_block_stop", {"index": index})
        open_kind = None

    async for ev in g.stream(PING_EVERY_S):
        if ev is None:
            await send("ping", {})
        elif isinstance(ev, wire.Error):
            await resp.write(f"event: error\ndata: {json.dumps(error_body(common.error_of(ev)))}"
                             "\n\n".encode())
            break
        elif isinstance(ev, wire.Delta) and ev.kind == "reasoning":
            if open_kind != "thinking":
                await open_block("thinking", {"type": "thinking", "thinking": "",
                                              "signature": ""})
            await send("content_block_delta", {"index": index, "delta": {
                "type": "thinking_delta", "thinking": ev.text}})
        elif isinstance(ev, wire.Delta):
            if open_kind != "text":
                await open_block("text", {"type": "text", "text": ""})
            await send("content_block_delta", {"index": index, "delta": {
                "type": "text_delta", "text": ev.text}})
        elif isinstance(ev, wire.ToolCall):
            await open_block("tool_use", {"type": "tool_use", "id": ev.call_id,
                                          "name": ev.name, "input": {}})
            await send("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": ev.arguments}})
        elif isinstance(ev, wire.Done):
            await close_block()
            await send("message_delta", {
                "delta": {"stop_reason": stop_reason(ev), "stop_sequence": ev.stop_sequence},
                "usage": _usage(ev, ev.prompt_tokens)})
            await send("message_stop", {})
    await resp.write_eof()
    return resp
