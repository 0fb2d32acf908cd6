"""Rerank: POST /v1/rerank (and /rerank, /v2/rerank) in the Jina/Cohere shape that vLLM's
and llama.cpp's servers serve, which Open WebUI's external reranker and Cohere's and
Jina's clients send: {model, query, documents: [str | {"text"}], top_n, return_documents}
-> {id, model, usage, results: [{index, relevance_score, document?}]}, best first. One
Rerank to the model's worker (a reranker's own score, or an embedding model's cosine
similarity), served beside the chat model. Text Embeddings Inference's shape, which
llama.cpp's /rerank takes too, is told apart by `texts` in place of `documents`: its answer
is a bare list of {index, score, text?}."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from aiohttp import web
from pydantic import Field, field_validator

from engine import protocol as wire
from engine.api import common, hints
from engine.api.backend import backend, placed
from engine.api.embedding_schemas import MAX_CHARS, MAX_INPUTS
from engine.api.openai_schemas import Strict
from engine.api.render import error_of
from engine.errors import BadRequest, WorkerFailed

routes = web.RouteTableDef()


class Document(Strict):
    text: str


class RerankRequest(Strict):
    """vLLM's RerankRequest, Jina's and Cohere's (v1 and v2) rerank bodies."""
    TREATMENT: ClassVar[dict[str, str]] = {
        "priority": "hint",
        "truncate_prompt_tokens": "only -1 (cut to the model's context, as here by default)",
        "use_activation": "only true (scores are the model's, after its activation)",
        "max_tokens_per_doc": "refused", "rank_fields": "refused",
        "mm_processor_kwargs": "refused", "raw_scores": "only false",
        "truncation_direction": "only Right (the end is cut)"}
    model: str | None = Field(default=None, min_length=1)
    query: str = Field(min_length=1)
    documents: list[str | Document] | None = Field(default=None, min_length=1,
                                                   max_length=MAX_INPUTS)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    use_activation: bool | None = None
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    max_tokens_per_doc: int | None = None  # Cohere v2's
    rank_fields: list[str] | None = None  # Cohere v1's, for documents as objects
    mm_processor_kwargs: dict[str, Any] | None = None
    # Text Embeddings Inference's (llama.cpp's /rerank takes `texts` and `return_text` too)
    texts: list[str] | None = Field(default=None, min_length=1, max_length=MAX_INPUTS)
    return_text: bool = False
    truncate: bool | None = None  # None: cut, as the other shapes are
    raw_scores: bool = False
    truncation_direction: Literal["Left", "Right", "left", "right"] | None = None

    @field_validator("documents", "texts")
    @classmethod
    def _size(cls, v: list[Any] | None) -> list[Any] | None:
        total = sum(len(d if isinstance(d, str) else d.text) for d in v or [])
        if total > MAX_CHARS:
            raise ValueError(f"more than {MAX_CHARS:,} characters in all")
        return v

    def check(self) -> None:
        for name in ("max_tokens_per_doc", "rank_fields", "mm_processor_kwargs"):
            if getattr(self, name) is not None:
                raise BadRequest(f"'{name}' is not taken here: send documents as text (each "
                                 "is cut to the model's context).", param=name)
        if self.truncate_prompt_tokens not in (None, -1):
            raise BadRequest("'truncate_prompt_tokens': only -1 is taken (a pair longer than "
                             "the model's context is cut to it, as by default).",
                             param="truncate_prompt_tokens")
        if (self.documents is None) == (self.texts is None):
            raise BadRequest("Send the documents to rank as 'documents' (or as 'texts', Text "
                             "Embeddings Inference's name), one of the two.",
                             param="documents")
        if self.raw_scores:
            raise BadRequest("'raw_scores': only false is taken (scores are the model's "
                             "after its activation).", param="raw_scores")
        if (self.truncation_direction or "right").lower() != "right":
            raise BadRequest("'truncation_direction': only Right is taken (the end is cut).",
                             param="truncation_direction")
        if self.use_activation is False:
            raise BadRequest("'use_activation': only true is taken (scores are the model's "
                             "after its activation).", param="use_activation")

    def docs(self) -> list[str]:
        if self.texts is not None:
            return self.texts
        return [d if isinstance(d, str) else d.text for d in self.documents or []]


async def _model(request: web.Request, body: RerankRequest) -> str:
    """The named model, or the one model here that reranks (running ones first)."""
    if body.model:
        return body.model
    here = backend(request).serving("rerank")
    if not here:
        raise BadRequest("'model' is required: no model here reranks.", param="model")
    return here[0]


async def rerank(request: web.Request) -> web.Response:
    """Rerank documents by relevance to a query (Jina, Cohere; vLLM's and llama.cpp's)."""
    body = common.parse(RerankRequest, await common.read_json(request))
    body.check()
    hints.note(request, ["priority"] if body.priority else [])
    model = await _model(request, body)
    texts = body.docs()
    ans = await backend(request).rerank(model, wire.Rerank("", body.query, texts,
                                                           body.truncate is not False))
    if isinstance(ans, wire.Error):
        raise error_of(ans)
    if not isinstance(ans, wire.Ranked) or len(ans.scores) != len(texts):
        raise WorkerFailed(f"The worker for {model} scored {len(getattr(ans, 'scores', []))} "
                           f"of {len(texts)} documents.")
    order = sorted(range(len(texts)), key=lambda i: -ans.scores[i])[:body.top_n]
    if body.texts is not None:  # Text Embeddings Inference's answer: a bare list
        return web.json_response([
            {"index": i, "score": ans.scores[i], **({"text": texts[i]} if body.return_text
                                                    else {})} for i in order])
    results: list[dict[str, Any]] = []
    for i in order:
        r: dict[str, Any] = {"index": i, "relevance_score": ans.scores[i]}
        if body.return_documents:
            r["document"] = {"text": texts[i]}
        results.append(r)
    return web.json_response({
        "id": f"rerank-{uuid.uuid4().hex}", "model": model,
        "usage": {"prompt_tokens": ans.prompt_tokens, "total_tokens": ans.prompt_tokens},
        "results": results})


for _path in ("/v1/rerank", "/rerank", "/v2/rerank"):
    routes.post(_path)(placed(rerank))
