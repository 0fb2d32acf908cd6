"""Tensor parallel: every rank holds a slice of every layer (mlx-lm's `shard()`), all ranks
compute each step together, rank 0 samples and the token is shared with an all_sum to
which the other ranks contribute zeros.

Between steps the other ranks sleep on the doorbell while rank 0 samples and decides
whether the request goes on, so nobody spins through the head and the sampler."""

from __future__ import annotations

import logging
from typing import Any

from engine.runtime.doorbell import END, REQUEST, TOKEN
from engine.runtime.generate import Sampling
from engine.runtime.lockstep import HEADER_LEN, DTYPES, Header, Link, prefill_chunks
from engine.runtime.pipeline import make_sampling

log = logging.getLogger(__name__)


def _prefill(model: Any, link: Link, prompt: Any, cache: list[Any]) -> Any:
    """The prompt but its last token, in mlx-lm's chunks; returns that last token."""
    import mlx.core as mx

    at = 0
    for n in prefill_chunks(prompt.size):
        model(prompt[at:at + n][None], cache=cache)
        link.compute([c.state for c in cache], collective=True)
        at += n
        mx.clear_cache()
    return prompt[at:]


class TensorLeader:
    """Rank 0 of a tensor parallel group."""

    def __init__(self, model: Any, link: Link):
        self.model, self.link = model, link
        self.cache: list[Any] = []
        self.history: Any = None  # tokens so far, for the logits processors

    def _step(self, tokens: Any) -> int:
        import mlx.core as mx

        logits = self.model(tokens[None], cache=self.cache)[:, -1, :]
        if self.processors:
            self.history = mx.concat([self.history, tokens])
            for p in self.processors:
                logits = p(self.history, logits)
        y = self.sampler(logits - mx.logsumexp(logits, keepdims=True))
        self.link.compute(y, collective=True)
        self.link.stats.steps += 1
        return int(y.item())

    def start(self, prompt: list[int], sampling: Sampling) -> int:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        link = self.link
        link.new_request()
        self.cache = make_prompt_cache(self.model)
        self.sampler, self.processors = make_sampling(sampling)
        link.bell.ring(REQUEST)
        link.all_sum(Header(len(prompt), 0, DTYPES[0], sampling).encode())
        ids = link.all_sum(mx.array(prompt, dtype=mx.int32))
        last = _prefill(self.model, link, ids, self.cache)
        self.history = ids[:-1]
        return self._step(last)

    def next(self, token: int) -> int:
        import mlx.core as mx

        self.link.bell.ring(TOKEN)
        y = self.link.all_sum(mx.array([token], dtype=mx.int32))
        return self._step(y)

    def end(self) -> None:
        self.cache = []
        self.link.end_round()


class TensorFollower:
    """Ranks 1…n-1: compute the layers' slices; the head and sampling are rank 0's."""

    def __init__(self, model: Any, link: Link):
        self.model, self.link = model, link
        self.body = getattr(model, "model", model)  # layers and norm, without the head

    def serve(self) -> None:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        link, cfg = self.link, self.link.cfg
        last = cfg.rank == cfg.world - 1
        busy, cache = False, []
        while True:
            op = link.wait(busy)
            if op in (REQUEST, TOKEN) and not last:
                link.bell.ring(op)  # first, so the whole group enters the collective together
            if op == REQUEST:
                link.new_request()
                hdr = Header.decode(link.all_sum(mx.zeros((HEADER_LEN,), mx.int32)))
                ids = link.all_sum(mx.zeros((hdr.n_prompt,), mx.int32))
                cache, busy = make_prompt_cache(self.model), True
                tokens = _prefill(self.model, link, ids, cache)
            elif op == TOKEN:
                tokens = link.all_sum(mx.zeros((1,), mx.int32))
            elif op == END:
                link.bell.ring(END)  # the last rank's END reaches rank 0: all are done
                cache, busy = [], False
                mx.clear_cache()
                link.end_request()
                continue
            else:
                log.warning("ignoring unknown doorbell op %r", op)
                continue
            link.compute(self.body(tokens[None], cache=cache), collective=True)
            link.stats.steps += 1
