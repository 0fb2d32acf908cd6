"""OpenAI Responses API request schema (pydantic) and its mapping onto one GenerateRequest.
Stateless: `previous_response_id` is refused with a 400 that says so."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from engine import protocol as wire
from engine.api.common import tool_arguments
from engine.api.openai_schemas import MAX_TOKENS_LIMIT, Loose, Strict
from engine.errors import BadRequest


class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Item(Loose):
    """An input item: a message (type "message" or just a role), function_call,
    function_call_output or reasoning; the fields that matter depend on the type."""
    type: str | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[dict[str, Any]] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[dict[str, Any]] | None = None


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: str | None = None


class NamedTool(Strict):
    type: Literal["function"]
    name: str


class ResponsesRequest(Strict):
    model: str | None = Field(default=None, min_length=1)
    input: str | list[Item]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    previous_response_id: str | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Harmless: bookkeeping a local, stateless server has no use for.
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None  # include_obfuscation: nothing to pad here
    background: Literal[False] | None = None  # stateless: no background responses


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    out = ""
    for i, p in enumerate(content):
        if p.get("type") not in ("input_text", "output_text", "text", "summary_text",
                                 "reasoning_text"):
            raise BadRequest(f"'{where}[{i}]': only text content is supported (got "
                             f"{p.get('type')!r}).", param=f"{where}[{i}].type")
        out += str(p.get("text") or "")
    return out


def template_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if body.instructions:
        msgs.append({"role": "system", "content": body.instructions})
    items = [Item(role="user", content=body.input)] if isinstance(body.input, str) \
        else body.input
    for i, it in enumerate(items):
        where = f"input[{i}]"
        kind = it.type or "message"
        if kind == "message":
            if it.role is None:
                raise BadRequest(f"'{where}.role' is required.", param=f"{where}.role")
            role = "system" if it.role == "developer" else it.role
            msgs.append({"role": role, "content": _text(it.content, f"{where}.content")})
        elif kind == "function_call":
            if not it.name or not it.call_id:
                raise BadRequest(f"'{where}': a function_call needs name and call_id.",
                                 param=where)
            call = {"id": it.call_id, "type": "function", "function": {
                "name": it.name, "arguments": tool_arguments(it.arguments or "",
                                                             f"{where}.arguments")}}
            last = msgs[-1] if msgs else None
            if last and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls share one assistant turn
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it.call_id,
                         "content": _text(it.output, f"{where}.output")})
        elif kind == "reasoning":
            continue  # the model's own earlier reasoning: templates drop it between turns
        else:
            raise BadRequest(f"'{where}.type' {kind!r} is not supported.",
                             param=f"{where}.type")
    return msgs


def to_request(body: ResponsesRequest) -> wire.GenerateRequest:
    if body.previous_response_id:
        raise BadRequest("Shoal's Responses API is stateless: send the whole conversation "
                         "in 'input' instead of 'previous_response_id'.",
                         param="previous_response_id")
    sampling: dict[str, Any] = {k: v for k, v in {
        "max_tokens": body.max_output_tokens, "temperature": body.temperature,
        "top_p": body.top_p}.items() if v is not None}
    for i, inc in enumerate(body.include or []):
        if inc == "message.output_text.logprobs":
            sampling["logprobs"] = body.top_logprobs or 0
        elif inc != "reasoning.encrypted_content":  # nothing is encrypted here: harmless
            raise BadRequest(f"'include[{i}]': {inc!r} is not available from Shoal.",
                             param=f"include[{i}]")
    if body.top_logprobs is not None:
        sampling["logprobs"] = body.top_logprobs
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_object":
        sampling["constraint"] = {"json_schema": {"type": "object"}}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise BadRequest("'text.format.schema' is required for json_schema.",
                             param="text.format.schema")
        sampling["constraint"] = {"json_schema": fmt.schema_}
    tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
             for t in body.tools or []] or None
    choice: str | dict[str, str] = "auto"
    if isinstance(body.tool_choice, NamedTool):
        if body.tool_choice.name not in [t.name for t in body.tools or []]:
            raise BadRequest(f"'tool_choice' names {body.tool_choice.name!r}, which is not "
                             "among the tools.", param="tool_choice")
        choice = {"name": body.tool_choice.name}
    elif body.tool_choice is not None:
        if body.tool_choice == "required" and not tools:
            raise BadRequest("'tool_choice' is 'required' but no tools were given.",
                             param="tool_choice")
        choice = body.tool_choice
    effort = body.reasoning.effort if body.reasoning else None
    return wire.GenerateRequest(
        messages=template_messages(body), tools=tools, tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        thinking=None if effort is None else effort != "none", sampling=sampling)
