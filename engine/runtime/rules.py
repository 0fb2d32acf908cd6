"""A request's rules over which tokens may come and which end the answer (vLLM's
ignore_eos, min_tokens, stop_token_ids, bad_words and allowed_token_ids), shared by every
generation path: one process, a batch, drafts, and rank 0 of a group.

The masks are built once per request as MLX arrays; a step costs a few `where`s (and, for
bad words of several tokens, one look at the last tokens generated).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.runtime.sampling import Sampling


def eos_ids(tokenizer: Any) -> frozenset[int]:
    return frozenset(int(t) for t in (getattr(tokenizer, "eos_token_ids", None) or ()))


def stop_tokens(sampling: Sampling, tokenizer: Any) -> frozenset[int]:
    """The tokens that end this answer with "stop": end-of-sequence (unless ignore_eos)
    and the request's stop_token_ids."""
    eos = frozenset() if sampling.ignore_eos else eos_ids(tokenizer)
    return eos | frozenset(sampling.stop_token_ids)


def own_finish(token: int, n: int, sampling: Sampling, stops: frozenset[int]) -> str | None:
    """The n-th generated token's own ending: "stop" for a stop token, "length" for the
    last one allowed."""
    return "stop" if token in stops else "length" if n >= sampling.max_tokens else None


def bad_word_ids(tokenizer: Any, words: tuple[str, ...]) -> list[tuple[int, ...]]:
    """vLLM's tokenization of bad words: each word as is and with one leading space, the
    spaced one kept where it makes a token sequence of its own of the same length."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not plain:
            continue
        out.append(plain)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


class TokenRules:
    """An mlx-lm logits processor for one request's token rules. Its first call is the
    answer's first token (every path calls processors from there on, one history token
    more per generated token), so the answer's length is the history's growth since."""

    def __init__(self, sampling: Sampling, tokenizer: Any):
        eos = eos_ids(tokenizer)
        self.banned = set(eos - set(sampling.stop_token_ids)) if sampling.ignore_eos else set()
        self.early = (set() if sampling.ignore_eos else set(eos)) | set(sampling.stop_token_ids)
        self.min_tokens = sampling.min_tokens
        self.allowed = sorted(set(sampling.allowed_token_ids))
        words = bad_word_ids(tokenizer, sampling.bad_words) if tokenizer is not None else []
        self.banned |= {w[0] for w in words if len(w) == 1}
        # a word of several tokens, by the tokens before its last: one look-up per length
        self.words: dict[int, dict[tuple[int, ...], set[int]]] = {}
        for w in words:
            if len(w) > 1:
                self.words.setdefault(len(w) - 1, {}).setdefault(w[:-1], set()).add(w[-1])
        self.longest = max(self.words, default=0)
        self._base: int | None = None
        self._always: Any = None  # (vocab,) bool: never sampled
        self._early: Any = None  # (vocab,) bool: not before min_tokens

    @property
    def active(self) -> bool:
        return bool(self.banned or self.allowed or self.words
                    or (self.min_tokens > 0 and self.early))

    def _masks(self, vocab: int) -> None:
        import mlx.core as mx

        def mask(ids: set[int] | list[int]) -> Any:
            m = mx.zeros((vocab,), dtype=mx.bool_)
            ids = [i for i in ids if 0 <= i < vocab]
            if ids:
                m[mx.array(ids)] = True
            return m
        always = mask(self.banned)
        if self.allowed:
            always = mx.logical_or(always, mx.logical_not(mask(self.allowed)))
        self._always = always
        self._early = mask(self.early)
        mx.eval(self._always, self._early)

    def __call__(self, history: Any, logits: Any) -> Any:
        import mlx.core as mx

        n = int(history.shape[-1]) if history is not None else 0
        if self._base is None:
            self._base = n
            self._masks(logits.shape[-1])
        made = n - self._base  # tokens generated before the one sampled now
        inf = mx.array(-mx.inf, logits.dtype)
        mask = self._always
        if made < self.min_tokens:
            mask = mx.logical_or(mask, self._early)
        if self.words and made > 0:
            mask = mx.logical_or(mask, self._word_ends(history, made, logits.shape[-1]))
        return mx.where(mask, inf, logits)

    def _word_ends(self, history: Any, made: int, vocab: int) -> Any:
        """vLLM's rule for a bad word of several tokens: its last token is ruled out right
        after the answer's last tokens spelled the rest of it."""
        import mlx.core as mx

        tail: list[int] = history[-min(made, self.longest):].tolist()
        ends = [t for n, by_prefix in self.words.items() if n <= len(tail)
                for t in by_prefix.get(tuple(tail[len(tail) - n:]), ()) if 0 <= t < vocab]
        m = mx.zeros((vocab,), dtype=mx.bool_)
        if ends:
            m[mx.array(ends)] = True
        return m


@functools.lru_cache(maxsize=8)
def special_tokens(tokenizer: Any) -> tuple[frozenset[int], frozenset[int], dict[int, str]]:
    """(special token ids, those of them Shoal's output splitters read, each one's text).
    Special: the tokenizer's all_special_ids and its added tokens marked special (what
    Hugging Face's decode skips). Read: the think and tool-call markers and Harmony's
    channel markers, which must reach the splitters whatever skip_special says."""
    from engine.runtime.harmony import CHANNEL, ENDS, MESSAGE, START
    from engine.runtime.toolcalls import GENERIC_END, GENERIC_START

    ids = set(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ()))
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids |= {int(i) for i, t in added.items() if getattr(t, "special", False)}
    named = [getattr(tokenizer, a, None) for a in
             ("think_start", "think_end", "tool_call_start", "tool_call_end")]
    markers = [m for m in named if isinstance(m, str) and m]
    markers += [GENERIC_START, GENERIC_END, CHANNEL, MESSAGE, START, *ENDS, "<|constrain|>"]
    text = {i: str(tokenizer.decode([i])) for i in ids}
    read = {i for i in ids if text[i] and any(text[i] in m for m in markers)}
    return frozenset(ids), frozenset(read), text
