"""A flood of connections that send nothing, or half a request, to both of a node's ports:
before, 2,100 of them stayed open forever, chats timed out while they were held, and the
log grew by a traceback per failed accept(). Now the node closes idle connections to make
room and after its keep-alive timeout, and chats are served within a second of normal."""

from __future__ import annotations

import resource
import socket
import statistics
import time

import httpx
import pytest

from members import Member
from nodes import NodeProcess, home_with

FLOOD = 2100  # per port, as in the attack


def _chat_seconds(node: NodeProcess) -> float:
    t0 = time.monotonic()
    r = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def _open(port: int, n: int, send: bytes = b"") -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if send:
            s.sendall(send)
        out.append(s)
    return out


def _closed_by_node(s: socket.socket) -> bool:
    s.settimeout(0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def flood_room():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FLOOD + 400
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"this machine allows {hard} open files; the flood needs {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_and_half_open_connections_dont_stop_chats(tmp_path, tiny_model_dir,
                                                       flood_room):
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama",
                       "--secret", "flood-secret").wait_healthy()
    socks: list[socket.socket] = []
    try:
        node.wait_ready()
        _chat_seconds(node)  # warm
        normal = statistics.median(_chat_seconds(node) for _ in range(3))
        log = node.home / "logs" / "node.log"
        log_before = log.stat().st_size
        for port, half in ((node.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"),
                           (node.cluster_port, b"\x16\x03\x01\x02\x00")):  # half a hello
            socks = _open(port, FLOOD) + _open(port, 100, half)
            flooded = statistics.median(_chat_seconds(node) for _ in range(3))
            assert flooded < normal + 1.0, (port, normal, flooded)
            with Member(node.cluster_url, "flood-secret") as m:  # members get through
                assert m.call("GET", "/shoal/node").status_code == 200
            # what was left open is closed within the keep-alive and handshake timeouts
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not all(_closed_by_node(s) for s in socks):
                time.sleep(1)
            assert all(_closed_by_node(s) for s in socks), port
            for s in socks:
                s.close()
        assert node.proc.poll() is None
        assert log.stat().st_size - log_before < 200_000  # a line a second, not a trace each
        assert _chat_seconds(node) < normal + 1.0
    finally:
        for s in socks:
            s.close()
        node.stop()
