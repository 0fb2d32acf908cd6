"""Drafts inside a batch: mlx-lm's generation batch, with verify steps.

mlx-lm's GenerationBatch feeds one token per sequence per step. When some of its sequences
have guesses (engine/runtime/speculative.py), a step here feeds every sequence its token
and its guesses, padded to the widest, as one (sequences, width) pass; each sequence keeps
what the accept/reject rule keeps. Sequences without guesses (drafting off, nothing to
guess, a grammar) ride in the same pass and keep one token. The KV of what a sequence
refused is taken back: the cache is trimmed by what every row refused, and each row's
remainder is rolled into its left padding (masked, as a shorter prompt's is), so each
sequence goes on at its own length.

Steps without guesses are mlx-lm's own. The governor (engine/runtime/batch_governor.py)
chooses the width from the guesses the sequences have, counting what the riders pay for
it. Its timings are honest: mlx-lm evaluates a step while the next is prepared, so a plain
step's time is the wait for the one before, counted only where that one was plain over as
many sequences with no prompt work between; a verify pass is timed from the end of the
step in flight. While it doesn't draft, prompt lookup's guesses are still made and checked
against what comes out (shadows), so acceptance stays known at no model cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.generate import GenerationBatch

from engine.runtime.batch_governor import BatchGovernor
from engine.runtime.speculative import Ask, Drafter, PromptLookup, batch_guesses, draw


@dataclass
class Row:
    """A sequence that drafts: its request's Job (how it asked for drafts, and its counts
    of guesses made and kept) and its drafter."""
    job: Any
    drafter: Drafter
    shadow: list[int] = field(default_factory=list)  # guesses not run, still to check
    guessed: int = 0  # how many the shadow had
    matched: int = 0  # of which came out so far

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
                 governor_for: Callable[[int], BatchGovernor]):
        import mlx.core as mx

        super().__init__(model=model, uids=[], inputs=mx.array([], dtype=mx.uint32),
                         prompt_cache=[], tokens=[], samplers=[],
                         fallback_sampler=fallback_sampler, logits_processors=[],
                         stop_sequences=[], max_tokens=[])
        self.rows: dict[int, Row] = {}
        self.governor = governor_for  # engine.runtime.drafting.Drafting's, by batch size
        self.steady = False  # the batcher's last step ran no prompt's chunk or join
        self._last: tuple[str, int] | None = None  # the last pass's kind and size

    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        import mlx.core as mx

        t0, size = time.perf_counter(), len(self.uids)
        asks = [self._ask(i) for i in range(size)]
        if not any(asks) or not rewindable(self.prompt_cache):
            return self._plain(t0, size)
        gov = self.governor(size)
        current: list[int] = []  # the tokens this step feeds, read once a drafter asks
        began = [t0]

        def propose(i: int, k: int) -> list[int]:
            if not current:  # the step in flight ends here: its time is a plain pass's
                mx.eval(self._next_tokens)
                began[0] = time.perf_counter()
                if self._timed(size):
                    gov.observed_rows([], 0, began[0] - t0)
                self._last = None  # what follows this sync is no measure of a pass
                current.extend(self._next_tokens.tolist())  # type: ignore[arg-type]
            return self.rows[self.uids[i]].drafter.propose([*self.tokens[i], current[i]], k)
        guesses = batch_guesses(gov, asks, propose)
        if not any(guesses):
            return self._plain(t0, size)
        for row in self.rows.values():  # these guesses ran: acceptance is measured by them
            row.shadow, row.guessed, row.matched = [], 0, 0
        out = self._verify(guesses, current, began[0])
        self._last = ("verify", size)
        return out

    def _timed(self, size: int) -> bool:
        """Whether the time to the end of the step in flight measures one plain pass:
        the last pass was plain over as many sequences, and no prompt's chunk or join ran
        since (its evaluation would have waited for the step)."""
        return self.steady and self._last == ("plain", size)

    def _plain(self, t0: float, size: int) -> list[GenerationBatch.Response]:
        """mlx-lm's own step; its time (the wait for the step in flight) is the
        governor's base where it measures one; shadow guesses are checked."""
        out = super().next()
        if self._timed(size):
            self.governor(size).observed_rows([], 0, time.perf_counter() - t0)
        self._last = ("plain", size)
        self._check_shadows(out)
        return out

    def _check_shadows(self, responses: list[GenerationBatch.Response]) -> None:
        """Each prompt-lookup row's shadow guesses against the token it got (a draft
        model's guesses cost passes: it has none); where none are pending, guess again."""
        gov = self.governor(max(len(self.uids), 1))
        for r in responses:
            row = self.rows.get(r.uid)
            if row is None or not row.guessed:
                continue
            if row.shadow and row.shadow[0] == r.token:
                row.shadow.pop(0)
                row.matched += 1
            else:
                row.shadow = []
            if not row.shadow:
                gov.shadow(row.guessed, row.matched)
                row.guessed = row.matched = 0
        for i, uid in enumerate(self.uids):
            row = self.rows.get(uid)
            if row is None or row.guessed or not isinstance(row.drafter, PromptLookup):
                continue
            room = self.max_tokens[i] - self._num_tokens[i] - 1
            row.shadow = row.drafter.propose(self.tokens[i], min(room, gov.shared.max_draft))
            row.guessed = len(row.shadow)

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
