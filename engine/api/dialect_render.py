"""What vLLM's extensions add to the OpenAI routes' answers, shared by the chat and
completions renderers: usage on every chunk (continuous_usage_stats), the prompt's
log-probabilities in vLLM's shape and in the legacy completions shape (echo + logprobs),
and tokens spelled by id (return_tokens_as_token_ids)."""

from __future__ import annotations

from typing import Any, TypedDict

from engine import protocol as wire
from engine.api.render import token_name
from engine.records import TokenLogprob


class RunningUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TokenCount:
    """The answer's tokens so far, for usage on every chunk: the worker's count where a
    Delta carries it, else one a Delta (each carries at least one token)."""

    def __init__(self, prompt_tokens: int):
        self.prompt, self.n = prompt_tokens, 0

    def add(self, ev: wire.Delta) -> None:
        self.n = ev.generation_tokens if ev.generation_tokens is not None else \
            self.n + max(1, len(ev.logprobs or []))

    def usage(self) -> RunningUsage:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.n,
                "total_tokens": self.prompt + self.n}


def vllm_prompt_logprobs(plps: list[TokenLogprob | None] | None, as_ids: bool = False
                         ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt_logprobs: per prompt token (None for the first), its id's and the top
    ids' {logprob, rank, decoded_token}, keyed by token id (the text where a record has no
    id)."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for e in plps or []:
        if e is None:
            out.append(None)
            continue
        d: dict[str, dict[str, Any]] = {}
        for rank, t in enumerate(e.top_logprobs, 1):
            d[str(t.id) if t.id is not None else t.token] = {
                "logprob": t.logprob, "rank": rank, "decoded_token": token_name(t, as_ids)}
        key = str(e.id) if e.id is not None else e.token
        ranked = d.get(key, {}).get("rank")
        d[key] = {"logprob": e.logprob, "rank": ranked, "decoded_token": token_name(e, as_ids)}
        out.append(d)
    return out


class Legacy(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


def legacy_prompt(plps: list[TokenLogprob | None], text: str, as_ids: bool = False
                  ) -> Legacy:
    """The prompt's log-probabilities in the completions API's legacy shape, as OpenAI's
    old API and vLLM answer echo + logprobs: the first token's logprob and top are None.
    The first token's text is what the prompt holds before the rest's."""
    rest = "".join(e.token for e in plps[1:] if e is not None)
    first = text[:len(text) - len(rest)] if text.endswith(rest) else ""
    out: Legacy = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    at = 0
    for i, e in enumerate(plps):
        piece = e.token if e is not None else first if i == 0 else ""
        out["tokens"].append(token_name(e, as_ids) if e is not None else piece)
        out["token_logprobs"].append(e.logprob if e is not None else None)
        out["top_logprobs"].append({token_name(t, as_ids): t.logprob for t in e.top_logprobs}
                                   if e is not None else None)
        out["text_offset"].append(at)
        at += len(piece)
    return out


def echo_of(messages: list[Any]) -> str:
    """vLLM's chat echo: the final message's text when it is the assistant's (the answer
    continues it), else nothing."""
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant":
        return ""
    if last.content is None or isinstance(last.content, str):
        return last.content or ""
    return "".join(p.text or "" for p in last.content)
