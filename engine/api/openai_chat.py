"""OpenAI chat completions (plain and streaming, tools, reasoning, logprobs) and /v1/models."""

from __future__ import annotations

from typing import Any, cast

from aiohttp import web

from engine import protocol as wire
from engine.api import common, content, dialect_map, images
from engine.api.backend import backend
from engine.api.dialect_render import TokenCount, echo_of, vllm_prompt_logprobs
from engine.api.images import Source
from engine.api.openai_bodies import (
    AnthropicModel,
    ChatCompletion,
    Choice,
    Chunk,
    ChunkChoice,
    ChunkDelta,
    Head,
    Message,
    ModelCard,
    ToolCallJSON,
    Usage,
)
from engine.api.openai_schemas import ChatCompletionRequest, ChatMessage, choose_tool, constraint_of
from engine.api.render import (
    SSE_KEEPALIVE,
    Answer,
    Context,
    drafts,
    error_of,
    logprobs_json,
    speed,
    sse,
    sse_progress,
)
from engine.api.serve import Endpoint, handler
from engine.errors import BadRequest, ModelNotFound
from engine.records import TokenLogprob

routes = web.RouteTableDef()


def _model_card(m: Any) -> ModelCard:
    return {"id": m.id, "object": "model", "created": 0, "owned_by": "shoal",
            "shoal": {"source": m.source, "size_bytes": m.size_bytes, "layers": m.layers,
                      "quantization": m.quantization, "context_length": m.context_length,
                      "capabilities": list(m.capabilities)}}


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    cards = [_model_card(m) for m in await backend(request).models()]
    have = {c["id"] for c in cards}
    for r in backend(request).remote_models():  # served by instances on other nodes
        if r.id not in have:
            have.add(r.id)
            cards.append({"id": r.id, "object": "model", "created": 0, "owned_by": "shoal",
                          "shoal": {"instance": r.instance}})
    if "anthropic-version" in request.headers:  # the same path, Anthropic's shape
        data = [_anthropic_card(c) for c in cards]
        return web.json_response({"data": data, "has_more": False,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})
    return web.json_response({"object": "list", "data": cards})


def _anthropic_card(card: ModelCard) -> AnthropicModel:
    ctx = card["shoal"].get("context_length")
    return {"type": "model", "id": card["id"], "display_name": card["id"],
            "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active",
            "max_input_tokens": ctx, "max_tokens": ctx}


@routes.get("/v1/models/{model_id:.+}")
async def get_model(request: web.Request) -> web.Response:
    mid = request.match_info["model_id"]
    for m in await backend(request).models():
        if m.id == mid:
            card = _model_card(m)
            anthropic = "anthropic-version" in request.headers
            return web.json_response(_anthropic_card(card) if anthropic else card)
    raise ModelNotFound(f"The model '{mid}' is not on this node.", param="model")


def _pieces(m: ChatMessage, i: int) -> list[content.Piece]:
    if m.content is None or isinstance(m.content, str):
        return [m.content or ""]
    out: list[content.Piece] = []
    for j, p in enumerate(m.content):
        got = content.piece(p.model_dump(exclude_none=True), f"messages[{i}].content[{j}]")
        if got is None:
            raise BadRequest(f"messages[{i}].content[{j}]: only text and image_url parts are "
                             f"supported (got {p.type!r}).",
                             param=f"messages[{i}].content[{j}].type")
        out.append(got)
    return out


def chat_turns(msgs: list[ChatMessage]) -> tuple[list[wire.TemplateMessage], list[Source]]:
    """Messages as Hugging Face chat templates take them (tool arguments as objects), and
    the images their parts hold, in order."""
    turns = content.Turns()
    out = []
    for i, m in enumerate(msgs):
        d = turns.turn("system" if m.role == "developer" else m.role, _pieces(m, i))
        if not d["content"] and "parts" not in d:
            d["content"] = m.refusal or ""  # an earlier answer that was a refusal said it
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": common.tool_arguments(
                    c.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments")}}
                for j, c in enumerate(m.tool_calls)]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        out.append(d)
    return out, turns.sources


def template_messages(msgs: list[ChatMessage]) -> list[wire.TemplateMessage]:
    """chat_turns for routes that take no images (a 400 naming the first)."""
    out, sources = chat_turns(msgs)
    if sources:
        raise BadRequest(f"'{sources[0].param}': images aren't taken on this route.",
                         param=sources[0].param)
    return out


