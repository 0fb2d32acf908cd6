"""OpenAI legacy completions (/v1/completions): a raw prompt (text or token ids), `echo`,
`suffix` for fill-in-the-middle where the model has FIM tokens, streaming, logprobs."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from aiohttp import web
from pydantic import Field

from engine import protocol as wire
from engine.api import common, dialect_map
from engine.api.dialect_fields import LlamaCppFields, VllmFields
from engine.api.dialect_render import Legacy, TokenCount, legacy_prompt, vllm_prompt_logprobs
from engine.api.openai_bodies import Head, LegacyLogprobs, TextChoice, TextChunk
from engine.api.openai_chat import finish_of, usage
from engine.api.openai_schemas import (
    MAX_TOKENS_LIMIT,
    ResponseFormat,
    SamplingFields,
    StreamOptions,
    constraint_of,
    treatment,
)
from engine.api.render import SSE_KEEPALIVE, Answer, Context, error_of, sse, token_name
from engine.api.serve import Endpoint, handler
from engine.errors import BadRequest
from engine.records import TokenLogprob

routes = web.RouteTableDef()


class CompletionRequest(SamplingFields, VllmFields, LlamaCppFields):
    TREATMENT: ClassVar[dict[str, str]] = treatment(
        VllmFields, LlamaCppFields, n="only 1", best_of="only 1", user="hint",
        prompt_embeds="refused")
    model: str | None = Field(default=None, min_length=1)
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    # 0: only the prompt's log-probabilities (echo + logprobs), as evaluation harnesses ask
    max_tokens: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    n: int | None = None
    best_of: int | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None  # vLLM's, as on chat
    add_special_tokens: bool | None = None  # vLLM's: None is the tokenizer's own
    prompt_embeds: Any = None  # refused: a prompt here is text or token ids

    def hints(self) -> list[str]:
        return dialect_map.hints_of(self, self.TREATMENT)


def _prompt(p: Any) -> str | list[int]:
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise BadRequest("Send one prompt per request (a list of several is not "
                             "supported).", param="prompt")
        p = p[0]
    if p == []:
        raise BadRequest("'prompt' is empty.", param="prompt")
    return p


def logprobs_of(body: CompletionRequest) -> int | None:
    """How many alternatives each token's logprobs list: OpenAI's logprobs or llama.cpp's
    n_probs (different values are a 400)."""
    if body.logprobs is not None and body.n_probs is not None \
            and body.logprobs != body.n_probs:
        raise BadRequest(f"'logprobs' ({body.logprobs}) and 'n_probs' ({body.n_probs}) "
                         "differ: send one.", param="n_probs")
    return body.logprobs if body.logprobs is not None else body.n_probs or None


def to_request(body: CompletionRequest) -> wire.GenerateRequest:
    for name in ("n", "best_of"):
        if getattr(body, name) not in (None, 1):
            raise BadRequest(f"Only {name}=1 is supported.", param=name)
    if body.prompt_embeds is not None:
        raise BadRequest("'prompt_embeds' can't be served here: send the prompt as text or "
                         "token ids.", param="prompt_embeds")
    dialect_map.check(body)
    k = logprobs_of(body)
    sampling = body.sampling(dialect_map.max_tokens_of(body, "max_tokens"), k,
                             dialect_map.structured(body, constraint_of(body.response_format)))
    if body.echo and k is not None and sampling.prompt_logprobs is None:
        # the echoed prompt's tokens get their logprobs too (OpenAI's old API, vLLM)
        sampling = dataclasses.replace(sampling, prompt_logprobs=k)
    return wire.GenerateRequest(prompt=_prompt(body.prompt), suffix=body.suffix,
                                sampling=sampling, add_special=body.add_special_tokens)


def legacy_logprobs(entries: list[TokenLogprob], offset: int, as_ids: bool = False
                    ) -> LegacyLogprobs:
    """The completions API's older shape: parallel lists."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {"tokens": [token_name(e, as_ids) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_name(t, as_ids): t.logprob for t in e.top_logprobs}
                             for e in entries],
            "text_offset": offsets}


def _joined(head: Legacy | LegacyLogprobs, tail: LegacyLogprobs) -> LegacyLogprobs:
    return {"tokens": head["tokens"] + tail["tokens"],
            "token_logprobs": head["token_logprobs"] + tail["token_logprobs"],
            "top_logprobs": (head["top_logprobs"] or []) + (tail["top_logprobs"] or []),
            "text_offset": head["text_offset"] + tail["text_offset"]}


