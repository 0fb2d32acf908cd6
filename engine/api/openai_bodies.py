"""The JSON bodies Shoal sends on the OpenAI routes, as TypedDicts: the shapes of the
openai SDK's ChatCompletion, ChatCompletionChunk, Completion and Model (its types are the
truth: tests/engine/api/test_renderers.py parses ours with them; test_openai_api.py reads
a node's with the SDK itself)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from engine.api.dialect_render import RunningUsage
from engine.api.render import Drafts, Speed

PromptLogprobs = list[dict[str, dict[str, Any]] | None]  # vLLM's, keyed by token id


class PromptDetails(TypedDict):
    cached_tokens: int


class CompletionDetails(TypedDict):
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails
    completion_tokens_details: CompletionDetails
    speculative: Drafts


class FunctionJSON(TypedDict, total=False):
    name: str
    arguments: str  # a JSON text, as OpenAI sends it


class ToolCallJSON(TypedDict, total=False):
    index: int  # streamed calls only
    id: str
    type: str
    function: FunctionJSON


class ChoiceLogprobs(TypedDict):
    content: list[dict[str, Any]]  # TokenLogprob.to_json
    refusal: None


class ChunkDelta(TypedDict, total=False):
    role: str
    content: str
    reasoning_content: str
    tool_calls: list[ToolCallJSON]


class ChunkChoice(TypedDict):
    index: int
    delta: ChunkDelta
    finish_reason: str | None
    logprobs: NotRequired[ChoiceLogprobs | None]


class Message(TypedDict):
    role: str
    content: str | None
    reasoning_content: NotRequired[str]
    tool_calls: NotRequired[list[ToolCallJSON]]


class Choice(TypedDict):
    index: int
    finish_reason: str
    message: Message
    logprobs: ChoiceLogprobs | None


class Head(TypedDict):
    """What every body and chunk of one answer repeats."""
    id: str
    created: int
    model: str


class Chunk(Head):
    object: str
    choices: list[ChunkChoice]
    usage: NotRequired[Usage | RunningUsage]  # every chunk's: vLLM's continuous usage
    shoal: NotRequired[Speed]
    prompt_logprobs: NotRequired[PromptLogprobs]  # vLLM's, on the finishing chunk


class ChatCompletion(Head):
    object: str
    choices: list[Choice]
    usage: Usage
    shoal: Speed
    prompt_logprobs: NotRequired[PromptLogprobs]


class LegacyLogprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None  # None: the prompt's first token
    text_offset: list[int]


class TextChoice(TypedDict):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: str | None
    prompt_logprobs: NotRequired[PromptLogprobs]  # vLLM's


class TextChunk(Head):
    object: str
    choices: list[TextChoice]
    usage: NotRequired[Usage | RunningUsage]


class ModelShoal(TypedDict, total=False):
    source: str
    size_bytes: int
    layers: int | None
    quantization: str | None
    context_length: int | None
    instance: dict[str, Any]  # Instance.to_json: a model served by another node
    capabilities: list[str]  # "generate", "vision", "embed", "rerank" (protocol.CAPABILITIES)


class ModelCard(TypedDict):
    id: str
    object: str
    created: int
    owned_by: str
    shoal: ModelShoal


class AnthropicModel(TypedDict):
    """/v1/models as Anthropic's SDK reads it (the same path, asked with anthropic-version)."""
    type: str
    id: str
    display_name: str
    created_at: str
    lifecycle: str
    max_input_tokens: int | None
    max_tokens: int | None
