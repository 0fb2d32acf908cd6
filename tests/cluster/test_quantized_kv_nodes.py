"""Quantized KV through real nodes: a launch chooses its KV's bits (one node and a
pipeline over two, which answer alike), the node's --kv-bits is the default, the planner
takes it, and bad values or a model whose heads can't be quantized are refused with the
reason before anything serves."""

from __future__ import annotations

import shutil

import httpx
import pytest

from nodes import NodeProcess, start_cluster
from tiny import make_tiny_model

HELLO = [{"role": "user", "content": "Hello from the cluster"}]
SELF = {"node": "self", "layers": [0, 4]}  # the whole model on the node asked


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("qkv-nodes")
    wide = make_tiny_model(root / "src" / "tiny-wide", hidden_size=256)  # 64-wide heads
    nodes = start_cluster(root, wide, 2)
    shutil.copytree(tiny_model_dir, nodes[0].home / "models" / "tiny-llama")  # 16-wide
    yield nodes
    for n in nodes:
        n.stop()


def launch(via: NodeProcess, body: dict) -> httpx.Response:
    return httpx.post(via.url + "/shoal/instances", json=body, timeout=300)


def greedy(n: NodeProcess) -> list[tuple[bytes, float]]:
    """The greedy answer's tokens (as bytes: a random model's text is no UTF-8) with their
    logprobs."""
    r = httpx.post(n.url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny-wide", "messages": HELLO, "max_tokens": 24, "temperature": 0,
        "logprobs": True})
    assert r.status_code == 200, r.text
    return [(bytes(t["bytes"]), t["logprob"])
            for t in r.json()["choices"][0]["logprobs"]["content"]]


def same(a: list[tuple[bytes, float]], b: list[tuple[bytes, float]]) -> bool:
    return [t for t, _ in a] == [t for t, _ in b] and \
        all(abs(x - y) < 1e-3 for (_, x), (_, y) in zip(a, b))


def test_a_launch_chooses_its_kv_bits_and_a_pipeline_answers_as_one_node(pair):
    a, b = pair
    r = launch(a, {"model": "tiny-wide", "nodes": [SELF], "kv_bits": 8})
    assert r.status_code == 201, r.text
    assert r.json()["kv_bits"] == 8
    one = greedy(a)
    r = launch(a, {"model": "tiny-wide", "nodes": [SELF]})
    assert r.status_code == 201 and r.json()["kv_bits"] == 16  # the node's default
    assert not same(greedy(a), one)  # 8-bit KV changes what this random model says
    b_id = b.client.status().cluster.id
    r = launch(a, {"model": "tiny-wide", "strategy": "pipeline", "kv_bits": 8,
                   "nodes": [{"node": "self", "layers": [0, 2]},
                             {"node": b_id, "layers": [2, 4]}]})
    assert r.status_code == 201, r.text
    assert r.json()["kv_bits"] == 8
    assert same(greedy(a), one)  # every rank kept its KV at 8 bits
    httpx.delete(a.url + f"/shoal/instances/{r.json()['id']}", timeout=60)


@pytest.mark.parametrize("bits", [3, "8", True, 32])
def test_bad_kv_bits_are_a_400_naming_the_field(pair, bits):
    a, _ = pair
    for path in ("/shoal/instances", "/shoal/plan"):
        r = httpx.post(a.url + path, json={"model": "tiny-wide", "kv_bits": bits},
                       timeout=60)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == "kv_bits"


def test_the_planner_counts_quantized_kv(pair):
    a, _ = pair
    plans = {bits: httpx.post(a.url + "/shoal/plan", json={
        "model": "tiny-wide", "kv_bits": bits}, timeout=60).json()["placements"][0]
        for bits in (16, 8, 4)}
    kv = {bits: p["ranks"][0]["memory"]["kv_cache"] for bits, p in plans.items()}
    assert kv[8] == pytest.approx(kv[16] * 1.0625 / 2, rel=0.01)
    assert kv[4] == pytest.approx(kv[16] * 0.5625 / 2, rel=0.01)


def test_a_model_whose_heads_cant_be_quantized_is_refused_with_the_reason(pair):
    a, _ = pair
    r = launch(a, {"model": "tiny-llama", "nodes": [SELF], "kv_bits": 4})
    assert r.status_code >= 400, r.text
    message = r.json()["error"]["message"]
    assert "heads are [16] wide" in message and "kv_bits" in message
    # the planner refuses it too, naming the field, so no view offers what can't launch
    r = httpx.post(a.url + "/shoal/plan", json={"model": "tiny-llama", "kv_bits": 8},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_bits", r.text
    assert "heads are [16] wide" in r.json()["error"]["message"]
    plain = httpx.post(a.url + "/shoal/plan", json={"model": "tiny-wide"}, timeout=60)
    assert plain.json()["kv_bits"] == 16  # the bits the figures assume
