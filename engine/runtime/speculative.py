"""Speculative decoding for one sequence: a drafter guesses the next tokens, one pass of
the target model runs them all, and the guesses the target agrees with are kept.

Exact by construction: every kept token is drawn from the target's own distribution given
everything before it. Drafts are point guesses (prompt lookup, or a draft model's argmax),
so "draw from the target at each position and go on while the draw equals the guess" is
the standard accept/reject rule for them: a guess d is kept with probability p(d), and a
rejection's draw comes from p without d, renormalised. Greedy output is the same token for
token, and a seeded sampler draws once per kept token, in order, as it does without drafts.

The KV of rejected guesses is trimmed, so speculation needs trimmable caches (no sliding
window's ring, no recurrent state): `usable()` says whether a model has them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

MAX_DRAFT = 16  # a request's draft_tokens may ask for 1..MAX_DRAFT
DEFAULT_DRAFT = 6


class Drafter(Protocol):
    """Guesses up to k tokens that follow `context` (prompt and answer so far)."""

    def propose(self, context: list[int], k: int) -> list[int]: ...


class PromptLookup:
    """Drafts by n-gram match: find the last earlier place where the context's final n
    tokens occurred (longest n first) and guess what followed them there. Costs no model;
    agents echo files and diffs back, so their answers are full of such repeats."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> where it last ended
        self._upto = 0  # n-grams ending before this position are indexed

    def propose(self, context: list[int], k: int) -> list[int]:
        end = len(context) - 1  # the tail itself is not an earlier occurrence
        for p in range(self._upto, end):
            for n in self.sizes:
                if p + 1 >= n:
                    self._index[tuple(context[p + 1 - n:p + 1])] = p
        self._upto = max(self._upto, end)
        if k <= 0:
            return []
        for n in self.sizes:
            if len(context) > n:
                at = self._index.get(tuple(context[-n:]))
                if at is not None:
                    return context[at + 1:at + 1 + k]
        return []


def feed(model: Any, cache: list[Any], tokens: list[int]) -> None:
    """Run `tokens` into `cache` (a prompt's chunk: no logits wanted) and evaluate it."""
    import mlx.core as mx

    model(mx.array(tokens)[None], cache=cache)
    mx.eval([c.state for c in cache])


class ModelDraft:
    """Drafts with a small model sharing the target's tokenizer: its own KV cache, fed
    what the context holds, then k greedy steps. The next call trims what was refused.
    `limit`: token ids both models take (their vocabularies may be padded differently):
    a guess is always below it, and a context holding an id past it gets no guesses."""

    def __init__(self, model: Any, chunk: int = 512, limit: int | None = None):
        from mlx_lm.models.cache import make_prompt_cache

        self.model, self.chunk, self.limit = model, chunk, limit
        self.cache = make_prompt_cache(model)
        self.fed: list[int] = []  # the tokens whose KV the draft cache holds

    def propose(self, context: list[int], k: int) -> list[int]:
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        if k <= 0:
            return []
        same = 0
        limit = min(len(self.fed), len(context) - 1)  # the last token is always fed
        while same < limit and self.fed[same] == context[same]:
            same += 1
        if len(self.fed) > same:
            trim_prompt_cache(self.cache, len(self.fed) - same)
            del self.fed[same:]
        todo = context[same:]
        if self.limit is not None and max(todo, default=0) >= self.limit:
            return []  # an id the draft model may not have: never embedded past its end
        while len(todo) > 1:
            part = todo[:min(self.chunk, len(todo) - 1)]
            feed(self.model, self.cache, part)
            self.fed += part
            todo = todo[len(part):]
        out: list[int] = []
        for _ in range(k):
            logits = self.model(mx.array(todo)[None], cache=self.cache)[:, -1, :self.limit]
            self.fed += todo
            best: Any = mx.argmax(logits, axis=-1).item()
            todo = [int(best)]
            out.append(todo[0])
        return out


