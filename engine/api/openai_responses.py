"""OpenAI Responses API (/v1/responses): input items, instructions, function tools with
function_call / function_call_output items, reasoning items, streaming events in the
documented order (created, in_progress, output_item.added, deltas, …done, completed)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api import common
from engine.api.render import (
    SSE_KEEPALIVE,
    Answer,
    Context,
    drafts,
    error_of,
    logprobs_json,
    sse,
)
from engine.api.responses_bodies import (
    CustomCallItem,
    FunctionCallItem,
    Item,
    MessageItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    Response,
)
from engine.api.responses_schemas import (
    NamedTool,
    ResponsesRequest,
    ToolNames,
    flatten_tools,
    to_request,
)
from engine.api.serve import Endpoint, handler
from engine.errors import ModelNotFound
from engine.records import TokenLogprob

routes = web.RouteTableDef()


def _envelope(body: ResponsesRequest, rid: str, model: str, status: str,
              output: list[Item], done: wire.Done | None, created: int) -> Response:
    out: Response = {
        "id": rid, "object": "response", "created_at": created, "status": status,
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
                        "total_tokens": done.prompt_tokens + done.generation_tokens,
                        "speculative": drafts(done)}
    return out


def _message(iid: str, text: str, logprobs: list[TokenLogprob], status: str
             ) -> MessageItem:
    return {"type": "message", "id": iid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs_json(logprobs)}] if status == "completed" else []}


def _reasoning(iid: str, text: str) -> ReasoningItem:
    return {"type": "reasoning", "id": iid, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _call(iid: str, c: wire.ToolCall, arguments: str, status: str,
          names: ToolNames) -> FunctionCallItem | CustomCallItem:
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
    item: FunctionCallItem = {"type": "function_call", "id": iid, "call_id": c.call_id,
                              "name": name, "arguments": arguments, "status": status}
    if namespace:
        item["namespace"] = namespace
    return item


@routes.get("/v1/responses/{rid}")
async def get_response(request: web.Request) -> web.Response:
    raise ModelNotFound("Shoal's Responses API is stateless: responses are not stored.",
                        param="response_id", code="not_found")


class ResponsesRenderer:
    """/v1/responses: the documented event order (created, in_progress, each item's
    added / deltas / done, completed or incomplete, or failed), numbered; or the response
    object."""

    media: str = "text/event-stream"
    keepalive_s: float | None = common.KEEPALIVE_S
    wants_admission: bool = False
    wants_progress: bool = False

    def __init__(self, body: ResponsesRequest, ctx: Context):
        self.body, self.ctx, self.names = body, ctx, flatten_tools(body.tools)
        self.rid, self.created = ctx.ids("resp_"), int(ctx.now())
        self.seq = 0
        self.output: list[Item] = []
        self.open_item: MessageItem | ReasoningItem | None = None  # the one being streamed
        self.text = ""

    def _env(self, status: str, done: wire.Done | None = None) -> Response:
        return _envelope(self.body, self.rid, self.ctx.model, status, self.output, done,
                         self.created)

    def _send(self, kind: str, **data: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return sse(obj, event=kind)

    def _close(self) -> list[bytes]:
        if self.open_item is None:
            return []
        i, iid, text = len(self.output), self.open_item["id"], self.text
        if self.open_item["type"] == "message":
            part: OutputText = {"type": "output_text", "text": text, "annotations": [],
                                "logprobs": []}
            out = [self._send("response.output_text.done", item_id=iid, output_index=i,
                              content_index=0, text=text, logprobs=[]),
                   self._send("response.content_part.done", item_id=iid, output_index=i,
                              content_index=0, part=part)]
            item: MessageItem | ReasoningItem = _message(iid, text, [], "completed")
        else:
            out = [self._send("response.reasoning_text.done", item_id=iid, output_index=i,
                              content_index=0, text=text)]
            item = _reasoning(iid, text)
        out.append(self._send("response.output_item.done", output_index=i, item=item))
        self.output.append(item)
        self.open_item, self.text = None, ""
        return out

    def _open(self, kind: str) -> list[bytes]:
        out = self._close()
        iid = self.ctx.ids("msg_" if kind == "message" else "rs_")
        self.open_item = _message(iid, "", [], "in_progress") if kind == "message" \
            else _reasoning(iid, "")
        i = len(self.output)
        out.append(self._send("response.output_item.added", output_index=i,
                              item=self.open_item))
        part: OutputText | ReasoningText = {
            "type": "output_text", "text": "", "annotations": [], "logprobs": []} \
            if kind == "message" else {"type": "reasoning_text", "text": ""}
        out.append(self._send("response.content_part.added", item_id=iid, output_index=i,
                              content_index=0, part=part))
        return out

    def start(self) -> list[bytes]:
        start = self._env("in_progress")
        return [self._send("response.created", response=start),
                self._send("response.in_progress", response=start)]

    def keepalive(self) -> bytes:
        return SSE_KEEPALIVE

    def event(self, ev: wire.Event) -> list[bytes]:
        if isinstance(ev, wire.Error):  # the protocol's own end for a failed response
            out = self._close()
            err = error_of(ev)
            failed = self._env("failed")
            failed["error"] = {"code": err.code or "server_error", "message": err.message}
            return out + [self._send("response.failed", response=failed)]
        if isinstance(ev, wire.Delta):
            kind = "reasoning" if ev.kind == "reasoning" else "message"
            out = self._open(kind) if self.open_item is None or \
                self.open_item["type"] != kind else []
            assert self.open_item is not None
            self.text += ev.text
            name = "response.output_text.delta" if kind == "message" \
                else "response.reasoning_text.delta"
            extra = {"logprobs": logprobs_json(ev.logprobs)} if kind == "message" else {}
            return out + [self._send(name, item_id=self.open_item["id"],
                                     output_index=len(self.output), content_index=0,
                                     delta=ev.text, **extra)]
        if isinstance(ev, wire.ToolCall):
            out = self._close()
            i, iid = len(self.output), self.ctx.ids("fc_")
            item = _call(iid, ev, ev.arguments, "completed", self.names)
            started = _call(iid, ev, "", "in_progress", self.names)
            out.append(self._send("response.output_item.added", output_index=i,
                                  item=started))
            if item["type"] == "custom_tool_call":
                out += [self._send("response.custom_tool_call_input.delta", item_id=iid,
                                   output_index=i, delta=item["input"]),
                        self._send("response.custom_tool_call_input.done", item_id=iid,
                                   output_index=i, input=item["input"])]
            else:
                out += [self._send("response.function_call_arguments.delta", item_id=iid,
                                   output_index=i, delta=ev.arguments),
                        self._send("response.function_call_arguments.done", item_id=iid,
                                   output_index=i, arguments=ev.arguments,
                                   name=item["name"])]
            out.append(self._send("response.output_item.done", output_index=i, item=item))
            self.output.append(item)
            return out
        if isinstance(ev, wire.Done):
            out = self._close()
            final = self._env("completed", ev)
            kind = "response.completed" if final["status"] == "completed" \
                else "response.incomplete"
            return out + [self._send(kind, response=final)]
        return []

    def end(self) -> list[bytes]:
        return []

    def answer(self, a: Answer) -> Response:
        if a.reasoning:
            self.output.append(_reasoning(self.ctx.ids("rs_"), a.reasoning))
        if a.content or not a.tool_calls:
            self.output.append(_message(self.ctx.ids("msg_"), a.content, a.logprobs,
                                        "completed"))
        self.output += [_call(self.ctx.ids("fc_"), c, c.arguments, "completed", self.names)
                        for c in a.tool_calls]
        return self._env("completed", a.done)


routes.post("/v1/responses")(handler(Endpoint(ResponsesRequest, to_request,
                                              ResponsesRenderer)))
