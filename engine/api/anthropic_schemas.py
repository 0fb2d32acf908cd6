"""Anthropic Messages wire schemas (pydantic) and their mapping onto one GenerateRequest.
Fields Claude Code sends only for bookkeeping (cache_control, metadata) are accepted; content
a local model can't take (images, documents, server tools) is refused naming the field."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from engine import protocol as wire
from engine.api.openai_schemas import Loose, Strict
from engine.errors import BadRequest

MAX_TOKENS_LIMIT = 1_000_000


class Block(Loose):
    """One content block; which fields matter depends on `type` (checked when mapped)."""
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: str | None = None


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class CountTokensRequest(Strict):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # Harmless: caching, bookkeeping and routing hints a local node has no use for.
    cache_control: dict[str, Any] | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None


def _text(blocks: str | list[Block] | None, where: str) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    for i, b in enumerate(blocks):
        if b.type != "text":
            raise BadRequest(f"'{where}[{i}]': only text blocks are supported here "
                             f"(got {b.type!r}).", param=f"{where}[{i}].type")
    return "".join(b.text or "" for b in blocks)


def template_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic turns as chat-template messages: tool_use blocks become an assistant's
    tool_calls, tool_result blocks become tool messages, thinking becomes reasoning_content."""
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system, "system")})
    for i, m in enumerate(body.messages):
        blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) \
            else m.content
        text, reasoning, calls = "", "", []
        for j, b in enumerate(blocks):
            where = f"messages[{i}].content[{j}]"
            if b.type == "text":
                text += b.text or ""
            elif b.type == "thinking" and m.role == "assistant":
                reasoning += b.thinking or ""
            elif b.type == "redacted_thinking" and m.role == "assistant":
                continue  # nothing readable to give the model
            elif b.type == "tool_use" and m.role == "assistant":
                if not b.id or not b.name:
                    raise BadRequest(f"'{where}': a tool_use block needs id and name.",
                                     param=where)
                calls.append({"id": b.id, "type": "function",
                              "function": {"name": b.name, "arguments": b.input or {}}})
            elif b.type == "tool_result" and m.role == "user":
                result = _text(b.content, f"{where}.content")
                if b.is_error:
                    result = f"Error: {result}"
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result})
            else:
                raise BadRequest(f"'{where}': {b.type!r} blocks are not supported in "
                                 f"{m.role} messages.", param=f"{where}.type")
        if text or calls or reasoning or m.role == "user" and not out[-1:]:
            msg: dict[str, Any] = {"role": m.role, "content": text}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = reasoning
            out.append(msg)
    return out


def to_request(body: CountTokensRequest, count_only: bool = False) -> wire.GenerateRequest:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description
                                               or "", "parameters": t.input_schema}}
             for t in body.tools or []] or None
    choice: str | dict[str, str] = "auto"
    tc = body.tool_choice
    if tc is not None:
        if tc.type in ("any", "tool") and not tools:
            raise BadRequest(f"'tool_choice' is {tc.type!r} but no tools were given.",
                             param="tool_choice")
        if tc.type == "tool":
            if tc.name not in [t.name for t in body.tools or []]:
                raise BadRequest(f"'tool_choice.name' {tc.name!r} is not among the tools.",
                                 param="tool_choice.name")
            choice = {"name": tc.name}
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
    thinking = None if body.thinking is None else body.thinking.type != "disabled"
    sampling: dict[str, Any] = {}
    if isinstance(body, MessagesRequest):
        sampling = {k: v for k, v in {
            "max_tokens": body.max_tokens, "temperature": body.temperature,
            "top_p": body.top_p, "top_k": body.top_k, "stop": body.stop_sequences}.items()
            if v is not None}
    fmt = body.output_config.format if body.output_config else None
    if fmt is not None:
        sampling["constraint"] = {"json_schema": fmt.schema_}
    return wire.GenerateRequest(
        messages=template_messages(body), tools=tools, tool_choice=choice,
        parallel_tool_calls=not (tc and tc.disable_parallel_tool_use), thinking=thinking,
        sampling=sampling, count_only=count_only)


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "cancelled": "end_turn"}


def stop_reason(done: wire.Done) -> str:
    if done.stop_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(done.finish_reason, "end_turn")


def tool_input(call: wire.ToolCall) -> Any:
    return json.loads(call.arguments or "{}")
