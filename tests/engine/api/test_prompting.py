"""How the worker turns a request into a prompt: the model's template with tools, or the
generic tool prompt when the template knows none; a template's refusal is a 400."""

from __future__ import annotations

import json

import pytest

from engine.errors import BadRequest
from engine.protocol import GenerateRequest
from engine.runtime.request import prepare
from engine.runtime.toolcalls import GENERIC_START

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory):
    import shutil

    from engine.runtime.load import load_model
    folder = tmp_path_factory.mktemp("tpl") / "m"
    shutil.copytree(tiny_model_dir, folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = ("{% if messages[0]['role'] == 'assistant' %}{{ raise_exception("
                            "'Conversations start with the user') }}{% endif %}"
                            + cfg["chat_template"])
    cfg_path.write_text(json.dumps(cfg))
    return load_model(folder, lambda done, total: None)[1]


def test_a_template_without_tools_gets_the_generic_tool_prompt(tiny):
    _, text, splitter, constraint, _ = prepare(tiny, GenerateRequest(messages=ASK, tools=TOOLS))
    assert "get_weather" in text and GENERIC_START in text and constraint is None
    pieces = splitter.feed('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    assert [v.name for k, v in pieces if k == "tool"] == ["get_weather"]


def test_tool_choice_none_leaves_the_tools_out(tiny):
    _, text, _, _, _ = prepare(tiny, GenerateRequest(messages=ASK, tools=TOOLS,
                                                  tool_choice="none"))
    assert "get_weather" not in text


def test_a_named_tool_choice_is_a_grammar_for_that_tool(tiny):
    _, _, _, constraint, _ = prepare(tiny, GenerateRequest(messages=ASK, tools=TOOLS,
                                                        tool_choice={"name": "get_weather"}))
    assert constraint["json_schema"]["properties"]["name"] == {"const": "get_weather"}


def test_a_templates_refusal_is_a_bad_request(tiny):
    with pytest.raises(BadRequest) as e:
        prepare(tiny, GenerateRequest(messages=[{"role": "assistant", "content": "hi"}]))
    assert e.value.param == "messages" and "start with the user" in e.value.message


def test_suffix_without_fim_tokens_is_refused(tiny):
    with pytest.raises(BadRequest) as e:
        prepare(tiny, GenerateRequest(prompt="def f(", suffix="return 1"))
    assert e.value.param == "suffix"
