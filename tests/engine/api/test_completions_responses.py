"""/v1/completions and /v1/responses through the openai SDK: the random tiny llama for text,
the forcing model (forcing.py) for reasoning items and function calls."""

from __future__ import annotations

import json

import openai
import pytest

TINY, FORCING = "tiny-llama", "forcing"
WEATHER = [{"type": "function", "name": "get_weather", "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def oai(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_completion_text_echo_and_stream(tiny_node):
    c = oai(tiny_node)
    r = c.completions.create(model=TINY, prompt="def fib(n):", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 10
    assert r.choices[0].finish_reason == "length"
    echoed = c.completions.create(model=TINY, prompt="def fib(n):", max_tokens=10,
                                  temperature=0, echo=True)
    assert echoed.choices[0].text == "def fib(n):" + r.choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=TINY, prompt="def fib(n):", max_tokens=10, temperature=0, stream=True)
        if ch.choices)
    assert streamed == r.choices[0].text


def test_completion_from_token_ids_and_logprobs(tiny_node):
    c = oai(tiny_node)
    ids = list(b"hello")  # not the tokenizer's ids, but valid ones
    r = c.completions.create(model=TINY, prompt=ids, max_tokens=4, logprobs=2)
    assert r.usage.prompt_tokens == 5
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text


def test_completion_refusals(tiny_node):
    c = oai(tiny_node)
    for kw, param in [({"suffix": "return x"}, "suffix"), ({"n": 2}, "n"),
                      ({"prompt": ["a", "b"]}, "prompt"),
                      ({"prompt": [999999]}, "prompt")]:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(**{"model": TINY, "prompt": "x", "max_tokens": 2, **kw})
        assert e.value.body["param"] == param, kw


def test_response_text_and_streamed_events(tiny_node):
    c = oai(tiny_node)
    r = c.responses.create(model=TINY, input="Hello", instructions="Be brief.",
                           max_output_tokens=8, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.usage.output_tokens == 8
    kinds, final = [], None
    for ev in c.responses.create(model=TINY, input=[{"role": "user", "content": "Hello"}],
                                 instructions="Be brief.", max_output_tokens=8,
                                 temperature=0, stream=True):
        kinds.append(ev.type)
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert final.output_text == r.output_text


def test_response_function_call_round_trip(forcing_node):
    c = oai(forcing_node)
    r = c.responses.create(model=FORCING, input="Weather in Paris?", tools=WEATHER)
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "function_call"]
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    events = [ev.type for ev in c.responses.create(model=FORCING, input="Weather?",
                                                   tools=WEATHER, stream=True)]
    assert "response.function_call_arguments.done" in events
    assert "response.reasoning_text.delta" in events and events[-1] == "response.completed"
    again = c.responses.create(model=FORCING, tools=WEATHER, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    assert again.usage.input_tokens > r.usage.input_tokens


def test_previous_response_id_is_refused(tiny_node):
    with pytest.raises(openai.BadRequestError) as e:
        oai(tiny_node).responses.create(model=TINY, input="hi", previous_response_id="r_1")
    assert e.value.body["param"] == "previous_response_id"
    assert "stateless" in e.value.body["message"]
