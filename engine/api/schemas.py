"""Validation of OpenAI-style chat requests. Every rejection names the parameter and says
what a valid value looks like; nothing here uses assert."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import BadRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOKENS_LIMIT = 1_000_000  # beyond any context window: a typo, not a request


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, str]]
    stream: bool
    include_usage: bool
    sampling: dict[str, Any] = field(default_factory=dict)


def _number(body: dict, name: str, lo: float, hi: float, *, integer: bool = False,
            lo_open: bool = False) -> float | int | None:
    v = body.get(name)
    if v is None:
        return None
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"'{name}' must be {kind}, got {v!r}.", param=name)
    if v < lo or v > hi or (lo_open and v == lo):
        low = f"greater than {lo}" if lo_open else f"at least {lo}"
        raise BadRequest(f"'{name}' must be {low} and at most {hi}, got {v}.", param=name)
    return v


def _content(msg: dict, i: int) -> str:
    c = msg.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts: only text is understood by these models
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text":
                raise BadRequest(f"messages[{i}].content: only text parts are supported.",
                                 param=f"messages[{i}].content")
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts.",
                     param=f"messages[{i}].content")


def parse_chat_request(body: Any) -> ChatRequest:
    """A ChatRequest from a decoded JSON body, or BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects.",
                         param="messages")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] needs a role, one of {', '.join(ROLES)}.",
                             param=f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        messages.append({"role": role, "content": _content(m, i)})
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise BadRequest("'model' must be a model id string.", param="model")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("Only n=1 is supported: ask again for another answer.", param="n")
    max_tokens = _number(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, MAX_TOKENS_LIMIT, integer=True)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > 16
                             or not all(isinstance(s, str) for s in stop)):
        raise BadRequest("'stop' must be a string or a list of up to 16 strings.",
                         param="stop")
    rep = _number(body, "repetition_penalty", 0.0, 10.0, lo_open=True)
    sampling = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 0.0, 2.0),
        "top_p": _number(body, "top_p", 0.0, 1.0, lo_open=True),
        "top_k": _number(body, "top_k", 0, 1_000_000, integer=True),
        "min_p": _number(body, "min_p", 0.0, 1.0),
        "repetition_penalty": rep,
        "seed": _number(body, "seed", -(2**63), 2**63 - 1, integer=True),
        "stop": stop,
    }
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false.", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object.", param="stream_options")
    return ChatRequest(model=model, messages=messages, stream=stream,
                       include_usage=bool(opts.get("include_usage")),
                       sampling={k: v for k, v in sampling.items() if v is not None})
