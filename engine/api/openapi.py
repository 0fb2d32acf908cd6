"""GET /openapi.json: an OpenAPI 3.1 document of the user API, generated from the same
pydantic request schemas that validate every request (so it can't drift from them). Each
property says how Shoal treats it and which API defines it (x-shoal-treatment,
x-defined-by: the field table of engine/api/field_table.py, as docs/api.md shows it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from engine import __version__
from engine.api import field_table

# GET routes whose query the handler reads
QUERIES = {"/props": ["model"]}


def operations(table: Iterable[Any]
               ) -> list[tuple[str, str, tuple[type[BaseModel], ...], str]]:
    """(method, path, request schemas, summary) of every route of the user API: from the
    route table itself (or the running app's routes), so no route is left out."""
    out = []
    for r in table:
        path = field_table.route_path(r)
        if not field_table.is_user_route(r.method, path):
            continue
        doc = (r.handler.__doc__ or "").strip().split("\n")[0].rstrip(".:")
        out.append((r.method.lower(), path, field_table.schemas_of(path, r.handler),
                    doc or path))
    return out


def _annotate(js: dict[str, Any], schemas: dict[str, Any], rows: list[field_table.Row]
              ) -> None:
    """x-shoal-treatment and x-defined-by on each property the table has a row for (a
    nested object's properties in the schema its property refers to)."""
    for row in rows:
        *parent, leaf = row.field.split(".")
        props = js.get("properties", {})
        if parent:
            props = _referred(props.get(parent[0], {}), schemas).get("properties", {})
        prop = props.get(leaf)
        if prop is None:
            continue
        prop["x-shoal-treatment"] = row.treatment
        prop["x-defined-by"] = list(row.defined_by)
        if row.note:
            prop["x-shoal-note"] = row.note


def _referred(prop: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    for sub in [prop, *prop.get("anyOf", [])]:
        ref = sub.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            return schemas.get(ref.rsplit("/", 1)[1], {})
    return {}


def document(table: Iterable[Any]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for method, path, models, summary in operations(table):
        op: dict[str, Any] = {"summary": summary, "responses": {
            "200": {"description": "the answer (JSON, or a stream when asked for)"},
            "400": {"description": "a field the node can't honour, named"},
            "404": {"description": "no such model"}}}
        refs = []
        for model in models:
            prefix = model.__module__.rsplit(".", 1)[-1]  # protocols reuse names (Tool)
            js = model.model_json_schema(
                ref_template=f"#/components/schemas/{prefix}.{{model}}")
            for key, sub in js.pop("$defs", {}).items():
                schemas[f"{prefix}.{key}"] = sub
            name = f"{prefix}.{model.__name__}"
            schemas[name] = js
            refs.append({"$ref": f"#/components/schemas/{name}"})
            rows = field_table.rows_for(method.upper(), path, [model], field_table.recorded)
            _annotate(js, schemas, rows)
        if refs:
            op["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": refs[0] if len(refs) == 1 else {"oneOf": refs}}}}
        if path in QUERIES:
            op["parameters"] = [{"name": q, "in": "query", "required": False,
                                 "schema": {"type": "string"}} for q in QUERIES[path]]
        paths.setdefault(path, {})[method] = op
    return {"openapi": "3.1.0",
            "info": {"title": "Shoal node user API", "version": __version__},
            "paths": paths, "components": {"schemas": schemas}}


def route(table: Sequence[web.RouteDef]
          ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The GET /openapi.json handler: the running app's routes (so the node's own, such as
    /metrics, are there too), or `table`'s outside an app; made once."""
    made: dict[str, Any] = {}

    async def openapi(request: web.Request) -> web.Response:
        if "doc" not in made:
            app_routes = list(request.app.router.routes()) if request.app else []
            made["doc"] = document(app_routes or table)
        return web.json_response(made["doc"])
    return openapi