def check_draft(target_tok: Any, draft_tok: Any, target: str, draft: str) -> None:
    """A draft model must speak the target's vocabulary token for token."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        differ = sum(1 for t, i in tv.items() if dv.get(t) != i)
        raise ValueError(
            f"The draft model {draft} has another vocabulary than {target} ({len(dv)} "
            f"against {len(tv)} tokens, {differ} of the target's differ): a draft model "
            f"must share the target's tokenizer (e.g. a smaller model of the same family).")


def usable(cache: list[Any]) -> bool:
    """Whether refused guesses can be trimmed from this cache."""
    from mlx_lm.models.cache import can_trim_prompt_cache
    return bool(cache) and can_trim_prompt_cache(cache)


class Governor:
    """Chooses each pass's draft length from what drafts have earned on this model and
    path: acceptance (a geometric fit: each guess kept with probability alpha) and the
    measured time of a pass of each width (where a width wasn't measured yet, a + b *
    guesses from those that were: a batch's first guess can cost far more than the
    next). It drafts the length that maximises expected tokens per second, none where
    drafting loses, and still probes now and then so a workload that starts repeating
    itself is noticed: every 16 passes at first, half as often after each probe that
    didn't pay (a draft model's probe costs its catching up), down to one in 512."""

    PROBE_EVERY = 16  # passes between probes while drafting doesn't pay, at first
    PROBE_MAX = 512
    REBASE_EVERY = 64  # passes between undrafted passes that re-measure a

    def __init__(self, max_draft: int = DEFAULT_DRAFT, decay: float = 0.8):
        self.max_draft, self.decay = max_draft, decay
        self.kept, self.refused = 1.0, 1.0  # decayed counts; prior alpha 0.5
        self.base: float | None = None  # seconds of a pass without guesses
        self.per: float | None = None  # seconds each guess adds to a pass (the fit's b)
        self.times: dict[int, float] = {}  # guesses -> seconds of a pass that wide
        self.passes = 0
        self.chose = False  # the last length was the best one (not a probe or a measure)
        self.probe_every, self._next_probe = self.PROBE_EVERY, self.PROBE_EVERY
        self.drafted = self.accepted = 0  # totals, for the stats line

    @property
    def alpha(self) -> float:
        return self.kept / (self.kept + self.refused)

    def length(self, limit: int, cap: int | None = None, force: bool = False) -> int:
        """Guesses to ask for in the next pass (at most `limit`, and `cap` if given);
        `force` (a request that sent "speculative": true) always asks for the most."""
        self.passes += 1
        self.chose = False
        top = min(limit, self.max_draft if cap is None else cap)
        if top <= 0:
            return 0
        if force:
            return top
        if self.base is None and self.passes > 1 or self.passes % self.REBASE_EVERY == 0:
            return 0  # measure a pass without guesses
        if self.base is None or self.per is None:
            return top
        best = self.best(top)
        if best > 0:
            self.chose = True
            self.probe_every = self.PROBE_EVERY
            self._next_probe = self.passes + self.probe_every
            return best
        if self.passes >= self._next_probe:
            self._next_probe = self.passes + self.probe_every
            self.probe_every = min(2 * self.probe_every, self.PROBE_MAX)
            return min(2, top)
        return 0

    def width(self, lengths: list[int]) -> int:
        """A batch's pass width, once each sequence's guesses are known (0 for those
        without): where `length` chose (not a probe, a measure or a forced pass), the
        best for these guesses, since every sequence pays for the widest."""
        top = max(lengths, default=0)
        return self.best(top, lengths) if self.chose and top else top

    def cost(self, m: int) -> float:
        if m in self.times:
            return self.times[m]
        return (self.base or 1.0) + (self.per or 0.0) * m

    def best(self, top: int, lengths: list[int] | None = None) -> int:
        """The width that gives the most tokens per second; `lengths`: each sequence's
        guesses (one sequence with `top` if not given)."""
        alpha = min(self.alpha, 0.999)

        def rate(m: int) -> float:  # expected tokens per second of a pass m wide
            return sum((1 - alpha ** (min(m, n) + 1)) / (1 - alpha)
                       for n in lengths or [top]) / self.cost(m)
        return max(range(top + 1), key=lambda m: (rate(m), -m))

    def observed(self, drafted: int, accepted: int, seconds: float) -> None:
        self.observed_rows([(drafted, accepted)], drafted, seconds)

    def observed_rows(self, rows: list[tuple[int, int]], width: int,
                      seconds: float) -> None:
        """A pass `width` guesses wide took `seconds`; each drafting sequence's (guesses,
        kept) counts towards acceptance."""
        d = self.decay
        before = self.times.get(width)
        self.times[width] = seconds if before is None else d * before + (1 - d) * seconds
        if width == 0:
            self.base = self.times[0]
            return
        for drafted, accepted in rows:
            if drafted:
                self.drafted += drafted
                self.accepted += accepted
                self.kept = d * self.kept + accepted
                self.refused = d * self.refused + (1 if accepted < drafted else 0)
        if self.base is not None:
            per = max(seconds - self.base, 0.0) / width
            self.per = per if self.per is None else d * self.per + (1 - d) * per


@dataclass(frozen=True)
class Ask:
    """One sequence's say in a batched pass: the tokens it may still emit after the one it
    feeds, and how its request asked for drafts (a cap on guesses, forced on)."""

    room: int
    cap: int | None
    force: bool

    @classmethod
    def of(cls, sampling: Any, room: int) -> Ask:
        return cls(room, sampling.draft_tokens, sampling.speculative is True)


class Widths(Protocol):
    """What batch_guesses asks of a governor (Governor, batch_governor.BatchGovernor)."""

    def length(self, limit: int, cap: int | None = None, force: bool = False) -> int: ...

    def width(self, lengths: list[int]) -> int: ...


def batch_guesses(gov: Widths, asks: list[Ask | None],
                  propose: Callable[[int, int], list[int]]) -> list[list[int]]:
    """Each sequence's guesses for one pass over a batch (None in `asks`: it doesn't
    draft, and rides): the governor says how many a sequence may ask for, `propose(i, k)`
    asks sequence i's drafter for k, and the pass is then as wide as pays for the guesses
    all of them got. All empty where drafting doesn't pay (a pass the governor times)."""
    out: list[list[int]] = [[] for _ in asks]
    drafting = [(i, a) for i, a in enumerate(asks) if a is not None]
    if not drafting:
        return out
    caps = [a.cap for _, a in drafting if a.cap is not None]
    want = gov.length(max(a.room for _, a in drafting),
                      max(caps) if len(caps) == len(drafting) else None,
                      any(a.force for _, a in drafting))
    if want == 0:
        return out
    for i, a in drafting:
        k = min(want, a.room, a.cap or want)
        if k > 0:
            out[i] = propose(i, k)[:k]
    width = gov.width([len(g) for g in out])  # what pays, now the guesses are known
    return [g[:width] for g in out]


