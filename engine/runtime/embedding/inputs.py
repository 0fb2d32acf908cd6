"""A request's texts as token rows, checked: bounded in count, characters and tokens, token
ids inside the vocabulary, each within the model's context (cut, or a 400 naming the
field)."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, cast

from engine.errors import BadRequest, ContextTooLong, CorruptModel

MAX_INPUTS = 2048  # texts (or documents) in one request
MAX_CHARS = 16 * 1024 * 1024  # characters (and token ids) in one request, before tokenizing
MAX_TOKENS = 1024 * 1024  # tokens in one request, after any cut


def check_list(items: Any, param: str, kind: type | tuple[type, ...] = (str, list)) -> None:
    """A non-empty list of at most MAX_INPUTS items of `kind`, none empty, within
    MAX_CHARS characters and token ids in all; a 400 naming `param` otherwise."""
    if not isinstance(items, list) or not items:
        raise BadRequest(f"'{param}' must be a non-empty list.", param=param)
    if len(items) > MAX_INPUTS:
        raise BadRequest(f"'{param}' has {len(items)} items; at most {MAX_INPUTS} per "
                         "request. Send them in several requests.", param=param)
    chars = 0
    for i, item in enumerate(items):
        if not isinstance(item, kind) or isinstance(item, bool):
            raise BadRequest(f"'{param}[{i}]' must be a string or a list of token ids.",
                             param=param)
        if not item:
            raise BadRequest(f"'{param}[{i}]' is empty.", param=param)
        chars += len(cast(Sized, item))  # a list of ids counts each: every one is checked
    if chars > MAX_CHARS:
        raise BadRequest(f"'{param}' holds {chars} characters or token ids; at most "
                         f"{MAX_CHARS} per request.", param=param)


def check_ids(row: list[Any], vocab: int, param: str, index: int) -> list[int]:
    """Token ids a client sent, each an int in [0, vocab)."""
    for t in row:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise BadRequest(f"'{param}[{index}]' holds {t!r}, not a token id of this model "
                             f"(0 to {vocab - 1}).", param=param)
    return list(row)


def fit(rows: list[list[int]], context: int, truncate: bool, param: str,
        cut: dict[int, list[int]] | None = None, vocab: int | None = None) -> list[list[int]]:
    """Each row within `context` tokens: where `truncate`, the cut version (`cut[i]`, the
    tokenizer's own, which keeps the closing special token; else the first `context`), or a
    ContextTooLong naming `param`. Then the total within MAX_TOKENS, and every id inside
    `vocab` (a tokenizer with more tokens than the model's rows would read past them)."""
    out = []
    for i, row in enumerate(rows):
        if vocab is not None and row and max(row) >= vocab:
            raise CorruptModel(f"The model's tokenizer gives token id {max(row)}, past its "
                               f"{vocab} embeddings. Download the model again.")
        if len(row) > context:
            if not truncate:
                raise ContextTooLong(f"'{param}[{i}]' has {len(row)} tokens; this model takes "
                                     f"at most {context}. Shorten it, or allow truncation.",
                                     param=param)
            row = (cut or {}).get(i) or row[:context]
        out.append(row)
    total = sum(len(r) for r in out)
    if total > MAX_TOKENS:
        raise BadRequest(f"'{param}' comes to {total} tokens; at most {MAX_TOKENS} per "
                         "request. Send fewer or shorter texts.", param=param)
    return out


def tokenize(tokenizer: Any, items: list[str | list[int]], vocab: int, context: int,
             truncate: bool, param: str = "input") -> list[list[int]]:
    """Each input's token ids (texts through the tokenizer, special tokens added; token id
    lists as sent, checked), fitted to the context."""
    check_list(items, param)
    texts = [(i, s) for i, s in enumerate(items) if isinstance(s, str)]
    rows: list[list[int]] = [[] for _ in items]
    if texts:
        encoded = tokenizer([s for _, s in texts], add_special_tokens=True)["input_ids"]
        for (i, _), ids in zip(texts, encoded):
            rows[i] = list(ids)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            rows[i] = check_ids(item, vocab, param, i)
    long = [i for i, r in enumerate(rows) if len(r) > context and isinstance(items[i], str)]
    cut = {}
    if truncate and long:
        encoded = tokenizer([items[i] for i in long], add_special_tokens=True,
                            truncation=True, max_length=context)["input_ids"]
        cut = {i: list(ids) for i, ids in zip(long, encoded)}
    return fit(rows, context, truncate, param, cut, vocab)
