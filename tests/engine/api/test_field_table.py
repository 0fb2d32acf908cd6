"""The field table (engine/api/field_table.py): docs/api.md and defined_by.json are what the
schemas make of them today; every field an official SDK defines is one Shoal takes (an
unknown field is a 400, so a missing one is a bug); each TREATMENT names real fields; what
the table says is what a request gets: a refused field's value is a 400 naming it, a hint
is reported by the request's hints(); /openapi.json carries the same words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine.api import field_table, openapi
from engine.api.common import parse
from engine.api.routes import routes
from engine.errors import BadRequest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def rows() -> list[field_table.Row]:
    return field_table.table(routes, field_table.definers(field_table.official_fields()))


def test_docs_api_md_is_what_the_schemas_make():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "api-table"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + "(run scripts/api-table and commit)"


def test_every_field_an_official_sdk_defines_is_taken(rows):
    have: dict[str, set[str]] = {}
    objects: dict[str, set[str]] = {}  # the fields Shoal checks key by key (a model)
    for r in rows:
        path = r.route.split(" ", 1)[1]
        have.setdefault(path, set()).add(r.field)
        if "." in r.field:
            objects.setdefault(path, set()).add(r.field.split(".")[0])
    missing = []
    for path, apis in field_table.official_fields().items():
        for api, names in apis.items():
            if api == field_table.MESSAGES_ONLY:
                continue
            for name in names - have.get(path, set()):
                # a key inside an object Shoal takes whole (metadata, a dict) is taken too
                if "." not in name or name.split(".")[0] in objects.get(path, set()):
                    missing.append(f"{path} {name} ({api})")
    assert missing == [], "defined by an SDK, unknown to Shoal (a 400 today)"


def _models() -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    for r in routes:
        for m in field_table.schemas_of(field_table.route_path(r), r.handler):
            for _, ann, _ in field_table.fields(m):
                sub = field_table._model(ann)
                if sub is not None and sub not in seen:
                    seen.append(sub)
            if m not in seen:
                seen.append(m)
    return seen


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_each_treatment_names_a_field(model):
    told = getattr(model, "TREATMENT", {})
    names = {name for name, _, _ in field_table.fields(model)}
    assert set(told) - names == set(), "TREATMENT names a field the schema hasn't"
    for name, word in told.items():
        assert word.strip() and len(word) < 200, name


def test_the_counts_cover_every_dialect(rows):
    counts = field_table.counts(rows)
    for api in ("OpenAI", "Anthropic", "Ollama", "vLLM", "llama.cpp", "Shoal"):
        assert sum(counts[api].values()) > 0, api
    assert counts["vLLM"]["honoured"] > 0 and counts["llama.cpp"]["honoured"] > 0


# a route's smallest body, and how it becomes a GenerateRequest (where the route has one)
def _to_request() -> dict[str, tuple[type[BaseModel], dict[str, Any], Any]]:
    from engine.api import anthropic_schemas, ollama_schemas, openai_chat, openai_completions
    from engine.api import responses_schemas as rs

    hi = [{"role": "user", "content": "hi"}]
    return {
        "/v1/chat/completions": (openai_chat.ChatCompletionRequest, {"messages": hi},
                                 openai_chat.to_request),
        "/v1/completions": (openai_completions.CompletionRequest, {"prompt": "hi"},
                            openai_completions.to_request),
        "/v1/responses": (rs.ResponsesRequest, {"input": "hi"}, rs.to_request),
        "/v1/messages": (anthropic_schemas.MessagesRequest,
                         {"model": "m", "max_tokens": 5, "messages": hi},
                         anthropic_schemas.to_request),
        "/api/chat": (ollama_schemas.ChatRequest, {"model": "m", "messages": hi},
                      ollama_schemas.chat_request),
        "/api/generate": (ollama_schemas.GenerateRequest, {"model": "m", "prompt": "hi"},
                          ollama_schemas.generate_request)}


# a value of each JSON type that a refused field can't take quietly
SAMPLE = {"boolean": True, "integer": 3, "number": 0.5, "string": "x", "array": ["x"],
          "object": {"type": "x"}, "any": {"type": "x"}}


def _value(row: field_table.Row) -> Any:
    first = row.type.split(" | ")[0]
    return json.loads(first) if first.startswith('"') else SAMPLE[first]


def _body(minimal: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(minimal))
    *parent, leaf = field.split(".")
    (body.setdefault(parent[0], {}) if parent else body)[leaf] = value
    return body


def test_a_refused_field_is_a_400_naming_it(rows):
    cases = _to_request()
    wrong = []
    for r in rows:
        path = r.route.split(" ", 1)[1]
        if r.treatment != "refused" or path not in cases:
            continue
        model, minimal, to_request = cases[path]
        try:
            to_request(parse(model, _body(minimal, r.field, _value(r))))
        except BadRequest as e:
            if e.param is None or not (e.param == r.field or e.param.startswith(r.field)):
                wrong.append(f"{r.route} {r.field}: the 400 names {e.param!r}")
        else:
            wrong.append(f"{r.route} {r.field}: taken")
    assert wrong == []


def test_a_hint_is_reported_once_given(rows):
    cases = _to_request()
    wrong = []
    for r in rows:
        path = r.route.split(" ", 1)[1]
        if r.treatment != "hint" or path not in cases:
            continue
        model, minimal, _ = cases[path]
        try:
            body = parse(model, _body(minimal, r.field, _value(r)))
        except BadRequest:
            continue  # the sample isn't a value of this field; the schema tests cover it
        noted = body.hints() if hasattr(body, "hints") else []
        if not any(n == r.field or n.startswith(r.field) for n in noted):
            wrong.append(f"{r.route} {r.field}")
    assert wrong == [], f"hints the node doesn't log: {wrong}"


def test_openapi_json_carries_the_table():
    doc = openapi.document(routes)
    schemas = doc["components"]["schemas"]
    chat = schemas["openai_schemas.ChatCompletionRequest"]["properties"]
    assert chat["temperature"]["x-shoal-treatment"] == "honoured"
    assert "OpenAI" in chat["temperature"]["x-defined-by"]
    assert "OpenAI" in chat["n"]["x-defined-by"] and chat["n"]["x-shoal-treatment"] == "partly"
    stream = schemas["openai_schemas.StreamOptions"]["properties"]
    assert stream["include_obfuscation"]["x-shoal-treatment"] == "hint"
    for path in ("/tokenize", "/detokenize", "/apply-template", "/props"):
        assert path in doc["paths"], path
    tokenize = doc["paths"]["/tokenize"]["post"]["requestBody"]["content"]
    assert len(tokenize["application/json"]["schema"]["oneOf"]) == 3
    unmarked = [f"{name}.{p}" for name, s in schemas.items()
                if name.endswith(("Request", "Tokenize", "TokenizePrompt", "TokenizeChat",
                                  "Detokenize", "ApplyTemplate"))
                for p, prop in s.get("properties", {}).items()
                if "x-shoal-treatment" not in prop]
    assert unmarked == []


def test_what_partly_honoured_fields_take_and_refuse():
    """The partly honoured fields of the Ollama and Responses schemas: the values they take
    reach the sampler, the others are a 400 naming the field."""
    from engine.api import ollama_schemas as ol
    from engine.api import responses_schemas as rs

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body = parse(ol.ChatRequest, {**chat, "options": {
        "typical_p": 0.5, "repeat_last_n": 32, "mirostat": 0, "tfs_z": 1.0, "num_thread": 8}})
    s = ol.sampling(body)
    assert (s.typical_p, s.repetition_context) == (0.5, 32)
    assert body.hints() == ["options.num_thread"]
    off = ol.sampling(parse(ol.ChatRequest, {**chat, "options": {
        "repeat_last_n": 0, "repeat_penalty": 1.3}}))
    assert off.repetition_penalty is None, "repeat_last_n 0 turns the penalties off"
    for name, value in (("mirostat", 2), ("tfs_z", 0.9)):
        with pytest.raises(BadRequest) as e:
            ol.sampling(parse(ol.ChatRequest, {**chat, "options": {name: value}}))
        assert e.value.param == f"options.{name}"
    with pytest.raises(BadRequest) as e:
        rs.to_request(parse(rs.ResponsesRequest, {"input": "hi", "reasoning": {
            "context": "all_turns"}}))
    assert e.value.param == "reasoning.context"
    rs.to_request(parse(rs.ResponsesRequest, {"input": "hi", "reasoning": {
        "context": "current_turn", "mode": "pro"}}))
