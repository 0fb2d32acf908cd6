"""Anthropic Messages wire schemas (pydantic) and their mapping onto one GenerateRequest.

Every field the official API defines (beta ones included: the SDK's types are the list) is
accepted. What changes the answer is honoured: system turns inside `messages` (and their
`clear_at`), deferred tools (offered once a tool_reference or tool_addition names them, as
the API does), the client tools Anthropic defines (bash, the text editor, memory) with
their published schemas. What can't be honoured is refused naming it (documents,
MCP servers, containers, compaction requests, a thread to continue). Bookkeeping and hints
(metadata, cache_control, context_management, service tiers, billing) are accepted and
logged once per client; tools that run on Anthropic's servers (web search, code
execution, ...) can't be called here and are left out of the prompt, with a note."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Literal

from pydantic import Field

from engine import protocol as wire
from engine.api import content, images
from engine.api.openai_schemas import TOP_K_LIMIT, Drafts, Loose, Strict
from engine.errors import BadRequest

MAX_TOKENS_LIMIT = 1_000_000
# Claude Code's first system block differs on every request (a version and a hash); it is
# no instruction to the model, and kept it would end every shared prefix at token ~25.
VOLATILE_SYSTEM = re.compile(r"^\s*x-anthropic-billing-header:")
TOP_LEVEL_HINTS = ("metadata", "cache_control", "context_management", "service_tier",
                   "inference_geo", "speed", "user_profile_id", "workspace_id", "betas",
                   "billing_policy", "diagnostics", "fallback_credit_token", "fallbacks")
TOOL_HINTS = ("cache_control", "strict", "allowed_callers", "eager_input_streaming",
              "defer_loading")
# Tools Anthropic defines and the client runs: their published input schemas.
_EDIT_COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]
CLIENT_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "bash": ("Run a bash command; `restart` restarts the shell.", {
        "type": "object", "properties": {"command": {"type": "string"},
                                         "restart": {"type": "boolean"}}}),
    "text_editor": ("View, create and edit files.", {
        "type": "object", "required": ["command", "path"], "properties": {
            "command": {"type": "string", "enum": _EDIT_COMMANDS},
            "path": {"type": "string"}, "file_text": {"type": "string"},
            "old_str": {"type": "string"}, "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}}}}),
    "memory": ("Read and write the memory directory (/memories).", {
        "type": "object", "required": ["command"], "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert",
                                                   "delete", "rename"]},
            "path": {"type": "string"}, "file_text": {"type": "string"},
            "old_str": {"type": "string"}, "new_str": {"type": "string"},
            "insert_line": {"type": "integer"}, "insert_text": {"type": "string"},
            "old_path": {"type": "string"}, "new_path": {"type": "string"},
            "view_range": {"type": "array", "items": {"type": "integer"}}}}),
}
SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_",
                "mcp_toolset", "advisor_", "browser_toolset_")


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
    tool_name: str | None = None  # tool_reference
    tool: dict[str, Any] | None = None  # tool_addition / tool_removal
    title: str | None = None  # search_result
    source: Any = None


class Message(Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]
    clear_at: Literal["next_user_message", "never"] | None = None  # system turns
    output_config: dict[str, Any] | None = None  # per-turn hints on a system turn


class Tool(Loose):
    """A tool: a custom one (no type, or "custom"), or one Anthropic defines (its type)."""
    name: str | None = Field(default=None, min_length=1, max_length=128,
                             pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    input_examples: list[Any] | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None
    eager_input_streaming: bool | None = None


class ToolChoice(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {}
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {
        "type": "enabled or adaptive turns the template's thinking on, disabled off",
        "budget_tokens": "hint", "display": "hint", "block_binding": "hint"}
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: str | None = None
    block_binding: Any = None  # how thinking blocks bind to later turns: a hint


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {"effort": "hint", "task_budget": "hint"}
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None
    task_budget: Any = None  # a budget hint for agentic turns


class CountTokensRequest(Strict):
    # how each field is treated (openai_schemas.py's convention): the module doc says why
    TREATMENT: ClassVar[dict[str, str]] = {
        **dict.fromkeys(TOP_LEVEL_HINTS, "hint"),
        "mcp_servers": "refused", "container": "refused", "compaction": "refused",
        "thread": "only {type: create}: this node keeps no conversation state",
        "tools": "custom tools and the client tools Anthropic defines (bash, text editor, "
                 "memory); server tools are left out of the prompt, computer use refused",
        "messages": "text, images (base64 and url sources), thinking, tool use and "
                    "results (their images too), search results; documents refused"}
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # refused when given: they change the answer and can't run on a local node
    mcp_servers: list[Any] | None = None
    container: Any = None
    compaction: Any = None
    thread: dict[str, Any] | None = None
    # bookkeeping and hints (TOP_LEVEL_HINTS)
    cache_control: Any = None
    context_management: Any = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    betas: list[str] | None = None
    billing_policy: Any = None
    diagnostics: Any = None
    fallback_credit_token: Any = None
    fallbacks: Any = None
    inference_geo: str | None = None
    service_tier: str | None = None
    metadata: dict[str, Any] | None = None

    def hints(self) -> list[str]:
        """The bookkeeping and hint fields this request carries (see module doc)."""
        out = [k for k in TOP_LEVEL_HINTS if getattr(self, k, None) is not None]
        for t in self.tools or []:
            out += [f"tools[].{k}" for k in TOOL_HINTS if getattr(t, k) is not None]
        for k in ("effort", "task_budget"):
            if self.output_config and getattr(self.output_config, k):
                out.append(f"output_config.{k}")
        for m in self.messages:
            for b in m.content if isinstance(m.content, list) else []:
                if (b.model_extra or {}).get("cache_control") is not None:
                    out.append("messages[].content[].cache_control")
        if self.thinking and self.thinking.budget_tokens is not None:
            out.append("thinking.budget_tokens")
        return sorted(set(out))


class MessagesRequest(CountTokensRequest, Drafts):
    max_tokens: int = Field(ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=TOP_K_LIMIT)


def _refuse_unrunnable(body: CountTokensRequest) -> None:
    if body.mcp_servers:
        raise BadRequest("'mcp_servers': this node can't connect to MCP servers; run them "
                         "in your client (Claude Code does) and pass their tools as tools.",
                         param="mcp_servers")
    if body.container is not None:
        raise BadRequest("'container': code-execution containers run on Anthropic's "
                         "servers, not on this node.", param="container")
    if body.compaction is not None:
        raise BadRequest("'compaction': this node doesn't summarise conversations itself; "
                         "compact in the client (Claude Code's /compact does).",
                         param="compaction")
    if body.thread is not None and body.thread.get("type") != "create":
        raise BadRequest("'thread': this node keeps no conversation state; send the whole "
                         "conversation in 'messages'.", param="thread")


def _block_text(b: Block, where: str) -> str:
    if b.type == "text":
        return b.text or ""
    if b.type == "search_result":  # a retrieval result: its title, source and text
        inner = _text(b.content, f"{where}.content")
        return f"{b.title or ''} ({b.source or ''})\n{inner}".strip()
    if b.type == "tool_reference":
        return f"Tool {b.tool_name} is now available."
    raise BadRequest(f"'{where}': {b.type!r} blocks can't be read by this model "
                     "(text only).", param=f"{where}.type")


def _text(blocks: str | list[Block] | None, where: str) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    return "".join(_block_text(b, f"{where}[{i}]") for i, b in enumerate(blocks))


def _image(b: Block, where: str) -> content.Piece:
    got = content.piece(b.model_dump(exclude_none=True), where)
    assert got is not None  # content.piece reads every "image" block
    return got


def _pieces(blocks: str | list[Block] | None, where: str) -> list[content.Piece]:
    """Text and images (a tool result's too), in order."""
    if blocks is None or isinstance(blocks, str):
        return [blocks or ""]
    out: list[content.Piece] = []
    for i, b in enumerate(blocks):
        out.append(_image(b, f"{where}[{i}]") if b.type == "image"
                   else _block_text(b, f"{where}[{i}]"))
    return out


def _system_text(system: str | list[Block] | None) -> str:
    if system is None or isinstance(system, str):
        return "" if system is None or VOLATILE_SYSTEM.match(system) else system
    kept = [b for b in system if not (b.type == "text" and VOLATILE_SYSTEM.match(b.text or ""))]
    return _text(kept, "system")


def _system_turn(m: Message, i: int, later_user: bool,
                 tools: Tools) -> wire.TemplateMessage | None:
    """A system turn inside `messages`: its text (gone once a later user turn exists when
    clear_at says so), and its tool additions and removals."""
    where = f"messages[{i}].content"
    blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
    text = []
    for j, b in enumerate(blocks):
        if b.type in ("tool_addition", "tool_removal"):
            tools.change(b, f"{where}[{j}].tool", b.type == "tool_addition")
        elif b.type == "text":
            text.append(b.text or "")
        else:
            raise BadRequest(f"'{where}[{j}]': {b.type!r} blocks are not supported in "
                             "system turns.", param=f"{where}[{j}].type")
    if m.clear_at == "next_user_message" and later_user or not "".join(text):
        return None
    return {"role": "system", "content": "".join(text)}


def template_messages(body: CountTokensRequest, tools: Tools | None = None,
                      turns: content.Turns | None = None) -> list[wire.TemplateMessage]:
    """Anthropic turns as chat-template messages: tool_use blocks become an assistant's
    tool_calls, tool_result blocks become tool messages, thinking becomes reasoning_content,
    system turns stay system turns where they are; image blocks (a tool result's too) are
    numbered in `turns`."""
    tools = tools or Tools([])
    turns = turns or content.Turns()
    out: list[wire.TemplateMessage] = []
    if (system := _system_text(body.system)):
        out.append({"role": "system", "content": system})
    last_user = max((i for i, m in enumerate(body.messages) if m.role == "user"), default=-1)
    for i, m in enumerate(body.messages):
        if m.role == "system":
            turn = _system_turn(m, i, i < last_user, tools)
            if turn:
                out.append(turn)
            continue
        if m.clear_at is not None or m.output_config is not None:
            field = "clear_at" if m.clear_at is not None else "output_config"
            raise BadRequest(f"'messages[{i}].{field}' is only allowed on system turns.",
                             param=f"messages[{i}].{field}")
        blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) \
            else m.content
        pieces: list[content.Piece] = []
        reasoning = ""
        calls: list[wire.TemplateCall] = []
        for j, b in enumerate(blocks):
            where = f"messages[{i}].content[{j}]"
            if b.type in ("text", "search_result"):
                pieces.append(_block_text(b, where))
            elif b.type == "image" and m.role == "user":
                pieces.append(_image(b, where))
            elif b.type == "thinking" and m.role == "assistant":
                reasoning += b.thinking or ""
            elif b.type == "redacted_thinking" and m.role == "assistant":
                continue  # nothing readable to give the model
            elif b.type == "compaction":  # an earlier summary stands for the turns it ate
                pieces.append(str(b.content or "") if not isinstance(b.content, list)
                              else _text(b.content, f"{where}.content"))
            elif b.type == "tool_use" and m.role == "assistant":
                if not b.id or not b.name:
                    raise BadRequest(f"'{where}': a tool_use block needs id and name.",
                                     param=where)
                calls.append({"id": b.id, "type": "function",
                              "function": {"name": b.name, "arguments": b.input or {}}})
            elif b.type == "tool_result" and m.role == "user":
                for ref in b.content if isinstance(b.content, list) else []:
                    if ref.type == "tool_reference" and ref.tool_name:
                        tools.load(ref.tool_name)
                result = _pieces(b.content, f"{where}.content")
                if b.is_error:
                    result = ["Error: ", *result]
                out.append({**turns.turn("tool", result), "tool_call_id": b.tool_use_id})
            else:
                raise BadRequest(f"'{where}': {b.type!r} blocks are not supported in "
                                 f"{m.role} messages.", param=f"{where}.type")
        if any(pieces) or calls or reasoning or m.role == "user" and not out[-1:]:
            msg = turns.turn(m.role, pieces)
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = reasoning
            out.append(msg)
    return out


