"""The JSON Shoal sends on Ollama's routes, as TypedDicts: the shapes of the ollama
library's ChatResponse, GenerateResponse and ListResponse (tests/engine/api/
test_renderers.py parses our lines with them; test_ollama_api.py reads a node's with the
library itself)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from engine.api.render import Drafts


class Details(TypedDict, total=False):
    parent_model: str
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str | None


class Entry(TypedDict):
    """A model in /api/tags (and, with its expiry, /api/ps)."""
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class Function(TypedDict):
    name: str
    arguments: dict[str, Any]  # an object, as Ollama sends it (not a JSON text)


class ToolCall(TypedDict):
    id: str
    function: Function


class Message(TypedDict):
    role: str
    content: str
    thinking: NotRequired[str]
    tool_calls: NotRequired[list[ToolCall]]


class Piece(TypedDict, total=False):
    """What one streamed event adds to its line."""
    content: str
    thinking: str
    tool_calls: list[ToolCall]
    logprobs: list[dict[str, Any]]  # TokenLogprob.to_json


class Line(TypedDict):
    """One NDJSON line of /api/chat or /api/generate; the last (done) has the counts."""
    model: str
    created_at: str
    done: bool
    done_reason: NotRequired[str]
    total_duration: NotRequired[int]  # nanoseconds, as Ollama counts
    load_duration: NotRequired[int]
    prompt_eval_count: NotRequired[int]
    prompt_eval_duration: NotRequired[int]
    eval_count: NotRequired[int]
    eval_duration: NotRequired[int]
    speculative: NotRequired[Drafts]
    message: NotRequired[Message]  # /api/chat
    response: NotRequired[str]  # /api/generate
    thinking: NotRequired[str]
    tool_calls: NotRequired[list[ToolCall]]
    logprobs: NotRequired[list[dict[str, Any]]]  # beside the message, where Ollama reads them


class ErrorLine(TypedDict):
    error: str
