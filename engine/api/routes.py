"""OpenAI-compatible routes: /v1/models and /v1/chat/completions (plain and streaming)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from engine.api.schemas import ChatRequest, parse_chat_request
from engine.errors import BadRequest, ModelNotFound, ShoalError, WorkerFailed
from engine.node.service import Node

routes = web.RouteTableDef()


def _node(request: web.Request) -> Node:
    return request.app["node"]


def _model_card(m: Any) -> dict[str, Any]:
    return {"id": m.id, "object": "model", "created": 0, "owned_by": "shoal",
            "shoal": {"source": m.source, "size_bytes": m.size_bytes, "layers": m.layers,
                      "quantization": m.quantization, "context_length": m.context_length}}


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    cards = [_model_card(m) for m in _node(request).local_models()]
    cluster = request.app.get("cluster")
    if cluster is not None:  # models served by distributed instances on other nodes
        have = {c["id"] for c in cards}
        for _, inst in cluster.remote_instances():
            if inst["model"] not in have:
                have.add(inst["model"])
                cards.append({"id": inst["model"], "object": "model", "created": 0,
                              "owned_by": "shoal", "shoal": {"instance": inst}})
    return web.json_response({"object": "list", "data": cards})


@routes.get("/v1/models/{model_id:.+}")
async def get_model(request: web.Request) -> web.Response:
    mid = request.match_info["model_id"]
    for m in _node(request).local_models():
        if m.id == mid:
            return web.json_response(_model_card(m))
    raise ModelNotFound(f"The model '{mid}' is not on this node.", param="model")


def _error_of(ev: dict[str, Any]) -> ShoalError:
    e = ShoalError(ev.get("message", "generation failed"), param=ev.get("param"),
                   code=ev.get("code"))
    e.status = int(ev.get("status") or 500)
    if e.status < 500:
        e.type = "invalid_request_error"
    return e


def _speed(done: dict[str, Any], ttft: float) -> dict[str, float]:
    return {"ttft_s": round(ttft, 4), "prompt_tps": round(done["prompt_tps"], 2),
            "generation_tps": round(done["generation_tps"], 2),
            "peak_memory_gb": round(done["peak_memory_gb"], 3)}


def _usage(done: dict[str, Any]) -> dict[str, int]:
    p, c = int(done["prompt_tokens"]), int(done["generation_tokens"])
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"The request body is not valid JSON: {e}.") from None


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    req = parse_chat_request(body)
    node = _node(request)
    cluster = request.app.get("cluster")
    w = node.worker
    serving_here = w is not None and w.alive and w.model_id == req.model
    if req.model and cluster is not None and not serving_here:
        owner = cluster.owner_of(req.model)
        if owner is not None:  # a distributed instance owned by another node serves it
            from engine.node.cluster_routes import proxy_chat
            return await proxy_chat(request, owner, body)
    worker = await node.ensure_loaded(req.model)
    t0 = time.perf_counter()
    async with worker.generate(req.messages, req.sampling, node.on_turn) as events:
        first = await anext(events)
        if first["ev"] == "error":
            raise _error_of(first)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": worker.model_id}
        if req.stream:
            return await _stream(request, req, events, base, t0)
        return await _whole(events, base, t0)


async def _whole(events: Any, base: dict[str, Any], t0: float) -> web.Response:
    parts: list[str] = []
    ttft = None
    async for ev in events:
        if ev["ev"] == "error":
            raise _error_of(ev)
        if ttft is None:
            ttft = time.perf_counter() - t0
        parts.append(ev["text"])
        if ev["ev"] == "done":
            return web.json_response({
                **base, "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": ev["finish_reason"],
                             "message": {"role": "assistant", "content": "".join(parts)}}],
                "usage": _usage(ev), "shoal": _speed(ev, ttft)})
    raise WorkerFailed("The worker stopped without finishing the answer.")


async def _stream(request: web.Request, req: ChatRequest, events: Any,
                  base: dict[str, Any], t0: float) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)

    async def send(obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
        await resp.write(f"data: {data}\n\n".encode())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    await send(chunk({"role": "assistant", "content": ""}))
    ttft = None
    async for ev in events:
        if ev["ev"] == "error":
            await send(_error_of(ev).to_openai())
            break
        if ttft is None:
            ttft = time.perf_counter() - t0
        if ev["text"]:
            await send(chunk({"content": ev["text"]}))
        if ev["ev"] == "done":
            finish = "stop" if ev["finish_reason"] == "cancelled" else ev["finish_reason"]
            await send({**chunk({}, finish), "shoal": _speed(ev, ttft)})
            if req.include_usage:
                await send({**base, "object": "chat.completion.chunk", "choices": [],
                            "usage": _usage(ev), "shoal": _speed(ev, ttft)})
    await send("[DONE]")
    await resp.write_eof()
    return resp
