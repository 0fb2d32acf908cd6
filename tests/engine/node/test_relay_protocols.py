"""Every protocol through another node's relay to a distributed instance: a pipeline of the
forcing model (tests/engine/api/forcing.py, weights that force a reasoning + tool call) over
two real nodes, asked through the node that doesn't own it. This also drives the group's
rank 0 (lockstep generation) through tool parsing and constrained decoding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from forcing import make_forcing_model  # noqa: E402

from nodes import start_cluster  # noqa: E402
from tests_support import wait_until  # noqa: E402

MODEL = "forcing"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    root = tmp_path_factory.mktemp("relay")
    a, b = start_cluster(root, make_forcing_model(root / "models" / MODEL), 2)
    try:
        bid = b.client.status().cluster.id
        r = httpx.post(a.url + "/shoal/instances", timeout=300, json={
            "model": MODEL, "strategy": "pipeline",
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": bid, "layers": [2, 4]}]})
        assert r.status_code == 201, r.text
        wait_until(lambda: any(m.id == MODEL for m in b.client.models()), 15)
        yield b  # b owns no rank 0: everything it serves goes through its relay
    finally:
        a.stop()
        b.stop()


def test_openai_tools_streamed_through_the_relay(relay):
    c = openai.OpenAI(base_url=relay.url + "/v1", api_key="x", max_retries=0, timeout=60)
    chunks = list(c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                            stream=True))
    args = "".join(tc.function.arguments for ch in chunks if ch.choices
                   for tc in ch.choices[0].delta.tool_calls or [])
    assert json.loads(args) == {"city": "Paris"}
    r = c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "w", "schema": {
            "type": "object", "required": ["ok"], "additionalProperties": False,
            "properties": {"ok": {"type": "boolean"}}}}})
    assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool)
    text = c.completions.create(model=MODEL, prompt="abc", max_tokens=3)
    assert text.usage.completion_tokens >= 1
    resp = c.responses.create(model=MODEL, input="Weather?", tools=[
        {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"][
            "parameters"]}])
    assert [o.type for o in resp.output] == ["reasoning", "function_call"]


def test_anthropic_and_ollama_through_the_relay(relay):
    a = anthropic.Anthropic(base_url=relay.url, api_key="x", max_retries=0, timeout=60)
    with a.messages.stream(model=MODEL, max_tokens=50, messages=ASK, tools=[{
            "name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}
    assert a.messages.count_tokens(model=MODEL, messages=ASK).input_tokens > 5
    oc = ollama.Client(host=relay.url, timeout=60)
    o = oc.chat(model=MODEL, messages=ASK, tools=TOOLS)
    assert o.message.tool_calls[0].function.arguments == {"city": "Paris"}
    assert MODEL in [m.model for m in oc.list().models]