class CompletionRenderer:
    """/v1/completions: text chunks (the echoed prompt first, when asked), the older
    logprobs shape, usage if asked, [DONE]; or the text_completion object. With echo and
    logprobs the echoed prompt's tokens carry theirs, which come with the answer's end:
    that stream is sent whole when it ends."""

    media: str = "text/event-stream"
    keepalive_s: float | None = common.KEEPALIVE_S
    wants_admission: bool = False
    wants_progress: bool = False

    def __init__(self, body: CompletionRequest, ctx: Context):
        self.body, self.k = body, logprobs_of(body)
        self.as_ids = bool(body.return_tokens_as_token_ids)
        self.base: Head = {"id": ctx.ids("cmpl-"), "created": int(ctx.now()),
                           "model": ctx.model}
        self.echo = (ctx.prompt_text or "") if body.echo else ""
        self.at = len(self.echo)
        self.joined = bool(self.echo) and self.k is not None  # the prompt's logprobs too
        self.held: list[TextChoice] = []
        opts = body.stream_options
        self.continuous = bool(opts and opts.continuous_usage_stats)
        self.include_usage = bool(opts and (opts.include_usage or self.continuous
                                            and opts.include_usage is None))
        self.count = TokenCount(ctx.prompt_tokens)

    def _body(self, choices: list[TextChoice]) -> TextChunk:
        h = self.base  # the keys in OpenAI's order
        return {"id": h["id"], "object": "text_completion", "created": h["created"],
                "model": h["model"], "choices": choices}

    def _send(self, choice: TextChoice) -> bytes:
        out = self._body([choice])
        if self.continuous:
            out["usage"] = self.count.usage()
        return sse(out)

    def start(self) -> list[bytes]:
        return [self._send({"index": 0, "text": self.echo, "logprobs": None,
                            "finish_reason": None})] if self.echo and not self.joined else []

    def keepalive(self) -> bytes:
        return SSE_KEEPALIVE

    def _prompt_part(self, done: wire.Done, choice: TextChoice) -> None:
        """The echoed prompt's logprobs before the answer's, and vLLM's prompt_logprobs."""
        plps = done.prompt_logprobs
        if plps is not None and self.body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(plps, self.as_ids)
        if self.joined and choice["logprobs"] is not None:
            choice["logprobs"] = _joined(legacy_prompt(plps or [], self.echo, self.as_ids),
                                         choice["logprobs"])

    def event(self, ev: wire.Event) -> list[bytes]:
        if isinstance(ev, wire.Error):
            return [sse(error_of(ev).to_openai())]
        if not isinstance(ev, (wire.Delta, wire.Done)):
            return []
        if isinstance(ev, wire.Delta):
            self.count.add(ev)
        else:
            self.count.n = ev.generation_tokens
        if self.joined:  # echo + logprobs: the whole stream at its end
            self.held.append(self._choice(ev))
            if not isinstance(ev, wire.Done):
                return []
            return self._whole(ev)
        out = []
        choice = self._choice(ev)
        if isinstance(ev, wire.Done):
            self._prompt_part(ev, choice)
        if choice["text"] or choice["finish_reason"] or choice["logprobs"] and \
                choice["logprobs"]["tokens"] or "prompt_logprobs" in choice:
            out.append(self._send(choice))
        if isinstance(ev, wire.Done) and self.include_usage:
            out.append(self._usage(ev))
        return out

    def _choice(self, ev: wire.Delta | wire.Done) -> TextChoice:
        lps = legacy_logprobs(ev.logprobs or [], self.at, self.as_ids) \
            if self.k is not None else None
        text = ev.text if isinstance(ev, wire.Delta) else ""
        self.at += len(text)
        finish = finish_of(ev) if isinstance(ev, wire.Done) else None
        return {"index": 0, "text": text, "logprobs": lps, "finish_reason": finish}

    def _whole(self, done: wire.Done) -> list[bytes]:
        """The held stream as one chunk: the echo and every piece, their logprobs joined."""
        lps = legacy_logprobs([], len(self.echo), self.as_ids)
        for c in self.held:
            if c["logprobs"] is not None:
                lps = _joined(lps, c["logprobs"])
        choice: TextChoice = {"index": 0,
                              "text": self.echo + "".join(c["text"] for c in self.held),
                              "logprobs": lps, "finish_reason": finish_of(done)}
        self._prompt_part(done, choice)
        out = [self._send(choice)]
        if self.include_usage:
            out.append(self._usage(done))
        return out

    def _usage(self, done: wire.Done) -> bytes:
        tail = self._body([])
        tail["usage"] = usage(done)
        return sse(tail)

    def end(self) -> list[bytes]:
        return [sse("[DONE]")]

    def answer(self, a: Answer) -> TextChunk:
        assert a.done is not None
        lps = legacy_logprobs(a.logprobs, len(self.echo), self.as_ids) \
            if self.k is not None else None
        choice: TextChoice = {"index": 0, "text": self.echo + a.content, "logprobs": lps,
                              "finish_reason": finish_of(a.done)}
        self._prompt_part(a.done, choice)
        out = self._body([choice])
        out["usage"] = usage(a.done)
        return out


routes.post("/v1/completions")(handler(Endpoint(CompletionRequest, to_request,
                                                CompletionRenderer)))
