"""The one handler every generation route shares: read and check the body, hand it to the
node that serves its model (relay), map it to a GenerateRequest, log its hints, generate,
and move the renderer's bytes (engine/api/render.py) to the client. A protocol module
gives only its schema, its mapping and its renderer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from engine import protocol as wire
from engine.api import common, hints
from engine.api.backend import backend
from engine.api.conversation import conversation_key
from engine.api.render import Context, Renderer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Endpoint:
    schema: type[BaseModel]
    to_request: Callable[[Any], wire.GenerateRequest]
    renderer: Callable[[Any, Context], Renderer]
    # the parsed body as the protocol means it (e.g. Ollama's "name:latest" untagged)
    prepare: Callable[[Any], Any] = lambda body: body
    # an answer without a generation (e.g. Ollama's empty request that only loads)
    shortcut: Callable[[web.Request, Any], Awaitable[web.StreamResponse | None]] | None = None
    extra_hints: Callable[[Any], list[str]] = lambda body: []


def handler(ep: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await common.read_json(request)
        body = ep.prepare(common.parse(ep.schema, raw))
        # the replica that answers: where this conversation's start went before
        relayed = await backend(request).relay(
            request, body.model, raw, key=lambda: conversation_key(ep.to_request(body)))
        if relayed is not None:
            return relayed
        if ep.shortcut is not None and (done := await ep.shortcut(request, body)) is not None:
            return done
        req = ep.to_request(body)
        noted = body.hints() if hasattr(body, "hints") else []
        hints.note(request, noted + ep.extra_hints(body))
        async with common.generation(request, body.model, req) as g:
            ctx = Context(g.model, g.accepted.prompt_tokens, prompt_text=g.accepted.prompt_text,
                          t0=g.t0)
            r = ep.renderer(body, ctx)
            if not getattr(body, "stream", False):
                return web.json_response(r.answer(await g.answer()))
            if r.wants_admission:  # e.g. Anthropic's message_start reports the cache hit
                ctx.cached = await g.admitted()
            resp = web.StreamResponse(headers={"Content-Type": r.media,
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
            for b in r.start():
                await resp.write(b)
            async for ev in g.stream(r.keepalive_s, progress=r.wants_progress):
                for b in [r.keepalive()] if ev is None else r.event(ev):
                    await resp.write(b)
                if isinstance(ev, wire.Error):
                    break
            for b in r.end():
                await resp.write(b)
            await resp.write_eof()
            return resp
    handle.endpoint = ep  # type: ignore[attr-defined]  # /openapi.json reads the schema
    handle.__doc__ = ep.renderer.__doc__ if isinstance(ep.renderer, type) else None
    return handle
