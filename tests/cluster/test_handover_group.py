"""Prefill on one node, decode on a group, and the other way round: four real nodes on
loopback. The first two serve a model as a pipeline or tensor group, the third prefills
for it: a prompt longer than a prefill chunk is prefilled there and every rank of the
group takes its share of the KV (a pipeline rank its layers, a tensor rank its heads),
and the answer is token for token the one the group gives alone, its prompt reported
cached. A pipeline group prefills for a node decoding alone, and for a group (the last
two nodes). A prefill node inside the group, or a group's member rather than its owner,
is refused by name; the hand-over routes serve their own group's members only; a prefill
node killed mid-hand-over fails that request alone."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from families import make_family_model
from members import Member
from nodes import start_cluster
from tiny import make_tiny_model

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="nodes on loopback")]
CASES = [("wide", "pipeline"), ("wide", "tensor"), ("gemma3_text", "pipeline")]


@pytest.fixture(scope="module")
def quartet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("handover-group")
    models = root / "models"
    # 4 heads over 2 KV heads: a tensor group of two splits them
    make_tiny_model(models / "wide", hidden_size=256, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=16384)
    make_family_model(models / "gemma3_text", "gemma3_text", seed=3)
    nodes = start_cluster(root / "nodes", models / "wide", 4)
    for n in nodes:
        shutil.copytree(models, n.home / "models", dirs_exist_ok=True)
    yield nodes
    for n in nodes:
        n.stop()


def node_id(n) -> str:
    return n.client.status().cluster.id


def launch(node, model: str, strategy: str, member, **extra) -> httpx.Response:
    nodes = [{"node": "self"}, {"node": node_id(member)}]
    if strategy == "pipeline":  # the layers halved
        n = json.loads((node.home / "models" / model / "config.json").read_text())
        half = n["num_hidden_layers"] // 2
        nodes[0]["layers"] = [0, half]
        nodes[1]["layers"] = [half, n["num_hidden_layers"]]
    return httpx.post(node.url + "/shoal/instances", timeout=300, json={
        "model": model, "strategy": strategy, "nodes": nodes, **extra})


def complete(node, model: str, prompt: str) -> dict:
    r = httpx.post(node.url + "/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model,strategy", CASES)
def test_a_group_decodes_a_prefill_nodes_kv_as_it_answers_alone(quartet, model: str,
                                                                 strategy: str) -> None:
    owner, member, prefill, _ = quartet
    text = " ".join(f"{model} line {i} of the log, tide {i % 7}." for i in range(40))
    r = launch(owner, model, strategy, member)
    assert r.status_code == 201, r.text
    alone = complete(owner, model, text)
    assert alone["usage"]["prompt_tokens"] > 600  # more than one 512-token chunk
    r = httpx.post(prefill.url + "/shoal/instances", timeout=300,
                   json={"model": model, "nodes": [{"node": "self"}]})
    assert r.status_code == 201, r.text
    # fresh workers on both ranks: empty prefix caches
    r = launch(owner, model, strategy, member, prefill=node_id(prefill), prefill_min=100)
    assert r.status_code == 201, r.text
    handed = Path(owner.log).read_text().count("for the group")
    split = complete(owner, model, text)
    assert split["choices"][0]["text"] == alone["choices"][0]["text"]
    usage = split["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert Path(owner.log).read_text().count("for the group") == handed + 1
    # each node's copy of the frames is gone once taken in
    for n in (owner, member):
        assert not list((n.home / "tmp" / "handover").glob("g*.frames"))


def test_a_prefill_node_inside_the_group_is_refused_by_name(quartet) -> None:
    owner, member, _, _ = quartet
    r = launch(owner, "wide", "pipeline", member, prefill=node_id(member))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prefill"
    assert "group" in r.json()["error"]["message"]


def test_hand_over_routes_serve_the_groups_own_members_only(quartet) -> None:
    """Members holding the secret, but outside the group or naming what isn't a
    hand-over, get a 400 saying so; nothing is written outside the hand-over folder."""
    owner, member, prefill, _ = quartet
    r = launch(owner, "wide", "pipeline", member)
    assert r.status_code == 201, r.text
    with Member(owner.cluster_url, "test-cluster-secret") as stranger:
        r = stranger.call("POST", "/shoal/peer/handover/frames", {"job": 5})
        assert r.status_code == 400 and "group" in r.text
    with Member(owner.cluster_url, "test-cluster-secret", node_id(member)) as inside:
        for job in (5, "../../etc/passwd", -1, 1 << 40, True):
            r = inside.call("POST", "/shoal/peer/handover/frames", {"job": job})
            assert r.status_code == 400, (job, r.text)
    with Member(member.cluster_url, "test-cluster-secret") as stranger:
        for body, words in (({"job": "../x", "model": "wide", "tokens": 3}, "numbered"),
                            ({"job": 7, "model": "other", "tokens": 3}, "rank"),
                            ({"job": 7, "model": "wide", "tokens": "3"}, "tokens"),
                            ({"job": 7, "model": "wide", "tokens": 3}, "owns")):
            r = stranger.call("POST", "/shoal/peer/handover/pull", body)
            assert r.status_code == 400 and words in r.text, (body, r.text)
    with Member(prefill.cluster_url, "test-cluster-secret") as m:
        r = m.call("POST", "/shoal/peer/handover/pull",
                   {"job": 7, "model": "wide", "tokens": 3})
        assert r.status_code == 400 and "rank" in r.text
    for n in quartet[:3]:
        assert not list(n.home.rglob("x")) and not list(n.home.rglob("g7.frames"))


@pytest.mark.parametrize("model", ["wide", "gemma3_text"])
def test_a_pipeline_group_prefills_for_a_node_that_decodes_alone(quartet, model: str) -> None:
    """The other way round: the first node serves the model alone, the other two as a
    pipeline group that prefills for it, each rank writing its layers' frames and the
    group's owner passing them on together. Naming the group's second node is refused:
    its owner is the one to name."""
    decode, g0, g1, _ = quartet
    text = " ".join(f"{model} entry {i}: the bell rang {i % 5} times." for i in range(36))
    r = httpx.post(decode.url + "/shoal/instances", timeout=300,
                   json={"model": model, "nodes": [{"node": "self"}]})
    assert r.status_code == 201, r.text
    alone = complete(decode, model, text)
    assert alone["usage"]["prompt_tokens"] > 600
    g1.client._call("POST", "/shoal/unload")  # (a node serving it alone could prefill)
    r = launch(g0, model, "pipeline", g1)
    assert r.status_code == 201, r.text
    r = httpx.post(decode.url + "/shoal/instances", timeout=300, json={
        "model": model, "nodes": [{"node": "self"}], "prefill": node_id(g1)})
    assert r.status_code == 400 and "owns it" in r.text, r.text
    r = httpx.post(decode.url + "/shoal/instances", timeout=300, json={
        "model": model, "nodes": [{"node": "self"}], "prefill": node_id(g0),
        "prefill_min": 100})
    assert r.status_code == 201, r.text
    handed = Path(decode.log).read_text().count("prefilled by")
    split = complete(decode, model, text)
    assert split["choices"][0]["text"] == alone["choices"][0]["text"]
    usage = split["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert Path(decode.log).read_text().count("prefilled by") == handed + 1
    for n in (g0, g1):
        assert not list((n.home / "tmp" / "handover").glob("p*.frames"))
    # the group still answers its own requests
    assert complete(g0, model, "Say hi.")["usage"]["completion_tokens"] == 12


def test_a_group_prefills_for_a_group(quartet) -> None:
    """Both sides groups: two nodes decode as a pipeline, the other two prefill as one;
    the answer is the decode group's own, its prompt cached."""
    d0, d1, p0, p1 = quartet
    text = " ".join(f"quay {i}: the crane lifted {i % 6} crates." for i in range(36))
    assert launch(d0, "wide", "pipeline", d1).status_code == 201
    alone = complete(d0, "wide", text)
    assert launch(p0, "wide", "pipeline", p1).status_code == 201
    r = launch(d0, "wide", "pipeline", d1, prefill=node_id(p0), prefill_min=100)
    assert r.status_code == 201, r.text
    split = complete(d0, "wide", text)
    assert split["choices"][0]["text"] == alone["choices"][0]["text"]
    usage = split["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_a_prefill_node_killed_mid_hand_over_fails_that_request_alone(quartet) -> None:
    """(Last: it kills the prefill node.) The group answers a short prompt meanwhile and
    after; no copy of the frames is left on either node of the group."""
    owner, member, prefill, _ = quartet
    r = httpx.post(prefill.url + "/shoal/instances", timeout=300,
                   json={"model": "wide", "nodes": [{"node": "self"}]})
    assert r.status_code == 201, r.text
    r = launch(owner, "wide", "pipeline", member, prefill=node_id(prefill), prefill_min=100)
    assert r.status_code == 201, r.text
    # a prompt past the context is the request's own 400, not the prefill node's refusal
    over = httpx.post(owner.url + "/v1/completions", timeout=120, json={
        "model": "wide", "prompt": "x" * 17000, "max_tokens": 4})
    assert over.status_code == 400 and "context" in over.text, over.text
    got: dict[str, httpx.Response] = {}
    text = " ".join(f"buoy {i} rang at {i % 9}." for i in range(700))  # ~14K tokens

    def ask() -> None:
        got["long"] = httpx.post(owner.url + "/v1/completions", timeout=120, json={
            "model": "wide", "prompt": text, "max_tokens": 4, "temperature": 0})
    t = threading.Thread(target=ask)
    t.start()
    time.sleep(3.0)  # the prefill node is at the prompt (it takes it many seconds)
    assert t.is_alive()
    prefill.proc.send_signal(signal.SIGKILL)
    prefill.proc.wait(10)
    short = complete(owner, "wide", "Say hi.")
    t.join(60)
    assert not t.is_alive()
    assert got["long"].status_code >= 500, got["long"].text
    assert "prefill node" in got["long"].json()["error"]["message"]
    assert complete(owner, "wide", "Say hi again.")["choices"][0]["text"] is not None
    assert short["usage"]["completion_tokens"] == 12

    def no_copies() -> bool:
        return not any(list((n.home / "tmp" / "handover").glob("g*.frames"))
                       for n in (owner, member))
    deadline = time.monotonic() + 10
    while not no_copies() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert no_copies()
