"""OpenAI legacy completions (/v1/completions): a raw prompt (text or token ids), `echo`,
`suffix` for fill-in-the-middle where the model has FIM tokens, streaming, logprobs."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web
from pydantic import Field

from engine import protocol as wire
from engine.api import common
from engine.api.openai_chat import finish_of, usage
from engine.api.openai_schemas import MAX_TOKENS_LIMIT, SamplingFields, StreamOptions
from engine.errors import BadRequest

routes = web.RouteTableDef()


class CompletionRequest(SamplingFields):
    model: str | None = Field(default=None, min_length=1)
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    n: int | None = None
    best_of: int | None = None
    user: str | None = None


def _prompt(p: Any) -> str | list[int]:
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise BadRequest("Send one prompt per request (a list of several is not "
                             "supported).", param="prompt")
        p = p[0]
    if p == []:
        raise BadRequest("'prompt' is empty.", param="prompt")
    return p


def to_request(body: CompletionRequest) -> wire.GenerateRequest:
    for name in ("n", "best_of"):
        if getattr(body, name) not in (None, 1):
            raise BadRequest(f"Only {name}=1 is supported.", param=name)
    if body.echo and body.logprobs is not None:
        raise BadRequest("'echo' with 'logprobs' would need the prompt's log-probabilities, "
                         "which Shoal doesn't compute.", param="echo")
    sampling = body.sampling(body.max_tokens)
    if body.logprobs is not None:
        sampling["logprobs"] = body.logprobs
    return wire.GenerateRequest(prompt=_prompt(body.prompt), suffix=body.suffix,
                                sampling=sampling)


def legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """The completions API's older shape: parallel lists."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in entries],
            "text_offset": offsets}


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    raw = await common.read_json(request)
    body = common.parse(CompletionRequest, raw)
    relayed = await common.relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    async with common.generation(request, body.model, to_request(body)) as g:
        base = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
                "created": int(time.time()), "model": g.model}
        echo = (g.accepted.prompt_text or "") if body.echo else ""
        if not body.stream:
            a = await g.answer()
            assert a.done is not None
            lps = legacy_logprobs(a.logprobs, len(echo)) if body.logprobs is not None \
                else None
            return web.json_response({**base, "choices": [{
                "index": 0, "text": echo + a.content, "logprobs": lps,
                "finish_reason": finish_of(a.done)}], "usage": usage(a.done)})
        resp = await common.sse(request)

        async def send(choice: dict[str, Any] | None, **extra: Any) -> None:
            obj = {**base, "choices": [choice] if choice else [], **extra}
            await resp.write(f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode())

        at = len(echo)
        if echo:
            await send({"index": 0, "text": echo, "logprobs": None, "finish_reason": None})
        async for ev in g.stream():
            if ev is None:
                await resp.write(common.SSE_KEEPALIVE)
                continue
            if isinstance(ev, wire.Error):
                await resp.write(f"data: {json.dumps(common.error_of(ev).to_openai())}\n\n"
                                 .encode())
                break
            if isinstance(ev, (wire.Delta, wire.Done)):
                lps = legacy_logprobs(ev.logprobs or [], at) if body.logprobs is not None \
                    else None
                text = ev.text if isinstance(ev, wire.Delta) else ""
                at += len(text)
                finish = finish_of(ev) if isinstance(ev, wire.Done) else None
                if text or finish or lps and lps["tokens"]:
                    await send({"index": 0, "text": text, "logprobs": lps,
                                "finish_reason": finish})
                if isinstance(ev, wire.Done) and body.stream_options \
                        and body.stream_options.include_usage:
                    await send(None, usage=usage(ev))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
