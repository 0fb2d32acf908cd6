"""One table of every request field of every route: its type, which API defines it, and
whether Shoal honours it, takes it only as a hint, or refuses it (docs/api.md and
/openapi.json's x-shoal-treatment and x-defined-by are made from it).

The treatment comes from each schema's TREATMENT (the convention is in
engine/api/openai_schemas.py). Which API defines a field comes from the official SDKs'
own types (openai, anthropic, ollama: test extras, read only by `scripts/api-table`,
which records the result in defined_by.json for the node) and, for vLLM's and llama.cpp's
extensions, from the lists in engine/api/dialect_sources.py."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from aiohttp import web
from pydantic import BaseModel
from typing_extensions import is_typeddict

from engine.api import dialect_sources, embedding_schemas, rerank, utility

DEFINED_BY = Path(__file__).with_name("defined_by.json")
SHOAL = "Shoal"
MESSAGES_ONLY = "Anthropic (on /v1/messages)"
# the user API: what /openapi.json describes and the table lists
USER_PATHS = ("/tokenize", "/detokenize", "/apply-template", "/props", "/metrics",
              "/rerank", "/v2/rerank")
# handlers that read their body themselves (one of several dialects): their schemas
BODIES: dict[str, tuple[type[BaseModel], ...]] = {
    "/tokenize": (utility.LlamaTokenize, utility.VllmTokenizePrompt,
                  utility.VllmTokenizeChat),
    "/detokenize": (utility.Detokenize,), "/apply-template": (utility.ApplyTemplate,),
    "/v1/embeddings": (embedding_schemas.EmbeddingsRequest,),
    "/api/embed": (embedding_schemas.OllamaEmbed,),
    "/api/embeddings": (embedding_schemas.OllamaEmbeddings,),
    **dict.fromkeys(("/v1/rerank", "/rerank", "/v2/rerank"), (rerank.RerankRequest,))}
Treatment = Literal["honoured", "partly", "hint", "refused"]


@dataclass(frozen=True)
class Row:
    route: str  # "POST /v1/chat/completions"
    field: str  # dotted for a field of a nested object: "stream_options.include_usage"
    type: str
    defined_by: tuple[str, ...]  # "OpenAI", "vLLM", "llama.cpp", ..., or ("Shoal",)
    treatment: Treatment
    note: str


def route_path(r: Any) -> str:
    """A route's path template, from a RouteDef or a route of a running app."""
    path = r.path if isinstance(r, web.RouteDef) else r.resource.canonical
    return str(path).replace("{model_id:.+}", "{model_id}")


def is_user_route(method: str, path: str) -> bool:
    return method != "HEAD" and (path.startswith(("/v1/", "/api/")) or path in USER_PATHS)


def schemas_of(path: str, handler: Any) -> tuple[type[BaseModel], ...]:
    """The request schemas of a route's body (several where the body's keys tell which)."""
    ep = getattr(handler, "endpoint", None)
    return (ep.schema,) if ep is not None else BODIES.get(path, ())


# --- the fields of a schema ---------------------------------------------------------------
def _parts(ann: Any) -> list[Any]:
    """The members of a union (None left out), unwrapping Annotated."""
    if typing.get_origin(ann) is typing.Annotated:
        return _parts(typing.get_args(ann)[0])
    if typing.get_origin(ann) in (Union, types.UnionType):
        return [p for a in typing.get_args(ann) for p in _parts(a)]
    return [] if ann is type(None) else [ann]


def _model(ann: Any) -> type[BaseModel] | None:
    """The model of an object field (a model, or a model or None), else None."""
    parts = _parts(ann)
    if len(parts) == 1 and isinstance(parts[0], type) and issubclass(parts[0], BaseModel):
        return parts[0]
    return None


def type_name(ann: Any) -> str:
    """A field's JSON type, in words: "integer", "string | array", ..."""
    names: list[str] = []
    for p in _parts(ann) or [Any]:
        origin = typing.get_origin(p)
        if origin is Literal:
            n = " | ".join(json.dumps(v) for v in typing.get_args(p))
        elif origin in (list, tuple, Sequence) or p in (list, tuple):
            n = "array"
        elif origin is dict or p is dict or isinstance(p, type) and issubclass(p, BaseModel):
            n = "object"
        else:
            n = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
                p, "any")
        if n not in names:
            names.append(n)
    return " | ".join(names)


