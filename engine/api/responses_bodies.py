"""The JSON Shoal sends on /v1/responses, as TypedDicts: the shapes of the openai SDK's
Response and its output items (tests/engine/api/test_renderers.py parses the stream's
events with them; test_completions_responses.py reads a node's with the SDK itself)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from engine.api.render import Drafts


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[object]
    logprobs: list[dict[str, Any]]  # TokenLogprob.to_json


class ReasoningText(TypedDict):
    type: Literal["reasoning_text"]
    text: str


class MessageItem(TypedDict):
    type: Literal["message"]
    id: str
    status: str
    role: str
    content: list[OutputText]


class ReasoningItem(TypedDict):
    type: Literal["reasoning"]
    id: str
    summary: list[object]
    content: list[ReasoningText]


class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    namespace: NotRequired[str]  # a tool from a namespace (Codex's MCP tools)


class CustomCallItem(TypedDict):
    """A freeform tool's call: its input is plain text, not JSON arguments."""
    type: Literal["custom_tool_call"]
    id: str
    call_id: str
    name: str
    input: str
    status: str


Item = MessageItem | ReasoningItem | FunctionCallItem | CustomCallItem


class InputDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int  # what this prompt added to the prefix cache


class OutputDetails(TypedDict):
    reasoning_tokens: int


class Usage(TypedDict):
    input_tokens: int
    input_tokens_details: InputDetails
    output_tokens: int
    output_tokens_details: OutputDetails
    total_tokens: int
    speculative: Drafts


class Failure(TypedDict):
    code: str
    message: str


class Incomplete(TypedDict):
    reason: str


class TextFormat(TypedDict):
    type: str


class TextConfig(TypedDict):
    format: TextFormat


class Response(TypedDict):
    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[Item]
    error: Failure | None
    incomplete_details: Incomplete | None
    instructions: str | None
    metadata: dict[str, Any]  # the client's own, sent back as it came
    parallel_tool_calls: bool
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    previous_response_id: None
    tool_choice: object  # as the request named it
    tools: list[object]  # the request's tools, as it sent them
    text: TextConfig
    usage: Usage | None
