"""Tensor parallel: every rank holds a slice of every layer (mlx-lm's `shard()`), all ranks
compute each step together, rank 0 samples and the token is shared with an all_sum to
which the other ranks contribute zeros. Where shard() splits the head too (an untied
head whose logits are gathered), every rank runs it; otherwise only rank 0 does.

Between steps the other ranks sleep on the doorbell while rank 0 samples and decides
whether the request goes on, so nobody spins through the head and the sampler."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.runtime.group.doorbell import END, REQUEST, TOKEN
from engine.runtime.group.lockstep import DTYPES, HEADER_LEN, Header, Link, prefill_chunks
from engine.runtime.prefix import PrefixCache
from engine.runtime.sampling import Sampling

log = logging.getLogger(__name__)


def _prefill(model: Any, link: Link, prompt: Any, cache: list[Any],
             done: Callable[[int], None] | None = None) -> Any:
    """The prompt but its last token, in mlx-lm's chunks (`done(n)` after each, with the
    tokens in so far); returns that last token."""
    import mlx.core as mx

    at = 0
    for n in prefill_chunks(prompt.size):
        model(prompt[at:at + n][None], cache=cache)
        link.compute([c.state for c in cache], collective=True)
        at += n
        mx.clear_cache()
        if done is not None:
            done(at)
    return prompt[at:]


class TensorLeader:
    """Rank 0 of a tensor parallel group: runs the whole model and returns logits."""

    def __init__(self, model: Any, link: Link, prefix: PrefixCache | None = None,
                 kv: Any = None):
        from engine.runtime.quant_kv import KV

        self.model, self.link = model, link
        self.kv = kv if kv is not None else KV()  # quantized KV or not (quant_kv.py)
        self.cache: list[Any] = []
        self.prefix = prefix if prefix is not None else PrefixCache(0)
        self.fed: list[int] = []   # the tokens the cache holds
        self.prev: list[int] = []  # the last request's, for the followers to store
        self.cached = 0

    def _step(self, tokens: Any) -> Any:
        logits = self.model(tokens[None], cache=self.cache)[:, -1, :]
        self.link.compute(logits, collective=True)
        self.link.stats.steps += 1
        return logits

    def start(self, prompt: list[int], sampling: Sampling,
              done: Callable[[int], None] | None = None) -> Any:
        """Logits for the prompt's last position (1, vocab); `done(n)` after each chunk."""
        import mlx.core as mx

        link = self.link
        link.new_request()
        cache, self.cached = self.prefix.fetch(prompt)
        self.cache = cache if cache is not None else self.kv.make(self.model)
        link.bell.ring(REQUEST)
        link.all_sum(Header(len(prompt), 0, DTYPES[0], sampling, self.cached,
                            len(self.prefix), len(self.prev)).encode())
        ids = link.all_sum(mx.array(prompt + self.prev, dtype=mx.int32))
        self.prev, self.fed = [], list(prompt)
        last = _prefill(self.model, link, ids[self.cached:len(prompt)], self.cache,
                        None if done is None else lambda n: done(self.cached + n))
        self.prefix.mark(prompt, self.cache)
        return self._step(last)

    def next(self, token: int) -> Any:
        import mlx.core as mx

        self.fed.append(token)
        self.link.bell.ring(TOKEN)
        return self._step(self.link.all_sum(mx.array([token], dtype=mx.int32)))

    def end(self) -> None:
        self.prefix.finish(self.fed, self.cache)
        self.prev, self.cache = self.fed, []
        self.link.end_round()


def body(model: Any) -> Any:
    """What a follower runs: the layers without the head, where the head isn't sharded
    (a vision checkpoint's wrapper holds its language model's)."""
    from engine.runtime.group.tensor_split import WRAPPERS

    if head_is_sharded(model):
        return model
    if type(model).__module__.rsplit(".", 1)[-1] in WRAPPERS:
        return model.language_model.model
    return getattr(model, "model", model)


def head_is_sharded(model: Any) -> bool:
    """Does anything outside the layers hold a distributed (sharded) linear layer?"""
    from mlx.nn.layers import distributed

    from engine.runtime.stage import layer_list

    kinds = tuple(v for v in vars(distributed).values()
                  if isinstance(v, type) and v.__name__.endswith("Linear"))
    inside = {id(m) for layer in layer_list(model) for _, m in layer.named_modules()}
    return any(isinstance(m, kinds) and id(m) not in inside
               for _, m in model.named_modules())


class TensorFollower:
    """Ranks 1…n-1: compute the layers' slices; the head and sampling are rank 0's."""

    def __init__(self, model: Any, link: Link, prefix: PrefixCache | None = None,
                 kv: Any = None):
        from engine.runtime.quant_kv import KV

        self.model, self.link = model, link
        self.kv = kv if kv is not None else KV()
        self.prefix = prefix if prefix is not None else PrefixCache(0, leader=False)
        # The head's slice must run with the other ranks' where it is sharded; otherwise
        # the body (layers and norm) is enough.
        self.body = body(model)

    def serve(self) -> None:
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        last = cfg.rank == cfg.world - 1
        busy, cache = False, list[Any]()
        done: list[Any] = []
        while True:
            op = link.wait(busy)
            if op in (REQUEST, TOKEN) and not last:
                link.bell.ring(op)  # first, so the whole group enters the collective together
            if op == REQUEST:
                link.new_request()
                hdr = Header.decode(link.all_sum(mx.zeros((HEADER_LEN,), mx.int32)))
                ids = link.all_sum(mx.zeros((hdr.n_prompt + hdr.n_prev,), mx.int32))
                hit, problem = self.prefix.follow(ids.tolist(), hdr.n_prompt, hdr.n_cached,
                                                  hdr.n_keep, done)
                if problem:
                    link.fail(problem)
                cache = hit if hit is not None else self.kv.make(self.model)
                busy, done = True, []
                tokens = _prefill(self.model, link, ids[hdr.n_cached:hdr.n_prompt], cache)
                self.prefix.mark(ids.tolist()[:hdr.n_prompt], cache)
            elif op == TOKEN:
                tokens = link.all_sum(mx.zeros((1,), mx.int32))
            elif op == END:
                link.bell.ring(END)  # the last rank's END reaches rank 0: all are done
                done, cache, busy = cache, [], False
                mx.clear_cache()
                link.end_request()
                continue
            else:
                log.warning("ignoring unknown doorbell op %r", op)
                continue
            link.compute(self.body(tokens[None], cache=cache), collective=True)
            link.stats.steps += 1
