"""Ollama's API: /api/chat and /api/generate (NDJSON streaming), /api/tags, /api/show,
/api/ps, /api/version and HEAD / — for Open WebUI, VS Code's Ollama provider and the like."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api import common
from engine.api.backend import backend
from engine.api.ollama_bodies import Details, Entry, ErrorLine, Line, Message, Piece, ToolCall
from engine.api.ollama_schemas import (
    DONE_REASONS,
    ChatRequest,
    GenerateRequest,
    chat_request,
    generate_request,
)
from engine.api.render import Answer, Context, drafts, logprobs_json
from engine.api.serve import Endpoint, handler
from engine.durations import duration_seconds
from engine.errors import BadRequest, ModelNotFound

routes = web.RouteTableDef()
OLLAMA_VERSION = "0.12.0"  # the Ollama API level these routes follow


def _now(at: float | None = None) -> str:
    t = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return t.isoformat().replace("+00:00", "Z")


def _details(m: Any) -> Details:
    return {"parent_model": "", "format": "safetensors", "family": m.model_type,
            "families": [m.model_type], "parameter_size": "",
            "quantization_level": m.quantization}


def _entry(m: Any) -> Entry:
    mtime = datetime.fromtimestamp(Path(m.path).stat().st_mtime, UTC)
    return {"name": m.id, "model": m.id, "modified_at": mtime.isoformat(),
            "size": m.size_bytes, "digest": "", "details": _details(m)}


async def _find(request: web.Request, model: str) -> Any:
    model = model.removesuffix(":latest")
    for m in await backend(request).models():
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
    models = [_entry(m) for m in await backend(request).models()]
    have = {m["name"] for m in models}
    for r in backend(request).remote_models():  # served by instances other nodes own
        if r.id not in have:
            have.add(r.id)
            models.append({"name": r.id, "model": r.id, "modified_at": _now(), "size": 0,
                           "digest": "", "details": {"format": "safetensors", "family": "",
                                                     "families": [], "parameter_size": "",
                                                     "quantization_level": ""}})
    return web.json_response({"models": models})


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    """The models loaded: the chat model, and those running beside it (embeddings)."""
    b = backend(request)
    loaded = b.loaded_model()
    running = [await _find(request, loaded)] if loaded is not None else []
    running += [m for m in await b.running_beside() if m.id != loaded]
    out = []
    for m in running:
        left = b.expires_in(m.id)  # None: kept loaded until it is stopped
        expires = "2100-01-01T00:00:00Z" if left is None else \
            _now(datetime.now(UTC).timestamp() + left)
        out.append({**_entry(m), "expires_at": expires, "size_vram": m.size_bytes,
                    "context_length": m.context_length})
    return web.json_response({"models": out})


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    body = await common.read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("model") or body.get("name"),
                                                    str):
        raise BadRequest("Send {\"model\": \"<model id>\"}.", param="model")
    m = await _find(request, body.get("model") or body["name"])
    template = ""
    cfg = Path(m.path) / "tokenizer_config.json"
    if cfg.exists():
        template = str(json.loads(cfg.read_text()).get("chat_template") or "")
    does = m.capabilities or ["generate"]
    # Ollama's names: what clients check before offering tools, images or embeddings
    caps = (["completion"] + (["tools"] if "tools" in template else []) +
            (["thinking"] if "<think>" in template else []) if "generate" in does else []) \
        + (["vision"] if "vision" in does else []) \
        + (["embedding"] if "embed" in does else [])
    return web.json_response({
        "modelfile": "", "parameters": "", "template": template, "details": _details(m),
        "model_info": {"general.architecture": m.model_type,
                       f"{m.model_type}.context_length": m.context_length,
                       f"{m.model_type}.block_count": m.layers},
        "capabilities": caps, "modified_at": _entry(m)["modified_at"]})


def _final(done: wire.Done, model: str, t0: float, now: float,
           at: float | None = None) -> Line:
    run = done.prompt_tokens - done.cached_tokens  # prompt_tps counts the tokens run
    p_s = run / done.prompt_tps if done.prompt_tps else 0.0
    g_s = done.generation_tokens / done.generation_tps if done.generation_tps else 0.0
    return {"model": model, "created_at": _now(at), "done": True,
            "done_reason": DONE_REASONS.get(done.finish_reason, "stop"),
            "total_duration": int((now - t0) * 1e9), "load_duration": 0,
            # the prompt's duration is what it took: a cached prefix cost nothing
            "prompt_eval_count": done.prompt_tokens, "prompt_eval_duration": int(p_s * 1e9),
            "eval_count": done.generation_tokens, "eval_duration": int(g_s * 1e9),
            "speculative": drafts(done)}


def _call(c: wire.ToolCall) -> ToolCall:
    return {"id": c.call_id, "function": {"name": c.name,
                                          "arguments": json.loads(c.arguments or "{}")}}


class OllamaRenderer:
    """/api/chat and /api/generate: NDJSON lines, each a piece of the message (or the
    response text), the last with Ollama's counts and durations; an error line if it
    fails. Or the one final object."""

    media: str = "application/x-ndjson"
    keepalive_s: float | None = None  # NDJSON has no comment lines
    wants_admission: bool = False
    wants_progress: bool = False

    def __init__(self, body: Any, ctx: Context, chat: bool):
        self.ctx, self.chat = ctx, chat

    def _final(self, done: wire.Done) -> Line:
        return _final(done, self.ctx.model, self.ctx.t0, self.ctx.clock(), self.ctx.now())

    def _line(self, piece: Piece, done: wire.Done | None = None) -> bytes:
        obj: Line = self._final(done) if done else {
            "model": self.ctx.model, "created_at": _now(self.ctx.now()), "done": False}
        if self.chat:
            msg: Message = {"role": "assistant", "content": piece.get("content", "")}
            if "thinking" in piece:
                msg["thinking"] = piece["thinking"]
            if "tool_calls" in piece:
                msg["tool_calls"] = piece["tool_calls"]
            obj["message"] = msg
        else:
            obj["response"] = piece.get("content", "")
            if "thinking" in piece:
                obj["thinking"] = piece["thinking"]
            if "tool_calls" in piece:
                obj["tool_calls"] = piece["tool_calls"]
        if piece.get("logprobs"):  # beside the message, as Ollama's ChatResponse reads them
            obj["logprobs"] = piece["logprobs"]
        return json.dumps(obj).encode() + b"\n"

    def start(self) -> list[bytes]:
        return []

    def keepalive(self) -> bytes:
        return b""

    def event(self, ev: wire.Event) -> list[bytes]:
        if isinstance(ev, wire.Error):
            err: ErrorLine = {"error": ev.message}
            return [json.dumps(err).encode() + b"\n"]
        lp: Piece = {"logprobs": logprobs_json(ev.logprobs)} \
            if isinstance(ev, (wire.Delta, wire.Done)) and ev.logprobs else {}
        if isinstance(ev, wire.Delta):
            piece: Piece = {"thinking": ev.text} if ev.kind == "reasoning" \
                else {"content": ev.text}
            return [self._line({**piece, **lp})]
        if isinstance(ev, wire.ToolCall):
            return [self._line({"tool_calls": [_call(ev)]})]
        if isinstance(ev, wire.Done):
            return [self._line(lp, ev)]
        return []

    def end(self) -> list[bytes]:
        return []

    def answer(self, a: Answer) -> Line:
        assert a.done is not None
        out = self._final(a.done)
        if self.chat:
            msg: Message = {"role": "assistant", "content": a.content}
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
            out["logprobs"] = logprobs_json(a.logprobs)
        return out


def keep_alive_seconds(v: Any) -> float | None:
    """Ollama's keep_alive (engine.durations.duration_seconds), or a 400 naming it."""
    try:
        return duration_seconds(v)
    except ValueError as e:
        raise BadRequest(f"keep_alive: {e}", param="keep_alive") from None


