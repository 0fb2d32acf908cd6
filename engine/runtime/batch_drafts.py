"""Drafts inside a batch: mlx-lm's generation batch, with verify steps.

mlx-lm's GenerationBatch feeds one token per sequence per step. When some of its sequences
have guesses (engine/runtime/speculative.py), a step here feeds every sequence its token
and its guesses, padded to the widest, as one (sequences, width) pass; each sequence keeps
what the accept/reject rule keeps. Sequences without guesses (drafting off, nothing to
guess, a grammar) ride in the same pass and keep one token. The KV of what a sequence
refused is taken back: the cache is trimmed by what every row refused, and each row's
remainder is rolled into its left padding (masked, as a shorter prompt's is), so each
sequence goes on at its own length.

Steps without guesses are mlx-lm's own. The governor (one per batch size, since a pass's
cost grows with the batch) chooses the width from the guesses the sequences have, counting
what the riders pay for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlx_lm.generate import GenerationBatch

from engine.runtime.speculative import Ask, Drafter, Governor, batch_guesses, draw


@dataclass
class Row:
    """A sequence that drafts: its request's Job (how it asked for drafts, and its counts
    of guesses made and kept) and its drafter."""
    job: Any
    drafter: Drafter

    @property
    def greedy(self) -> bool:
        return bool(self.job.sampling.temperature == 0)


def rewindable(cache: list[Any]) -> bool:
    """Whether every layer of a batch's cache can be rewound row by row."""
    from mlx_lm.models.cache import BatchKVCache, CacheList

    from engine.runtime.quant_kv import BatchQuantKV

    def ok(c: Any) -> bool:
        if isinstance(c, CacheList):
            return all(ok(x) for x in c.caches)
        return isinstance(c, (BatchKVCache, BatchQuantKV))
    return all(ok(c) for c in cache)


def take_back(cache: list[Any], refused: list[int]) -> None:
    """Drop each row's last `refused[i]` positions from a batch's KV."""
    import mlx.core as mx
    from mlx_lm.models.cache import CacheList

    least = min(refused)
    rest = [r - least for r in refused]

    def fix(c: Any) -> None:
        if isinstance(c, CacheList):
            for x in c.caches:
                fix(x)
            return
        if least:
            c.trim(least)
        if any(rest) and c.keys is not None:  # (a pipeline's other ranks' layers hold
            # nothing) shift each row right: its refused tail becomes padding
            c.prepare(right_padding=rest)
            c.finalize()
    for c in cache:
        fix(c)
    mx.eval([c.state for c in cache if getattr(c, "keys", 0) is not None])


class DraftedBatch(GenerationBatch):
    """The BatchGenerator's generation batch (engine/runtime/batching.py installs it);
    `rows` are the sequences that draft, by uid."""

    def __init__(self, model: Any, fallback_sampler: Any,
                 governor_for: Callable[[int], Governor]):
        import mlx.core as mx

        super().__init__(model=model, uids=[], inputs=mx.array([], dtype=mx.uint32),
                         prompt_cache=[], tokens=[], samplers=[],
                         fallback_sampler=fallback_sampler, logits_processors=[],
                         stop_sequences=[], max_tokens=[])
        self.rows: dict[int, Row] = {}
        self.governor = governor_for  # engine.runtime.drafting.Drafting's, by batch size

    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        t0, size = time.perf_counter(), len(self.uids)
        asks = [self._ask(i) for i in range(size)]
        if not any(asks) or not rewindable(self.prompt_cache):
            return super().next()
        current: list[int] = []  # the tokens this step feeds, read once a drafter asks

        def propose(i: int, k: int) -> list[int]:
            if not current:
                current.extend(self._next_tokens.tolist())  # type: ignore[arg-type]
            return self.rows[self.uids[i]].drafter.propose([*self.tokens[i], current[i]], k)
        guesses = batch_guesses(self.governor(size), asks, propose)
        if not any(guesses):
            out = super().next()  # a pass without guesses: the governor's base
            self.governor(size).observed_rows([], 0, time.perf_counter() - t0)
            return out
        return self._verify(guesses, current, t0)

    def _ask(self, i: int) -> Ask | None:
        row = self.rows.get(self.uids[i])
        room = self.max_tokens[i] - self._num_tokens[i] - 1
        return Ask.of(row.job.sampling, room) if row is not None else None

    def _verify(self, guesses: list[list[int]], current: list[int],
                t0: float) -> list[GenerationBatch.Response]:
        import mlx.core as mx

        width = max(len(g) for g in guesses)
        fed = [[c, *g, *[c] * (width - len(g))] for c, g in zip(current, guesses,
                                                                 strict=True)]
        logits = self.model(mx.array(fed, dtype=mx.int32),
                            cache=self.prompt_cache).astype(mx.float32)
        drawn, kept = [], []
        for i, g in enumerate(guesses):
            row = self.rows.get(self.uids[i])
            processors = (self.logits_processors or [])[i] or []
            sampler: Any = (self.samplers or [])[i]
            sampler = self.fallback_sampler if sampler is None else sampler
            context = [*self.tokens[i], current[i]]
            greedy = row.greedy if row is not None else False
            tokens, lps = draw(logits[i, :len(g) + 1], g, context, sampler, processors,
                               greedy)
            drawn.append((tokens, lps))
            kept.append(len(tokens) - 1)
            if row is not None:
                row.job.drafted += len(g)
                row.job.accepted += kept[-1]
            if processors:  # the buffer mlx-lm keeps for processors: what was fed and kept
                self._token_context[i].update_and_fetch(
                    mx.array([current[i], *g[:kept[-1]]], dtype=mx.int32))
        take_back(self.prompt_cache, [width - k for k in kept])
        out = self._emit(current, drawn)
        self.governor(len(guesses)).observed_rows(
            [(len(g), k) for g, k in zip(guesses, kept, strict=True)], width,
            time.perf_counter() - t0)
        return out

    def _emit(self, current: list[int],
              drawn: list[tuple[list[int], list[Any]]]) -> list[GenerationBatch.Response]:
        """Every row's fed-and-kept tokens, in order, each checked for a stop and the
        length limit as mlx-lm's own step checks its one; the last draw is fed next."""
        import mlx.core as mx

        responses, keep = [], []
        nexts, next_lps = [], []
        for i, (tokens, lps) in enumerate(drawn):
            emit = [current[i], *tokens[:-1]]
            rows = [self._next_logprobs[i], *lps[:-1]]
            finish = None
            for n, (token, lp) in enumerate(zip(emit, rows, strict=True)):
                self.tokens[i].append(token)
                self._num_tokens[i] += 1
                if self._num_tokens[i] >= self.max_tokens[i]:
                    finish = "length"
                if self._matchers[i].advance(token):
                    finish = "stop"
                if finish is None:
                    responses.append(self.Response(self.uids[i], token, lp, None, None,
                                                   None))
                    continue
                cache = self.extract_cache(i)
                extra = len(emit) - n - 1  # kept tokens after the one that ended it
                if extra:
                    from mlx_lm.models.cache import trim_prompt_cache
                    trim_prompt_cache(cache, extra)
                responses.append(self.Response(self.uids[i], token, lp, finish, cache,
                                               self.tokens[i]))
                break
            if finish is None:
                keep.append(i)
            nexts.append(tokens[-1])
            next_lps.append(lps[-1])
        self._current_tokens = mx.array(  # type: ignore[assignment]
            current, dtype=self._next_tokens.dtype)
        self._next_tokens = mx.array(nexts, dtype=self._next_tokens.dtype)
        self._next_logprobs = next_lps
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses
