"""OpenAI chat completions (plain and streaming, tools, reasoning, logprobs) and /v1/models."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api import common, hints
from engine.api.openai_schemas import ChatCompletionRequest, ChatMessage, choose_tool, constraint_of
from engine.errors import BadRequest, ModelNotFound

routes = web.RouteTableDef()


def _model_card(m: Any) -> dict[str, Any]:
    return {"id": m.id, "object": "model", "created": 0, "owned_by": "shoal",
            "shoal": {"source": m.source, "size_bytes": m.size_bytes, "layers": m.layers,
                      "quantization": m.quantization, "context_length": m.context_length}}


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    cards = [_model_card(m) for m in request.app["node"].local_models()]
    cluster = request.app.get("cluster")
    if cluster is not None:  # models served by distributed instances on other nodes
        have = {c["id"] for c in cards}
        for _, inst in cluster.remote_instances():
            if inst["model"] not in have:
                have.add(inst["model"])
                cards.append({"id": inst["model"], "object": "model", "created": 0,
                              "owned_by": "shoal", "shoal": {"instance": inst}})
    if "anthropic-version" in request.headers:  # the same path, Anthropic's shape
        data = [_anthropic_card(c) for c in cards]
        return web.json_response({"data": data, "has_more": False,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})
    return web.json_response({"object": "list", "data": cards})


def _anthropic_card(card: dict[str, Any]) -> dict[str, Any]:
    ctx = (card.get("shoal") or {}).get("context_length")
    return {"type": "model", "id": card["id"], "display_name": card["id"],
            "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active",
            "max_input_tokens": ctx, "max_tokens": ctx}


@routes.get("/v1/models/{model_id:.+}")
async def get_model(request: web.Request) -> web.Response:
    mid = request.match_info["model_id"]
    for m in request.app["node"].local_models():
        if m.id == mid:
            card = _model_card(m)
            anthropic = "anthropic-version" in request.headers
            return web.json_response(_anthropic_card(card) if anthropic else card)
    raise ModelNotFound(f"The model '{mid}' is not on this node.", param="model")


def _text(m: ChatMessage, i: int) -> str:
    if m.content is None or isinstance(m.content, str):
        return m.content or ""
    for j, p in enumerate(m.content):
        if p.type not in ("text", "input_text") or p.text is None:
            raise BadRequest(f"messages[{i}].content[{j}]: only text parts are supported "
                             f"(got {p.type!r}).", param=f"messages[{i}].content[{j}].type")
    return "".join(p.text or "" for p in m.content)


def template_messages(msgs: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates take them (tool arguments as objects)."""
    out = []
    for i, m in enumerate(msgs):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                             "content": _text(m, i)}
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
    return out


def thinking_of(body: ChatCompletionRequest) -> bool | None:
    kw = dict(body.chat_template_kwargs or {})
    think = kw.pop("enable_thinking", None)
    if kw:
        raise BadRequest(f"'chat_template_kwargs': only enable_thinking is understood, not "
                         f"{', '.join(kw)}.", param="chat_template_kwargs")
    if think is None and body.reasoning_effort is not None:
        think = body.reasoning_effort != "none"
    return None if think is None else bool(think)


REFUSED = {"audio": "this model answers in text only",
           "functions": "send them as 'tools' (each {\"type\": \"function\", "
                        "\"function\": ...}), the API's current form",
           "function_call": "use 'tool_choice', the API's current form",
           "web_search_options": "this node doesn't search the web; give the model a "
                                 "search tool of your own"}


