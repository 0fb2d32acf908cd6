"""Rerank over HTTP on a real node, from the bundled all-MiniLM-L6-v2 (an embedding model
reranks by cosine similarity) served beside the chat model: the Jina shape (Open WebUI's
external reranker), Cohere's (v1 and v2, documents as objects), vLLM's and llama.cpp's
/rerank; the order right on a small labelled set; hostile bodies get a 400."""

from __future__ import annotations

import httpx
import pytest
from embed_node import CHAT, MINILM, embed_node, needs_minilm

pytestmark = needs_minilm
QUERY = "What is the capital of France?"
DOCS = ["Bananas are a yellow fruit rich in potassium.",
        "Paris is the capital and largest city of France.",
        "Python is a programming language.",
        "France's government sits in its capital, Paris, on the Seine."]
RELEVANT = {1, 3}


CROSS = "tiny-ce"  # a random BERT cross-encoder (a reranker that doesn't embed)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    import sys
    from pathlib import Path

    from engine.hub.bundled_embedding import ensure_embedding_model
    sys.path.append(str(Path(__file__).resolve().parents[1] / "runtime"))
    from embedding_tiny import make_tiny_bert
    tmp = tmp_path_factory.mktemp("rerank")
    minilm = ensure_embedding_model(tmp / "bundled")
    cross = make_tiny_bert(tmp / "extra" / CROSS, minilm, classifier=True)
    yield from embed_node(tmp, more=(cross,))


def post(node, path: str, body: dict) -> httpx.Response:
    return httpx.post(node.url + path, json=body, timeout=120)


def test_jina_shape_as_open_webui_sends_it(node):
    r = post(node, "/v1/rerank", {"model": MINILM, "query": QUERY, "documents": DOCS,
                                  "top_n": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == MINILM and out["id"] and out["usage"]["total_tokens"] > 20
    results = out["results"]
    assert len(results) == 3
    assert {x["index"] for x in results[:2]} == RELEVANT
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert results[0]["document"]["text"] == DOCS[results[0]["index"]]


def test_cohere_shape_documents_as_objects_and_no_documents_back(node):
    for path in ("/v2/rerank", "/rerank"):
        r = post(node, path, {"model": MINILM, "query": QUERY, "return_documents": False,
                              "documents": [{"text": d} for d in DOCS]})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == len(DOCS) and "document" not in results[0]
        assert {x["index"] for x in results[:2]} == RELEVANT
        assert sorted(x["index"] for x in results) == list(range(len(DOCS)))


def test_scores_agree_with_embeddings_cosine(node):
    import numpy as np
    emb = post(node, "/v1/embeddings", {"model": MINILM, "input": [QUERY, *DOCS]}).json()
    v = np.array([d["embedding"] for d in emb["data"]])
    cos = v[1:] @ v[0]
    ranked = post(node, "/v1/rerank", {"model": MINILM, "query": QUERY,
                                       "documents": DOCS}).json()["results"]
    for x in ranked:
        assert abs(x["relevance_score"] - cos[x["index"]]) < 1e-4


def test_model_may_be_left_out(node):
    post(node, "/v1/rerank", {"model": MINILM, "query": QUERY, "documents": DOCS[:1]})
    r = post(node, "/v1/rerank", {"query": QUERY, "documents": DOCS[:2]})
    assert r.status_code == 200, r.text
    assert r.json()["model"] in (MINILM, CROSS)  # a model that reranks, a running one first


def test_text_embeddings_inference_shape(node):
    r = post(node, "/rerank", {"model": MINILM, "query": QUERY, "texts": DOCS,
                               "return_text": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == len(DOCS)
    assert {x["index"] for x in out[:2]} == RELEVANT and out[0]["text"] == DOCS[out[0]["index"]]
    assert set(out[0]) == {"index", "score", "text"}
    bare = post(node, "/rerank", {"query": QUERY, "texts": DOCS}).json()  # a running one
    assert set(bare[0]) == {"index", "score"}


HOSTILE = [
    ({"model": MINILM, "query": QUERY}, "documents"),
    ({"model": MINILM, "query": QUERY, "documents": DOCS, "texts": DOCS}, "documents"),
    ({"model": MINILM, "query": QUERY, "texts": DOCS, "raw_scores": True}, "raw_scores"),
    ({"model": MINILM, "query": QUERY, "texts": DOCS, "truncation_direction": "Left"},
     "truncation_direction"),
    ({"model": MINILM, "query": QUERY, "documents": []}, "documents"),
    ({"model": MINILM, "query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"model": MINILM, "query": "", "documents": DOCS}, "query"),
    ({"model": MINILM, "documents": DOCS}, "query"),
    ({"model": MINILM, "query": QUERY, "documents": ["x"] * 2049}, "documents"),
    ({"model": MINILM, "query": QUERY, "documents": [5]}, "documents[0]"),
    ({"model": MINILM, "query": QUERY, "documents": [{"txt": "a"}]}, "documents[0]"),
    ({"model": MINILM, "query": QUERY, "documents": DOCS, "max_tokens_per_doc": 10},
     "max_tokens_per_doc"),
    ({"model": MINILM, "query": QUERY, "documents": DOCS, "rank_fields": ["text"]},
     "rank_fields"),
    ({"model": MINILM, "query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 9},
     "truncate_prompt_tokens"),
    ({"model": MINILM, "query": QUERY, "documents": DOCS, "bogus": 1}, "bogus"),
    ({"model": CHAT, "query": QUERY, "documents": DOCS}, "model"),
]


@pytest.mark.parametrize(("body", "param"), HOSTILE)
def test_hostile_bodies_get_a_400_naming_the_field(node, body, param):
    r = post(node, "/v1/rerank", body)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"] or "").startswith(param), r.text


def test_unknown_model_is_a_404_and_the_node_lives(node):
    r = post(node, "/v1/rerank", {"model": "nope", "query": QUERY, "documents": DOCS})
    assert r.status_code == 404
    r = httpx.post(node.url + "/v1/rerank", content=b"[1,2", timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert post(node, "/rerank", {"model": MINILM, "query": QUERY,
                                  "documents": DOCS}).status_code == 200


def test_a_cross_encoder_reranks_beside_the_embedding_model(node):
    r = post(node, "/v1/rerank", {"model": CROSS, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    scores = [x["relevance_score"] for x in r.json()["results"]]
    assert len(scores) == len(DOCS) and scores == sorted(scores, reverse=True)
    assert all(0.0 <= x <= 1.0 for x in scores)  # a probability (sigmoid of its logit)
    again = post(node, "/v1/rerank", {"model": CROSS, "query": QUERY, "documents": DOCS})
    assert again.json()["results"] == r.json()["results"]
    emb = post(node, "/v1/embeddings", {"model": CROSS, "input": "x"})
    assert emb.status_code == 400 and emb.json()["error"]["param"] == "model"
    assert MINILM in emb.json()["error"]["message"]  # names a model that embeds
    post(node, "/v1/rerank", {"model": MINILM, "query": QUERY, "documents": DOCS})
    beside = {b.model for b in node.client.status().beside or []}
    assert {CROSS, MINILM} <= beside
