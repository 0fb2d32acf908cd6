"""GET /openapi.json: an OpenAPI 3.1 document of the user API, generated from the same
pydantic request schemas that validate every request (so it can't drift from them)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel

from engine import __version__
from engine.api import anthropic_schemas, ollama_schemas, openai_schemas, responses_schemas
from engine.api.openai_completions import CompletionRequest

routes = web.RouteTableDef()

# (method, path, request schema or None, summary)
OPERATIONS: list[tuple[str, str, type[BaseModel] | None, str]] = [
    ("get", "/v1/models", None, "Models this node serves (OpenAI)"),
    ("post", "/v1/chat/completions", openai_schemas.ChatCompletionRequest,
     "Chat completion (OpenAI)"),
    ("post", "/v1/completions", CompletionRequest, "Text completion (OpenAI)"),
    ("post", "/v1/responses", responses_schemas.ResponsesRequest, "Response (OpenAI)"),
    ("post", "/v1/messages", anthropic_schemas.MessagesRequest, "Message (Anthropic)"),
    ("post", "/v1/messages/count_tokens", anthropic_schemas.CountTokensRequest,
     "Count a message's tokens (Anthropic)"),
    ("post", "/api/chat", ollama_schemas.ChatRequest, "Chat (Ollama)"),
    ("post", "/api/generate", ollama_schemas.GenerateRequest, "Generate (Ollama)"),
    ("get", "/api/tags", None, "Local models (Ollama)"),
    ("get", "/api/ps", None, "Running models (Ollama)"),
    ("get", "/api/version", None, "Version (Ollama)"),
]


def document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for method, path, model, summary in OPERATIONS:
        op: dict[str, Any] = {"summary": summary, "responses": {
            "200": {"description": "the answer (JSON, or a stream when asked for)"},
            "400": {"description": "a field the node can't honour, named"},
            "404": {"description": "no such model"}}}
        if model is not None:
            prefix = model.__module__.rsplit(".", 1)[-1]  # protocols reuse names (Tool)
            js = model.model_json_schema(
                ref_template=f"#/components/schemas/{prefix}.{{model}}")
            for key, sub in js.pop("$defs", {}).items():
                schemas[f"{prefix}.{key}"] = sub
            name = f"{prefix}.{model.__name__}"
            schemas[name] = js
            op["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{name}"}}}}
        paths.setdefault(path, {})[method] = op
    return {"openapi": "3.1.0",
            "info": {"title": "Shoal node user API", "version": __version__},
            "paths": paths, "components": {"schemas": schemas}}


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())
