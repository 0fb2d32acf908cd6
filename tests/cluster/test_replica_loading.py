"""A copy that is still loading counts as a copy: a request at another node waits for
it there rather than load a second copy of the model (which, for a model that fits only
once, would fail or push out what that node runs). Seen in CI: the app's replicas view
asked a node whose peer's copy was a poll away from ready, and that node loaded its own.
Two real nodes; the loading copy's worker is held mid-load with SIGSTOP so the window is
certain, not a race."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.node.peers import POLL_S
from nodes import start_cluster, worker_pids
from tests_support import wait_until

pytestmark = pytest.mark.slow


def ask(url: str, out: dict, key: str) -> None:
    out[key] = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny-llama", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]})


def test_a_request_elsewhere_waits_for_the_copy_loading_rather_than_load_another(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    out: dict = {}
    held: list[int] = []
    try:
        first = threading.Thread(target=ask, args=(a.url, out, "a"))
        first.start()  # a loads the model for a request of its own
        wait_until(lambda: worker_pids(a), 30, interval=0.02)
        held = worker_pids(a)
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        st = httpx.get(a.url + "/shoal/status", timeout=10).json()
        assert st["runner"]["type"] == "Loading", st  # held before it was ready
        time.sleep(2 * POLL_S + 1)  # b's polls of a have seen it loading

        second = threading.Thread(target=ask, args=(b.url, out, "b"))
        second.start()
        time.sleep(2)
        assert worker_pids(b) == [], "b started a copy of its own"
        for pid in held:
            os.kill(pid, signal.SIGCONT)
        held = []
        first.join(120)
        second.join(120)
        assert out["a"].status_code == 200, out["a"].text
        assert out["b"].status_code == 200, out["b"].text
        assert worker_pids(b) == []

        def rows() -> list:  # a's copy, once b's poll has seen it ready: b sent it one
            got = httpx.get(b.url + "/shoal/replicas", timeout=10).json()["replicas"]
            return [(r["here"], r["routed"]) for r in got]
        wait_until(lambda: rows() == [(False, 1)], 10)
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
        a.stop()
        b.stop()