def thinking_of(body: ChatCompletionRequest) -> tuple[bool | None, dict[str, Any]]:
    """(the template's thinking switch, the rest of chat_template_kwargs)."""
    think, kw = dialect_map.template_kwargs(body.chat_template_kwargs)
    if think is None and body.reasoning_effort is not None:
        think = body.reasoning_effort != "none"
    return think, kw


REFUSED = {"audio": "this model answers in text only",
           "functions": "send them as 'tools' (each {\"type\": \"function\", "
                        "\"function\": ...}), the API's current form",
           "function_call": "use 'tool_choice', the API's current form",
           "web_search_options": "this node doesn't search the web; give the model a "
                                 "search tool of your own",
           "chat_template": "a template is code, which Shoal never takes from a request; "
                            "the model's own template is used, and chat_template_kwargs "
                            "sets its variables"}


def top_logprobs_of(body: ChatCompletionRequest) -> int | None:
    """How many alternatives each token's logprobs list (None: no logprobs): OpenAI's
    logprobs + top_logprobs, or llama.cpp's n_probs (above 0 it turns them on)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    n = body.n_probs
    if body.logprobs and body.top_logprobs is not None and n is not None \
            and n != body.top_logprobs:
        raise BadRequest(f"'top_logprobs' ({body.top_logprobs}) and 'n_probs' ({n}) differ: "
                         "send one.", param="n_probs")
    if body.logprobs:
        return body.top_logprobs if body.top_logprobs is not None else n or 0
    return n or None


def to_request(body: ChatCompletionRequest) -> wire.GenerateRequest:
    for name, why in REFUSED.items():
        if getattr(body, name) is not None:
            raise BadRequest(f"'{name}' can't be served here: {why}.", param=name)
    dialect_map.check(body)
    if body.n not in (None, 1):
        raise BadRequest("Only n=1 is supported: ask again for another answer.", param="n")
    if body.add_special_tokens:
        raise BadRequest("'add_special_tokens' can only be false on chat: the model's chat "
                         "template places its special tokens.", param="add_special_tokens")
    if body.n_predict == 0:
        raise BadRequest("'n_predict' must be at least 1 on chat (or -1: no limit).",
                         param="n_predict")
    cont = bool(body.continue_final_message)
    if cont and body.add_generation_prompt:
        raise BadRequest("'continue_final_message' continues the last message, so "
                         "'add_generation_prompt' can't also start a new one: set it false.",
                         param="continue_final_message")
    max_tokens = dialect_map.max_tokens_of(body, "max_completion_tokens", "max_tokens")
    sampling = body.sampling(max_tokens, top_logprobs_of(body), dialect_map.structured(
        body, constraint_of(body.response_format)))
    tools: list[wire.ToolSpec] | None = [
        {"type": "function", "function": cast(wire.ToolFunction, t.function.model_dump(
            exclude_none=True))} for t in body.tools] if body.tools else None
    think, kwargs = thinking_of(body)
    messages, sources = chat_turns(body.messages)
    if sources and body.mm_processor_kwargs:  # it would change how the images are read
        raise BadRequest("'mm_processor_kwargs': the model's own image processor settings "
                         "are used here; leave it out.", param="mm_processor_kwargs")
    return images.pending(wire.GenerateRequest(
        messages=messages, tools=tools,
        tool_choice=choose_tool(body.tools, body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        thinking=think, sampling=sampling, continue_final=cont,
        add_generation_prompt=not cont if body.add_generation_prompt is None
        else body.add_generation_prompt,
        documents=body.documents, template_kwargs=kwargs or None), sources)


def usage(done: wire.Done) -> Usage:
    p, c = done.prompt_tokens, done.generation_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": done.accepted_tokens,
                "rejected_prediction_tokens": done.drafted_tokens - done.accepted_tokens},
            "speculative": drafts(done)}


def finish_of(done: wire.Done) -> str:
    return "stop" if done.finish_reason == "cancelled" else done.finish_reason


def call_json(c: wire.ToolCall, index: int | None = None) -> ToolCallJSON:
    d: ToolCallJSON = {"id": c.call_id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}}
    return d if index is None else {"index": index, **d}


class ChatRenderer:
    """/v1/chat/completions: chunks as OpenAI streams them (the role first, a tool call's
    name before its arguments, the finish with Shoal's speed figures, usage if asked),
    or the one chat.completion object. vLLM's additions: the echoed final message, usage
    on every chunk, the prompt's logprobs, tokens spelled by id."""

    media: str = "text/event-stream"
    keepalive_s: float | None = common.KEEPALIVE_S
    wants_admission: bool = False
    wants_progress: bool = True  # progress: the chat window's bubble

    def __init__(self, body: ChatCompletionRequest, ctx: Context):
        self.ctx = ctx
        self.logprobs = bool(body.logprobs) or bool(body.n_probs)
        self.as_ids = bool(body.return_tokens_as_token_ids)
        opts = body.stream_options
        self.continuous = bool(opts and opts.continuous_usage_stats)
        self.include_usage = bool(opts and (opts.include_usage or self.continuous
                                            and opts.include_usage is None))
        self.echo = echo_of(body.messages) if body.echo else ""
        self.reasoning = body.include_reasoning is not False  # vLLM's include_reasoning
        self.count = TokenCount(ctx.prompt_tokens)
        self.base: Head = {"id": ctx.ids("chatcmpl-"), "created": int(ctx.now()),
                           "model": ctx.model}
        self.ttft: float | None = None
        self.calls = 0

    def _chunk(self, delta: ChunkDelta, finish: str | None = None,
               lps: list[TokenLogprob] | None = None) -> Chunk:
        c: ChunkChoice = {"index": 0, "delta": delta, "finish_reason": finish}
        if self.logprobs:
            c["logprobs"] = {"content": logprobs_json(lps, self.as_ids),
                             "refusal": None} if lps else None
        out: Chunk = {**self.base, "object": "chat.completion.chunk", "choices": [c]}
        if self.continuous:
            out["usage"] = self.count.usage()
        return out

    def start(self) -> list[bytes]:
        out = [sse(self._chunk({"role": "assistant", "content": ""}))]
        if self.echo:
            out.append(sse(self._chunk({"content": self.echo})))
        return out

    def keepalive(self) -> bytes:
        return SSE_KEEPALIVE

    def event(self, ev: wire.Event) -> list[bytes]:
        if isinstance(ev, wire.Progress):
            return [sse_progress(ev)]
        if self.ttft is None:
            self.ttft = self.ctx.since_start()
        if isinstance(ev, wire.Error):
            return [sse(error_of(ev).to_openai())]
        if isinstance(ev, wire.Delta):
            self.count.add(ev)
            if ev.kind == "reasoning" and not self.reasoning:
                return []
            delta: ChunkDelta = {"reasoning_content": ev.text} if ev.kind == "reasoning" \
                else {"content": ev.text}
            return [sse(self._chunk(delta, lps=ev.logprobs))]
        if isinstance(ev, wire.ToolCall):  # name first, then the arguments, as OpenAI
            first = call_json(ev, self.calls)
            first["function"] = {"name": ev.name, "arguments": ""}
            rest: ToolCallJSON = {"index": self.calls, "function": {"arguments": ev.arguments}}
            self.calls += 1
            return [sse(self._chunk({"tool_calls": [first]})),
                    sse(self._chunk({"tool_calls": [rest]}))]
        if isinstance(ev, wire.Done):
            self.count.n = ev.generation_tokens
            last = self._chunk({}, finish_of(ev), ev.logprobs)
            last["shoal"] = speed(ev, self.ttft)
            if ev.prompt_logprobs is not None:
                last["prompt_logprobs"] = vllm_prompt_logprobs(ev.prompt_logprobs, self.as_ids)
            out = [sse(last)]
            if self.include_usage:
                tail: Chunk = {**self.base, "object": "chat.completion.chunk", "choices": [],
                               "usage": usage(ev), "shoal": speed(ev, self.ttft)}
                out.append(sse(tail))
            return out
        return []

    def end(self) -> list[bytes]:
        return [sse("[DONE]")]

    def answer(self, a: Answer) -> ChatCompletion:
        assert a.done is not None
        content = self.echo + a.content
        msg: Message = {"role": "assistant",
                        "content": content or (None if a.tool_calls else "")}
        if a.reasoning and self.reasoning:
            msg["reasoning_content"] = a.reasoning
        if a.tool_calls:
            msg["tool_calls"] = [call_json(c) for c in a.tool_calls]
        choice: Choice = {"index": 0, "finish_reason": finish_of(a.done),
                          "message": msg, "logprobs": None}
        if self.logprobs:
            choice["logprobs"] = {"content": logprobs_json(a.logprobs, self.as_ids),
                                  "refusal": None}
        out: ChatCompletion = {**self.base, "object": "chat.completion", "choices": [choice],
                               "usage": usage(a.done),
                               "shoal": speed(a.done, self.ctx.since_start())}
        if a.done.prompt_logprobs is not None:
            out["prompt_logprobs"] = vllm_prompt_logprobs(a.done.prompt_logprobs, self.as_ids)
        return out


routes.post("/v1/chat/completions")(handler(Endpoint(ChatCompletionRequest, to_request,
                                                     ChatRenderer)))
