"""Generation as a generator of small frozen records, wrapping mlx-lm's stream_generate.

The HTTP API, the chat window, the CLI and the benchmark all consume this one stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.runtime.sampling import Sampling
from engine.runtime.stops import StopMatcher


@dataclass(frozen=True)
class Record:
    """One step of a generation. Exactly one record of a stream has finish_reason set
    ("stop", "length" or "cancelled") and it is the last."""

    text: str
    token: int | None
    finish_reason: str | None
    prompt_tokens: int
    generation_tokens: int
    prompt_tps: float
    generation_tps: float
    peak_memory_gb: float
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    drafted_tokens: int = 0  # guesses verified so far (speculative decoding)
    accepted_tokens: int = 0  # of them, those the model agreed with


def decode_tps(tokens: int, since_first: float) -> float:
    """Decode speed as every path reports it: the tokens after the first over the time
    since the first came (the first token's time is the prefill's). mlx-lm counts the
    first one too, which overstates short answers: a second token 0.1 s after the first
    is 10 tokens/s, not 20."""
    return (tokens - 1) / since_first if tokens > 1 and since_first > 0 else 0.0


def build_prompt(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids for a chat, through the model's own chat template."""
    if getattr(tokenizer, "has_chat_template", False):
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        # Some templates return a BatchEncoding-like mapping.
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    # No template: plain "role: content" lines, the least surprising fallback.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return list(tokenizer.encode(text))


ProgressFn = Callable[[int, int, int], None]  # (cached, done, total) prompt tokens


class _Cancelled(Exception):
    """Raised inside mlx-lm's prefill loop to leave it between two chunks."""


def generate(model: Any, tokenizer: Any, prompt: list[int], sampling: Sampling,
             cancel: threading.Event | None = None, prefix: Any = None,
             progress: ProgressFn | None = None, kv: Any = None) -> Iterator[Record]:
    """Stream records for `prompt`. Setting `cancel` ends the stream at the next token, or
    at the next prefill chunk, with finish_reason "cancelled". With a `prefix`
    (engine.runtime.prefix.PrefixCache) the prompt starts from the longest cached prefix,
    and its KV is kept afterwards. `progress` hears how far the prefill is; `kv`
    (engine.runtime.quant_kv.KV) makes a fresh cache (quantized, say)."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    from engine.runtime.sampling import make_sampling, token_logprobs

    sampler, processors = make_sampling(sampling, tokenizer)
    stops = StopMatcher(sampling.stop)
    cache, cached = prefix.fetch(prompt) if prefix is not None else (None, 0)
    if cache is None:
        cache = kv.make(model) if kv is not None else make_prompt_cache(model)
    fed = list(prompt)  # every token the cache holds: mlx-lm feeds each one it yields
    tell = progress or (lambda cached, done, total: None)
    tell(cached, cached, len(prompt))

    def prefilled(done: int, total: int) -> None:
        if prefix is not None and cached + done == len(prompt) - 1:  # all but its last
            prefix.mark(prompt, cache)
        tell(cached, cached + done, len(prompt))
        if cancel is not None and cancel.is_set() and done < total:
            raise _Cancelled

    last, first = None, 0.0
    try:
        for r in stream_generate(model, tokenizer, mx.array(prompt[cached:]),
                                 max_tokens=sampling.max_tokens, sampler=sampler,
                                 logits_processors=processors, prompt_cache=cache,
                                 prompt_progress_callback=prefilled):
            last = r
            now = time.perf_counter()
            first = first or now  # mlx-lm's own figure counts the first token too
            tps = decode_tps(int(r.generation_tokens), now - first)
            fed.append(int(r.token))
            lp = token_logprobs(r.logprobs, r.token, sampling.logprobs)
            text, hit = stops.feed(r.text)
            finish = r.finish_reason
            if hit:
                finish = "stop"
            elif finish is None and cancel is not None and cancel.is_set():
                finish = "cancelled"
            if finish is not None:
                text += "" if hit else stops.flush()
                yield _record(r, text, finish, lp, len(prompt), cached, tps, stops.matched)
                return
            yield _record(r, text, None, lp, len(prompt), cached, tps)
        if last is None:  # stream_generate always yields; keep the one-finish promise
            yield Record("", None, "length", len(prompt), 0, 0.0, 0.0, 0.0)
    except _Cancelled:  # left during the prefill: nothing was generated
        yield Record("", None, "cancelled", len(prompt), 0, 0.0, 0.0, 0.0,
                     cached_tokens=cached)
    finally:
        if prefix is not None and cache_holds(cache, len(fed)):
            prefix.finish(fed, cache)


def cache_holds(cache: list[Any], n: int) -> bool:
    """Does every position-keeping layer cache hold exactly n tokens?"""
    return all(getattr(c, "offset", n) == n for c in cache)


def _record(r: Any, text: str, finish: str | None,
            lp: tuple[float | None, tuple[tuple[int, float], ...]], n_prompt: int,
            cached: int, tps: float, matched: str | None = None) -> Record:
    return Record(text=text, token=int(r.token), finish_reason=finish,
                  prompt_tokens=n_prompt, generation_tokens=int(r.generation_tokens),
                  prompt_tps=float(r.prompt_tps), generation_tps=tps,
                  peak_memory_gb=float(r.peak_memory), logprob=lp[0], top_logprobs=lp[1],
                  stop_sequence=matched, cached_tokens=cached)
