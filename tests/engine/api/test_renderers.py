"""Each protocol's renderer, with no node and no HTTP: a list of internal events in, the
exact wire lines out, in milliseconds. Ids, clocks and times are fixed through the
renderer's Context; every event a renderer writes is also checked against the official
SDK's own type for it."""

from __future__ import annotations

import json

import pytest

from engine import protocol as wire
from engine.api.anthropic import MessagesRenderer
from engine.api.anthropic_schemas import MessagesRequest
from engine.api.ollama import OllamaRenderer
from engine.api.ollama_schemas import ChatRequest
from engine.api.openai_chat import ChatRenderer
from engine.api.openai_completions import CompletionRenderer, CompletionRequest
from engine.api.openai_responses import ResponsesRenderer
from engine.api.openai_schemas import ChatCompletionRequest
from engine.api.render import Answer, Context, render_stream
from engine.api.responses_schemas import ResponsesRequest
from engine.records import TokenLogprob, TopLogprob

HELLO = [{"role": "user", "content": "hi"}]
TEXT = [wire.Delta("r", "Hel"), wire.Delta("r", "lo"),
        wire.Done("r", "stop", 10, 2, 100.0, 20.0, 0.5, cached_tokens=4)]
CALL = [wire.Delta("r", "thinking…", "reasoning"), wire.ToolCall("r", "call_1", "f", '{"a":1}'),
        wire.Done("r", "tool_calls", 10, 3, cached_tokens=0)]
FAILED = [wire.Delta("r", "Hel"), wire.Error("r", "worker_failed", "The worker died.")]


def ctx(**kw) -> Context:
    return Context("m", 10, ids=lambda prefix: f"{prefix}ID", now=lambda: 1000.0,
                   clock=lambda: 5.25, t0=5.0, **kw)


def lines(raw: bytes) -> list[str]:
    return [x for x in raw.decode().split("\n") if x]


def datas(raw: bytes) -> list[dict]:
    return [json.loads(x[6:]) for x in lines(raw) if x.startswith("data: {")]


def test_openai_chat_stream():
    r = ChatRenderer(ChatCompletionRequest(messages=HELLO, stream=True,
                                           stream_options={"include_usage": True}), ctx())
    out = render_stream(r, TEXT)
    head = '{"id":"chatcmpl-ID","created":1000,"model":"m","object":"chat.completion.chunk"'
    assert lines(out) == [
        f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
        '"finish_reason":null}]}',
        f'data: {head},"choices":[{{"index":0,"delta":{{"content":"Hel"}},'
        '"finish_reason":null}]}',
        f'data: {head},"choices":[{{"index":0,"delta":{{"content":"lo"}},'
        '"finish_reason":null}]}',
        f'data: {head},"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}],'
        '"shoal":{"ttft_s":0.25,"prompt_tps":100.0,"generation_tps":20.0,'
        '"peak_memory_gb":0.5}}',
        f'data: {head},"choices":[],"usage":{{"prompt_tokens":10,"completion_tokens":2,'
        '"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4},'
        '"completion_tokens_details":{"accepted_prediction_tokens":0,'
        '"rejected_prediction_tokens":0},'
        '"speculative":{"drafted_tokens":0,"accepted_tokens":0}},'
        '"shoal":{"ttft_s":0.25,"prompt_tps":100.0,"generation_tps":20.0,'
        '"peak_memory_gb":0.5}}',
        "data: [DONE]"]
    from openai.types.chat import ChatCompletionChunk
    for d in datas(out):
        ChatCompletionChunk.model_validate(d)


