"""A request the batcher runs alone, with drafts (engine/runtime/speculative.py).

mlx-lm's BatchGenerator decodes one token per sequence per step, so drafts can't ride in
it. While one request is all the worker has, the batcher's thread runs it here instead:
its prompt in chunks, then verify passes. When another request arrives it goes back into
the batch, where it left off (its KV cache, and its tokens for the sampler's penalties);
when the batch drains to one request, that one comes out again (`Solo.resume`).
"""

from __future__ import annotations

import time
from typing import Any

from engine.runtime.speculative import Speculator, feed


class Solo:
    """`job` is the batcher's Job: its sampler and processors, and its counts of tokens
    emitted, drafted and kept, which the request's thread reads."""

    def __init__(self, job: Any, cache: list[Any], done: int, drafting: Any, model: Any,
                 context: list[int] | None = None):
        self.job, self.cache, self.done = job, cache, done
        self.model, self.drafting = model, drafting
        self.spec: Speculator | None = None
        self.started = time.perf_counter()
        if done >= len(job.prompt) - 1:  # nothing left to prefill
            self._decode(context or job.prompt)

    @classmethod
    def resume(cls, job: Any, cache: list[Any], tokens: list[int], drafting: Any,
               model: Any) -> Solo:
        """A job taken out of the batch: `cache` holds every token of `tokens`, the last
        of them already sent; that one is fed again for the next token's logits."""
        from mlx_lm.models.cache import trim_prompt_cache

        trim_prompt_cache(cache, 1)
        return cls(job, cache, len(job.prompt), drafting, model, context=list(tokens))

    @property
    def prefilling(self) -> bool:
        return self.spec is None

    def _decode(self, context: list[int]) -> None:
        job = self.job
        self.spec = self.drafting.speculator(self.model, self.cache, context, job.sampling,
                                             job.sampler, job.processors)

    def prefill(self, size: int) -> tuple[int, float]:
        """One chunk of the prompt (all of it but its last token); (tokens, seconds)."""
        t0 = time.perf_counter()
        end = min(self.done + max(1, size), len(self.job.prompt) - 1)
        part = self.job.prompt[self.done:end]
        feed(self.model, self.cache, part)
        self.done = end
        if self.done >= len(self.job.prompt) - 1:
            self._decode(self.job.prompt)
        return len(part), time.perf_counter() - t0

    def decode(self, eos: set[int]) -> list[tuple[int, Any, str | None]]:
        """One verify pass: the tokens it gives, each with its logprob row and whether it
        ends the request ("stop" for an end token, "length" for the last allowed)."""
        assert self.spec is not None
        job, limit = self.job, self.job.sampling.max_tokens
        p = self.spec.step(limit - job.emitted)
        job.drafted += p.drafted
        job.accepted += p.accepted
        out = []
        for token, lp in zip(p.tokens, p.logprobs, strict=True):
            job.emitted += 1
            finish = ("stop" if token in eos else
                      "length" if job.emitted >= limit else None)
            out.append((token, lp, finish))
            if finish is not None:
                break
        return out

    def seconds(self) -> float:
        """Since this request went alone (its log line's figure)."""
        return time.perf_counter() - self.started

    def tokens(self) -> list[int]:
        """Exactly the tokens the cache holds."""
        if self.spec is None:
            return self.job.prompt[:self.done]
        return self.spec.context[:-1]

    def batch_entry(self) -> dict[str, Any]:
        """What BatchGenerator.insert needs to carry on where this left off."""
        job = self.job
        if self.spec is None:
            rest, fed = job.prompt[self.done:], job.prompt[:self.done]
        else:
            rest, fed = self.spec.context[-1:], self.spec.context[:-1]
        return {"prompts": [rest], "max_tokens": [job.sampling.max_tokens - job.emitted],
                "caches": [self.cache], "all_tokens": [fed], "samplers": [job.sampler],
                "logits_processors": [job.processors]}
