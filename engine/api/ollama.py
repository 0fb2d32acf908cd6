"""Ollama's API: /api/chat and /api/generate (NDJSON streaming), /api/tags, /api/show,
/api/ps, /api/version and HEAD / — for Open WebUI, VS Code's Ollama provider and the like."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api import common
from engine.api.ollama_schemas import (
    DONE_REASONS,
    ChatRequest,
    GenerateRequest,
    chat_request,
    generate_request,
)
from engine.errors import BadRequest, ModelNotFound

routes = web.RouteTableDef()
OLLAMA_VERSION = "0.12.0"  # the Ollama API level these routes follow


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _details(m: Any) -> dict[str, Any]:
    return {"parent_model": "", "format": "safetensors", "family": m.model_type,
            "families": [m.model_type], "parameter_size": "",
            "quantization_level": m.quantization}


def _entry(m: Any) -> dict[str, Any]:
    mtime = datetime.fromtimestamp(Path(m.path).stat().st_mtime, UTC)
    return {"name": m.id, "model": m.id, "modified_at": mtime.isoformat(),
            "size": m.size_bytes, "digest": "", "details": _details(m)}


def _find(request: web.Request, model: str) -> Any:
    model = model.removesuffix(":latest")
    for m in request.app["node"].local_models():
        if m.id == model:
            return m
    raise ModelNotFound(f"model '{model}' not found", param="model")


def _untagged(body: Any) -> Any:
    """Ollama clients may add the default tag (name:latest); Shoal's ids have no tags."""
    if body.model.endswith(":latest"):
        return body.model_copy(update={"model": body.model.removesuffix(":latest")})
    return body


@routes.get("/")
async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")  # what clients probe for; HEAD too


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    models = [_entry(m) for m in request.app["node"].local_models()]
    cluster = request.app.get("cluster")
    if cluster is not None:  # served by distributed instances other nodes own
        have = {m["name"] for m in models}
        for _, inst in cluster.remote_instances():
            if inst["model"] not in have:
                have.add(inst["model"])
                models.append({"name": inst["model"], "model": inst["model"],
                               "modified_at": _now(), "size": 0, "digest": "",
                               "details": {"format": "safetensors", "family": "",
                                           "families": [], "parameter_size": "",
                                           "quantization_level": ""}})
    return web.json_response({"models": models})


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    w = request.app["node"].worker
    if w is None or not w.alive:
        return web.json_response({"models": []})
    m = _find(request, w.model_id)
    return web.json_response({"models": [{**_entry(m), "expires_at": "2100-01-01T00:00:00Z",
                                          "size_vram": m.size_bytes,
                                          "context_length": m.context_length}]})


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    body = await common.read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("model") or body.get("name"),
                                                    str):
        raise BadRequest("Send {\"model\": \"<model id>\"}.", param="model")
    m = _find(request, body.get("model") or body["name"])
    template = ""
    cfg = Path(m.path) / "tokenizer_config.json"
    if cfg.exists():
        template = str(json.loads(cfg.read_text()).get("chat_template") or "")
    caps = ["completion"] + (["tools"] if "tools" in template else []) + \
        (["thinking"] if "<think>" in template else [])
    return web.json_response({
        "modelfile": "", "parameters": "", "template": template, "details": _details(m),
        "model_info": {"general.architecture": m.model_type,
                       f"{m.model_type}.context_length": m.context_length,
                       f"{m.model_type}.block_count": m.layers},
        "capabilities": caps, "modified_at": _entry(m)["modified_at"]})


def _final(done: wire.Done, model: str, t0: float) -> dict[str, Any]:
    run = done.prompt_tokens - done.cached_tokens  # prompt_tps counts the tokens run
    p_s = run / done.prompt_tps if done.prompt_tps else 0.0
    g_s = done.generation_tokens / done.generation_tps if done.generation_tps else 0.0
    return {"model": model, "created_at": _now(), "done": True,
            "done_reason": DONE_REASONS.get(done.finish_reason, "stop"),
            "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
            # the prompt's duration is what it took: a cached prefix cost nothing
            "prompt_eval_count": done.prompt_tokens, "prompt_eval_duration": int(p_s * 1e9),
            "eval_count": done.generation_tokens, "eval_duration": int(g_s * 1e9)}


def _call(c: wire.ToolCall) -> dict[str, Any]:
    return {"id": c.call_id, "function": {"name": c.name,
                                          "arguments": json.loads(c.arguments or "{}")}}


async def _serve(request: web.Request, body: Any, req: wire.GenerateRequest,
                 chat: bool) -> web.StreamResponse:
    async with common.generation(request, body.model, req) as g:
        if not body.stream:
            a = await g.answer()
            assert a.done is not None
            out = _final(a.done, g.model, g.t0)
            if chat:
                msg: dict[str, Any] = {"role": "assistant", "content": a.content}
                if a.reasoning:
                    msg["thinking"] = a.reasoning
                if a.tool_calls:
                    msg["tool_calls"] = [_call(c) for c in a.tool_calls]
                out["message"] = msg
            else:
                out["response"] = a.content
                if a.reasoning:
                    out["thinking"] = a.reasoning
            if a.logprobs:
                out["logprobs"] = a.logprobs
            return web.json_response(out)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        async def line(piece: dict[str, Any], done: wire.Done | None = None) -> None:
            obj = _final(done, g.model, g.t0) if done else {
                "model": g.model, "created_at": _now(), "done": False}
            if chat:
                obj["message"] = {"role": "assistant", "content": "", **piece}
            else:
                obj["response"] = piece.pop("content", "")
                obj.update(piece)
            await resp.write(json.dumps(obj).encode() + b"\n")

        async for ev in g.events:
            if isinstance(ev, wire.Error):
                await resp.write(json.dumps({"error": ev.message}).encode() + b"\n")
                break
            lp = {"logprobs": ev.logprobs} if isinstance(ev, (wire.Delta, wire.Done)) \
                and ev.logprobs else {}
            if isinstance(ev, wire.Delta):
                key = "thinking" if ev.kind == "reasoning" else "content"
                await line({key: ev.text, **lp})
            elif isinstance(ev, wire.ToolCall):
                await line({"tool_calls": [_call(ev)]})
            elif isinstance(ev, wire.Done):
                await line(lp, ev)
        await resp.write_eof()
        return resp


async def _load_only(request: web.Request, model: str, chat: bool,
                     keep_alive: Any) -> web.Response:
    """An empty request loads the model (or, with keep_alive 0, unloads it), as Ollama."""
    node = request.app["node"]
    if keep_alive in (0, "0", "0s", "0m"):
        if node.worker is not None and node.worker.model_id == model:
            await node.unload()
        reason = "unload"
    else:
        await node.ensure_loaded(model)
        reason = "load"
    out: dict[str, Any] = {"model": model, "created_at": _now(), "done": True,
                           "done_reason": reason}
    out.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return web.json_response(out)


@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = _untagged(common.parse(ChatRequest, raw))
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    if not body.messages:
        return await _load_only(request, body.model, True, body.keep_alive)
    return await _serve(request, body, chat_request(body), chat=True)


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = _untagged(common.parse(GenerateRequest, raw))
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    if not body.prompt and not body.raw:
        return await _load_only(request, body.model, False, body.keep_alive)
    return await _serve(request, body, generate_request(body), chat=False)
