"""Embeddings over HTTP from the bundled all-MiniLM-L6-v2, served beside a chat model on a
real node: the openai SDK (float and base64, which it decodes), the ollama SDK (embed and
the older embeddings), token ids, dimensions, the chat model still serving in between, the
status showing both, concurrent requests, and hostile bodies answered with a 400 while the
node lives."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import httpx
import numpy as np
import ollama
import openai
import pytest
from embed_node import CHAT, MINILM, beside_log, embed_node, needs_minilm

from engine.hub.bundled_embedding import EMBEDDING_FOLDER
from engine.records import RunnerReady

pytestmark = needs_minilm
JSON = {"Content-Type": "application/json"}
TEXTS = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell today."]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from embed_node(tmp_path_factory.mktemp("embed"))


def oa(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def vectors(r) -> np.ndarray:
    return np.array([d.embedding for d in sorted(r.data, key=lambda d: d.index)])


def test_openai_sdk_float_and_base64_agree(node):
    c = oa(node)
    try:
        floats = c.embeddings.create(model=MINILM, input=TEXTS, encoding_format="float")
    except openai.APIError:
        print(beside_log(node))
        raise
    b64 = c.embeddings.create(model=MINILM, input=TEXTS)  # the SDK asks base64, decodes it
    a, b = vectors(floats), vectors(b64)
    assert a.shape == (3, 384) and floats.model == MINILM and floats.object == "list"
    assert np.allclose(a, b, atol=1e-6)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 10
    sims = a @ a.T  # the two cat sentences are closer than either to the markets one
    assert sims[0, 1] > sims[0, 2] + 0.2 and sims[0, 1] > sims[1, 2] + 0.2
    one = c.embeddings.create(model=MINILM, input=TEXTS[0], encoding_format="float")
    assert np.allclose(vectors(one)[0], a[0], atol=1e-5)  # batched equals alone


def test_token_ids_and_dimensions(node):
    c = oa(node)
    ids = c.embeddings.create(model=MINILM, input=[[101, 4937, 102], [101, 3899, 102]],
                              encoding_format="float")
    assert vectors(ids).shape == (2, 384) and ids.usage.prompt_tokens == 6
    cut = vectors(c.embeddings.create(model=MINILM, input=TEXTS, dimensions=64,
                                      encoding_format="float"))
    assert cut.shape == (3, 64) and np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-4)
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model=MINILM, input="x", dimensions=385)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as e:  # past the vocabulary (30,522)
        c.embeddings.create(model=MINILM, input=[[101, 4_000_000, 102]])
    assert "input" in (e.value.body["param"] or "")


def test_base64_is_little_endian_float32(node):
    import base64
    r = httpx.post(node.url + "/v1/embeddings", timeout=120, json={
        "model": MINILM, "input": TEXTS[:1], "encoding_format": "base64"}).json()
    f = httpx.post(node.url + "/v1/embeddings", timeout=120, json={
        "model": MINILM, "input": TEXTS[:1]}).json()
    got = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(got, f["data"][0]["embedding"], atol=1e-7)
    assert set(f) == {"object", "data", "model", "usage"}


def test_ollama_sdk_embed_and_embeddings(node):
    c = ollama.Client(host=node.url, timeout=120)
    r = c.embed(model=MINILM, input=TEXTS)
    ref = vectors(oa(node).embeddings.create(model=MINILM, input=TEXTS,
                                             encoding_format="float"))
    assert np.allclose(np.array(r.embeddings), ref, atol=1e-5)
    assert r.model == MINILM and r.prompt_eval_count > 10 and r.total_duration > 0
    one = c.embed(model=MINILM, input=TEXTS[0], dimensions=32)
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == 32
    old = np.array(c.embeddings(model=MINILM, prompt=TEXTS[0]).embedding)
    assert old.shape == (384,) and np.allclose(old / np.linalg.norm(old), ref[0], atol=1e-5)
    with pytest.raises(ollama.ResponseError) as e:
        c.embed(model=MINILM, input="x", options={"num_ctx": 8})
    assert e.value.status_code == 400 and "num_ctx" in e.value.error


def test_chat_keeps_serving_beside_and_status_shows_both(node):
    c = oa(node)
    c.embeddings.create(model=MINILM, input="first")
    chat = c.chat.completions.create(model=CHAT, max_tokens=4,
                                     messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message is not None
    c.embeddings.create(model=MINILM, input="second")
    s = node.client.status()
    assert isinstance(s.runner, RunnerReady) and s.runner.model == CHAT
    assert "generate" in (s.runner.capabilities or [])
    beside = {r.model: r for r in s.beside or []}
    assert isinstance(beside.get(MINILM), RunnerReady), s
    assert "embed" in (beside[MINILM].capabilities or [])
    assert beside[MINILM].pid != s.runner.pid
    # Ollama's /api/show says what each does, as clients check before offering it
    show = httpx.post(node.url + "/api/show", json={"model": EMBEDDING_FOLDER}, timeout=30)
    assert show.json()["capabilities"] == ["embedding"]
    show = httpx.post(node.url + "/api/show", json={"model": CHAT}, timeout=30)
    assert "completion" in show.json()["capabilities"]
    assert "embedding" not in show.json()["capabilities"]
    # Ollama's /api/ps lists both as loaded (the SDK's own types read it)
    names = [m.model for m in ollama.Client(node.url).ps().models]
    assert names[0] == CHAT and EMBEDDING_FOLDER in names


def test_concurrent_requests_are_all_answered(node):
    c = oa(node)
    texts = [f"sentence number {i} about cats" for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda t: vectors(c.embeddings.create(
            model=MINILM, input=t, encoding_format="float"))[0], texts))
    together = vectors(c.embeddings.create(model=MINILM, input=texts,
                                           encoding_format="float"))
    assert np.allclose(np.array(got), together, atol=1e-5)


def test_chat_model_or_unknown_model_is_refused(node):
    c = oa(node)
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model=CHAT, input="x")
    assert e.value.body["param"] == "model" and MINILM in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="no-such-model", input="x")


HOSTILE = [
    ({"model": MINILM, "input": ["x"] * 2049}, "input"),
    ({"model": MINILM, "input": []}, "input"),
    ({"model": MINILM, "input": ""}, "input[0]"),
    ({"model": MINILM, "input": 5}, "input"),
    ({"model": MINILM, "input": ["a", [1, 2]]}, "input"),
    ({"model": MINILM, "input": [[1, -2]]}, "input[0]"),
    ({"model": MINILM, "input": [True]}, "input[0]"),
    ({"model": MINILM, "input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"model": MINILM, "input": "x", "dimensions": 0}, "dimensions"),
    ({"model": MINILM, "input": "x", "dimensions": "12"}, "dimensions"),
    ({"model": MINILM, "input": "x", "truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
    ({"model": MINILM, "input": "x", "add_special_tokens": False}, "add_special_tokens"),
    ({"model": MINILM, "input": "x", "no_such_field": 1}, "no_such_field"),
    ({"model": MINILM}, "input"),
    ({"input": "x"}, "model"),
    ({"model": "../../etc/passwd", "input": "x"}, "model"),
]


@pytest.mark.parametrize(("body", "param"), HOSTILE)
def test_hostile_bodies_get_a_400_naming_the_field(node, body, param):
    r = httpx.post(node.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_hostile_ollama_bodies_and_the_node_lives(node):
    for body in ({"model": MINILM, "input": [1, 2]}, {"model": MINILM, "input": {"a": 1}},
                 {"model": MINILM, "input": "x", "keep_alive": "soon"},
                 {"model": MINILM, "input": "x", "truncate": "yes"}):
        r = httpx.post(node.url + "/api/embed", json=body, timeout=60)
        assert r.status_code == 400 and "error" in r.json(), r.text
    r = httpx.post(node.url + "/v1/embeddings", timeout=60, headers=JSON,
                   content=b'{"model": "' + MINILM.encode() + b'", "input": [NaN]}')
    assert r.status_code == 400
    r = httpx.post(node.url + "/v1/embeddings", timeout=60,  # over the body limit: 413
                   json={"model": MINILM, "input": ["y" * 1000] * 5000})
    assert r.status_code in (400, 413)
    assert oa(node).embeddings.create(model=MINILM, input="still here").data


def test_keep_alive_zero_unloads_the_beside_model(node):
    c = ollama.Client(host=node.url, timeout=120)
    c.embed(model=MINILM, input="load me")
    assert any(r.model == MINILM for r in node.client.status().beside or [])
    r = httpx.post(node.url + "/api/embed", json={"model": MINILM, "input": [],
                                                   "keep_alive": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["embeddings"] == []
    assert not any(r.model == MINILM for r in node.client.status().beside or [])
    assert c.embed(model=MINILM, input="back again", keep_alive="5m").embeddings  # loaded
    assert isinstance(node.client.status().runner, RunnerReady)  # the chat model stayed


# --- units ------------------------------------------------------------------------------
def test_inputs_are_bounded_in_characters():
    from engine.api.embedding_schemas import MAX_CHARS, inputs
    from engine.errors import BadRequest
    with pytest.raises(BadRequest) as e:
        inputs(["x" * (MAX_CHARS // 2 + 1)] * 2)
    assert e.value.param == "input"
    assert inputs([1, 2, 3]) == [[1, 2, 3]] and inputs("a") == ["a"]


def test_a_beside_model_that_does_not_fit_is_refused_with_a_503(tmp_path):
    from engine.errors import ShoalError
    from engine.node.beside import Beside, Found
    fake = SimpleNamespace(memory_limit=10**9, worker=None)
    beside = Beside(fake, lambda: None)
    with pytest.raises(ShoalError) as e:
        beside._check_room(Found("big-embedder", tmp_path, ["embed"], 2 * 10**9))
    assert e.value.status == 503 and "big-embedder" in e.value.message
    beside._check_room(Found("small", tmp_path, ["embed"], 10**6))  # fits: no error


def test_a_client_that_leaves_cancels_its_request(node):
    import time
    oa(node).embeddings.create(model=MINILM, input="warm")
    many = [f"text {i} " + "about rivers and mountains " * 20 for i in range(2048)]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(node.url + "/v1/embeddings", json={"model": MINILM, "input": many},
                   timeout=1.0)
    deadline = time.monotonic() + 60  # the worker stops between batches, the turn ends
    while time.monotonic() < deadline:
        beside = {r.model: r for r in node.client.status().beside or []}
        state = beside.get(MINILM)
        if state is None or isinstance(state, RunnerReady) and not state.generating:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the beside model stayed busy after its client left")
    t = time.monotonic()
    assert oa(node).embeddings.create(model=MINILM, input="after").data
    assert time.monotonic() - t < 30


def test_a_beside_worker_that_dies_is_started_again(node):
    import os
    import signal
    import time
    oa(node).embeddings.create(model=MINILM, input="alive")
    pid = {r.model: r for r in node.client.status().beside or []}[MINILM].pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the status says it failed, the chat model stays
        s = node.client.status()
        if not isinstance({r.model: r for r in s.beside or []}.get(MINILM), RunnerReady):
            break
        time.sleep(0.1)
    assert isinstance(s.runner, RunnerReady) and s.runner.model == CHAT
    assert oa(node).embeddings.create(model=MINILM, input="again").data
    after = {r.model: r for r in node.client.status().beside or []}[MINILM]
    assert isinstance(after, RunnerReady) and after.pid != pid


def test_a_long_input_is_cut_unless_truncate_is_false(node):
    long = "rivers and mountains " * 400  # about 1,200 tokens, past MiniLM's 512
    assert oa(node).embeddings.create(model=MINILM, input=long).usage.prompt_tokens <= 512
    r = httpx.post(node.url + "/api/embed", timeout=60,
                   json={"model": MINILM, "input": long, "truncate": False})
    assert r.status_code == 400 and "error" in r.json(), r.text
    ok = httpx.post(node.url + "/api/embed", timeout=60, json={"model": MINILM, "input": long})
    assert ok.status_code == 200 and len(ok.json()["embeddings"][0]) == 384


def test_the_bundled_models_names_share_one_worker(node):
    ref = vectors(oa(node).embeddings.create(model=MINILM, input="x", encoding_format="float"))
    for name in ("all-minilm", "all-minilm:latest", "all-MiniLM-L6-v2"):
        r = oa(node).embeddings.create(model=name, input="x", encoding_format="float")
        assert r.model == name and np.allclose(vectors(r), ref, atol=1e-6)
    assert np.allclose(ollama.Client(host=node.url).embed(model="all-minilm",
                                                          input="x").embeddings, ref)
    assert [r.model for r in node.client.status().beside or []] == [MINILM]


def test_vectors_are_the_engines_own_in_process(node):
    import threading

    from engine.protocol import Embed
    from engine.runtime.embedding import load_engine
    http = vectors(oa(node).embeddings.create(model=MINILM, input=TEXTS,
                                              encoding_format="float"))
    folder = node.home / "models" / EMBEDDING_FOLDER  # where the node unpacked it
    out: list = []
    engine = load_engine(str(folder), SimpleNamespace(model_id=MINILM), out.append)
    engine.embed(Embed("ref", list(TEXTS)), threading.Event(), out.append)
    assert np.allclose(http, np.array(out[-1].vectors), atol=1e-5)
