"""OpenAI Responses API request schema (pydantic) and its mapping onto one GenerateRequest.

Every field the official API defines is accepted (the SDK's types are the list), plus
`client_metadata`, which Codex always sends. Honoured: input items, instructions, function
and custom (freeform) tools, namespaces (flattened into their tools; calls name their
namespace), tool choice, sampling, text formats, reasoning effort. Refused, naming the
field: state this node doesn't keep (`previous_response_id`, `conversation`, stored
`prompt`s, background runs) and image options. Built-in tools that run on OpenAI's servers
(web and file search, code interpreter, image generation, MCP, computer use) can't be
called here: they are left out of the prompt with a note in the log. Bookkeeping and hints
are accepted and logged once per client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from engine import protocol as wire
from engine.api import content, images
from engine.api.common import tool_arguments
from engine.api.openai_schemas import MAX_TOKENS_LIMIT, Drafts, Loose, Strict
from engine.errors import BadRequest

HINTS = ("store", "metadata", "user", "service_tier", "prompt_cache_key",
         "prompt_cache_options", "prompt_cache_retention", "safety_identifier",
         "stream_options", "client_metadata", "context_management", "max_tool_calls",
         "moderation", "access_programs", "background_options", "truncation")
BUILT_IN = ("web_search", "web_search_preview", "file_search", "computer",
            "computer_use_preview", "code_interpreter", "image_generation", "mcp",
            "local_shell", "shell", "apply_patch", "tool_search", "programmatic_tool_calling")
CUSTOM_INPUT = {"type": "object", "properties": {"input": {"type": "string"}},
                "required": ["input"]}  # a freeform tool's text, as one argument
TOOL_NAME = r"^[A-Za-z0-9_.\-]+$"
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class FunctionTool(Loose):
    """A function or custom tool (at the top level or inside a namespace); which fields
    matter depends on the type."""
    type: Literal["function", "custom"]
    name: str = Field(min_length=1, max_length=128, pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    format: dict[str, Any] | None = None  # custom: text or a grammar
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None
    output_schema: dict[str, Any] | None = None


class ToolEntry(Loose):
    """Any entry of `tools`: function, custom, namespace or a built-in tool."""
    type: str
    name: str | None = None
    tools: list[FunctionTool] | None = None  # a namespace's


class Item(Loose):
    """An input item: a message (type "message" or just a role), function_call,
    function_call_output, custom_tool_call(_output) or reasoning; the fields that matter
    depend on the type."""
    type: str | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[dict[str, Any]] | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    input: str | None = None
    output: str | list[dict[str, Any]] | None = None


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {"verbosity": "hint"}
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {
        "effort": "none turns the template's thinking off, any other level on",
        "summary": "hint", "generate_summary": "hint", "mode": "hint",
        "context": "only auto or current_turn: earlier turns' reasoning is left out"}
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: str | None = None
    mode: str | None = Field(default=None, max_length=64)  # standard or pro: compute, a hint
    context: Literal["auto", "current_turn", "all_turns"] | None = None


class NamedTool(Strict):
    type: Literal["function", "custom"]
    name: str


class ResponsesRequest(Drafts):
    # how each field is treated (openai_schemas.py's convention): the module doc says why
    TREATMENT: ClassVar[dict[str, str]] = {
        **dict.fromkeys(HINTS, "hint"), "previous_response_id": "refused",
        "conversation": "refused", "prompt": "refused", "image": "refused",
        "background": "only false: this node answers while the request is open",
        "include": "only message.output_text.logprobs and reasoning.encrypted_content",
        "tools": "function and custom tools, namespaces; built-in tools are left out of "
                 "the prompt",
        "input": "text and image items (input_image by image_url; file_id refused), function "
                 "and custom tool calls and outputs"}
    model: str | None = Field(default=None, min_length=1)
    input: str | list[Item]
    instructions: str | None = None
    tools: list[ToolEntry] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    # refused when given: state or services this node doesn't have
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    background: bool | None = None
    image: Any = None
    # bookkeeping and hints (HINTS)
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    client_metadata: dict[str, Any] | None = None
    context_management: Any = None
    max_tool_calls: int | None = None
    moderation: Any = None
    access_programs: Any = None
    background_options: Any = None

    def hints(self) -> list[str]:
        out = [k for k in HINTS if getattr(self, k) is not None]
        out += content.image_hints(p for it in self.input if isinstance(it, Item)
                                   and isinstance(it.content, list) for p in it.content)
        if self.text and self.text.verbosity:
            out.append("text.verbosity")
        for k in ("summary", "generate_summary", "mode"):
            if self.reasoning and getattr(self.reasoning, k):
                out.append(f"reasoning.{k}")
        return out + [f"tools[].type={t} (built in at OpenAI, not callable here)"
                      for t in sorted({t.type for t in self.tools or []
                                       if t.type in BUILT_IN})]


@dataclass
class ToolNames:
    """Flattened tools: the prompt's name of each, and back, its namespace and kind."""
    functions: list[wire.ToolSpec] = field(default_factory=list)
    namespace: dict[str, str] = field(default_factory=dict)  # prompt name -> namespace
    plain: dict[str, str] = field(default_factory=dict)  # prompt name -> name in its space
    custom: set[str] = field(default_factory=set)  # prompt names of freeform tools

    def prompt_name(self, name: str, namespace: str | None) -> str:
        if namespace:
            for k, ns in self.namespace.items():
                if ns == namespace and self.plain[k] == name:
                    return k
        return name

    def call(self, name: str) -> tuple[str, str | None, bool]:
        """(name, namespace, freeform) of a call the model made under a prompt name."""
        return self.plain.get(name, name), self.namespace.get(name), name in self.custom


