"""Concurrent requests on one node decode together (continuous batching): each answer is
token for token what it is alone, the node reports the streams in flight, and beyond the
streams it takes a request waits a bounded time, then gets a 503 with Retry-After."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from nodes import NodeProcess, home_with

MODEL = "tiny-llama"


def ask(url: str, i: int, n: int = 24) -> str:
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = oai.chat.completions.create(
        model=MODEL, max_tokens=n, temperature=0,
        messages=[{"role": "user", "content": f"Question {i}: " + "why? " * (3 * i + 1)}])
    return r.choices[0].message.content or ""


def test_concurrent_streams_answer_as_alone(fresh_node):
    alone = [ask(fresh_node.url, i) for i in range(4)]
    got: dict[int, str] = {}
    seen: list[int] = []

    def one(i: int) -> None:
        got[i] = ask(fresh_node.url, i, 24)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.append(fresh_node.client.status()["streams"]["in_flight"])
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert [got[i] for i in range(4)] == alone
    assert max(seen) >= 2, "requests were in flight together"


@pytest.fixture
def one_stream_node(tmp_path, tiny_model_dir):
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), MODEL, "--max-streams", "1",
                       "--queue-wait", "1").wait_healthy()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


def test_beyond_the_streams_a_request_waits_then_gets_503(one_stream_node):
    url = one_stream_node.url
    long = threading.Thread(target=ask, args=(url, 0, 2000))  # holds the only stream
    long.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert r.json()["error"]["code"] == "overloaded"
    assert 0.9 < time.monotonic() - t0 < 10  # the wait is bounded by --queue-wait
    long.join(120)
    assert ask(url, 1, 4)  # and the node serves again
