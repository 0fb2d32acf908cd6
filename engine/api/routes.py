"""Every protocol's routes, for the node's HTTP server (one adapter module per protocol), and
the one mapping from the error tree to each protocol's error body."""

from __future__ import annotations

from aiohttp import web

from engine.api import (
    anthropic,
    embeddings,
    ollama,
    openai_chat,
    openai_completions,
    openai_responses,
    openapi,
    rerank,
    utility,
)
from engine.api.anthropic_bodies import ErrorBody as AnthropicError
from engine.api.ollama_bodies import ErrorLine
from engine.errors import ErrorBody, ShoalError

routes: list[web.RouteDef] = [  # type: ignore[list-item]
    *openai_chat.routes, *openai_completions.routes, *openai_responses.routes,
    *anthropic.routes, *ollama.routes, *utility.routes,
    *embeddings.routes, *rerank.routes]
routes.append(web.get("/openapi.json", openapi.route(routes)))


def error_body(path: str, e: ShoalError) -> ErrorBody | AnthropicError | ErrorLine:
    """The error as the client on `path` expects it (Anthropic, Ollama, else OpenAI)."""
    if path.startswith("/v1/messages"):
        return anthropic.error_body(e)
    if path.startswith("/api/"):
        return {"error": e.message}
    return e.to_openai()