def to_request(body: ChatCompletionRequest) -> wire.GenerateRequest:
    for name, why in REFUSED.items():
        if getattr(body, name) is not None:
            raise BadRequest(f"'{name}' can't be served here: {why}.", param=name)
    if body.n not in (None, 1):
        raise BadRequest("Only n=1 is supported: ask again for another answer.", param="n")
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    sampling = body.sampling(body.max_completion_tokens or body.max_tokens)
    if body.logprobs:
        sampling["logprobs"] = body.top_logprobs or 0
    constraint = constraint_of(body.response_format)
    if constraint:
        sampling["constraint"] = constraint
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    return wire.GenerateRequest(
        messages=template_messages(body.messages), tools=tools,
        tool_choice=choose_tool(body.tools, body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        thinking=thinking_of(body), sampling=sampling)


def usage(done: wire.Done) -> dict[str, Any]:
    p, c = done.prompt_tokens, done.generation_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def finish_of(done: wire.Done) -> str:
    return "stop" if done.finish_reason == "cancelled" else done.finish_reason


def call_json(c: wire.ToolCall, index: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"id": c.call_id, "type": "function",
                         "function": {"name": c.name, "arguments": c.arguments}}
    return d if index is None else {"index": index, **d}


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = common.parse(ChatCompletionRequest, raw)
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    req = to_request(body)
    hints.note(request, body.hints())
    async with common.generation(request, body.model, req) as g:
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": g.model}
        if body.stream:
            opts = body.stream_options
            return await _stream(request, g, base, bool(opts and opts.include_usage),
                                 bool(body.logprobs))
        a = await g.answer()
        assert a.done is not None
        msg: dict[str, Any] = {"role": "assistant",
                               "content": a.content or (None if a.tool_calls else "")}
        if a.reasoning:
            msg["reasoning_content"] = a.reasoning
        if a.tool_calls:
            msg["tool_calls"] = [call_json(c) for c in a.tool_calls]
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_of(a.done),
                                  "message": msg, "logprobs": None}
        if body.logprobs:
            choice["logprobs"] = {"content": a.logprobs, "refusal": None}
        return web.json_response({
            **base, "object": "chat.completion", "choices": [choice],
            "usage": usage(a.done),
            "shoal": common.speed(a.done, time.perf_counter() - g.t0)})


async def _stream(request: web.Request, g: common.Generation, base: dict[str, Any],
                  include_usage: bool, logprobs: bool) -> web.StreamResponse:
    resp = await common.sse(request)

    async def send(obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
        await resp.write(f"data: {data}\n\n".encode())

    def chunk(delta: dict[str, Any], finish: str | None = None,
              lps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs:
            c["logprobs"] = {"content": lps or [], "refusal": None} if lps else None
        return {**base, "object": "chat.completion.chunk", "choices": [c]}

    await send(chunk({"role": "assistant", "content": ""}))
    ttft, calls = None, 0
    async for ev in g.stream(progress=True):
        if ev is None:
            await resp.write(common.SSE_KEEPALIVE)
            continue
        if isinstance(ev, wire.Progress):
            await resp.write(common.sse_progress(ev))
            continue
        if ttft is None:
            ttft = time.perf_counter() - g.t0
        if isinstance(ev, wire.Error):
            await send(common.error_of(ev).to_openai())
            break
        if isinstance(ev, wire.Delta):
            key = "reasoning_content" if ev.kind == "reasoning" else "content"
            await send(chunk({key: ev.text}, lps=ev.logprobs))
        elif isinstance(ev, wire.ToolCall):  # name first, then the arguments, as OpenAI
            first = call_json(ev, calls)
            first["function"] = {"name": ev.name, "arguments": ""}
            await send(chunk({"tool_calls": [first]}))
            await send(chunk({"tool_calls": [{"index": calls,
                                              "function": {"arguments": ev.arguments}}]}))
            calls += 1
        elif isinstance(ev, wire.Done):
            await send({**chunk({}, finish_of(ev), ev.logprobs),
                        "shoal": common.speed(ev, ttft)})
            if include_usage:
                await send({**base, "object": "chat.completion.chunk", "choices": [],
                            "usage": usage(ev), "shoal": common.speed(ev, ttft)})
    await send("[DONE]")
    await resp.write_eof()
    return resp
