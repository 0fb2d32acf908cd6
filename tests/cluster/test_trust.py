"""Trust between nodes, tried as an attacker would: a real stranger process without the
secret (tests/hostile_peer.py) that answers polls, claims to serve models, and replays
what it captured; members' requests replayed at other nodes; nodes with another secret.
Each gets nothing: no trust, no relayed prompt, no owner role, no replayed effect."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from engine.cluster.auth import HELLO, NotInCluster, Verifier, sign
from hostile_peer import STOLEN, HostilePeer
from members import Member
from nodes import NodeProcess, home_with, start_cluster
from tests_support import wait_until

PROMPT = "my bank password is hunter2"


def _peers(node: NodeProcess) -> dict[str, dict]:
    return {p["url"]: p for p in node.client._call("GET", "/shoal/peers")}


def _stranger_seen(node: NodeProcess, stranger: HostilePeer) -> dict:
    """The stranger as `node` lists it, once the node has tried it."""
    def seen() -> dict | None:
        p = next((p for u, p in _peers(node).items() if u.endswith(stranger.address)), None)
        return p if p is not None and p["error"] else None
    wait_until(seen, 15)
    return seen() or {}


@pytest.mark.parametrize("tls_node,tls_stranger", [(True, False), (True, True),
                                                   (False, False)],
                         ids=["plain-stranger", "tls-stranger", "no-tls-anywhere"])
def test_a_stranger_is_never_trusted_and_never_gets_a_prompt(tmp_path, tiny_model_dir,
                                                            tls_node, tls_stranger):
    """Before: the stranger's parsed answer made it trusted; after an unload its made-up
    instance made it the model's owner and it read the prompt. Now it is "not in this
    cluster", and the chat is answered here. Without TLS at all (as when measuring what
    TLS costs) the answers' signatures alone keep it out."""
    env = {} if tls_node else {"SHOAL_CLUSTER_TLS": "off"}
    stranger = HostilePeer(tmp_path, tls=tls_stranger, claims=("tiny-llama",))
    a = NodeProcess(home_with(tmp_path / "a", tiny_model_dir), "tiny-llama",
                    "--secret", "the-secret", env=env)
    try:
        a.wait_healthy().wait_ready()
        r = httpx.post(a.url + "/shoal/peers", json={"address": stranger.address},
                       timeout=10)
        assert r.status_code == 201
        seen = _stranger_seen(a, stranger)
        assert seen["trusted"] is False and "not in this cluster" in seen["error"]
        assert seen["id"] is None  # what it claims about itself is not believed
        a.client._call("POST", "/shoal/unload")  # the moment the old code relayed
        time.sleep(3)  # a few polls: the stranger keeps answering
        answer = httpx.post(a.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny-llama", "max_tokens": 3,
            "messages": [{"role": "user", "content": PROMPT}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] != STOLEN
        got = stranger.received()
        assert not any("hunter2" in g["body"] for g in got)
        assert not any(g["path"].startswith(("/v1/", "/shoal/peer/files")) for g in got)
        # nor is it anyone's owner, nor a node the planner may use
        topo = a.client._call("GET", "/shoal/topology")
        assert all("stranger" not in json.dumps(n) for n in topo["nodes"][1:]
                   if n.get("trusted", True))
        assert "stranger-node" not in json.dumps(a.client._call("GET", "/shoal/instances"))
        if tls_node:  # TLS: the stranger never even saw a request
            assert got == []
        else:  # in clear it saw the hello, and can't spend it: it is signed for no route
            assert got and all(g["path"] == HELLO for g in got)
    finally:
        a.stop()
        stranger.stop()


def test_a_captured_request_cant_be_spent_again_here_or_at_another_node(tmp_path,
                                                                       tiny_model_dir):
    """Before: the signature didn't name the receiver, so a request captured on its way
    to one node was good at every other. Now it is good once, at its own node."""
    b, c = start_cluster(tmp_path, tiny_model_dir, 2, secret="the-secret")
    try:
        with Member(b.cluster_url, "the-secret", "node-a") as to_b, \
                Member(c.cluster_url, "the-secret", "node-a") as to_c:
            path, body = "/shoal/peer/stop", {"instance": "abc123", "reason": "x"}
            raw = json.dumps(body).encode()
            captured = to_b.signed("POST", path, raw)
            assert to_b.send("POST", path, body, captured).status_code == 200
            again = to_b.send("POST", path, body, captured)
            assert again.status_code == 401 and "replay" in again.text
            elsewhere = to_c.send("POST", path, body, captured)
            assert elsewhere.status_code == 401 and "another node" in elsewhere.text
            # the first contact, captured, gets a third node to say its id and no more
            hello = sign("the-secret", "node-a", "GET", HELLO)
            assert to_c.send("GET", HELLO, headers=hello).json() == \
                {"id": to_c.node_id()}
            node = {**hello, "X-Shoal-Nonce": "f" * 24}
            assert to_c.send("GET", "/shoal/node", headers=node).status_code == 401
            # another secret, a stale clock, a changed body: refused
            wrong = sign("another-secret", "node-a", "POST", path, raw, to=to_b.node_id())
            assert "another cluster secret" in to_b.send("POST", path, body, wrong).text
            stale = to_b.signed("POST", path, raw, now=1_000_000.0)
            assert "clock" in to_b.send("POST", path, body, stale).text
            tampered = to_b.signed("POST", path, b"{}")
            assert to_b.send("POST", path, body, tampered).status_code == 401
    finally:
        for n in (b, c):
            n.stop()


def test_an_answer_is_signed_for_the_request_it_answers(tmp_path, tiny_model_dir):
    (a,) = start_cluster(tmp_path, tiny_model_dir, 1, secret="the-secret")
    try:
        with Member(a.cluster_url, "the-secret") as m:
            r = m.call("GET", "/shoal/node")  # checks the signature and the body hash
            assert r.json()["id"] == m.node_id()
            # the same answer can't stand for another request: the nonce is in it
            other = m.signed("GET", "/shoal/node")
            with pytest.raises(NotInCluster):
                from engine.cluster.auth import check_answer
                check_answer("the-secret", m.me, other, r.status_code, r.headers)
            # an unsigned request gets an unsigned refusal: nothing to learn or reuse
            refused = m.send("GET", "/shoal/node", headers={})
            assert refused.status_code == 401
            assert "X-Shoal-Answer-Signature" not in refused.headers
            # a peer's own body for another version: a 400 naming the field, signed
            old = m.call("POST", "/shoal/peer/prepare", {"instance": "x"})
            assert old.status_code == 400 and "'model'" in old.json()["error"]["message"]
            # an instance id from a member is never a path
            bad = m.call("POST", "/shoal/peer/prepare", {"instance": "/tmp/evil",
                                                         "model": "tiny-llama"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "instance"
            ports = m.call("POST", "/shoal/peer/prepare", {"instance": "abc123",
                                                           "model": "tiny-llama"})
            assert ports.status_code == 200 and len(ports.json()["ports"]) == 2
    finally:
        a.stop()


def test_the_cluster_port_serves_members_only_and_the_user_port_no_peer_route(
        tmp_path, tiny_model_dir):
    (a,) = start_cluster(tmp_path, tiny_model_dir, 1, secret="the-secret")
    try:
        # the user API never serves the peer routes, signed or not
        for route in ("/shoal/node", "/shoal/peer/instances/x", HELLO):
            r = httpx.get(a.url + route, timeout=10)
            assert r.status_code == 401 and r.json()["error"]["code"] == "not_in_cluster"
        signed = sign("the-secret", "n", "GET", HELLO)
        assert httpx.get(a.url + HELLO, headers=signed, timeout=10).status_code == 401
        # the cluster port: in clear, nothing; over TLS without the cluster's
        # certificate, no answer at all
        with pytest.raises(httpx.HTTPError):
            httpx.get(a.cluster_url.replace("https", "http") + "/health", timeout=5)
        with pytest.raises(httpx.HTTPError):
            httpx.get(a.cluster_url + "/health", verify=False, timeout=5)
        # a member's client without a signature: refused, even /health and the user API
        with Member(a.cluster_url, "the-secret") as m:
            for route in ("/health", "/v1/models", "/shoal/status"):
                assert m.send("GET", route, headers={}).status_code == 401
            assert m.call("GET", "/v1/models").status_code == 200
    finally:
        a.stop()


def test_nodes_with_another_secret_are_not_in_the_cluster(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path / "one", tiny_model_dir, 2, secret="secret-one")
    (other,) = start_cluster(tmp_path / "two", tiny_model_dir, 1, secret="secret-two")
    try:
        httpx.post(a.url + "/shoal/peers", json={"address": f"127.0.0.1:{other.cluster_port}"},
                   timeout=10).raise_for_status()
        wait_until(lambda: _peers(a)[other.cluster_url]["error"] is not None, 10)
        peers = _peers(a)
        assert peers[b.cluster_url]["trusted"] is True
        assert peers[other.cluster_url]["trusted"] is False
        assert "not in this cluster" in peers[other.cluster_url]["error"]
        assert "another cluster secret" in peers[other.cluster_url]["error"]
        # It can't be placed, and it can't drive a's workers.
        sid = f"127.0.0.1:{other.cluster_port}"  # its id is private to its own cluster
        r = httpx.post(a.url + "/shoal/instances", timeout=30, json={
            "model": "tiny-llama", "strategy": "pipeline",
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": sid, "layers": [2, 4]}]})
        assert r.status_code == 400 and "not in this cluster" in r.json()["error"]["message"]
    finally:
        for n in (a, b, other):
            n.stop()


def test_verifier_of_a_node_follows_its_id():
    """A node whose id collided takes a new one: requests for the new id pass at once."""
    ids = ["old"]
    v = Verifier("s", lambda: ids[0])
    ids[0] = "new"
    assert v.verify("GET", "/x", sign("s", "a", "GET", "/x", to="new"), b"").node == "a"


def test_a_member_gone_bad_cant_write_outside_the_model_cache(tmp_path, tiny_model_dir):
    """A peer that holds the secret (so it is trusted, as members are) offers, with the Hub
    unreachable, a file plan whose paths, commit and etags walk out of the cache. Before,
    the pull linked them where the peer said (a sitecustomize.py outside the cache ran the
    attacker's code at the next Python start). Now the plan is refused whole, naming the
    peer, and nothing is written."""
    cache = tmp_path / "hf-cache"
    evil = HostilePeer(tmp_path, secret="the-secret")
    a = NodeProcess(home_with(tmp_path / "a", tiny_model_dir), "none", "--secret",
                    "the-secret", env={"HF_ENDPOINT": "http://127.0.0.1:9",
                                       "HF_HUB_CACHE": str(cache)})
    outside = [Path("/tmp/shoal-pwned"), Path("/tmp/shoal-pwned-abs"),
               Path("/tmp/shoal-etag")]
    for p in outside:
        p.unlink(missing_ok=True)
    try:
        a.wait_healthy()
        httpx.post(a.url + "/shoal/peers", json={"address": evil.address}, timeout=10)
        wait_until(lambda: any(p["trusted"] for p in _peers(a).values()), 15)
        d = a.client.hub_pull("evil/model")

        def ended() -> bool:
            nonlocal d
            d = next(x for x in a.client.hub_downloads() if x.id == d.id)
            return d.state != "running"
        wait_until(ended, 30)
        assert d.state == "failed" and d.error is not None
        assert evil.address in d.error.message and "Nothing was written" in d.error.message
        assert not any(p.exists() or p.is_symlink() for p in outside)
        written = [p for p in cache.rglob("*") if p.is_file() or p.is_symlink()] \
            if cache.exists() else []
        assert written == []
        assert not any(g["path"].startswith("/shoal/peer/files/") for g in evil.received())
    finally:
        a.stop()
        evil.stop()


def _ask(url: str, text: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=120, json={
        "model": "tiny-llama", "prompt": text, "max_tokens": 4})


def _each_lie_fails_its_prompt_alone(url: str) -> None:
    """HostilePeer as the prefill node answers with another model's frames, then a 2 GB
    frame header: each long prompt gets a 502 naming why; a short one is answered."""
    lied = _ask(url, "a long prompt for the prefill node " * 4)
    assert lied.status_code == 502, lied.text
    assert "another model" in lied.json()["error"]["message"]
    bomb = _ask(url, "another long prompt for the prefill node " * 4)
    assert bomb.status_code == 502, bomb.text
    assert "isn't KV" in bomb.json()["error"]["message"]
    assert _ask(url, "short").status_code == 200


def test_a_member_gone_bad_as_a_prefill_node_fails_the_long_prompt_alone(tmp_path,
                                                                          tiny_model_dir):
    """A member that holds the secret, named as the prefill node, answers with KV frames
    that are another model's, then with a 2 GB frame header: each long prompt fails with
    a 502 naming the hand-over, nothing of it is kept, and the node answers short prompts
    as before."""
    evil = HostilePeer(tmp_path, secret="the-secret", claims=("tiny-llama",))
    a = NodeProcess(home_with(tmp_path / "a", tiny_model_dir), "tiny-llama", "--secret",
                    "the-secret")
    try:
        a.wait_healthy().wait_ready(120)
        httpx.post(a.url + "/shoal/peers", json={"address": evil.address}, timeout=10)
        wait_until(lambda: any(p["trusted"] for p in _peers(a).values()), 15)
        r = httpx.post(a.url + "/shoal/instances", timeout=120, json={
            "model": "tiny-llama", "nodes": [{"node": "self"}], "prefill": "evil-member",
            "prefill_min": 40})
        assert r.status_code == 201, r.text
        _each_lie_fails_its_prompt_alone(a.url)
        assert [g["path"] for g in evil.received()].count("/shoal/peer/prefill") == 2
        assert a.proc.poll() is None
    finally:
        a.stop()
        evil.stop()


def test_a_member_gone_bad_as_a_groups_prefill_node_fails_the_long_prompt_alone(
        tmp_path, tiny_model_dir):
    """The same member gone bad named as the prefill node of a pipeline group over two
    real nodes: the frames of another model reach both ranks, and both refuse them alike
    (their prefix caches stay in step); the 2 GB header ends the hand-over on the owner
    and the member's copy with it. Each long prompt gets a 502, the group goes on serving,
    and no copy of the frames is left on either node."""
    evil = HostilePeer(tmp_path, secret="the-secret", claims=("tiny-llama",))
    nodes = start_cluster(tmp_path / "group", tiny_model_dir, 2, secret="the-secret")
    a, b = nodes
    try:
        httpx.post(a.url + "/shoal/peers", json={"address": evil.address}, timeout=10)
        wait_until(lambda: any(p["trusted"] for p in _peers(a).values()
                               if p["url"].endswith(evil.address.split(":")[-1])), 15)
        layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
        r = httpx.post(a.url + "/shoal/instances", timeout=300, json={
            "model": "tiny-llama", "strategy": "pipeline", "prefill": "evil-member",
            "prefill_min": 40, "nodes": [
                {"node": "self", "layers": [0, layers // 2]},
                {"node": b.client.status().cluster.id, "layers": [layers // 2, layers]}]})
        assert r.status_code == 201, r.text
        _each_lie_fails_its_prompt_alone(a.url)
        assert _ask(a.url, "a long prompt for the prefill node " * 4).status_code == 502
        assert _ask(a.url, "short, once more").status_code == 200
        for n in nodes:
            assert n.proc.poll() is None
            assert not list((n.home / "tmp" / "handover").glob("*.frames"))
    finally:
        for n in nodes:
            n.stop()
        evil.stop()
