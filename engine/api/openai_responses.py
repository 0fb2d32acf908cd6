"""OpenAI Responses API (/v1/responses): input items, instructions, function tools with
function_call / function_call_output items, reasoning items, streaming events in the
documented order (created, in_progress, output_item.added, deltas, …done, completed)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api import common, hints
from engine.api.responses_schemas import (
    NamedTool,
    ResponsesRequest,
    ToolNames,
    flatten_tools,
    to_request,
)
from engine.errors import ModelNotFound

routes = web.RouteTableDef()


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _envelope(body: ResponsesRequest, rid: str, model: str, status: str,
              output: list[dict[str, Any]], done: wire.Done | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
        "model": model, "output": output, "error": None, "incomplete_details": None,
        "instructions": body.instructions, "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "temperature": body.temperature, "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens, "previous_response_id": None,
        "tool_choice": body.tool_choice.model_dump()
        if isinstance(body.tool_choice, NamedTool) else (body.tool_choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "text": {"format": {"type": "text"}}, "usage": None}
    if done is not None:
        if done.finish_reason == "length":
            out["status"] = "incomplete"
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        out["usage"] = {"input_tokens": done.prompt_tokens,
                        "input_tokens_details": {
                            "cached_tokens": done.cached_tokens,
                            # what this prompt added to the prefix cache
                            "cache_write_tokens": done.prompt_tokens - done.cached_tokens},
                        "output_tokens": done.generation_tokens,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": done.prompt_tokens + done.generation_tokens}
    return out


def _message(iid: str, text: str, logprobs: list[dict[str, Any]], status: str
             ) -> dict[str, Any]:
    return {"type": "message", "id": iid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs}] if status == "completed" else []}


def _reasoning(iid: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": iid, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _call(iid: str, c: wire.ToolCall, arguments: str, status: str,
          names: ToolNames) -> dict[str, Any]:
    """A function_call item (naming its namespace), or a freeform tool's custom_tool_call."""
    name, namespace, freeform = names.call(c.name)
    if freeform:
        try:
            text = json.loads(arguments or "{}").get("input", "")
        except (ValueError, AttributeError):
            text = arguments
        return {"type": "custom_tool_call", "id": iid, "call_id": c.call_id, "name": name,
                "input": text if isinstance(text, str) else json.dumps(text),
                "status": status}
    item = {"type": "function_call", "id": iid, "call_id": c.call_id, "name": name,
            "arguments": arguments, "status": status}
    return {**item, "namespace": namespace} if namespace else item


@routes.get("/v1/responses/{rid}")
async def get_response(request: web.Request) -> web.Response:
    raise ModelNotFound("Shoal's Responses API is stateless: responses are not stored.",
                        param="response_id", code="not_found")


@routes.post("/v1/responses")
async def responses(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = common.parse(ResponsesRequest, raw)
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    req = to_request(body)
    names = flatten_tools(body.tools)
    hints.note(request, body.hints())
    async with common.generation(request, body.model, req) as g:
        rid = _id("resp")
        if body.stream:
            return await _stream(request, body, g, rid, names)
        a = await g.answer()
        output: list[dict[str, Any]] = []
        if a.reasoning:
            output.append(_reasoning(_id("rs"), a.reasoning))
        if a.content or not a.tool_calls:
            output.append(_message(_id("msg"), a.content, a.logprobs, "completed"))
        output += [_call(_id("fc"), c, c.arguments, "completed", names) for c in a.tool_calls]
        return web.json_response(_envelope(body, rid, g.model, "completed", output, a.done))


async def _stream(request: web.Request, body: ResponsesRequest, g: common.Generation,
                  rid: str, names: ToolNames) -> web.StreamResponse:
    resp = await common.sse(request)
    seq = 0
    output: list[dict[str, Any]] = []
    open_item: dict[str, Any] | None = None  # the message or reasoning item being written
    text = ""

    async def send(kind: str, **data: Any) -> None:
        nonlocal seq
        obj = {"type": kind, "sequence_number": seq, **data}
        seq += 1
        await resp.write(f"event: {kind}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"
                         .encode())

    async def close() -> None:
        nonlocal open_item, text
        if open_item is None:
            return
        i, iid = len(output), open_item["id"]
        if open_item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            await send("response.output_text.done", item_id=iid, output_index=i,
                       content_index=0, text=text, logprobs=[])
            await send("response.content_part.done", item_id=iid, output_index=i,
                       content_index=0, part=part)
            item = _message(iid, text, [], "completed")
        else:
            await send("response.reasoning_text.done", item_id=iid, output_index=i,
                       content_index=0, text=text)
            item = _reasoning(iid, text)
        await send("response.output_item.done", output_index=i, item=item)
        output.append(item)
        open_item, text = None, ""

    async def open_(kind: str) -> None:
        nonlocal open_item
        await close()
        iid = _id("msg" if kind == "message" else "rs")
        open_item = _message(iid, "", [], "in_progress") if kind == "message" \
            else _reasoning(iid, "")
        i = len(output)
        await send("response.output_item.added", output_index=i, item=open_item)
        if kind == "message":
            await send("response.content_part.added", item_id=iid, output_index=i,
                       content_index=0, part={"type": "output_text", "text": "",
                                              "annotations": [], "logprobs": []})
        else:
            await send("response.content_part.added", item_id=iid, output_index=i,
                       content_index=0, part={"type": "reasoning_text", "text": ""})

    start = _envelope(body, rid, g.model, "in_progress", [], None)
    await send("response.created", response=start)
    await send("response.in_progress", response=start)
    async for ev in g.stream():
        if ev is None:
            await resp.write(common.SSE_KEEPALIVE)
            continue
        if isinstance(ev, wire.Error):  # the protocol's own end for a failed response
            await close()
            err = common.error_of(ev)
            failed = _envelope(body, rid, g.model, "failed", output, None)
            failed["error"] = {"code": err.code or "server_error", "message": err.message}
            await send("response.failed", response=failed)
            break
        if isinstance(ev, wire.Delta):
            kind = "reasoning" if ev.kind == "reasoning" else "message"
            if open_item is None or open_item["type"] != kind:
                await open_(kind)
            assert open_item is not None
            text += ev.text
            name = "response.output_text.delta" if kind == "message" \
                else "response.reasoning_text.delta"
            extra = {"logprobs": ev.logprobs or []} if kind == "message" else {}
            await send(name, item_id=open_item["id"], output_index=len(output),
                       content_index=0, delta=ev.text, **extra)
        elif isinstance(ev, wire.ToolCall):
            await close()
            i, iid = len(output), _id("fc")
            item = _call(iid, ev, ev.arguments, "completed", names)
            started = _call(iid, ev, "", "in_progress", names)
            await send("response.output_item.added", output_index=i, item=started)
            if item["type"] == "custom_tool_call":
                await send("response.custom_tool_call_input.delta", item_id=iid,
                           output_index=i, delta=item["input"])
                await send("response.custom_tool_call_input.done", item_id=iid,
                           output_index=i, input=item["input"])
            else:
                await send("response.function_call_arguments.delta", item_id=iid,
                           output_index=i, delta=ev.arguments)
                await send("response.function_call_arguments.done", item_id=iid,
                           output_index=i, arguments=ev.arguments, name=item["name"])
            await send("response.output_item.done", output_index=i, item=item)
            output.append(item)
        elif isinstance(ev, wire.Done):
            await close()
            final = _envelope(body, rid, g.model, "completed", output, ev)
            kind = "response.completed" if final["status"] == "completed" \
                else "response.incomplete"
            await send(kind, response=final)
    await resp.write_eof()
    return resp
