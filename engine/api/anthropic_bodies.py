"""The JSON Shoal sends on /v1/messages, as TypedDicts: the shapes of the anthropic SDK's
Message, its content blocks, Usage and ErrorResponse (tests/engine/api/test_renderers.py
parses the stream's events with them; test_anthropic_api.py reads a node's with the SDK)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from engine.api.render import Drafts


class ErrorInfo(TypedDict):
    type: str
    message: str


class ErrorBody(TypedDict):
    type: Literal["error"]
    error: ErrorInfo


class Usage(TypedDict):
    input_tokens: int  # those not read from the prefix cache
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    speculative: NotRequired[Drafts]


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str  # empty: a local model signs nothing


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]  # the call's arguments


Block = TextBlock | ThinkingBlock | ToolUseBlock


class Message(TypedDict):
    id: str
    type: Literal["message"]
    role: str
    model: str
    content: list[Block]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage


class TokenCount(TypedDict):
    input_tokens: int
