"""How a worker drafts: its drafter (prompt lookup, or a draft model), the governor that
learns whether drafting pays on this model, and the one-sequence generation that uses
them (engine/runtime/speculative.py does the passes).

Per request: `"speculative": false` turns drafting off; `true` drafts the most guesses
every pass (`"draft_tokens"` of them, or the node's), even where the node has drafting off
or the governor finds it doesn't pay; left out, the node's setting and its governor decide.
Drafting needs trimmable caches and no output constraint (a grammar's matcher can't take
back refused guesses); where it can't run, the request decodes as without it and its
usage says 0 drafted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.batch_governor import BatchGovernor, Shared
from engine.runtime.generate import ProgressFn, Record, cache_holds, decode_tps
from engine.runtime.sampling import Sampling
from engine.runtime.speculative import (
    DEFAULT_DRAFT,
    Drafter,
    Governor,
    ModelDraft,
    PromptLookup,
    Speculator,
    feed,
    usable,
)
from engine.runtime.stops import Shown

log = logging.getLogger(__name__)

PREFILL_CHUNK = 512


@dataclass
class Drafting:
    """A worker's drafting: on by default or not, with a draft model or prompt lookup."""

    enabled: bool = True
    draft_model: Any = None  # an mlx-lm model sharing the target's tokenizer
    max_draft: int = DEFAULT_DRAFT
    governor: Governor = field(default_factory=Governor)  # for one sequence at a time
    governors: dict[int, BatchGovernor] = field(default_factory=dict)  # batches, by size
    limit: int | None = None  # a draft model's guesses stay below it (ModelDraft)
    shared: Shared = field(init=False)  # what the batch governors learn together

    def __post_init__(self) -> None:
        self.governor.max_draft = self.max_draft
        self.shared = Shared(self.max_draft)

    def governor_for(self, size: int) -> BatchGovernor:
        """The governor of batched passes over `size` sequences: what a guess costs grows
        with the batch, so each size measures its own; acceptance is shared
        (engine/runtime/batch_governor.py)."""
        if size not in self.governors:
            self.governors[size] = BatchGovernor(self.shared, size)
        return self.governors[size]

    @property
    def source(self) -> str:
        return "draft model" if self.draft_model is not None else "prompt lookup"

    def drafter(self) -> Drafter:
        if self.draft_model is None:
            return PromptLookup()
        return ModelDraft(self.draft_model, limit=self.limit)

    def wanted(self, sampling: Sampling) -> bool:
        """Whether this request drafts (before the cache is known)."""
        on = self.enabled if sampling.speculative is None else sampling.speculative
        return on and sampling.constraint is None

    def log_request(self, drafted: int, accepted: int, tokens: int, seconds: float) -> None:
        """The worker's line per drafted request (its log is the node's worker.log)."""
        if drafted:
            log.info("drafts (%s): %d of %d kept (%.0f%%), %d tokens in %.2f s, "
                     "acceptance on this model %.2f", self.source, accepted, drafted,
                     100 * accepted / drafted, tokens, seconds,
                     self.shared.alpha if self.governors else self.governor.alpha)

    def speculator(self, model: Any, cache: list[Any], context: list[int],
                   sampling: Sampling, sampler: Any, processors: list[Any]) -> Speculator:
        """One request's decoding with drafts, as it asked (a cap, forced on, greedy)."""
        return Speculator(model, cache, context, sampler, processors, self.drafter(),
                          self.governor, sampling.draft_tokens, sampling.speculative is True,
                          sampling.temperature == 0)