class Tools:
    """The tools the model is offered: custom ones and Anthropic's client tools, deferred
    ones once something names them; server tools left out (noted)."""

    def __init__(self, tools: list[Tool]):
        self.defs: dict[str, wire.ToolSpec] = {}
        self.offered: list[str] = []
        self.dropped: list[str] = []
        for i, t in enumerate(tools):
            self._declare(t, f"tools[{i}]")

    def _declare(self, t: Tool, where: str) -> str | None:
        kind = t.type or "custom"
        if kind == "custom":
            extra = sorted(t.model_extra or {})
            if extra:
                raise BadRequest(f"'{where}.{extra[0]}' is not a field of a custom tool.",
                                 param=f"{where}.{extra[0]}")
            if not t.name or t.input_schema is None:
                raise BadRequest(f"'{where}': a custom tool needs name and input_schema.",
                                 param=where)
            desc = t.description or ""
            if t.input_examples:  # the API shows them to the model with the tool
                desc += "\nExample inputs:\n" + "\n".join(json.dumps(x)
                                                          for x in t.input_examples)
            name = t.name
            fn: wire.ToolFunction = {"name": name, "description": desc,
                                     "parameters": t.input_schema}
        elif kind.startswith(SERVER_TOOLS):
            self.dropped.append(kind)
            return None
        elif kind.startswith("computer_"):
            raise BadRequest(f"'{where}.type': {kind!r} needs screenshots, and this model "
                             "reads text only.", param=f"{where}.type")
        else:
            family = next((k for k in CLIENT_TOOLS if kind.startswith(k)), None)
            if family is None or not t.name:
                raise BadRequest(f"'{where}.type': {kind!r} is not a tool type this node "
                                 "knows.", param=f"{where}.type")
            desc, schema = CLIENT_TOOLS[family]
            name = t.name
            fn = {"name": name, "description": desc, "parameters": schema}
        self.defs[name] = {"type": "function", "function": fn}
        if not t.defer_loading and name not in self.offered:
            self.offered.append(name)
        return name

    def load(self, name: str) -> None:
        if name in self.defs and name not in self.offered:
            self.offered.append(name)

    def change(self, b: Block, where: str, add: bool) -> None:
        ref = b.tool or {}
        if ref.get("type") == "tool_definition" and add:
            name = self._declare(Tool.model_validate(ref.get("definition") or {}),
                                 f"{where}.definition")
        else:
            name = ref.get("name")
        if not isinstance(name, str):
            return
        if add:
            self.load(name)
        elif name in self.offered:
            self.offered.remove(name)

    def listed(self) -> list[wire.ToolSpec] | None:
        return [self.defs[n] for n in self.offered] or None


