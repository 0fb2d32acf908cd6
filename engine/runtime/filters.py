"""The sampler's filters that mlx-lm lacks (locally typical sampling, XTC drawing from a
request's own key, llama.cpp's min_keep) and the one chain that orders every filter as a
request asked (llama.cpp's `samplers`), or as mlx-lm orders them by default.

Each filter takes log-probabilities (1, vocab) and gives them back with the tokens it rules
out at -inf; engine/runtime/sampling.py draws from what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.runtime.sampling import Sampling

# mlx-lm's order (make_sampler: top_p, min_p, xtc, top_k, then temperature), with typical_p,
# which mlx-lm lacks, first. A request's `samplers` replaces it.
DEFAULT_ORDER = ("typical_p", "top_p", "min_p", "xtc", "top_k", "temperature")

Filter = Callable[[Any, Any], Any]  # (logprobs, the XTC coin's key or None) -> logprobs


def keep_top(before: Any, after: Any, n: int) -> Any:
    """`after` with the n most likely tokens of `before` put back (llama.cpp's min_keep:
    a filter never leaves fewer than n)."""
    import mlx.core as mx

    if n <= 1 or n >= before.shape[-1]:
        return after if n <= 1 else before
    top = mx.argpartition(-before, kth=n - 1, axis=-1)[..., :n]
    return mx.put_along_axis(after, top, mx.take_along_axis(before, top, axis=-1), axis=-1)


def apply_typical_p(logprobs: Any, mass: float) -> Any:
    """Locally typical sampling (Meister et al., as Hugging Face's TypicalLogitsWarper and
    llama.cpp do it): keep the tokens whose surprise is closest to the distribution's
    entropy, in that order, until they hold `mass` of the probability."""
    import mlx.core as mx

    lp = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    p = mx.exp(lp)
    entropy = -mx.sum(mx.where(p > 0, p * lp, 0.0), axis=-1, keepdims=True)
    shifted = mx.abs(-lp - entropy)  # a ruled-out token: inf, last in the order
    order = mx.argsort(shifted, axis=-1)
    cum = mx.cumsum(mx.take_along_axis(p, order, axis=-1), axis=-1)
    last = mx.minimum(mx.sum(cum < mass, axis=-1, keepdims=True), lp.shape[-1] - 1)
    cutoff = mx.take_along_axis(mx.take_along_axis(shifted, order, axis=-1), last, axis=-1)
    return mx.where(shifted > cutoff, mx.array(-mx.inf, logprobs.dtype), logprobs)


def apply_xtc(logprobs: Any, probability: float, threshold: float, spared: Any,
              min_keep: int, coin: Any) -> Any:
    """mlx-lm's apply_xtc (exclude the top choices: with `probability`, every token above
    `threshold` but the least likely of them is ruled out), its coin drawn from `coin`
    (a seeded request's key) or MLX's global key; `spared` (a bool mask) are never ruled
    out (llama.cpp: end-of-sequence and newline); nothing is ruled out where fewer than
    `min_keep` tokens would be left."""
    import mlx.core as mx

    probs = mx.softmax(logprobs, axis=-1)
    least = mx.where(probs > threshold, probs, mx.inf).min(axis=-1, keepdims=True)
    mask = probs > least
    if spared is not None:
        mask = mx.logical_and(mask, mx.logical_not(spared[:mask.shape[-1]]))
    out = mx.where(mask, mx.array(-mx.inf, logprobs.dtype), logprobs)
    u = mx.random.uniform(key=coin) if coin is not None else mx.random.uniform()
    go = u <= probability
    if min_keep > 1:
        go = mx.logical_and(go, mx.sum(out > -mx.inf) >= min_keep)
    return mx.where(go, out, logprobs)


def _top_k(k: int) -> Filter:
    from mlx_lm.sample_utils import apply_top_k

    def top_k(logprobs: Any, coin: Any) -> Any:  # k of the vocabulary or more: every token
        return apply_top_k(logprobs, k) if k < logprobs.shape[-1] else logprobs
    return top_k


def _typical(mass: float, keep: int) -> Filter:
    def typical(logprobs: Any, coin: Any) -> Any:
        return keep_top(logprobs, apply_typical_p(logprobs, mass), keep)
    return typical


def chain(sampling: Sampling, spared: Callable[[int], Any]) -> tuple[list[Filter], bool]:
    """The request's filters in its order: ([filter], whether temperature comes last, as
    mlx-lm applies it). A `samplers` order runs only the filters it names (as llama.cpp
    does); temperature where it stands, or last where not named. `spared(vocab)`: XTC's
    bool mask of tokens it never rules out."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_p

    s = sampling
    order = tuple(dict.fromkeys(s.samplers)) or DEFAULT_ORDER  # each filter once
    keep = max(s.min_keep, 1)
    temp = s.temperature
    out: list[Filter] = []
    for name in order:
        if name == "top_k" and s.top_k > 0:
            out.append(_top_k(max(s.top_k, s.min_keep)))
        elif name == "typical_p" and s.typical_p is not None and 0 < s.typical_p < 1.0:
            out.append(_typical(s.typical_p, keep))
        elif name == "top_p" and 0 < s.top_p < 1.0:
            out.append(lambda lp, c: keep_top(lp, apply_top_p(lp, s.top_p), keep))
        elif name == "min_p" and s.min_p != 0.0:
            out.append(lambda lp, c: apply_min_p(lp, s.min_p, min(keep, lp.shape[-1])))
        elif name == "xtc" and s.xtc_probability > 0:
            out.append(lambda lp, c: apply_xtc(lp, s.xtc_probability, s.xtc_threshold,
                                               spared(lp.shape[-1]), s.min_keep, c))
        elif name == "temperature" and s.samplers:
            out.append(lambda lp, c: lp * (1.0 / temp))
    return out, not s.samplers or "temperature" not in s.samplers
