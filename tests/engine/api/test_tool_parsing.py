"""Tool calls and reasoning split out of streamed text, over every mlx-lm tool parser with
the formats its models really write (a random-weight model can't decide to call a tool, so
the text is given here; test_tools_e2e.py drives the whole path with a forcing model)."""

from __future__ import annotations

import importlib
import json

import pytest

from engine.runtime.toolcalls import OutputSplitter, generic_parse

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "days": {"type": "integer"}},
                   "required": ["city"]}}}]

# parser module -> what its models write for get_weather(city="Paris", days=3)
FORMATS = {
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                  '"days": 3}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                   "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "glm47": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "laguna": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
              "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
               "<|tool_calls_section_end|>",
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
               '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
               '<|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>'
               "<|close|>call<|sep|><|close|>tools<|sep|>",
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>',
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>,"
                      "days:3}<end_function_call>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
    "longcat": "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
               "<longcat_arg_value>Paris</longcat_arg_value>\n<longcat_arg_key>days"
               "</longcat_arg_key>\n<longcat_arg_value>3</longcat_arg_value>\n"
               "</longcat_tool_call>",
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param>'
                '<param name="days">3</param></function>',
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
                  'Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
                  "</minimax:tool_call>",
    "muse_spark": '<atem:function_calls><atem:invoke name="get_weather"><atem:parameter '
                  'name="city">Paris</atem:parameter><atem:parameter name="days">3'
                  "</atem:parameter></atem:invoke></atem:function_calls>",
}


def splitter_for(parser: str, **kw) -> OutputSplitter:
    mod = importlib.import_module(f"mlx_lm.tool_parsers.{parser}")
    return OutputSplitter(tools=(mod.tool_call_start, mod.tool_call_end, mod.parse_tool_call),
                          tool_specs=TOOLS, **kw)


def run(sp: OutputSplitter, text: str, step: int = 3) -> list[tuple[str, object]]:
    out = []
    for i in range(0, len(text), step):  # small pieces: markers arrive split across tokens
        out += sp.feed(text[i:i + step])
    return out + sp.finish()


def test_every_mlx_lm_parser_is_covered():
    import pkgutil

    import mlx_lm.tool_parsers as tp
    have = {m.name for m in pkgutil.iter_modules(tp.__path__)}
    assert have <= set(FORMATS), f"new mlx-lm parsers without a format here: {have - set(FORMATS)}"


@pytest.mark.parametrize("parser", sorted(FORMATS))
def test_each_parser_gives_one_call_with_its_arguments(parser):
    text = "Let me check." + FORMATS[parser]
    pieces = run(splitter_for(parser), text)
    content = "".join(v for k, v in pieces if k == "content")
    calls = [v for k, v in pieces if k == "tool"]
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather"]
    args = json.loads(calls[0].arguments)
    assert args["city"] == "Paris" and int(args["days"]) == 3
    assert calls[0].id


def test_kimi_keeps_the_models_call_id():
    [(_, call)] = run(splitter_for("kimi_k2"), FORMATS["kimi_k2"])
    assert call.id == "functions.get_weather:0"


@pytest.mark.parametrize("parser,text", [
    ("json_tools", FORMATS["json_tools"] + "\n" + FORMATS["json_tools"].replace("Paris", "Oslo")),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}call:get_weather'
               '{city:<|"|>Oslo<|"|>}<tool_call|>'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
])
def test_parallel_calls_come_out_in_order(parser, text):
    pieces = run(splitter_for(parser), text, step=5)
    calls = [v for k, v in pieces if k == "tool"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    assert all(k == "tool" for k, _ in pieces)  # the newline between calls is not content
    assert len({c.id for c in calls}) == 2


def test_a_call_that_does_not_parse_comes_back_as_text():
    sp = splitter_for("json_tools")
    text = "<tool_call>{not json at all</tool_call> sorry"
    pieces = run(sp, text)
    assert "".join(v for k, v in pieces if k == "content") == text
    assert sp.made_calls == 0 and sp.failed_calls == 1


def test_a_call_cut_off_by_max_tokens_comes_back_as_text():
    pieces = run(splitter_for("json_tools"), '<tool_call>{"name": "get_weather", "argu')
    assert pieces == [("content", '<tool_call>{"name": "get_weather", "argu</tool_call>')]


def test_reasoning_is_kept_apart_from_content_and_calls():
    sp = splitter_for("qwen3_coder", think=("<think>", "</think>"))
    text = "<think>The user wants weather.</think>\n\n" + FORMATS["qwen3_coder"]
    pieces = run(sp, text, step=2)
    assert "".join(v for k, v in pieces if k == "reasoning") == "The user wants weather."
    assert [v.name for k, v in pieces if k == "tool"] == ["get_weather"]
    assert not [v for k, v in pieces if k == "content"]


def test_reasoning_opened_by_the_template_starts_in_reasoning():
    sp = OutputSplitter(think=("<think>", "</think>"), reasoning_first=True)
    pieces = run(sp, "hmm, 2+2</think>It is 4.")
    assert pieces == [("reasoning", "hmm, 2+2"), ("content", "It is 4.")] or \
        "".join(v for k, v in pieces if k == "reasoning") == "hmm, 2+2"
    assert "".join(v for k, v in pieces if k == "content") == "It is 4."


def test_text_that_only_looks_like_a_marker_start_is_not_lost():
    pieces = run(splitter_for("json_tools"), "a <tool or <b>", step=1)
    assert "".join(v for _, v in pieces) == "a <tool or <b>"


def test_the_generic_form_parses_one_call_or_several():
    assert generic_parse('{"name": "f", "arguments": {}}') == {"name": "f", "arguments": {}}
    assert len(generic_parse('[{"name": "f"}, {"name": "g", "arguments": {"x": 1}}]')) == 2
    with pytest.raises(ValueError):
        generic_parse('{"arguments": {}}')


# gpt-oss's Harmony channels (mlx-lm has no parser for them; engine/runtime/harmony.py)
HARMONY = ("<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant"
           "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
           '{"city": "Paris", "days": 3}')  # <|call|> is end-of-sequence: not in the text


@pytest.mark.parametrize("text,end", [(HARMONY, ""), (HARMONY, "<|call|>")])
def test_harmony_reasoning_and_tool_call(text, end):
    from engine.runtime.harmony import HarmonySplitter
    pieces = run(HarmonySplitter(), text + end, step=4)
    assert "".join(v for k, v in pieces if k == "reasoning") == "Need the weather tool."
    [call] = [v for k, v in pieces if k == "tool"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris",
                                                                        "days": 3}


def test_harmony_final_answer_streams_as_content():
    from engine.runtime.harmony import HarmonySplitter
    text = ("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Paris is sunny.")
    pieces = run(HarmonySplitter(), text, step=3)
    assert "".join(v for k, v in pieces if k == "content") == "Paris is sunny."
    assert "".join(v for k, v in pieces if k == "reasoning") == "Easy."
    # recipient before the channel, as gpt-oss also writes it
    pieces = run(HarmonySplitter(), "<|start|>assistant to=functions.get_weather<|channel|>"
                 'commentary json<|message|>{"city": "Oslo"}<|call|>')
    assert [v.name for k, v in pieces if k == "tool"] == ["get_weather"]
