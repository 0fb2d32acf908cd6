"""Shoal's request schemas against the official SDKs' own request types: every parameter an
SDK can send is either understood or refused with a 400 naming it, never dropped; a new SDK
parameter fails here until someone decides which."""

from __future__ import annotations

import pytest

from engine.api.anthropic_schemas import CountTokensRequest, MessagesRequest
from engine.api.common import parse
from engine.api.openai_completions import CompletionRequest
from engine.api.openai_schemas import ChatCompletionRequest
from engine.api.responses_schemas import ResponsesRequest
from engine.errors import BadRequest


def sdk_params(td: type) -> set[str]:
    return set(td.__annotations__)


def _cases():
    from anthropic.types.message_count_tokens_params import MessageCountTokensParams
    from anthropic.types.message_create_params import MessageCreateParamsBase
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase
    from openai.types.completion_create_params import CompletionCreateParamsBase as Legacy
    from openai.types.responses.response_create_params import ResponseCreateParamsBase

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return [
        (CompletionCreateParamsBase, ChatCompletionRequest, chat,
         {"audio", "function_call", "functions", "moderation", "prediction", "verbosity",
          "web_search_options"}),
        (Legacy, CompletionRequest, {"model": "m", "prompt": "hi"}, set()),
        (ResponseCreateParamsBase, ResponsesRequest, {"model": "m", "input": "hi"},
         {"access_programs", "background_options", "context_management", "conversation",
          "image", "max_tool_calls", "moderation", "prompt"}),
        (MessageCreateParamsBase, MessagesRequest,
         {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
         {"container", "diagnostics"}),
        (MessageCountTokensParams, CountTokensRequest,
         {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, set()),
    ]


@pytest.mark.parametrize("td,model,minimal,refused", _cases(),
                         ids=lambda v: getattr(v, "__name__", ""))
def test_every_sdk_parameter_is_understood_or_refused(td, model, minimal, refused):
    fields = set(model.model_fields) | {f.alias for f in model.model_fields.values()
                                        if f.alias}
    assert sdk_params(td) - fields == refused
    parse(model, minimal)
    for name in sorted(refused):
        with pytest.raises(BadRequest) as e:
            parse(model, {**minimal, name: {"x": 1}})
        assert e.value.param == name
