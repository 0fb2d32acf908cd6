"""What agents do to a node that plain chat doesn't: 20,000-token prompts, timeouts and
Ctrl-C mid-prefill. A client that leaves stops its own request within a second, even
during its prefill, and nothing else; a prefill longer than the stall watchdog is work,
not silence; a stream that fails after it started ends with its protocol's own error."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nodes import NodeProcess, home_with  # noqa: E402
from tests_support import wait_until  # noqa: E402
from tiny import LLAMA, make_tiny_model  # noqa: E402

LONG = "the quick brown fox jumps over the lazy dog " * 180  # ~8 K byte tokens
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> Path:
    """Wide enough that an 8 K-token prompt takes seconds to prefill on a CI machine (about
    10 s here, 4 K about 3.4 s)."""
    return make_tiny_model(tmp_path_factory.mktemp("slow") / "slow", LLAMA, hidden_size=128,
                           intermediate_size=512, num_hidden_layers=4,
                           max_position_embeddings=131072)


@pytest.fixture
def node(tmp_path, slow_model):
    n = NodeProcess(home_with(tmp_path, slow_model), "slow", "--stall-timeout", "3")
    n.wait_healthy()
    n.wait_ready()
    yield n
    n.stop()


@pytest.fixture
def calm_node(tmp_path, slow_model):
    """The node with its default stall watchdog: a chunk of a long prompt on a loaded
    machine can be silent past the 3 s the other node allows, which isn't what the test
    below is about."""
    n = NodeProcess(home_with(tmp_path, slow_model), "slow")
    n.wait_healthy()
    n.wait_ready()
    yield n
    n.stop()


def _status(n: NodeProcess) -> dict:
    return httpx.get(n.url + "/shoal/status", timeout=10).json()


def test_a_client_that_leaves_mid_prefill_stops_only_its_own_request(calm_node):
    node = calm_node
    pid = _status(node)["worker_pid"]
    other: dict = {}

    def short() -> None:  # a second stream in flight all along
        time.sleep(0.5)
        r = httpx.post(node.url + "/v1/chat/completions", timeout=120, json={
            "model": "slow", "messages": HELLO, "max_tokens": 40, "stream": False})
        other["status"], other["tokens"] = r.status_code, \
            (r.json().get("usage") or {}).get("completion_tokens")
        if r.status_code != 200:  # what it said, for the assertion's message
            other["body"] = r.text[:300]

    t = threading.Thread(target=short)
    t.start()
    with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=120, json={
            "model": "slow", "messages": [{"role": "user", "content": LONG}],
            "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200
        wait_until(lambda: _status(node)["streams"]["in_flight"] >= 1, 30)
        time.sleep(1.0)  # well inside the prefill
    left = time.monotonic()  # the prompt has seconds of prefill to go: it stops now
    wait_until(lambda: _status(node)["streams"]["in_flight"] <= 1, 10)
    assert time.monotonic() - left < 2.5, "the request ended within a chunk of the cancel"
    t.join(120)
    assert other == {"status": 200, "tokens": 40}, "the other stream finished untouched"
    status = _status(node)
    assert status["worker_pid"] == pid and status["state"] != "error", "no worker was lost"
    log = (node.home / "logs" / "worker.log").read_text()
    assert "did not stop when asked" not in (node.home / "node-test.log").read_text() + log


def test_a_prefill_longer_than_the_stall_watchdog_is_answered(node):
    """The node runs with --stall-timeout 3; this prompt takes longer than that."""
    t0 = time.monotonic()
    r = httpx.post(node.url + "/v1/chat/completions", timeout=300, json={
        "model": "slow", "messages": [{"role": "user", "content": LONG}], "max_tokens": 3})
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert took > 4, f"the prefill took {took:.1f} s: the test needs a longer one"


def _kill_worker_after_first_token(n: NodeProcess, r: httpx.Response) -> str:
    text = ""
    for chunk in r.iter_text():
        text += chunk
        if "delta" in text and "kill" not in text:
            os.kill(_status(n)["worker_pid"], signal.SIGKILL)
            text += "\n#kill\n"
    return text


@pytest.mark.parametrize("path, body, last", [
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 3000, "stream": True},
     '"error"'),
    ("/v1/messages", {"messages": HELLO, "max_tokens": 3000, "stream": True},
     "event: error"),
    ("/v1/responses", {"input": "hello", "max_output_tokens": 3000, "stream": True},
     "event: response.failed"),
])
def test_a_stream_that_fails_ends_with_its_protocols_error(node, path, body, last):
    with httpx.stream("POST", node.url + path, timeout=120,
                      json={"model": "slow", **body}) as r:
        assert r.status_code == 200
        text = _kill_worker_after_first_token(node, r)
    tail = text.split("#kill", 1)[1]
    assert last in tail, tail[-800:]
    if path == "/v1/responses":
        failed = next(json.loads(line[6:]) for line in tail.splitlines()
                      if line.startswith("data: ") and "response.failed" in line)
        assert failed["response"]["status"] == "failed" and failed["response"]["error"]


def test_the_chat_window_sees_the_prefill_progress(node):
    """Shoal's own client reads the progress comments (other clients skip them)."""
    from engine.client import NodeClient

    with NodeClient(node.url) as c:
        seen = [d.prefill for d in c.chat([{"role": "user", "content": LONG[:len(LONG) // 2]}],
                                          model="slow", max_tokens=2) if d.prefill]
    assert len(seen) >= 2, seen
    dones = [done for _, done, _ in seen]
    assert dones == sorted(dones) and seen[-1][2] > 3000, seen
