"""OpenAI legacy completions (/v1/completions): a raw prompt (text or token ids), `echo`,
`suffix` for fill-in-the-middle where the model has FIM tokens, streaming, logprobs."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import Field

from engine import protocol as wire
from engine.api import common
from engine.api.openai_bodies import Head, LegacyLogprobs, TextChoice, TextChunk
from engine.api.openai_chat import finish_of, usage
from engine.api.openai_schemas import MAX_TOKENS_LIMIT, SamplingFields, StreamOptions
from engine.api.render import SSE_KEEPALIVE, Answer, Context, error_of, sse
from engine.api.serve import Endpoint, handler
from engine.errors import BadRequest
from engine.records import TokenLogprob

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
    return wire.GenerateRequest(prompt=_prompt(body.prompt), suffix=body.suffix,
                                sampling=body.sampling(body.max_tokens, body.logprobs))


def legacy_logprobs(entries: list[TokenLogprob], offset: int) -> LegacyLogprobs:
    """The completions API's older shape: parallel lists."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {"tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top_logprobs} for e in entries],
            "text_offset": offsets}


class CompletionRenderer:
    """/v1/completions: text chunks (the echoed prompt first, when asked), the older
    logprobs shape, usage if asked, [DONE]; or the text_completion object."""

    media: str = "text/event-stream"
    keepalive_s: float | None = common.KEEPALIVE_S
    wants_admission: bool = False
    wants_progress: bool = False

    def __init__(self, body: CompletionRequest, ctx: Context):
        self.body = body
        self.base: Head = {"id": ctx.ids("cmpl-"), "created": int(ctx.now()),
                           "model": ctx.model}
        self.echo = (ctx.prompt_text or "") if body.echo else ""
        self.at = len(self.echo)

    def _body(self, choices: list[TextChoice]) -> TextChunk:
        h = self.base  # the keys in OpenAI's order
        return {"id": h["id"], "object": "text_completion", "created": h["created"],
                "model": h["model"], "choices": choices}

    def _send(self, choice: TextChoice) -> bytes:
        return sse(self._body([choice]))

    def start(self) -> list[bytes]:
        return [self._send({"index": 0, "text": self.echo, "logprobs": None,
                            "finish_reason": None})] if self.echo else []

    def keepalive(self) -> bytes:
        return SSE_KEEPALIVE

    def event(self, ev: wire.Event) -> list[bytes]:
        if isinstance(ev, wire.Error):
            return [sse(error_of(ev).to_openai())]
        if not isinstance(ev, (wire.Delta, wire.Done)):
            return []
        out = []
        lps = legacy_logprobs(ev.logprobs or [], self.at) \
            if self.body.logprobs is not None else None
        text = ev.text if isinstance(ev, wire.Delta) else ""
        self.at += len(text)
        finish = finish_of(ev) if isinstance(ev, wire.Done) else None
        if text or finish or lps and lps["tokens"]:
            out.append(self._send({"index": 0, "text": text, "logprobs": lps,
                                   "finish_reason": finish}))
        opts = self.body.stream_options
        if isinstance(ev, wire.Done) and opts and opts.include_usage:
            tail = self._body([])
            tail["usage"] = usage(ev)
            out.append(sse(tail))
        return out

    def end(self) -> list[bytes]:
        return [sse("[DONE]")]

    def answer(self, a: Answer) -> TextChunk:
        assert a.done is not None
        lps = legacy_logprobs(a.logprobs, len(self.echo)) \
            if self.body.logprobs is not None else None
        out = self._body([{"index": 0, "text": self.echo + a.content, "logprobs": lps,
                           "finish_reason": finish_of(a.done)}])
        out["usage"] = usage(a.done)
        return out


routes.post("/v1/completions")(handler(Endpoint(CompletionRequest, to_request,
                                                CompletionRenderer)))
