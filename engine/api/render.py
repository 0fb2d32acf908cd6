"""What every protocol's renderer is: pure code from the internal events (engine/protocol.py)
to one protocol's exact bytes, with no aiohttp and no node, so each can be tested with a
list of events in and the wire lines out (render_stream).

A renderer is made per request with what the answer names (the model, ids, the time) and
is fed the generation's events in order; `end` closes the stream. The HTTP side
(engine/api/serve.py) only moves bytes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from engine import protocol as wire
from engine.errors import ShoalError
from engine.records import TokenLogprob, TopLogprob

SSE_KEEPALIVE = b": keep-alive\n\n"  # a comment line: every SSE client skips it


@dataclass
class Answer:
    """Everything a finished generation said, for the non-streaming renderings."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[wire.ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    done: wire.Done | None = None

    def add(self, ev: wire.Event) -> None:
        if isinstance(ev, wire.Delta):
            if ev.kind == "reasoning":
                self.reasoning += ev.text
            else:
                self.content += ev.text
        elif isinstance(ev, wire.ToolCall):
            self.tool_calls.append(ev)
        elif isinstance(ev, wire.Done):
            self.done = ev
        if isinstance(ev, (wire.Delta, wire.Done)) and ev.logprobs:
            self.logprobs += ev.logprobs


def logprobs_json(lps: list[TokenLogprob] | None, as_ids: bool = False
                  ) -> list[dict[str, Any]]:
    """Tokens' log-probabilities as OpenAI, the Responses API and Ollama all spell them
    (without the token ids records may carry); `as_ids`: each token spelled "token_id:<id>"
    (vLLM's return_tokens_as_token_ids), for tokens whose text isn't valid UTF-8."""
    out = []
    for e in lps or []:
        d = e.to_json()
        d.pop("id", None)
        top = [t.to_json() for t in e.top_logprobs]
        for t, tj in zip([e, *e.top_logprobs], [d, *top]):
            tj.pop("id", None)
            if as_ids:
                tj["token"] = token_name(t, True)
        d["top_logprobs"] = top
        out.append(d)
    return out


def token_name(t: TopLogprob, as_ids: bool) -> str:
    """A token as logprobs name it: its text, or "token_id:<id>" (vLLM's
    return_tokens_as_token_ids) where the record carries its id."""
    return f"token_id:{t.id}" if as_ids and t.id is not None else t.token


def error_of(ev: wire.Error) -> ShoalError:
    e = ShoalError(ev.message, param=ev.param, code=ev.code)
    e.status = int(ev.status or 500)
    if e.status < 500:
        e.type = "invalid_request_error"
    return e


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


@dataclass
class Context:
    """What an answer names besides its events: injected, so tests can fix them."""
    model: str
    prompt_tokens: int
    cached: int = 0  # the prefix cache's hit, when known at the start (Anthropic)
    prompt_text: str | None = None  # the rendered prompt, when the worker sent it (echo)
    t0: float = field(default_factory=time.perf_counter)  # the request's start
    ids: Callable[[str], str] = new_id
    now: Callable[[], float] = time.time  # wall clock, for "created" fields
    clock: Callable[[], float] = time.perf_counter  # for the time to first token

    def since_start(self) -> float:
        return self.clock() - self.t0


class Renderer(Protocol):
    media: str  # the stream's content type
    keepalive_s: float | None  # silence after which keepalive() is sent (None: never)
    wants_admission: bool  # start() needs the prefix cache's hit (waits for it)
    wants_progress: bool  # event() takes Progress events too

    def start(self) -> list[bytes]: ...
    def event(self, ev: wire.Event) -> list[bytes]: ...
    def keepalive(self) -> bytes: ...
    def end(self) -> list[bytes]: ...
    def answer(self, a: Answer) -> Mapping[str, object]: ...  # the JSON body


def render_stream(r: Renderer, events: Iterable[wire.Event]) -> bytes:
    """The whole stream for `events`, as a client would receive it."""
    out = list(r.start())
    for ev in events:
        out += r.event(ev)
    out += r.end()
    return b"".join(out)


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event (compact JSON, or a literal string such as [DONE])."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def sse_progress(p: wire.Progress) -> bytes:
    """Prefill progress as an SSE comment: clients skip it, Shoal's own client (the chat
    window's waiting bubble) reads it."""
    return f": shoal-progress {p.cached} {p.done} {p.total}\n\n".encode()


class Speed(TypedDict):
    """Shoal's figures on a finished answer (its "shoal" key, in every protocol)."""
    ttft_s: float
    prompt_tps: float
    generation_tps: float
    peak_memory_gb: float


class Drafts(TypedDict):
    drafted_tokens: int
    accepted_tokens: int


def speed(done: wire.Done, ttft: float | None) -> Speed:
    return {"ttft_s": round(ttft or 0.0, 4), "prompt_tps": round(done.prompt_tps, 2),
            "generation_tps": round(done.generation_tps, 2),
            "peak_memory_gb": round(done.peak_memory_gb, 3)}


def drafts(done: wire.Done) -> Drafts:
    """Shoal's extension to every API's usage: speculative decoding's guesses and how many
    of them the model kept (the answer is the same either way; only its speed differs)."""
    return {"drafted_tokens": done.drafted_tokens, "accepted_tokens": done.accepted_tokens}