def fields(model: type[BaseModel], prefix: str = ""
           ) -> Iterator[tuple[str, Any, str | None]]:
    """(dotted name, annotation, TREATMENT entry) of each field, and of the fields of each
    object-valued field one level down (stream_options.include_usage, options.top_k)."""
    treatment: dict[str, str] = getattr(model, "TREATMENT", {})
    for name, f in model.model_fields.items():
        wire = f.alias or name
        yield prefix + wire, f.annotation, treatment.get(wire)
        sub = _model(f.annotation)
        if sub is not None and not prefix:
            for sub_name, ann, told in fields(sub, f"{wire}."):
                yield sub_name, ann, treatment.get(sub_name, told)  # the parent's word first


def classify(told: str | None) -> tuple[Treatment, str]:
    if told is None:
        return "honoured", ""
    if told in ("hint", "refused"):
        return told, ""  # type: ignore[return-value]
    return "partly", told


def rows_for(method: str, path: str, schemas: Iterable[type[BaseModel]],
             defined: Callable[[str, str], tuple[str, ...]]) -> list[Row]:
    """The table's rows of one route (fields of several schemas merged, first one wins)."""
    route, out, seen = f"{method} {path}", [], set()
    for model in schemas:
        for name, ann, told in fields(model):
            if name in seen:
                continue
            seen.add(name)
            treatment, note = classify(told)
            out.append(Row(route, name, type_name(ann), defined(path, name), treatment,
                           note))
    return out


def recorded(path: str, name: str) -> tuple[str, ...]:
    """Who defines a field, as scripts/api-table recorded it (defined_by.json)."""
    return tuple(_recorded().get(path, {}).get(name, ()))


def _recorded() -> dict[str, dict[str, list[str]]]:
    global _RECORDED
    if _RECORDED is None:
        try:
            _RECORDED = json.loads(DEFINED_BY.read_text())
        except (OSError, ValueError):
            _RECORDED = {}
    return _RECORDED


_RECORDED: dict[str, dict[str, list[str]]] | None = None


# the order of a route's rows: the official API's fields first, then the extensions'
ORDER = ("OpenAI", "Anthropic", "Anthropic (older SDKs)", "Anthropic beta", MESSAGES_ONLY,
         "Ollama", "Codex", "Jina", "Cohere", "TEI",
         "vLLM", "llama.cpp", SHOAL)


def table(routes: Iterable[Any], defined: Callable[[str, str], tuple[str, ...]] = recorded
          ) -> list[Row]:
    """Every row of every user route with a body, in the route table's order."""
    out: list[Row] = []
    for r in routes:
        path = route_path(r)
        if is_user_route(r.method, path):
            rows = rows_for(r.method, path, schemas_of(path, r.handler), defined)
            out += sorted(rows, key=lambda row: ORDER.index(row.defined_by[0])
                          if row.defined_by and row.defined_by[0] in ORDER else len(ORDER))
    return out


# --- who defines each field (the SDKs: only where the test extras are installed) ----------
def typed_dict_fields(td: Any, prefix: str = "") -> set[str]:
    """The keys of an SDK's TypedDict, and one level down those of each object-valued key
    (several TypedDicts in a union: all their keys)."""
    out: set[str] = set()
    hints = typing.get_type_hints(td)
    for key, ann in hints.items():
        out.add(prefix + key)
        if prefix:
            continue
        for p in _parts(_unrequired(ann)):
            if is_typeddict(p):
                out |= typed_dict_fields(p, f"{key}.")
            elif isinstance(p, type) and issubclass(p, BaseModel):
                out |= {f"{key}.{k}" for k in p.model_fields}
    return out


def _unrequired(ann: Any) -> Any:
    while typing.get_origin(ann) in (typing.Required, typing.NotRequired):
        ann = typing.get_args(ann)[0]
    return ann


def model_fields_of(model: type[BaseModel]) -> set[str]:
    """A pydantic SDK model's fields (the ollama package's), one level down as above."""
    out: set[str] = set()
    for name, f in model.model_fields.items():
        out.add(name)
        for p in _parts(f.annotation):
            if isinstance(p, type) and issubclass(p, BaseModel) and name == "options":
                out |= {f"options.{k}" for k in p.model_fields}
    return out