def _keep(request: web.Request, model: str, keep_alive: Any) -> None:
    if keep_alive is not None:
        backend(request).keep_alive(model, keep_alive_seconds(keep_alive))


async def _load_only(request: web.Request, model: str, chat: bool,
                     keep_alive: Any) -> web.Response:
    """An empty request loads the model (or, with keep_alive 0, unloads it), as Ollama."""
    _keep(request, model, keep_alive)
    if keep_alive is not None and keep_alive_seconds(keep_alive) == 0:
        await backend(request).unload(model)
        reason = "unload"
    else:
        await backend(request).load(model)
        reason = "load"
    out: Line = {"model": model, "created_at": _now(), "done": True, "done_reason": reason}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return web.json_response(out)


async def _chat_load(request: web.Request, body: ChatRequest) -> web.Response | None:
    if body.messages:  # a request to answer: its keep_alive holds from now on
        _keep(request, body.model, body.keep_alive)
        return None
    return await _load_only(request, body.model, True, body.keep_alive)


async def _generate_load(request: web.Request, body: GenerateRequest) -> web.Response | None:
    if body.prompt or body.raw:
        _keep(request, body.model, body.keep_alive)
        return None
    return await _load_only(request, body.model, False, body.keep_alive)


routes.post("/api/chat")(handler(Endpoint(
    ChatRequest, chat_request, lambda body, ctx: OllamaRenderer(body, ctx, chat=True),
    prepare=_untagged, shortcut=_chat_load)))
routes.post("/api/generate")(handler(Endpoint(
    GenerateRequest, generate_request, lambda body, ctx: OllamaRenderer(body, ctx, chat=False),
    prepare=_untagged, shortcut=_generate_load)))