def drafted_generate(drafting: Drafting, model: Any, tokenizer: Any, prompt: list[int],
                     sampling: Sampling, cancel: threading.Event | None = None,
                     prefix: Any = None, progress: ProgressFn | None = None,
                     fallback: Callable[..., Iterator[Record]] | None = None,
                     kv: Any = None, images: Any = None) -> Iterator[Record]:
    """engine.runtime.generate.generate with drafts where this request can have them
    (`kv`, an engine.runtime.quant_kv.KV, makes a fresh cache; a request with `images`
    has none: its prompt runs as embeddings)."""
    from mlx_lm.models.cache import make_prompt_cache

    from engine.runtime.generate import generate

    plain = fallback or generate
    if images is not None:
        yield from generate(model, tokenizer, prompt, sampling, cancel, prefix=prefix,
                            progress=progress, kv=kv, images=images)
        return
    if not drafting.wanted(sampling) or len(prompt) < 1:
        yield from plain(model, tokenizer, prompt, sampling, cancel, prefix=prefix,
                         progress=progress, kv=kv)
        return
    cache, cached = prefix.fetch(prompt) if prefix is not None else (None, 0)
    if cache is None:
        cache = kv.make(model) if kv is not None else make_prompt_cache(model)
    if not usable(cache):
        yield from plain(model, tokenizer, prompt, sampling, cancel, prefix=prefix,
                         progress=progress, kv=kv)
        return
    yield from _run(drafting, model, tokenizer, prompt, sampling, cache, cached, cancel,
                    prefix, progress or (lambda c, d, t: None))


def _run(drafting: Drafting, model: Any, tokenizer: Any, prompt: list[int],
         sampling: Sampling, cache: list[Any], cached: int, cancel: threading.Event | None,
         prefix: Any, tell: ProgressFn) -> Iterator[Record]:
    import mlx.core as mx

    from engine.runtime.rules import own_finish, stop_tokens
    from engine.runtime.sampling import make_sampling, token_logprobs

    sampler, processors = make_sampling(sampling, tokenizer)
    tic = time.perf_counter()
    tell(cached, cached, len(prompt))
    done = cached
    while done < len(prompt) - 1:  # all but the last token: the first pass feeds it
        if cancel is not None and cancel.is_set():
            if prefix is not None and done > cached and cache_holds(cache, done):
                prefix.partial(prompt[:done], cache)  # a retry starts where this stopped
            yield Record("", None, "cancelled", len(prompt), 0, 0.0, 0.0, 0.0,
                         cached_tokens=cached)
            return
        part = prompt[done:min(done + PREFILL_CHUNK, len(prompt) - 1)]
        feed(model, cache, part)
        done += len(part)
        tell(cached, done, len(prompt))
    if prefix is not None:
        prefix.mark(prompt, cache)
    spec = drafting.speculator(model, cache, prompt, sampling, sampler, processors)
    shown, ends = Shown(tokenizer, sampling), stop_tokens(sampling, tokenizer)
    n, first, drafted, accepted = 0, 0.0, 0, 0
    try:
        while True:
            p = spec.step(sampling.max_tokens - n)
            drafted, accepted = drafted + p.drafted, accepted + p.accepted
            for token, lp in zip(p.tokens, p.logprobs, strict=True):
                n += 1
                if n == 1:
                    first = time.perf_counter()
                    tell(cached, len(prompt), len(prompt))
                text, finish, hit = shown.step(token, own_finish(token, n, sampling, ends),
                                               cancel)
                now = time.perf_counter()
                lpv = token_logprobs(lp, token, sampling.logprobs)
                yield Record(text=text, token=token, finish_reason=finish,
                             prompt_tokens=len(prompt), generation_tokens=n,
                             prompt_tps=(len(prompt) - cached) / max(first - tic, 1e-9),
                             generation_tps=decode_tps(n, now - first),
                             peak_memory_gb=float(mx.get_peak_memory() / 1e9),
                             logprob=lpv[0], top_logprobs=lpv[1],
                             stop_sequence=shown.matched if hit else None,
                             cached_tokens=cached, drafted_tokens=drafted,
                             accepted_tokens=accepted)
                if finish is not None:
                    return
    finally:
        drafting.log_request(drafted, accepted, n, time.perf_counter() - (first or tic))
        fed = spec.context[:-1]
        if prefix is not None and cache_holds(cache, len(fed)):
            prefix.finish(fed, cache)
