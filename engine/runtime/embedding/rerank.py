"""A reranker's inputs: a cross-encoder's (query, document) pairs, or Qwen3-Reranker's
documented prompt (its model card: a system turn asking for "yes" or "no", then
<Instruct>/<Query>/<Document>, then an empty thinking block)."""

from __future__ import annotations

from typing import Any

from engine.errors import BadRequest, ContextTooLong
from engine.runtime.embedding.inputs import MAX_CHARS

QWEN3_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
                "on the Query and the Instruct provided. Note that the answer can only be "
                "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = ("Given a web search query, retrieve relevant passages that answer the "
                     "query")


def check_size(query: str, docs: list[str]) -> None:
    """The query is tokenized once per document: bound the characters that makes."""
    chars = len(query) * len(docs) + sum(map(len, docs))
    if chars > MAX_CHARS:
        raise BadRequest(f"The query times the documents comes to {chars} characters; at "
                         f"most {MAX_CHARS}. Shorten the query or send fewer documents.",
                         param="query")


def too_long(n: int, context: int) -> ContextTooLong:
    return ContextTooLong(f"A query and document come to {n} tokens; this model takes at "
                          f"most {context}. Shorten them, or allow truncation.",
                          param="documents")


def pair_rows(tokenizer: Any, query: str, docs: list[str], context: int,
              truncate: bool) -> tuple[list[list[int]], list[list[int]] | None]:
    """Each pair's ids (the tokenizer's [CLS] query [SEP] document [SEP]) and token types,
    cut longest-first to the context where `truncate` (as sentence-transformers does)."""
    check_size(query, docs)
    enc = tokenizer([query] * len(docs), docs, add_special_tokens=True)
    rows = [list(r) for r in enc["input_ids"]]
    types = enc.get("token_type_ids")
    types = [list(t) for t in types] if types is not None else None
    long = [i for i, r in enumerate(rows) if len(r) > context]
    if long and not truncate:
        raise too_long(len(rows[long[0]]), context)
    if long:
        cut = tokenizer([query] * len(long), [docs[i] for i in long], add_special_tokens=True,
                        truncation="longest_first", max_length=context)
        for j, i in enumerate(long):
            rows[i] = list(cut["input_ids"][j])
            if types is not None:
                types[i] = list(cut["token_type_ids"][j])
    return rows, types


def yesno_rows(tokenizer: Any, query: str, docs: list[str], context: int,
               truncate: bool) -> list[list[int]]:
    """Qwen3-Reranker's prompt for each document, the middle cut to fit where `truncate`.
    The client's text can't forge the prompt's turns: its special-token spellings are
    split into plain text."""
    check_size(query, docs)
    prefix = tokenizer(QWEN3_PREFIX, add_special_tokens=False)["input_ids"]
    suffix = tokenizer(QWEN3_SUFFIX, add_special_tokens=False)["input_ids"]
    bodies = [f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {d}"
              for d in docs]
    encoded = tokenizer(bodies, add_special_tokens=False,
                        split_special_tokens=True)["input_ids"]
    room = context - len(prefix) - len(suffix)
    rows = []
    for body in encoded:
        if len(body) > room:
            if not truncate:
                raise too_long(len(body) + len(prefix) + len(suffix), context)
            body = body[:max(room, 0)]
        rows.append(list(prefix) + list(body) + list(suffix))
    return rows
