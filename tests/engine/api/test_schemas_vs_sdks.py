"""Shoal's request schemas against the official SDKs' own request types (beta ones too):
every parameter an SDK can send is accepted. Each is honoured, refused with a 400 naming
it when it can't be (only when given a value), or, when it only carries bookkeeping or a
hint, accepted and reported by the request's hints() so the node logs it once. A new SDK
parameter fails here until someone decides which."""

from __future__ import annotations

import pytest

from engine.api import anthropic_schemas, openai_chat, responses_schemas
from engine.api.anthropic_schemas import CountTokensRequest, MessagesRequest
from engine.api.common import parse
from engine.api.openai_completions import CompletionRequest
from engine.api.openai_schemas import ChatCompletionRequest
from engine.api.responses_schemas import ResponsesRequest
from engine.errors import BadRequest


def sdk_params(td: type) -> set[str]:
    return set(td.__annotations__)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}
# field -> a value that can't be honoured: refused with a 400 naming the field
CHAT_REFUSED = {"audio": {"voice": "alloy", "format": "mp3"},
                "functions": [{"name": "f"}], "function_call": "auto",
                "web_search_options": {}}
MESSAGES_REFUSED = {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}],
                    "container": "c1", "compaction": {"instructions": "sum up"},
                    "thread": {"type": "continue", "previous_message_id": "msg_1"}}
RESPONSES_REFUSED = {"previous_response_id": "resp_1", "conversation": "conv_1",
                     "prompt": {"id": "pmpt_1"}, "background": True, "image": {}}


def _cases():
    from anthropic.types.beta.message_count_tokens_params import (
        MessageCountTokensParams as BetaCount,
    )
    from anthropic.types.beta.message_create_params import MessageCreateParamsBase as Beta
    from anthropic.types.message_count_tokens_params import MessageCountTokensParams
    from anthropic.types.message_create_params import MessageCreateParamsBase
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase
    from openai.types.completion_create_params import CompletionCreateParamsBase as Legacy
    from openai.types.responses.response_create_params import ResponseCreateParamsBase

    return [
        (CompletionCreateParamsBase, ChatCompletionRequest, CHAT, CHAT_REFUSED,
         openai_chat.to_request),
        (Legacy, CompletionRequest, {"model": "m", "prompt": "hi"}, {}, None),
        (ResponseCreateParamsBase, ResponsesRequest, RESPONSES, RESPONSES_REFUSED,
         responses_schemas.to_request),
        (MessageCreateParamsBase, MessagesRequest, MESSAGES, MESSAGES_REFUSED,
         anthropic_schemas.to_request),
        (Beta, MessagesRequest, MESSAGES, MESSAGES_REFUSED, anthropic_schemas.to_request),
        (MessageCountTokensParams, CountTokensRequest,
         {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, {}, None),
        (BetaCount, CountTokensRequest,
         {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, {}, None),
    ]


@pytest.mark.parametrize("td,model,minimal,refused,to_request", _cases(),
                         ids=lambda v: getattr(v, "__module__", "").rsplit(".", 2)[-2]
                         if isinstance(v, type) and v.__module__.startswith(("openai",
                                                                             "anthropic"))
                         else "")
def test_every_sdk_parameter_is_accepted(td, model, minimal, refused, to_request):
    fields = set(model.model_fields) | {f.alias for f in model.model_fields.values()
                                        if f.alias}
    assert sdk_params(td) - fields == set(), "unknown to Shoal"
    parse(model, minimal)
    for name, value in refused.items():
        body = parse(model, {**minimal, name: value})  # accepted as a field...
        with pytest.raises(BadRequest) as e:  # ...and refused, naming it, when it matters
            to_request(body)
        assert e.value.param == name, name


@pytest.mark.parametrize("model,minimal,hint", [
    (MessagesRequest, MESSAGES, {"context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"}]}}),
    (MessagesRequest, MESSAGES, {"metadata": {"user_id": "u"}, "service_tier": "auto"}),
    (ResponsesRequest, RESPONSES, {"client_metadata": {"x-codex-turn-metadata": "{}"},
                                   "prompt_cache_key": "k", "store": False}),
    (ChatCompletionRequest, CHAT, {"verbosity": "low", "user": "u"}),
])
def test_bookkeeping_and_hints_are_accepted_and_named_for_the_log(model, minimal, hint):
    body = parse(model, {**minimal, **hint})
    assert set(hint) <= set(body.hints())


def test_a_field_no_official_api_defines_is_still_refused():
    for model, minimal in ((MessagesRequest, MESSAGES), (ResponsesRequest, RESPONSES),
                           (ChatCompletionRequest, CHAT)):
        with pytest.raises(BadRequest) as e:
            parse(model, {**minimal, "temprature": 0.5})  # a typo changes nothing: say so
        assert e.value.param == "temprature"
