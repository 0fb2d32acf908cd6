"""The whole tool path, through official clients (openai, langchain-openai bind_tools,
litellm) against a real node serving a test-only model whose weights force a tool call
(see forcing.py: a real mlx-lm llama whose head maps each token to the next of a chosen
sequence: <think>Checking.</think><tool_call>{get_weather Paris}</tool_call>)."""

from __future__ import annotations

import json

import openai
import pytest

MODEL = "forcing"
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def oai(forcing_node) -> openai.OpenAI:
    return openai.OpenAI(base_url=forcing_node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_tool_call_comes_back_parsed_with_reasoning_apart(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "Checking."


def test_streamed_tool_call_has_openais_delta_shape(oai):
    chunks = list(oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                              stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    first, rest = calls[0], calls[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert all(tc.index == 0 and tc.id is None for tc in rest)
    args = "".join(tc.function.arguments for tc in calls)
    assert json.loads(args) == {"city": "Paris"}
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "Checking."
    assert [c.choices[0].finish_reason for c in chunks
            if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_results_round_trip_through_the_template(oai):
    first = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    again = oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert again.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_tool_choice_none_leaves_the_text_alone(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none")
    assert not r.choices[0].message.tool_calls
    assert "<tool_call>" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_tool_choice_force_a_valid_call(oai, choice):
    tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}}}}]
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=tools,
                                    tool_choice=choice, max_tokens=200)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert r.choices[0].finish_reason == "tool_calls"


def test_bad_tool_requests_are_refused_naming_the_field(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK,
                                    tools=[{"type": "function", "function": {"name": "a b"}}])
    assert e.value.body["param"] == "tools[0].function.name"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK + [
            {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{not json"}}]}])
    assert e.value.body["param"] == "messages[1].tool_calls[0].function.arguments"


def test_langchain_bind_tools_sees_the_call(forcing_node):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL, base_url=forcing_node.url + "/v1", api_key="unused",
                     max_retries=0, timeout=60)
    msg = llm.bind_tools([get_weather]).invoke("What's the weather in Paris?")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather",
                                                                 {"city": "Paris"})]


def test_litellm_sees_the_call(forcing_node, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the internet
    import litellm

    r = litellm.completion(model=f"openai/{MODEL}", api_base=forcing_node.url + "/v1",
                           api_key="unused", messages=ASK, tools=TOOLS, timeout=60)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_parallel_tool_calls_false_ends_at_the_first_call(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                    parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1
    assert r.choices[0].finish_reason == "tool_calls"
