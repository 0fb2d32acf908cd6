"""The engine for embedding and reranker models: Embed -> Embedded, Rerank -> Ranked.

Inputs are tokenized and checked (engine/runtime/embedding/inputs.py), sorted into batches
of similar length with a bounded number of padded tokens each (batches.py), so a request
of thousands of texts takes the memory of one batch; a cancel is seen between batches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx

from engine.errors import BadRequest, Cancelled
from engine.protocol import Embed, Embedded, Ranked, Rerank
from engine.runtime.embedding.batches import batch_limit, buckets, pad, pool, unit
from engine.runtime.embedding.folder import ModelSpec
from engine.runtime.embedding.inputs import check_list, fit, tokenize
from engine.runtime.embedding.models import Decoder, Encoder
from engine.runtime.engine import Emit, Engine

Forward = Callable[[mx.array, mx.array, mx.array | None], mx.array]  # ids, mask, types


class EmbeddingEngine(Engine):
    """An embedding model: vectors, and rerank as cosine similarity of query and each
    document (as vLLM's score API does for embedding models)."""

    capabilities = frozenset({"embed", "rerank"})
    streams = 1  # one request at a time; its inputs are batched inside

    def __init__(self, spec: ModelSpec, net: Encoder | Decoder, tokenizer: Any,
                 context_limit: int | None = None):
        self.spec = spec
        self.net = net
        self.tokenizer = tokenizer
        self.context_length = min(spec.context, context_limit or spec.context)
        pad_id = spec.config.get("pad_token_id")
        self.pad_id = pad_id if isinstance(pad_id, int) and 0 <= pad_id < net.vocab_size else 0

    def embed(self, cmd: Embed, cancel: threading.Event, emit: Emit) -> None:
        dims = self.check_dimensions(cmd.dimensions)
        rows = tokenize(self.tokenizer, cmd.inputs, self.net.vocab_size,
                        self.context_length, cmd.truncate)
        vectors = self.vectors(rows, cancel)[:, :dims]
        if cmd.normalize:
            vectors = unit(vectors)
        emit(Embedded(cmd.id, cast(list[list[float]], vectors.tolist()), sum(map(len, rows))))

    def rerank(self, cmd: Rerank, cancel: threading.Event, emit: Emit) -> None:
        check_query(cmd.query)
        query = tokenize(self.tokenizer, [cmd.query], self.net.vocab_size,
                         self.context_length, cmd.truncate, "query")
        docs = tokenize(self.tokenizer, list(documents(cmd.documents)), self.net.vocab_size,
                        self.context_length, cmd.truncate, "documents")
        vectors = unit(self.vectors(query + docs, cancel))
        scores = vectors[1:] @ vectors[0]
        emit(Ranked(cmd.id, cast(list[float], scores.tolist()), sum(map(len, query + docs))))

    def check_dimensions(self, dims: Any) -> int:
        size = self.net.hidden_size
        if dims is None:
            return size
        if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= size:
            raise BadRequest(f"'dimensions' must be from 1 to {size} for this model "
                             f"(got {dims!r}).", param="dimensions")
        return dims

    def vectors(self, rows: list[list[int]], cancel: threading.Event) -> mx.array:
        """One pooled float32 vector per row, in order."""
        def forward(ids: mx.array, mask: mx.array, types: mx.array | None) -> mx.array:
            return pool(self.net.hidden(ids, mask, types), mask, self.spec.pooling)
        return run(forward, rows, None, cancel, self.pad_id)


def run(forward: Forward, rows: list[list[int]], types: list[list[int]] | None,
        cancel: threading.Event, pad_id: int = 0) -> mx.array:
    """`forward` over the rows in length buckets, its outputs stacked in the rows' order.
    Each batch is evaluated before the next, so only one batch's activations are alive."""
    out: list[mx.array | None] = [None] * len(rows)
    for batch in buckets([len(r) for r in rows], most=batch_limit()):
        if cancel.is_set():
            raise Cancelled("The request was cancelled.")
        ids, mask = pad([rows[i] for i in batch], pad_id)
        type_ids = pad([types[i] for i in batch])[0] if types is not None else None
        result = forward(ids, mask, type_ids)
        mx.eval(result)
        for j, i in enumerate(batch):
            out[i] = result[j]
    mx.clear_cache()  # the buckets' buffers of many shapes, not kept for the next request
    return mx.stack(out)  # type: ignore[arg-type]


def check_query(query: Any) -> None:
    if not isinstance(query, str) or not query:
        raise BadRequest("'query' must be a non-empty string.", param="query")


def documents(docs: Any) -> list[str]:
    check_list(docs, "documents", str)
    return cast(list[str], docs)


class RerankEngine(EmbeddingEngine):
    """A reranker: a cross-encoder's score for each (query, document) pair, or a causal
    reranker's yes/no judgement (Qwen3-Reranker). Scores are probabilities in [0, 1]."""

    capabilities = frozenset({"rerank"})

    def embed(self, cmd: Embed, cancel: threading.Event, emit: Emit) -> None:
        raise self.refuse("embed")

    def rerank(self, cmd: Rerank, cancel: threading.Event, emit: Emit) -> None:
        from engine.runtime.embedding.rerank import pair_rows, yesno_rows

        check_query(cmd.query)
        docs = documents(cmd.documents)
        net = self.net
        if isinstance(net, Decoder):
            rows, types = yesno_rows(self.tokenizer, cmd.query, docs, self.context_length,
                                     cmd.truncate), None
            yes, no = yes_no_ids(self.tokenizer)

            def yesno(ids: mx.array, mask: mx.array, t: mx.array | None) -> mx.array:
                logits = net.logits(pool(net.hidden(ids, mask, None), mask, "lasttoken"))
                return mx.sigmoid(logits[:, yes] - logits[:, no])
            forward = yesno
        else:
            rows, types = pair_rows(self.tokenizer, cmd.query, docs, self.context_length,
                                    cmd.truncate)

            def cross(ids: mx.array, mask: mx.array, t: mx.array | None) -> mx.array:
                return mx.sigmoid(net.scores(ids, mask, t).astype(mx.float32))
            forward = cross
        rows = fit(rows, self.context_length, False, "documents", vocab=net.vocab_size)
        scores = run(forward, rows, types, cancel, self.pad_id)
        emit(Ranked(cmd.id, cast(list[float], scores.tolist()), sum(map(len, rows))))


def yes_no_ids(tokenizer: Any) -> tuple[int, int]:
    from engine.errors import UnsupportedModel

    ids = tokenizer.convert_tokens_to_ids(["yes", "no"])
    if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in ids):
        raise UnsupportedModel("This reranker's vocabulary has no 'yes' and 'no' tokens.",
                               param="model")
    return ids[0], ids[1]
