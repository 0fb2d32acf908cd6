"""Ollama's wire schemas (pydantic) for /api/chat and /api/generate, and their mapping onto
one GenerateRequest. Every field the ollama package's types define is taken: runtime hints
that only tune llama.cpp (num_thread, num_gpu, ...) are accepted and logged once; sampling
Shoal can't do (mirostat, tfs_z) is refused naming the field unless it is off; image
generation's fields are refused. TREATMENT says which (openai_schemas.py's convention)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import Field

from engine import protocol as wire
from engine.api import content, images
from engine.api.common import tool_arguments
from engine.api.openai_schemas import TOP_K_LIMIT, Drafts, Loose, Strict
from engine.errors import BadRequest

# llama.cpp runtime hints: threads, offload and memory mapping here are MLX's own
RUNTIME_HINTS = ("num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "use_mmap",
                 "use_mlock", "f16_kv", "numa", "low_vram", "logits_all", "vocab_only",
                 "embedding_only", "penalize_newline", "mirostat_tau", "mirostat_eta")
# option -> (the only value honoured, why): other values are a 400 naming it
OPTION_ONLY: dict[str, tuple[Any, str]] = {
    "mirostat": (0, "Shoal has no mirostat sampler; leave it 0"),
    "tfs_z": (1.0, "Shoal has no tail-free sampler; leave it 1 (off)"),
}


class Options(Drafts):
    TREATMENT: ClassVar[dict[str, str]] = {
        **dict.fromkeys(RUNTIME_HINTS, "hint"), "mirostat": "only 0 (off)",
        "tfs_z": "only 1 (off)",
        "num_ctx": "a smaller window than the model's; a larger one is the model's"}
    num_predict: int | None = Field(default=None, ge=-2, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=TOP_K_LIMIT)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # Ollama's int
    stop: list[str] | None = Field(default=None, max_length=16)
    num_ctx: int | None = Field(default=None, ge=1)
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=1_000_000)
    mirostat: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: float | None = Field(default=None, ge=0.0, le=100.0)
    mirostat_eta: float | None = Field(default=None, ge=0.0, le=10.0)
    tfs_z: float | None = Field(default=None, ge=0.0, le=100.0)
    penalize_newline: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    embedding_only: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None


class ToolCallFn(Loose):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCallIn(Loose):
    function: ToolCallFn


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    # Not Ollama's own, but Ollama accepts it and Open WebUI sends it on tool results:
    # which call a result answers (chat templates use it)
    tool_call_id: str | None = None


class Common(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {
        "think": "true or false; a level (low, medium, high) turns thinking on, the level "
                 "itself is not used"}
    model: str = Field(min_length=1)
    stream: bool = True  # Ollama streams unless told not to
    format: Literal["json"] | dict[str, Any] | Literal[""] | None = None
    options: Options | None = None
    keep_alive: float | str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def hints(self) -> list[str]:
        """The runtime hints in `options` (accepted, logged once, no effect here)."""
        o = self.options
        return [f"options.{k}" for k in RUNTIME_HINTS
                if o is not None and k in o.model_fields_set]


class ChatRequest(Common):
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(Common):
    TREATMENT: ClassVar[dict[str, str]] = {**Common.TREATMENT,
        "suffix": "refused", "template": "refused", "context": "refused",
        "width": "refused", "height": "refused", "steps": "refused"}
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[Any] | None = None
    context: list[int] | None = None
    # image generation's (refused: this node generates no images)
    width: int | None = None
    height: int | None = None
    steps: int | None = None


def sampling(body: Common, ctx_hint: int | None = None) -> wire.SamplingRequest:
    o = body.options or Options()
    constraint: wire.Constraint | None = None
    if body.format == "json":
        constraint = {"json_schema": {"type": "object"}}
    elif isinstance(body.format, dict):
        constraint = {"json_schema": body.format}
    for name, (only, why) in OPTION_ONLY.items():
        v = getattr(o, name)
        if v is not None and v != only:
            raise BadRequest(f"'options.{name}' can only be {only} here ({why}); got {v}.",
                             param=f"options.{name}")
    last_n = o.repeat_last_n  # 0 turns the penalties off, -1 means the whole context
    off = last_n == 0
    if not body.logprobs and body.top_logprobs is not None:
        raise BadRequest("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    return wire.SamplingRequest.of(
        temperature=o.temperature, top_p=o.top_p, top_k=o.top_k, min_p=o.min_p,
        typical_p=o.typical_p, repetition_penalty=None if off else o.repeat_penalty,
        presence_penalty=None if off else o.presence_penalty,
        frequency_penalty=None if off else o.frequency_penalty,
        repetition_context=1_000_000 if last_n == -1 else last_n or None,
        seed=o.seed, stop=o.stop,
        # -1, -2: up to the context; a smaller window than the model's is honoured
        max_tokens=o.num_predict if o.num_predict is not None and o.num_predict > 0 else None,
        context_limit=o.num_ctx, constraint=constraint,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None, **o.drafts())


def _call(c: ToolCallIn, where: str) -> wire.TemplateCall:
    """A call of an earlier assistant turn (arguments an object or its JSON text), with
    the id Open WebUI adds."""
    args = c.function.arguments
    call: wire.TemplateCall = {"type": "function", "function": {
        "name": c.function.name,
        "arguments": args if isinstance(args, dict) else tool_arguments(args or "", where)}}
    cid = (c.model_extra or {}).get("id")
    if isinstance(cid, str):
        call["id"] = cid
    return call


def chat_request(body: ChatRequest) -> wire.GenerateRequest:
    msgs: list[wire.TemplateMessage] = []
    turns = content.Turns()
    for i, m in enumerate(body.messages):
        # Ollama puts a turn's images before its text
        d = turns.turn(m.role, [*content.ollama_images(m.images, f"messages[{i}].images"),
                                m.content or ""])
        if m.tool_calls:
            d["tool_calls"] = [_call(c, f"messages[{i}].tool_calls[{j}].function.arguments")
                               for j, c in enumerate(m.tool_calls)]
        if m.thinking:
            d["reasoning_content"] = m.thinking
        if m.tool_name:
            d["name"] = m.tool_name
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        msgs.append(d)
    for i, t in enumerate(body.tools or []):
        f = t.get("function") if isinstance(t, dict) else None
        if t.get("type", "function") != "function" or not isinstance(f, dict) \
                or not isinstance(f.get("name"), str):
            raise BadRequest(f"'tools[{i}]' must be {{type: function, function: {{name, "
                             "description, parameters}}}}.", param=f"tools[{i}]")
    think = None if body.think is None else bool(body.think)
    tools = cast(list[wire.ToolSpec], body.tools)  # checked above: templates take them as sent
    return images.pending(wire.GenerateRequest(
        messages=msgs, tools=tools or None, thinking=think, sampling=sampling(body)),
        turns.sources)


def generate_request(body: GenerateRequest) -> wire.GenerateRequest:
    if body.images and body.raw:
        raise BadRequest("'images' can't go with a raw prompt (no template places them): "
                         "send raw false, or use /api/chat.", param="images")
    for name in ("suffix", "template", "context"):
        if getattr(body, name):
            raise BadRequest(f"'{name}' is not supported: send the whole prompt (raw) or "
                             "use /api/chat.", param=name)
    for name in ("width", "height", "steps"):
        if getattr(body, name) is not None:
            raise BadRequest(f"'{name}': this node generates no images.", param=name)
    think = None if body.think is None else bool(body.think)
    if body.raw:
        return wire.GenerateRequest(prompt=body.prompt, sampling=sampling(body))
    msgs: list[wire.TemplateMessage] = [{"role": "system", "content": body.system}] \
        if body.system else []
    turns = content.Turns()
    msgs.append(turns.turn("user", [*content.ollama_images(body.images, "images"),
                                    body.prompt]))
    return images.pending(wire.GenerateRequest(messages=msgs, thinking=think,
                                               sampling=sampling(body)), turns.sources)


DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "cancelled": "stop"}
