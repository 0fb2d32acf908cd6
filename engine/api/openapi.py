"""GET /openapi.json: an OpenAPI 3.1 document of the user API, generated from the same
pydantic request schemas that validate every request (so it can't drift from them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from engine import __version__


def operations(table: Sequence[web.RouteDef]) -> list[tuple[str, str, Any, str]]:
    """(method, path, request schema or None, summary) of every route of the user API:
    from the route table itself, so no route is left out."""
    out = []
    for r in table:
        if r.method == "HEAD" or not r.path.startswith(("/v1/", "/api/")):
            continue
        ep = getattr(r.handler, "endpoint", None)
        doc = (r.handler.__doc__ or "").strip().split("\n")[0].rstrip(".:")
        out.append((r.method.lower(), r.path.replace("{model_id:.+}", "{model_id}"),
                    ep.schema if ep is not None else None, doc or r.path))
    return out


def document(table: Sequence[web.RouteDef]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for method, path, model, summary in operations(table):
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


def route(table: Sequence[web.RouteDef]
          ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The GET /openapi.json handler for the routes in `table`."""
    doc = document(table)

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(doc)
    return openapi
