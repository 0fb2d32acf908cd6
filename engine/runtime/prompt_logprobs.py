"""The log-probability of each prompt token given those before it (vLLM's prompt_logprobs;
evaluation harnesses score a text this way with max_tokens 0), and the logprob records
both it and the generated tokens' logprobs are made of.

The prompt runs through the model once more, in chunks and into a cache of its own (not
the request's, not the prefix cache), so a long prompt never holds a (length x vocab)
array at once and nothing served after it sees this pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.errors import BadRequest
from engine.records import TokenLogprob, TopLogprob

CHUNK_BYTES = 64 << 20  # the float32 log-softmax rows one chunk holds
MAX_CHUNK = 512
# The answer rides in one pipe line, which the node reads up to 16 MiB (worker_handle.py);
# an entry is ~70 bytes of JSON plus ~4 a byte of its token's text
MAX_ENTRIES = 150_000  # (prompt tokens) x (1 + top): refused before any is computed
MAX_JSON_BYTES = 12 << 20


def entry(tokenizer: Any, token: int, logprob: float,
          top: tuple[tuple[int, float], ...] | list[tuple[int, float]],
          decode: Callable[[int], str] | None = None) -> TokenLogprob:
    """The record of one token's logprob and the top alternatives at its place, each with
    its id, its text and that text's UTF-8 bytes."""
    decode = decode or (lambda t: str(tokenizer.decode([t])))

    def one(t: int, lp: float) -> TopLogprob:
        s = decode(t)
        return TopLogprob(s, lp, list(s.encode()), id=t)
    first = one(token, logprob)
    return TokenLogprob(first.token, first.logprob, first.bytes,
                        [one(t, lp) for t, lp in top], id=token)


def whole(model: Any) -> bool:
    """Is this the whole model? A group's rank holds a pipeline Stage (no modules of its
    own) or layers split across machines (mlx's sharded linears, which sum over a group
    every other rank must join): running either alone computes nothing, or waits forever."""
    if not hasattr(model, "named_modules"):
        return False
    for _, m in model.named_modules():
        group = getattr(m, "group", None)
        size = getattr(group, "size", None)
        if callable(size) and size() > 1:
            return False
    return True


def refuse_split(model: Any) -> None:
    """BadRequest naming prompt_logprobs where the model is split over a group."""
    if not whole(model):
        raise BadRequest("'prompt_logprobs': this model is split across machines, and the "
                         "prompt's logprobs need the model whole on one machine; load it on "
                         "one machine or leave prompt_logprobs out.", param="prompt_logprobs")


def compute(model: Any, tokenizer: Any, prompt: list[int], top: int,
            cancel: threading.Event | None = None) -> list[TokenLogprob | None]:
    """The logprob of each prompt token given the ones before (the first has none: None),
    with the `top` most likely tokens at its place. Stops early (a shorter list) when
    `cancel` is set."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    out: list[TokenLogprob | None] = [None] if prompt else []
    if len(prompt) < 2:
        return out
    if (len(prompt) - 1) * (1 + top) > MAX_ENTRIES:
        raise _too_large(len(prompt), top)
    cache = make_prompt_cache(model)
    names: dict[int, str] = {}

    def decode(t: int) -> str:
        if t not in names:
            names[t] = str(tokenizer.decode([t]))
        return names[t]

    step, size = 0, 0
    n = len(prompt) - 1  # the last token is only ever a target
    start = 0
    while start < n:
        if cancel is not None and cancel.is_set():
            break
        inputs = prompt[start:min(n, start + (step or 1))]  # the first: one row
        targets = mx.array(prompt[start + 1:start + 1 + len(inputs)])
        logits = model(mx.array(inputs)[None], cache=cache)[0].astype(mx.float32)
        if not step:  # the vocabulary is known now: as many rows as CHUNK_BYTES hold
            step = max(1, min(MAX_CHUNK, CHUNK_BYTES // (4 * logits.shape[-1])))
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(lp, targets[:, None], axis=-1)[:, 0]
        k = min(top, lp.shape[-1])
        if k > 0:
            ids = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
            vals = mx.take_along_axis(lp, ids, axis=-1)
            order = mx.argsort(-vals, axis=-1)
            ids, vals = (mx.take_along_axis(ids, order, axis=-1),
                         mx.take_along_axis(vals, order, axis=-1))
            mx.eval(chosen, ids, vals)
            top_ids: list[Any] = ids.tolist()  # type: ignore[assignment]
            top_vals: list[Any] = vals.tolist()  # type: ignore[assignment]
            tops = [list(zip(i, v)) for i, v in zip(top_ids, top_vals)]
        else:
            mx.eval(chosen)
            tops = [[] for _ in inputs]
        rows: list[Any] = chosen.tolist()  # type: ignore[assignment]
        for t, c, alts in zip(prompt[start + 1:start + 1 + len(inputs)], rows, tops):
            e = entry(tokenizer, int(t), float(c), [(int(i), float(v)) for i, v in alts],
                      decode)
            size += sum(70 + 4 * len(x.bytes) for x in (e, *e.top_logprobs))
            out.append(e)
        if size > MAX_JSON_BYTES:  # long tokens: the count alone didn't tell
            raise _too_large(len(prompt), top)
        start += len(inputs)
    return out


def _too_large(tokens: int, top: int) -> BadRequest:
    return BadRequest(f"'prompt_logprobs': {tokens} prompt tokens with the top {top} "
                      f"each is more than one answer carries (about {MAX_ENTRIES:,} "
                      "logprobs); ask for fewer top logprobs or send a shorter prompt.",
                      param="prompt_logprobs")
