"""Generation as a generator of small frozen records, over mlx-lm's generate_step (as its
stream_generate, with the request's token rules: engine/runtime/rules.py and stops.Shown).

The HTTP API, the chat window, the CLI and the benchmark all consume this one stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from engine.runtime.sampling import Sampling
from engine.runtime.stops import Shown


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
             progress: ProgressFn | None = None, kv: Any = None,
             images: Any = None) -> Iterator[Record]:
    """Stream records for `prompt`. Setting `cancel` ends the stream at the next token, or
    at the next prefill chunk, with finish_reason "cancelled". With a `prefix`
    (engine.runtime.prefix.PrefixCache) the prompt starts from the longest cached prefix,
    and its KV is kept afterwards. `progress` hears how far the prefill is; `kv`
    (engine.runtime.quant_kv.KV) makes a fresh cache (quantized, say). With `images`
    (engine.runtime.vision.images.ImagePrompt) the prompt runs as input embeddings with
    the image features in, and the prefix cache keys it by images.keys."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step, generation_stream, wired_limit
    from mlx_lm.models.cache import make_prompt_cache

    from engine.runtime.rules import own_finish, stop_tokens
    from engine.runtime.sampling import make_sampling, token_logprobs

    sampler, processors = make_sampling(sampling, tokenizer)
    shown, ends = Shown(tokenizer, sampling), stop_tokens(sampling, tokenizer)
    key = images.keys if images is not None else prompt  # what the prefix cache sees
    cache, cached = prefix.fetch(key) if prefix is not None else (None, 0)
    if cache is None:
        cache = kv.make(model) if kv is not None else make_prompt_cache(model)
    embedded = images.embeddings(cached) if images is not None else None
    fed = list(key)  # every token the cache holds: mlx-lm feeds each one it yields
    tell = progress or (lambda cached, done, total: None)
    tell(cached, cached, len(prompt))
    held = [cached]  # the prompt tokens the cache holds: every chunk done is in

    def prefilled(done: int, total: int) -> None:
        held[0] = cached + done
        if prefix is not None and cached + done == len(prompt) - 1:  # all but its last
            prefix.mark(key, cache)
        tell(cached, cached + done, len(prompt))
        if cancel is not None and cancel.is_set() and done < total:
            raise _Cancelled

    n, first, prompt_tps = 0, 0.0, 0.0
    try:
        placing = images.running() if images is not None else nullcontext()  # Qwen-VL
        with wired_limit(model, [generation_stream]), placing:  # type: ignore[list-item]
            tic = time.perf_counter()
            for n, (y, logprobs) in enumerate(generate_step(
                    mx.array(prompt[cached:]), model, max_tokens=sampling.max_tokens,
                    sampler=sampler, logits_processors=processors, prompt_cache=cache,
                    prompt_progress_callback=prefilled,
                    **({} if embedded is None else {"input_embeddings": embedded})),
                    start=1):
                token, now = int(y), time.perf_counter()  # mlx-lm yields ints
                if n == 1:  # the first token's time is the prefill's (as mlx-lm counts it)
                    first, prompt_tps = now, (len(prompt) - cached) / (now - tic)
                fed.append(token)
                text, finish, hit = shown.step(token, own_finish(token, n, sampling, ends),
                                               cancel)
                lp = token_logprobs(logprobs, token, sampling.logprobs)
                yield Record(text=text, token=token, finish_reason=finish,
                             prompt_tokens=len(prompt), generation_tokens=n,
                             prompt_tps=prompt_tps, generation_tps=decode_tps(n, now - first),
                             peak_memory_gb=mx.get_peak_memory() / 1e9, logprob=lp[0],
                             top_logprobs=lp[1], stop_sequence=shown.matched if hit else None,
                             cached_tokens=cached)
                if finish is not None:
                    return
        if n == 0:  # nothing asked for (max_tokens 0): keep the one-finish promise
            yield Record("", None, "length", len(prompt), 0, 0.0, 0.0, 0.0,
                         cached_tokens=cached)
    except _Cancelled:  # left during the prefill: nothing was generated, but the chunks
        fed = []         # done are kept, so a retry of the prompt starts where this stopped
        if prefix is not None and held[0] > cached and cache_holds(cache, held[0]):
            prefix.partial(key[:held[0]], cache)
        yield Record("", None, "cancelled", len(prompt), 0, 0.0, 0.0, 0.0,
                     cached_tokens=cached)
    finally:
        if prefix is not None and fed and cache_holds(cache, len(fed)):
            prefix.finish(fed, cache)


def cache_holds(cache: list[Any], n: int) -> bool:
    """Does every position-keeping layer cache hold exactly n tokens?"""
    return all(getattr(c, "offset", n) == n for c in cache)