def flatten_tools(tools: list[ToolEntry] | None) -> ToolNames:
    out = ToolNames()
    entries: list[tuple[str | None, FunctionTool, str]] = []
    for i, t in enumerate(tools or []):
        where = f"tools[{i}]"
        if t.type == "namespace":
            for j, inner in enumerate(t.tools or []):
                entries.append((t.name, inner, f"{where}.tools[{j}]"))
        elif t.type in ("function", "custom"):
            entries.append((None, FunctionTool.model_validate(
                t.model_dump(exclude_none=True, exclude={"tools"})), where))
        elif t.type not in BUILT_IN:
            raise BadRequest(f"'{where}.type': {t.type!r} is not a tool type of the "
                             "Responses API.", param=f"{where}.type")
    names = [inner.name for _, inner, _ in entries]
    for ns, inner, where in entries:
        extra = sorted(inner.model_extra or {})
        if extra:
            raise BadRequest(f"'{where}.{extra[0]}' is not a field of a {inner.type} tool.",
                             param=f"{where}.{extra[0]}")
        name = inner.name if names.count(inner.name) == 1 or not ns else f"{ns}.{inner.name}"
        desc = inner.description or ""
        params = inner.parameters
        if inner.type == "custom":
            out.custom.add(name)
            params = CUSTOM_INPUT
            fmt = (inner.format or {}).get("definition")
            desc += f"\nIts input is free text{': ' + str(fmt) if fmt else ''}."
        if ns:
            out.namespace[name] = ns
        out.plain[name] = inner.name
        fn: wire.ToolFunction = {"name": name, "description": desc}
        if params:
            fn["parameters"] = params
        if inner.strict is not None:
            fn["strict"] = inner.strict
        out.functions.append({"type": "function", "function": fn})
    return out


def _pieces(parts: Any, where: str) -> list[content.Piece]:
    """A message's or a tool output's text and images, in order."""
    if parts is None or isinstance(parts, str):
        return [parts or ""]
    out: list[content.Piece] = []
    for i, p in enumerate(parts):
        kind = p.get("type")
        got = str(p.get("text") or "") if kind in TEXT_PARTS else content.piece(
            p, f"{where}[{i}]")
        if got is None:
            raise BadRequest(f"'{where}[{i}]': only text and image content is supported "
                             f"(got {kind!r}).", param=f"{where}[{i}].type")
        out.append(got)
    return out


