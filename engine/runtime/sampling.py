"""Sampling for one request: mlx-lm's sampler and logits processors, seeded as asked, plus
the request's output constraint (a grammar) and logit bias, and the log-probabilities the
client asked for.

One place for both paths: the one-process worker and rank 0 of a group sample with this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.protocol import Constraint, SamplingRequest


@dataclass(frozen=True)
class Sampling:
    """What the caller asked for; validated by the API layer before it gets here."""

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k: the chosen token's and the top k
    constraint: Constraint | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    speculative: bool | None = None  # None: as the node is set
    draft_tokens: int | None = None  # the most guesses per pass (None: the node's)

    @classmethod
    def of(cls, asked: SamplingRequest, max_tokens: int,
           constraint: Constraint | None) -> Sampling:
        """What the client asked, defaults where it didn't, for a prompt that leaves
        `max_tokens` of the context."""
        d = cls()
        return cls(max_tokens=max_tokens,
                   temperature=d.temperature if asked.temperature is None else asked.temperature,
                   top_p=d.top_p if asked.top_p is None else asked.top_p,
                   top_k=d.top_k if asked.top_k is None else asked.top_k,
                   min_p=d.min_p if asked.min_p is None else asked.min_p,
                   repetition_penalty=asked.repetition_penalty,
                   presence_penalty=asked.presence_penalty,
                   frequency_penalty=asked.frequency_penalty, seed=asked.seed,
                   stop=asked.stop, logprobs=asked.logprobs, constraint=constraint,
                   logit_bias=asked.logit_bias, speculative=asked.speculative,
                   draft_tokens=asked.draft_tokens)


def make_sampling(sampling: Sampling, tokenizer: Any = None) -> tuple[Any, list[Any]]:
    """mlx-lm's sampler and logits processors for a request. A constraint needs the
    tokenizer (the grammar is matched against its vocabulary)."""
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    if sampling.seed is not None and sampling.temperature > 0:
        sampler = seeded_sampler(sampling)
    else:
        def build(top_k: int) -> Any:
            return make_sampler(temp=sampling.temperature, top_p=sampling.top_p,
                                min_p=sampling.min_p, top_k=top_k)
        sampler = build(sampling.top_k)
        if sampling.top_k > 0:  # a top_k of the vocabulary or more keeps every token
            k, narrowed, every = sampling.top_k, sampler, build(0)
            sampler = lambda lp: narrowed(lp) if k < lp.shape[-1] else every(lp)  # noqa: E731
    bias = {int(k): float(v) for k, v in sampling.logit_bias} or None
    processors = make_logits_processors(logit_bias=bias,
                                        repetition_penalty=sampling.repetition_penalty,
                                        presence_penalty=sampling.presence_penalty,
                                        frequency_penalty=sampling.frequency_penalty)
    if sampling.constraint is not None:
        if tokenizer is None:
            raise ValueError("an output constraint needs the tokenizer")
        from engine.runtime.grammar import GrammarProcessor
        processors.append(GrammarProcessor(sampling.constraint, tokenizer))
    return sampler, processors


LogProbs = tuple[float | None, tuple[tuple[int, float], ...]]


def token_sampler(sampling: Sampling, tokenizer: Any, prompt: list[int]
                  ) -> Callable[[Any], tuple[int, LogProbs]]:
    """One request's sampling step over logits (1, vocab), as mlx-lm's generate_step does
    it (processors see the prompt and every token sampled so far): (token, its logprobs
    as token_logprobs gives them). Rank 0 of a group samples with this, in lockstep or in
    a batch."""
    import mlx.core as mx

    sampler, processors = make_sampling(sampling, tokenizer)
    history = mx.array(prompt, dtype=mx.int32)

    def sample(logits: Any) -> tuple[int, LogProbs]:
        nonlocal history
        for p in processors:
            logits = p(history, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        y = sampler(logprobs)
        if processors:
            history = mx.concat([history, y.astype(mx.int32)])
        token = int(y.item())
        return token, token_logprobs(logprobs, token, sampling.logprobs)

    return sample


def seeded_sampler(sampling: Sampling) -> Any:
    """mlx-lm's sampling chain drawing from the request's own random key. mlx-lm's draws
    from MLX's global key, which every request in a batch shares: with its own key a
    seeded request gives the same tokens in a batch as alone (the same draws as
    mx.random.seed(seed) followed by mlx-lm's sampler)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    key = mx.random.key((sampling.seed or 0) % (2**63))
    top_p, min_p, top_k, temp = (sampling.top_p, sampling.min_p, sampling.top_k,
                                 sampling.temperature)

    def sample(logprobs: Any) -> Any:
        nonlocal key
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if min_p != 0.0:
            logprobs = apply_min_p(logprobs, min_p)
        if 0 < top_k < logprobs.shape[-1]:  # of the vocabulary or more: every token
            logprobs = apply_top_k(logprobs, top_k)
        key, draw = mx.random.split(key)
        return mx.random.categorical(logprobs * (1.0 / temp), key=draw)

    return sample


def token_logprobs(logprobs: Any, token: int, top: int | None) -> LogProbs:
    """The sampled token's log-probability and the `top` most likely (token, logprob)
    pairs from one step's log-softmax vector; (None, ()) when not asked for."""
    if top is None:
        return None, ()
    import mlx.core as mx

    lp = logprobs.reshape(-1)
    chosen = float(lp[token].item())
    top = min(top, lp.size)  # a vocabulary smaller than k: all of it (kth must be in it)
    if top <= 0:
        return chosen, ()
    ids = mx.argpartition(-lp, kth=top - 1)[:top]
    vals = lp[ids]
    order = mx.argsort(-vals)
    top_ids: list[Any] = ids[order].tolist()  # type: ignore[assignment]
    top_vals: list[Any] = vals[order].tolist()  # type: ignore[assignment]
    return chosen, tuple((int(i), float(v)) for i, v in zip(top_ids, top_vals))
