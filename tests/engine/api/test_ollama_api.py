"""Ollama's API through the official ollama client: chat and generate (streamed NDJSON and
whole), list/show/ps/version, HEAD /, tool calls from the forcing model (forcing.py)."""

from __future__ import annotations

import httpx
import ollama
import pytest

TINY, FORCING = "tiny-llama", "forcing"
HELLO = [{"role": "user", "content": "Hello there"}]


def client(node) -> ollama.Client:
    return ollama.Client(host=node.url, timeout=60)


def test_chat_whole_and_streamed_agree(tiny_node):
    c = client(tiny_node)
    whole = c.chat(model=TINY, messages=HELLO, options={"num_predict": 12, "temperature": 0})
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    assert whole.prompt_eval_count > 5 and whole.message.role == "assistant"
    parts = list(c.chat(model=TINY, messages=HELLO, stream=True,
                        options={"num_predict": 12, "temperature": 0}))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done


def test_generate_with_system_and_raw(tiny_node):
    c = client(tiny_node)
    r = c.generate(model=TINY + ":latest", prompt="Once upon", system="Tell a story.",
                   options={"num_predict": 8})
    assert r.done and r.eval_count == 8 and r.response
    raw = list(c.generate(model=TINY, prompt="abc", raw=True, stream=True,
                          options={"num_predict": 5, "stop": ["zzz"]}))
    assert raw[-1].done and raw[-1].prompt_eval_count == 3  # one token per byte, no template


def test_json_format_gives_an_object(tiny_node):
    import json
    r = client(tiny_node).chat(model=TINY, messages=HELLO, options={"num_predict": 200},
                               format={"type": "object", "required": ["ok"],
                                       "additionalProperties": False,
                                       "properties": {"ok": {"type": "boolean"}}})
    assert isinstance(json.loads(r.message.content)["ok"], bool)


def test_list_show_ps_version_and_head(tiny_node):
    c = client(tiny_node)
    assert TINY in [m.model for m in c.list().models]
    info = c.show(TINY + ":latest")  # the tag Ollama clients add by default
    assert info.modelinfo["llama.context_length"] == 4096
    assert TINY in [m.model for m in c.ps().models]
    assert httpx.get(tiny_node.url + "/api/version").json()["version"]
    assert httpx.head(tiny_node.url + "/").status_code == 200


def test_errors_are_ollamas_shape(tiny_node):
    with pytest.raises(ollama.ResponseError) as e:
        client(tiny_node).chat(model="nope", messages=HELLO)
    assert e.value.status_code == 404 and "nope" in e.value.error
    r = httpx.post(tiny_node.url + "/api/chat", timeout=30, json={
        "model": TINY, "messages": HELLO, "options": {"mirostat": 2}})
    assert r.status_code == 400 and "options.mirostat" in r.json()["error"]


def test_tool_calls_and_thinking(forcing_node):
    r = client(forcing_node).chat(model=FORCING, messages=[
        {"role": "user", "content": "Weather in Paris?"}], tools=[{
            "type": "function", "function": {"name": "get_weather", "description": "weather",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}}}}])
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.message.thinking == "Checking."


def test_num_ctx_limits_the_window(tiny_node):
    c = client(tiny_node)
    r = c.generate(model=TINY, prompt="abcdefghij", raw=True, options={"num_ctx": 16})
    assert r.done_reason == "length" and r.prompt_eval_count + r.eval_count == 16
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model=TINY, prompt="x" * 40, raw=True, options={"num_ctx": 16})
    assert e.value.status_code == 400
