"""The token ids a request may carry, checked where the vocabulary is known: in the worker,
when a request is admitted, before any of its ids indexes an array.

A token id indexes the embedding (a prompt's ids), the logits (logit_bias: mlx-lm adds
the bias with `logits.at[:, ids]`, unchecked, so an id past the end writes past the
array or crashes the process) and the tokenizer's tables (decoding). So an id of this
model is one all three have: 0 <= id < the least of the model's vocabulary and the
tokenizer's length. Every path (one process, a batch, drafts, a group's rank 0) is
served through engine.runtime.request.run, which checks here once.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from engine.errors import BadRequest
from engine.protocol import GenerateRequest

log = logging.getLogger(__name__)


def model_vocab(model: Any) -> int | None:
    """How many token ids the model's embedding and head take: its config's vocab_size
    (mlx-lm builds both with it, and loads their weights strictly), the least where a
    model holds several (a text model inside another); else its largest embedding's
    rows; None where neither is found."""
    import mlx.nn as nn

    if not hasattr(model, "named_modules"):  # a pipeline rank's Stage: the model it slices
        model = getattr(model, "model", None)
        if not hasattr(model, "named_modules"):
            return None
    sizes: list[int] = []
    rows: list[int] = []
    for _, m in model.named_modules():
        for args in (getattr(m, "args", None), getattr(m, "config", None)):
            for holder in (args, _get(args, "text_config")):
                v = _get(holder, "vocab_size")
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    sizes.append(v)
        if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)):
            rows.append(int(m.weight.shape[0]))
    if sizes:
        return min(sizes)
    return max(rows) if rows else None


def _get(holder: Any, name: str) -> Any:
    return holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)


def token_limit(model: Any, tokenizer: Any) -> int:
    """One past the largest token id this model takes (see the module's docstring)."""
    try:
        known = len(tokenizer)
    except TypeError:  # a tokenizer without a length: its vocabulary's size
        known = 0
    known = max(known, int(getattr(tokenizer, "vocab_size", 0) or 0))
    try:
        vocab = model_vocab(model)
    except Exception:  # a model built in a way not foreseen here must still serve
        log.exception("reading the model's vocabulary size failed")
        vocab = None
    if vocab is None:
        log.warning("can't tell this model's vocabulary size: token ids are checked "
                    "against the tokenizer's %d alone", known)
        return known
    if known and known != vocab:
        log.info("token ids: the model has %d, the tokenizer %d; requests may use the "
                 "first %d", vocab, known, min(vocab, known))
    return min(vocab, known) if known else vocab


MAX_PROMPT_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_IDS = 4096  # stop_token_ids, allowed_token_ids: more than any real list


def check_request(req: GenerateRequest, limit: int, ctx_len: int | None = None) -> None:
    """A 400 naming the field for any id the request carries that this model hasn't, for
    a bias that isn't a finite number, and for a prompt_logprobs or truncate_prompt_tokens
    out of range (the API checked them; the pipe is re-checked on the side that indexes
    with them). `ctx_len`: the context, which truncate_prompt_tokens can't exceed."""
    s = req.sampling
    for token, bias in s.logit_bias:
        if not _is_id(token, limit):
            raise BadRequest(f"'logit_bias' key {token} is not a token id of this model "
                             f"(0 to {limit - 1}).", param="logit_bias")
        if not math.isfinite(bias) or not -100 <= bias <= 100:
            raise BadRequest(f"'logit_bias' for token {token} is {bias}: biases are "
                             "between -100 and 100.", param="logit_bias")
    for name in ("stop_token_ids", "allowed_token_ids"):
        ids = getattr(s, name)
        if len(ids) > MAX_IDS:
            raise BadRequest(f"'{name}' holds {len(ids)} ids; at most {MAX_IDS} are taken.",
                             param=name)
        bad = next((t for t in ids if not _is_id(t, limit)), None)
        if bad is not None:
            raise BadRequest(f"'{name}' holds {bad!r}, which is not a token id of this model "
                             f"(0 to {limit - 1}).", param=name)
    k = s.prompt_logprobs
    if k is not None and (not _is_int(k) or not 0 <= k <= MAX_PROMPT_LOGPROBS):
        raise BadRequest(f"'prompt_logprobs' is {k!r}: it is between 0 and "
                         f"{MAX_PROMPT_LOGPROBS}.", param="prompt_logprobs")
    k = s.truncate_prompt_tokens
    if k is not None and (not _is_int(k) or k < 1 or (ctx_len is not None and k > ctx_len)):
        most = f" and at most the context, {ctx_len}" if ctx_len is not None else ""
        raise BadRequest(f"'truncate_prompt_tokens' is {k!r}: it is at least 1{most}.",
                         param="truncate_prompt_tokens")
    if isinstance(req.prompt, list):  # before it is decoded: the tokenizer takes only u32
        bad = _first_outside(req.prompt, limit)
        if bad is not None:
            raise BadRequest(f"'prompt' holds {bad}, which is not a token id of this model "
                             f"(0 to {limit - 1}).", param="prompt")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_id(v: object, limit: int) -> bool:
    return _is_int(v) and 0 <= v < limit  # type: ignore[operator]


def check_prompt(prompt: list[int], limit: int, req: GenerateRequest) -> None:
    """The prompt as it will run (a text's encoding, fill-in-the-middle tokens added): a
    tokenizer that knows more ids than the model has embeddings for must not reach them."""
    bad = _first_outside(prompt, limit)
    if bad is not None:
        param = "messages" if req.messages is not None else "prompt"
        raise BadRequest(f"'{param}' encodes to token id {bad}, which this model's "
                         f"embedding doesn't have (its ids are 0 to {limit - 1}): its "
                         "tokenizer knows more tokens than the model; leave out the "
                         "special tokens it added.", param=param)


def _first_outside(tokens: list[int], limit: int) -> int | None:
    if not tokens or (0 <= min(tokens) and max(tokens) < limit):
        return None
    return next(t for t in tokens if not 0 <= t < limit)