def test_openai_chat_tool_call_reasoning_progress_and_error():
    r = ChatRenderer(ChatCompletionRequest(messages=HELLO, stream=True), ctx())
    out = render_stream(r, [wire.Progress("r", 4, 8, 10), *CALL])
    assert lines(out)[1] == ": shoal-progress 4 8 10"  # for Shoal's own client only
    deltas = [d["choices"][0]["delta"] for d in datas(out)]
    assert deltas[1] == {"reasoning_content": "thinking…"}
    assert deltas[2]["tool_calls"][0] == {"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "f", "arguments": ""}}
    assert deltas[3]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    failed = datas(render_stream(ChatRenderer(
        ChatCompletionRequest(messages=HELLO, stream=True), ctx()), FAILED))
    assert failed[-1] == {"error": {"message": "The worker died.", "type": "server_error",
                                    "param": None, "code": "worker_failed"}}


def test_openai_chat_answer():
    a = Answer(content="Hello", done=TEXT[-1])
    body = ChatRenderer(ChatCompletionRequest(messages=HELLO), ctx()).answer(a)
    from openai.types.chat import ChatCompletion
    ChatCompletion.model_validate(body)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_completions_stream_with_echo():
    r = CompletionRenderer(CompletionRequest(prompt="Say", stream=True, echo=True),
                           ctx(prompt_text="Say"))
    texts = [d["choices"][0]["text"] for d in datas(render_stream(r, TEXT))]
    assert texts == ["Say", "Hel", "lo", ""]
    assert lines(render_stream(r, []))[-1] == "data: [DONE]"


def test_anthropic_stream():
    body = MessagesRequest(model="m", max_tokens=5, messages=HELLO, stream=True)
    out = render_stream(MessagesRenderer(body, ctx(cached=4)), [*CALL[:1], *TEXT])
    events = [x[7:] for x in lines(out) if x.startswith("event: ")]
    assert events == ["message_start", "ping", "content_block_start", "content_block_delta",
                      "content_block_delta", "content_block_stop", "content_block_start",
                      "content_block_delta", "content_block_delta", "content_block_stop",
                      "message_delta", "message_stop"]
    start = datas(out)[0]["message"]["usage"]
    assert start == {"input_tokens": 6, "output_tokens": 1, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 4}
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter
    adapter = TypeAdapter(RawMessageStreamEvent)
    for d in datas(out):
        if d["type"] != "ping":
            adapter.validate_python(d)
    failed = lines(render_stream(MessagesRenderer(body, ctx()), FAILED))
    assert failed[-2:] == ["event: error", 'data: {"type":"error","error":{"type":'
                           '"api_error","message":"The worker died."}}']


def test_responses_stream_numbers_its_events_and_fails_with_response_failed():
    body = ResponsesRequest(input="hi", stream=True)
    out = render_stream(ResponsesRenderer(body, ctx()), CALL)
    kinds = [d["type"] for d in datas(out)]
    assert kinds == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added",
                     "response.reasoning_text.delta", "response.reasoning_text.done",
                     "response.output_item.done", "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    assert [d["sequence_number"] for d in datas(out)] == list(range(len(kinds)))
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter
    adapter = TypeAdapter(ResponseStreamEvent)
    for d in datas(out):
        adapter.validate_python(d)
    failed = datas(render_stream(ResponsesRenderer(body, ctx()), FAILED))
    assert failed[-1]["type"] == "response.failed"
    assert failed[-1]["response"]["error"] == {"code": "worker_failed",
                                               "message": "The worker died."}


@pytest.mark.parametrize("chat", [True, False])
def test_ollama_ndjson(chat):
    r = OllamaRenderer(ChatRequest(model="m", messages=HELLO), ctx(), chat=chat)
    rows = [json.loads(x) for x in lines(render_stream(r, TEXT))]
    assert [row["done"] for row in rows] == [False, False, True]
    assert rows[-1]["total_duration"] == 250_000_000 and rows[-1]["eval_count"] == 2
    assert rows[0]["created_at"] == "1970-01-01T00:16:40Z"
    import ollama
    for row in rows:
        (ollama.ChatResponse if chat else ollama.GenerateResponse).model_validate(row)


LP = [TokenLogprob("Hi", -0.25, [72, 105], [TopLogprob("Hi", -0.25, [72, 105]),
                                                 TopLogprob("Yo", -1.5, [89, 111])])]
LP_JSON = [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105],
            "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]},
                             {"token": "Yo", "logprob": -1.5, "bytes": [89, 111]}]}]
WITH_LP = [wire.Delta("r", "Hi", logprobs=LP), wire.Done("r", "stop", 10, 1)]


def test_logprobs_are_spelled_as_each_protocol_does():
    """A token's log-probabilities reach OpenAI chat (streamed and whole), the Responses
    API and Ollama as {token, logprob, bytes, top_logprobs}, and the completions API as its
    older parallel lists; each checked against the official SDK's type."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.completion_choice import Logprobs

    chat = ChatRenderer(ChatCompletionRequest(messages=HELLO, stream=True, logprobs=True,
                                              top_logprobs=2), ctx())
    chunk = datas(render_stream(chat, WITH_LP))[1]
    ChatCompletionChunk.model_validate(chunk)
    assert chunk["choices"][0]["logprobs"] == {"content": LP_JSON, "refusal": None}
    whole = ChatRenderer(ChatCompletionRequest(messages=HELLO, logprobs=True), ctx())
    body = whole.answer(Answer(content="Hi", logprobs=LP, done=WITH_LP[-1]))
    ChatCompletion.model_validate(body)
    assert body["choices"][0]["logprobs"]["content"] == LP_JSON

    old = CompletionRenderer(CompletionRequest(prompt="Say", stream=True, logprobs=2), ctx())
    first = datas(render_stream(old, WITH_LP))[0]
    Logprobs.model_validate(first["choices"][0]["logprobs"])
    assert first["choices"][0]["logprobs"] == {
        "tokens": ["Hi"], "token_logprobs": [-0.25], "top_logprobs": [{"Hi": -0.25, "Yo": -1.5}],
        "text_offset": [0]}

    resp = ResponsesRenderer(ResponsesRequest(input="hi", stream=True), ctx())
    delta = next(json.loads(x[6:]) for x in lines(render_stream(resp, WITH_LP))
                 if x.startswith("data: ") and "output_text.delta" in x)
    assert delta["logprobs"] == LP_JSON

    import ollama
    row = json.loads(lines(render_stream(
        OllamaRenderer(ChatRequest(model="m", messages=HELLO), ctx(), chat=True),
        WITH_LP))[0])
    assert ollama.ChatResponse.model_validate(row).logprobs[0].top_logprobs[1].token == "Yo"
    assert row["logprobs"] == LP_JSON  # beside the message, where the SDK reads them


def test_logprobs_cross_the_worker_pipe_as_records():
    line = wire.encode(WITH_LP[0])
    assert json.loads(line)["logprobs"] == LP_JSON
    assert wire.decode(line) == WITH_LP[0]