@dataclass
class Pass:
    """What one verify pass gave: the tokens to emit (the kept guesses, then the target's
    own draw) with their log-probability rows, and how many guesses it ran and kept."""

    tokens: list[int]
    logprobs: list[Any]
    drafted: int
    accepted: int


class Speculator:
    """Decodes one sequence with drafts. The cache holds `context[:-1]`; the context's last
    token is the one the next pass feeds (at the start: the prompt's last token)."""

    def __init__(self, model: Any, cache: list[Any], context: list[int], sampler: Any,
                 processors: list[Any], drafter: Drafter, governor: Governor,
                 draft_cap: int | None = None, force: bool = False, greedy: bool = False):
        self.model, self.cache, self.context = model, cache, list(context)
        self.sampler, self.processors = sampler, processors
        self.drafter, self.governor, self.cap = drafter, governor, draft_cap
        self.force = force  # draft on even where the governor finds it doesn't pay
        self.greedy = greedy  # argmax: every position drawn in one evaluation

    def step(self, room: int) -> Pass:
        """One pass; `room` is how many tokens may still be emitted (>= 1)."""
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        t0 = time.perf_counter()
        want = self.governor.length(room - 1, self.cap, self.force)
        guesses = self.drafter.propose(self.context, want)[:want] if want else []
        fed = [self.context[-1], *guesses]
        logits = self.model(mx.array(fed)[None], cache=self.cache)[0].astype(mx.float32)
        tokens, rows = draw(logits, guesses, self.context, self.sampler, self.processors,
                            self.greedy)
        kept = len(tokens) - 1
        if len(guesses) > kept:
            trim_prompt_cache(self.cache, len(guesses) - kept)
        self.context += tokens
        self.governor.observed(len(guesses), kept, time.perf_counter() - t0)
        return Pass(tokens, rows, len(guesses), kept)


def draw(logits: Any, guesses: list[int], context: list[int], sampler: Any,
         processors: list[Any], greedy: bool) -> tuple[list[int], list[Any]]:
    """The accept/reject rule over one sequence's verify logits (1 + len(guesses), vocab):
    draw at each position, in order, while the draw equals the guess. `context` ends with
    the token the pass fed first; processors see it and the guesses before each position.
    Gives the kept guesses and the target's own last draw, with their logprob rows."""
    import mlx.core as mx

    if not processors:
        lps = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if greedy:  # one evaluation for every position
            drawn: list[int] = mx.argmax(lps, axis=-1).tolist()  # type: ignore[assignment]
            n = 0
            while n < len(guesses) and drawn[n] == guesses[n]:
                n += 1
            return drawn[:n + 1], [lps[i] for i in range(n + 1)]
    tokens: list[int] = []
    rows: list[Any] = []
    for i in range(len(guesses) + 1):
        row = logits[i:i + 1]
        if processors:
            history = mx.array(context + guesses[:i], dtype=mx.int32)
            for p in processors:
                row = p(history, row)
        lp = row - mx.logsumexp(row, axis=-1, keepdims=True)
        t = int(sampler(lp).item())
        tokens.append(t)
        rows.append(lp[0])
        if i == len(guesses) or t != guesses[i]:
            break
    return tokens, rows
