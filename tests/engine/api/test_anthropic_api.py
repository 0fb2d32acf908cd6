"""Anthropic Messages through the official anthropic SDK: text from the random tiny llama,
thinking and tool_use from the forcing model (forcing.py), streaming events in order."""

from __future__ import annotations

import anthropic
import httpx
import pytest

TINY, FORCING = "tiny-llama", "forcing"
HELLO = [{"role": "user", "content": "Hello there"}]
WEATHER = [{"name": "get_weather", "description": "Current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]


def client(node) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=60)


def test_text_message_and_usage(tiny_node):
    m = client(tiny_node).messages.create(model=TINY, max_tokens=12, messages=HELLO,
                                          system="Be brief.")
    assert m.type == "message" and m.role == "assistant" and m.model == TINY
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 12
    assert m.content[0].type == "text" and m.content[0].text
    assert m.usage.input_tokens > 5


def test_streamed_text_matches_and_events_come_in_order(tiny_node):
    c = client(tiny_node)
    whole = c.messages.create(model=TINY, max_tokens=15, messages=HELLO)
    with c.messages.stream(model=TINY, max_tokens=15, messages=HELLO) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == "max_tokens"
    with httpx.stream("POST", tiny_node.url + "/v1/messages", timeout=30, json={
            "model": TINY, "max_tokens": 5, "messages": HELLO, "stream": True}) as r:
        raw = [ln[7:] for ln in r.iter_lines() if ln.startswith("event: ")]
    assert raw[:3] == ["message_start", "ping", "content_block_start"]
    assert raw[-4:] == ["content_block_delta", "content_block_stop", "message_delta",
                        "message_stop"]


def test_stop_sequences_name_the_one_hit(tiny_node):
    c = client(tiny_node)
    text = c.messages.create(model=TINY, max_tokens=30, messages=HELLO,
                             ).content[0].text
    stop = text[8:11]
    m = c.messages.create(model=TINY, max_tokens=30, messages=HELLO,
                          stop_sequences=[stop, "zzzz-never"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[:text.index(stop)]


def test_count_tokens(tiny_node):
    c = client(tiny_node)
    n = c.messages.count_tokens(model=TINY, messages=HELLO).input_tokens
    m = c.messages.create(model=TINY, max_tokens=1, messages=HELLO)
    # as Anthropic counts them: prompt tokens read from the cache are apart
    assert n == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_tool_use_and_thinking_blocks(forcing_node):
    m = client(forcing_node).messages.create(
        model=FORCING, max_tokens=100, tools=WEATHER,
        messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert m.stop_reason == "tool_use"
    thinking, use = m.content
    assert thinking.type == "thinking" and thinking.thinking == "Checking."
    assert use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "Paris"} and use.id


def test_streamed_tool_use_and_the_result_round_trip(forcing_node):
    c = client(forcing_node)
    with c.messages.stream(model=FORCING, max_tokens=100, tools=WEATHER,
                           messages=[{"role": "user", "content": "Weather in Paris?"}]) as s:
        final = s.get_final_message()
    use = final.content[-1]
    assert use.type == "tool_use" and use.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    again = c.messages.create(model=FORCING, max_tokens=100, tools=WEATHER, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "18 C"}]}])
    assert again.usage.input_tokens > final.usage.input_tokens


def test_x_api_key_and_version_headers_and_error_shape(tiny_node):
    r = httpx.post(tiny_node.url + "/v1/messages", timeout=30, headers={
        "x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={"model": TINY, "messages": HELLO})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "'max_tokens' is required."}}
    with pytest.raises(anthropic.BadRequestError):
        client(tiny_node).messages.create(model=TINY, max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    with pytest.raises(anthropic.NotFoundError):
        client(tiny_node).messages.create(model="claude-x", max_tokens=5, messages=HELLO)


def test_models_are_listed_in_anthropics_shape(tiny_node):
    c = client(tiny_node)
    assert TINY in [m.id for m in c.models.list().data]
    m = c.models.retrieve(TINY)
    assert m.type == "model" and m.max_input_tokens == 4096