def official_fields() -> dict[str, dict[str, set[str]]]:
    """path -> {API: the fields its SDK's types define}, read from the installed SDKs."""
    from anthropic.types.beta import message_count_tokens_params as beta_count
    from anthropic.types.beta import message_create_params as beta_create
    from anthropic.types.message_count_tokens_params import MessageCountTokensParams
    from anthropic.types.message_create_params import MessageCreateParamsStreaming
    from ollama import _types as ollama
    from openai.types import completion_create_params as legacy
    from openai.types import embedding_create_params as embeddings
    from openai.types.chat import completion_create_params as chat
    from openai.types.responses import response_create_params as responses

    messages = typed_dict_fields(MessageCreateParamsStreaming)
    beta = typed_dict_fields(beta_create.MessageCreateParamsStreaming)
    return {  # (the streaming variants: the base's fields and `stream`)
        "/v1/chat/completions": {"OpenAI": typed_dict_fields(
            chat.CompletionCreateParamsStreaming)},
        "/v1/completions": {"OpenAI": typed_dict_fields(
            legacy.CompletionCreateParamsStreaming)},
        "/v1/responses": {"OpenAI": typed_dict_fields(
            responses.ResponseCreateParamsStreaming)},
        "/v1/messages": {"Anthropic": messages, "Anthropic beta": beta},
        "/v1/messages/count_tokens": {
            "Anthropic": typed_dict_fields(MessageCountTokensParams),
            "Anthropic beta": typed_dict_fields(beta_count.MessageCountTokensParams),
            # the hints and refusals a message may carry, taken here too
            MESSAGES_ONLY: messages | beta},
        "/api/chat": {"Ollama": model_fields_of(ollama.ChatRequest)},
        "/api/generate": {"Ollama": model_fields_of(ollama.GenerateRequest)},
        "/v1/embeddings": {"OpenAI": typed_dict_fields(embeddings.EmbeddingCreateParams)},
        "/api/embed": {"Ollama": model_fields_of(ollama.EmbedRequest)},
        "/api/embeddings": {"Ollama": model_fields_of(ollama.EmbeddingsRequest)},
    }


def definers(official: dict[str, dict[str, set[str]]]
             ) -> Callable[[str, str], tuple[str, ...]]:
    """defined(path, field): the APIs that define it (the official ones first), or Shoal's
    own, or () where nobody does (a field to explain)."""
    def defined(path: str, name: str) -> tuple[str, ...]:
        apis = [api for api, names in official.get(path, {}).items() if name in names]
        for more in ("Anthropic beta", MESSAGES_ONLY):  # the most official one is enough
            if more in apis and apis[0] != more:
                apis.remove(more)
        apis += [api for api, names in dialect_sources.EXTENSIONS.get(path, {}).items()
                 if name in names]
        if not apis:  # Shoal's own (speculative, draft_tokens) or Shoal's addition
            apis.append(SHOAL)
        return tuple(apis)
    return defined


def record(rows: Iterable[Row]) -> str:
    """defined_by.json's text: path -> field -> the APIs that define it."""
    out: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        out.setdefault(r.route.split(" ", 1)[1], {})[r.field] = list(r.defined_by)
    return json.dumps(out, indent=1, sort_keys=True) + "\n"


# --- docs/api.md --------------------------------------------------------------------------
def counts(rows: Iterable[Row]) -> dict[str, dict[Treatment, int]]:
    """API -> how many of the fields it defines (over every route) each treatment has."""
    out: dict[str, dict[Treatment, int]] = {}
    for r in rows:
        for api in r.defined_by:
            c = out.setdefault(api, {"honoured": 0, "partly": 0, "hint": 0, "refused": 0})
            c[r.treatment] += 1
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: Sequence[Row]) -> str:
    """docs/api.md: the counts per API, then one table per route."""
    out = ["# The fields of Shoal's API", "",
           "Generated by `scripts/api-table` from the request schemas (don't edit by hand). "
           "Every field of every route, which API defines it, and what Shoal does with it:",
           "- **honoured**: it does what its API says;",
           "- **partly**: some values are honoured (the note says which), the others get a "
           "400 naming the field;",
           "- **hint**: accepted and logged once, without effect on the answer;",
           "- **refused**: a value gets a 400 naming the field.",
           "",
           "A field no route lists gets a 400 naming it. `/openapi.json` carries the same, "
           "as each property's `x-shoal-treatment` and `x-defined-by`.", "",
           "## Counts", "",
           "Fields each API defines, over every route that takes them.", "",
           "| API | honoured | partly | hint | refused |", "| --- | --- | --- | --- | --- |"]
    for api, c in sorted(counts(rows).items(), key=lambda kv: -sum(kv[1].values())):
        out.append(f"| {api} | {c['honoured']} | {c['partly']} | {c['hint']} | "
                   f"{c['refused']} |")
    route = None
    for r in rows:
        if r.route != route:
            route = r.route
            out += ["", f"## {route}", "", "| field | type | defined by | what Shoal does | note |",
                    "| --- | --- | --- | --- | --- |"]
        out.append(f"| `{r.field}` | {_cell(r.type)} | {', '.join(r.defined_by)} | "
                   f"{r.treatment} | {_cell(r.note)} |")
    return "\n".join(out) + "\n"
