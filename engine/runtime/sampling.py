"""Sampling for one request: mlx-lm's sampler and logits processors, seeded as asked, plus
the request's output constraint (a grammar) and logit bias, and the log-probabilities the
client asked for.

One place for both paths: the one-process worker and rank 0 of a group sample with this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
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
    # vLLM's and llama.cpp's extensions (engine/protocol.py's SamplingRequest says each)
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    include_stop: bool = False
    skip_special: bool = True
    spaces_between_special: bool = True
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    typical_p: float | None = None
    min_keep: int = 0
    samplers: tuple[str, ...] = ()  # the filters' order (engine/runtime/filters.py)
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repetition_context: int | None = None  # the penalties' window (None: mlx-lm's 20)

    @classmethod
    def of(cls, asked: SamplingRequest, max_tokens: int,
           constraint: Constraint | None) -> Sampling:
        """What the client asked, defaults where it didn't, for a prompt that leaves
        `max_tokens` of the context."""
        given = {f.name: getattr(asked, f.name) for f in fields(cls)
                 if getattr(asked, f.name, None) is not None}
        return cls(**{**given, "max_tokens": max_tokens, "constraint": constraint})


def make_sampling(sampling: Sampling, tokenizer: Any = None) -> tuple[Any, list[Any]]:
    """The request's sampler and logits processors: mlx-lm's penalties and logit bias,
    then its grammar (which needs the tokenizer: it is matched against its vocabulary)
    and its token rules (engine/runtime/rules.py)."""
    from mlx_lm.sample_utils import make_logits_processors

    sampler = make_sampler(sampling, tokenizer)
    bias = {int(k): float(v) for k, v in sampling.logit_bias} or None
    window = sampling.repetition_context
    window = 20 if window is None else window if window > 0 else 2**31 - 1 if window < 0 else 0
    processors = make_logits_processors(logit_bias=bias,
                                        repetition_penalty=sampling.repetition_penalty,
                                        presence_penalty=sampling.presence_penalty,
                                        frequency_penalty=sampling.frequency_penalty,
                                        repetition_context_size=window,
                                        presence_context_size=window,
                                        frequency_context_size=window)
    if window == 0:  # llama.cpp's repeat_last_n 0: the penalties look at nothing
        processors = processors[:1] if bias else []
    if sampling.constraint is not None:
        if tokenizer is None:
            raise ValueError("an output constraint needs the tokenizer")
        from engine.runtime.grammar import GrammarProcessor
        processors.append(GrammarProcessor(sampling.constraint, tokenizer))
    from engine.runtime.rules import TokenRules
    rules = TokenRules(sampling, tokenizer)
    if rules.active:
        processors.append(rules)
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


def make_sampler(sampling: Sampling, tokenizer: Any = None) -> Any:
    """The request's sampler: its filters in its order (engine/runtime/filters.py), then a
    draw at its temperature; argmax at temperature 0. A seeded request draws from its own
    random key: mlx-lm's draws from MLX's global key, which every request in a batch
    shares, so with its own key a seeded request gives the same tokens in a batch as alone
    (the same draws as mx.random.seed(seed) followed by mlx-lm's sampler)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import categorical_sampling, greedy_sampler

    from engine.runtime.filters import chain

    temp = sampling.temperature
    if temp == 0:
        return greedy_sampler
    spared: list[Any] = []  # XTC's: end-of-sequence and newline, as llama.cpp's

    def spare(vocab: int) -> Any:
        if not spared:
            ids = [] if tokenizer is None else [
                *tokenizer.encode("\n", add_special_tokens=False), *tokenizer.eos_token_ids]
            m = mx.zeros((vocab,), dtype=mx.bool_)
            ids = [int(i) for i in ids if 0 <= int(i) < vocab]
            if ids:
                m[mx.array(ids)] = True
            spared.append(m)
        return spared[0]
    filters, temp_last = chain(sampling, spare)
    xtc = sampling.xtc_probability > 0
    key = None if sampling.seed is None else mx.random.key(sampling.seed % (2**63))

    def sample(logprobs: Any) -> Any:
        nonlocal key
        draw = coin = None
        if key is not None:
            key, draw = mx.random.split(key)
            if xtc:
                draw, coin = mx.random.split(draw)
        for f in filters:
            logprobs = f(logprobs, coin)
        if not temp_last:  # applied where the request's order put it
            return mx.random.categorical(logprobs, key=draw)
        if draw is None:
            return categorical_sampling(logprobs, temp)
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
