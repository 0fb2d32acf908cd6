"""response_format by constrained decoding, logprobs, the default max_tokens and the checks
on every number: the openai SDK against a node serving a random-weight tiny llama (whose
output is noise, so valid JSON can only come from the grammar)."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

MODEL = "tiny-llama"
HELLO = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pet": {"enum": ["cat", "dog", "none"]}}}


@pytest.fixture(scope="module")
def oai(tiny_node) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_is_valid_from_a_random_model(oai, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for seed in (1, 2):
        r = oai.chat.completions.create(model=MODEL, messages=HELLO, response_format=fmt,
                                        temperature=1.0, seed=seed, max_tokens=300,
                                        stream=stream)
        text = "".join(c.choices[0].delta.content or "" for c in r if c.choices) \
            if stream else r.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)


def test_json_object_output_parses(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=HELLO, response_format={"type": "json_object"}, max_tokens=400,
        extra_body={"chat_template_kwargs": {}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut off by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.startswith("{")


def test_openai_parse_with_a_pydantic_model(oai):
    class Pet(BaseModel):
        kind: str = Field(max_length=8)
        legs: int = Field(ge=0, le=8)

    r = oai.chat.completions.parse(model=MODEL, messages=HELLO, response_format=Pet,
                                   max_tokens=200)
    assert isinstance(r.choices[0].message.parsed, Pet)


def test_logprobs_and_top_logprobs(oai):
    r = oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0,
                                    logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert math.isclose(t.logprob, t.top_logprobs[0].logprob, abs_tol=1e-4)  # greedy
    assert "".join(t.token for t in content) == r.choices[0].message.content
    s = list(oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6,
                                         temperature=0, logprobs=True, stream=True))
    streamed = [t for c in s if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_logit_bias_is_honoured(oai, tiny_model_dir):
    from tokenizers import Tokenizer

    def first(**kw) -> str:
        r = oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1,
                                        temperature=0, **kw)
        return r.choices[0].message.content
    plain = first()
    [tid] = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode(plain).ids
    assert first(logit_bias={str(tid): -100}) != plain


def test_without_max_tokens_the_rest_of_the_context_is_allowed(oai):
    long = [{"role": "user", "content": "x" * 3900}]  # 4096 context, one token per byte
    r = oai.chat.completions.create(model=MODEL, messages=long, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 4096


@pytest.mark.parametrize("field,value", [
    ("temperature", "NaN"), ("top_p", "NaN"), ("min_p", "Infinity"),
    ("repetition_penalty", "NaN"), ("presence_penalty", "-Infinity"),
    ("frequency_penalty", 3), ("presence_penalty", -2.5), ("top_logprobs", 21),
    ("logit_bias", {"abc": 1}), ("logit_bias", {"5": 500}), ("n", 3),
    ("tools", [{"type": "function"}]), ("functions", []), ("response_format", {"type": "xml"}),
])
def test_bad_numbers_and_fields_are_a_400_naming_the_field(tiny_node, field, value):
    raw = json.dumps({"model": MODEL, "messages": HELLO})[:-1]
    raw += f', "{field}": {value if isinstance(value, str) else json.dumps(value)}}}'
    r = httpx.post(tiny_node.url + "/v1/chat/completions", content=raw,
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(field)


def test_deeply_nested_json_is_a_400_not_a_crash(tiny_node):
    raw = '{"model": "tiny-llama", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(tiny_node.url + "/v1/chat/completions", content=raw,
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert tiny_node.client.health().ok


def test_a_schema_that_cant_be_enforced_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=HELLO, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}})
    assert e.value.body["param"] == "response_format"
    assert oai.chat.completions.create(model=MODEL, messages=HELLO,
                                       max_tokens=2).usage.completion_tokens == 2


def test_a_template_without_tools_still_gets_forced_calls_right(oai):
    # tiny-llama's ChatML template knows no tools: they go in a generic system message,
    # and tool_choice "required" is enforced by the grammar even on random weights.
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "required": ["id"], "additionalProperties": False,
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}}}}}]
    r = oai.chat.completions.create(model=MODEL, messages=HELLO, tools=tools,
                                    tool_choice="required", max_tokens=100)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "lookup"
    assert 0 <= json.loads(call.function.arguments)["id"] <= 99
    auto = oai.chat.completions.create(model=MODEL, messages=HELLO, tools=tools, max_tokens=5)
    assert auto.choices[0].finish_reason == "length"  # noise, but served


def test_structured_output_in_the_other_protocols(tiny_node):
    import anthropic
    fmt = {"type": "object", "required": ["ok"], "additionalProperties": False,
           "properties": {"ok": {"type": "boolean"}}}
    c = openai.OpenAI(base_url=tiny_node.url + "/v1", api_key="x", max_retries=0)
    r = c.responses.create(model=MODEL, input="ok?", max_output_tokens=50, text={
        "format": {"type": "json_schema", "name": "ok", "schema": fmt}})
    assert isinstance(json.loads(r.output_text)["ok"], bool)
    a = anthropic.Anthropic(base_url=tiny_node.url, api_key="x", max_retries=0)
    m = a.messages.create(model=MODEL, max_tokens=50, messages=HELLO,
                          output_config={"format": {"type": "json_schema", "schema": fmt}})
    assert isinstance(json.loads(m.content[0].text)["ok"], bool)


def test_langchain_with_structured_output(tiny_node):
    from langchain_openai import ChatOpenAI

    class Verdict(BaseModel):
        ok: bool
        score: int = Field(ge=0, le=9)

    llm = ChatOpenAI(model=MODEL, base_url=tiny_node.url + "/v1", api_key="x", max_retries=0,
                     max_tokens=60, timeout=60)
    for method in ("json_schema", "function_calling"):
        v = llm.with_structured_output(Verdict, method=method).invoke("Judge this.")
        assert isinstance(v, Verdict), method