def to_request(body: CountTokensRequest, count_only: bool = False) -> wire.GenerateRequest:
    _refuse_unrunnable(body)
    tools = Tools(body.tools or [])
    turns = content.Turns()
    messages = template_messages(body, tools, turns)
    offered = tools.listed()
    choice: str | dict[str, str] = "auto"
    tc = body.tool_choice
    if tc is not None:
        if tc.type in ("any", "tool") and not offered:
            raise BadRequest(f"'tool_choice' is {tc.type!r} but no tools were given.",
                             param="tool_choice")
        if tc.type == "tool":
            if tc.name not in tools.offered:
                raise BadRequest(f"'tool_choice.name' {tc.name!r} is not among the tools.",
                                 param="tool_choice.name")
            choice = {"name": tc.name}
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
    thinking = None if body.thinking is None else body.thinking.type != "disabled"
    fmt = body.output_config.format if body.output_config else None
    constraint: wire.Constraint | None = None if fmt is None else {"json_schema": fmt.schema_}
    sampling = wire.SamplingRequest.of(
        max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k, stop=body.stop_sequences, constraint=constraint,
        **body.drafts()) if isinstance(body, MessagesRequest) else \
        wire.SamplingRequest(constraint=constraint)  # count_tokens: the prompt only
    last = body.messages[-1]
    prefill = last.role == "assistant" and bool(messages) and \
        messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
    return images.pending(wire.GenerateRequest(
        messages=messages, tools=offered, tool_choice=choice,
        parallel_tool_calls=not (tc and tc.disable_parallel_tool_use), thinking=thinking,
        sampling=sampling, count_only=count_only, continue_final=prefill), turns.sources)


def dropped_tools(body: CountTokensRequest) -> list[str]:
    """Server tools in the request that this node leaves out of the prompt."""
    return [f"tools[].type={t.type} (runs on Anthropic's servers)" for t in body.tools or []
            if t.type and t.type.startswith(SERVER_TOOLS)]


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "cancelled": "end_turn"}


def stop_reason(done: wire.Done) -> str:
    if done.stop_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(done.finish_reason, "end_turn")


def tool_input(call: wire.ToolCall) -> Any:
    return json.loads(call.arguments or "{}")