def template_messages(body: ResponsesRequest, names: ToolNames | None = None,
                      turns: content.Turns | None = None) -> list[wire.TemplateMessage]:
    """The input items as chat-template turns; their images numbered in `turns`."""
    names = names or flatten_tools(body.tools)
    turns = turns or content.Turns()
    msgs: list[wire.TemplateMessage] = []
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
            msgs.append(turns.turn(role, _pieces(it.content, f"{where}.content")))
        elif kind in ("function_call", "custom_tool_call"):
            if not it.name or not it.call_id:
                raise BadRequest(f"'{where}': a {kind} needs name and call_id.", param=where)
            args = {"input": it.input or ""} if kind == "custom_tool_call" else \
                tool_arguments(it.arguments or "", f"{where}.arguments")
            call: wire.TemplateCall = {"id": it.call_id, "type": "function", "function": {
                "name": names.prompt_name(it.name, it.namespace), "arguments": args}}
            last = msgs[-1] if msgs else None
            if last and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls share one assistant turn
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            msgs.append({**turns.turn("tool", _pieces(it.output, f"{where}.output")),
                         "tool_call_id": it.call_id})
        elif kind == "reasoning":
            continue  # the model's own earlier reasoning: templates drop it between turns
        else:
            raise BadRequest(f"'{where}.type' {kind!r} is not supported.",
                             param=f"{where}.type")
    return msgs


def _refuse_state(body: ResponsesRequest) -> None:
    for name, why in (("previous_response_id", "send the whole conversation in 'input'"),
                      ("conversation", "send the whole conversation in 'input'"),
                      ("prompt", "send the prompt's text in 'instructions' and 'input'")):
        if getattr(body, name) is not None:
            raise BadRequest(f"Shoal's Responses API is stateless: {why} instead of "
                             f"'{name}'.", param=name)
    if body.background:
        raise BadRequest("'background': this node answers while the request is open; "
                         "send it without background.", param="background")
    if body.image is not None:
        raise BadRequest("'image': this node generates no images.", param="image")
    if body.reasoning and body.reasoning.context == "all_turns":
        raise BadRequest("'reasoning.context': this node leaves earlier turns' reasoning out "
                         "of the prompt; send auto or current_turn.",
                         param="reasoning.context")


def to_request(body: ResponsesRequest) -> wire.GenerateRequest:
    _refuse_state(body)
    logprobs = body.top_logprobs
    for i, inc in enumerate(body.include or []):
        if inc == "message.output_text.logprobs":
            logprobs = body.top_logprobs or 0
        elif inc != "reasoning.encrypted_content":  # nothing is encrypted here: harmless
            raise BadRequest(f"'include[{i}]': {inc!r} is not available from Shoal.",
                             param=f"include[{i}]")
    fmt = body.text.format if body.text else None
    constraint: wire.Constraint | None = None
    if fmt is not None and fmt.type == "json_object":
        constraint = {"json_schema": {"type": "object"}}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise BadRequest("'text.format.schema' is required for json_schema.",
                             param="text.format.schema")
        constraint = {"json_schema": fmt.schema_}
    sampling = wire.SamplingRequest.of(
        max_tokens=body.max_output_tokens, temperature=body.temperature, top_p=body.top_p,
        logprobs=logprobs, constraint=constraint, **body.drafts())
    names = flatten_tools(body.tools)
    tools = names.functions or None
    choice: str | dict[str, str] = "auto"
    if isinstance(body.tool_choice, NamedTool):
        if body.tool_choice.name not in names.plain.values():
            raise BadRequest(f"'tool_choice' names {body.tool_choice.name!r}, which is not "
                             "among the tools.", param="tool_choice")
        choice = {"name": names.prompt_name(body.tool_choice.name, None)}
    elif body.tool_choice is not None:
        if body.tool_choice == "required" and not tools:
            raise BadRequest("'tool_choice' is 'required' but no tools were given.",
                             param="tool_choice")
        choice = body.tool_choice
    effort = body.reasoning.effort if body.reasoning else None
    turns = content.Turns()
    messages = template_messages(body, names, turns)
    return images.pending(wire.GenerateRequest(
        messages=messages, tools=tools, tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        thinking=None if effort is None else effort != "none",
        sampling=sampling), turns.sources)
