"""Pipeline parallel: rank r runs layers [s_r, e_r) of any mlx-lm model whose layers are a
list (engine/runtime/stage.py runs each share through the model's own code). Hidden states
go rank → rank+1; the last rank sends its output back to rank 0, which runs the model's
own norm and head and samples, so every logits processor works as in one process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.runtime.group.doorbell import END, REQUEST, STEP, TOKEN
from engine.runtime.group.lockstep import HEADER_LEN, Header, Link, prefill_chunks
from engine.runtime.prefix import PrefixCache
from engine.runtime.sampling import Sampling
from engine.runtime.stage import Stage

log = logging.getLogger(__name__)


class PipelineLeader:
    """Rank 0: embeds, runs its layers, sends hidden states on, gets the last rank's
    output back and turns it into logits."""

    def __init__(self, stage: Stage, link: Link, hidden: int, dtype: str,
                 prefix: PrefixCache | None = None):
        import mlx.core as mx

        self.stage, self.link, self.hidden, self.dtype = stage, link, hidden, dtype
        self._dtype = getattr(mx, dtype)
        self.cache: list[Any] = []
        self.prefix = prefix if prefix is not None else PrefixCache(0)
        self.fed: list[int] = []   # the tokens the cache holds
        self.prev: list[int] = []  # the last request's, for the followers to store
        self.cached = 0            # prompt tokens the prefix cache gave this request

    def _hop(self, tokens: list[int], logits: bool = True) -> Any:
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        h = self.stage(mx.array(tokens)[None], self.cache)
        h = h if h.dtype == self._dtype else h.astype(self._dtype)
        link.compute(h)
        link.send(h, cfg.successor, STEP)
        link.expect(TOKEN)
        link.stats.steps += 1
        out = link.recv((1, 1, self.hidden), self._dtype, cfg.predecessor)
        if not logits:
            return None
        y = self.stage.logits(out)[:, -1, :]
        link.compute(y)
        return y

    def start(self, prompt: list[int], sampling: Sampling,
              done: Callable[[int], None] | None = None) -> Any:
        """Logits for the prompt's last position (1, vocab); `done(n)` after each chunk,
        with the prompt tokens in so far."""
        import mlx.core as mx

        link = self.link
        link.new_request()
        cache, self.cached = self.prefix.fetch(prompt)
        self.cache = cache if cache is not None else self.stage.make_cache()
        hdr = Header(len(prompt), self.hidden, self.dtype, sampling, self.cached,
                     len(self.prefix), len(self.prev))
        link.send(hdr.encode(), link.cfg.successor, REQUEST)
        link.send(mx.array(prompt + self.prev, dtype=mx.int32), link.cfg.successor, STEP)
        self.prev, self.fed = [], list(prompt)
        at = self.cached
        for n in prefill_chunks(len(prompt) - self.cached):
            self._hop(prompt[at:at + n], logits=False)
            at += n
            mx.clear_cache()
            if done is not None:
                done(at)
        self.prefix.mark(prompt, self.cache)
        return self._hop(prompt[at:])

    def next(self, token: int) -> Any:
        self.fed.append(token)
        return self._hop([token])

    def end(self) -> None:
        """Every rank ends the request (END comes back round the ring when all have); its
        cache goes into the prefix cache, on the followers at the next request."""
        self.prefix.finish(self.fed, self.cache)
        self.prev, self.cache = self.fed, []
        self.link.end_round()


class PipelineFollower:
    """Ranks 1…n-1: asleep on the doorbell until the predecessor announces a tensor."""

    def __init__(self, stage: Stage, link: Link, prefix: PrefixCache | None = None):
        self.stage, self.link = stage, link
        self.prefix = prefix if prefix is not None else PrefixCache(0, leader=False)
        self.done: list[Any] = []  # the last request's cache, stored once its tokens come

    def serve(self) -> None:
        import mlx.core as mx

        link, cfg, stage = self.link, self.link.cfg, self.stage
        src, dst = cfg.predecessor, cfg.successor
        busy = False
        while True:
            op = link.wait(busy)
            if op == REQUEST:
                link.new_request()
                head = link.recv((HEADER_LEN,), mx.int32, src)
                hdr = Header.decode(head)
                link.expect(STEP)
                ids = link.recv((hdr.n_prompt + hdr.n_prev,), mx.int32, src)
                if not stage.last:
                    link.send(head, dst, REQUEST)
                    link.send(ids, dst, STEP)
                prompt = ids.tolist()[:hdr.n_prompt]
                cache = self._cache_for(hdr, ids.tolist())
                # prompt chunks, then the last prompt token, then one token per step
                schedule = [1] + prefill_chunks(hdr.n_prompt - hdr.n_cached)[::-1]
                chunks = len(schedule) - 1
                if not chunks:
                    self.prefix.mark(prompt, cache)
                stage.set_dtype(hdr.dtype)
                dtype, busy = getattr(mx, hdr.dtype), True
            elif op == STEP:
                n = schedule.pop() if schedule else 1
                h = stage(link.recv((1, n, hdr.hidden), dtype, src), cache)
                h = h if h.dtype == dtype else h.astype(dtype)
                link.stats.steps += 1
                if chunks:
                    chunks -= 1
                    if not chunks:  # all the prompt but its last token is in
                        link.compute(h)
                        self.prefix.mark(prompt, cache)
                if not stage.last:
                    link.compute(h)
                    link.send(h, dst, STEP)
                    continue
                out = h[:, -1:, :]  # rank 0 needs only the last position
                link.compute(out, [c.state for c in cache[stage.start:stage.end]])
                link.send(out, dst, TOKEN)
            elif op == END:
                link.bell.ring(END)  # on to the successor; the last rank's reaches rank 0
                self.done, cache, busy = cache, [], False
                mx.clear_cache()
                link.end_request()
            else:
                log.warning("ignoring unknown doorbell op %r", op)

    def _cache_for(self, hdr: Header, ids: list[int]) -> list[Any]:
        cache, problem = self.prefix.follow(ids, hdr.n_prompt, hdr.n_cached, hdr.n_keep,
                                            self.done)
        self.done = []
        if problem:
            self.link.fail(problem)
        return cache if cache is not None else self.stage.make_cache()
