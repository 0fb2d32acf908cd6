"""Idle models unload (as Ollama's keep-alive): after the node's --unload-after, or what an
Ollama request's keep_alive said; the status says which model went and why, and the next
request loads it again."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import UTC, datetime

import httpx
import pytest

from engine.durations import duration_seconds
from engine.records import RunnerIdle, RunnerReady
from nodes import NodeProcess, home_with
from tests_support import wait_until

HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("text,seconds", [
    (30, 30.0), ("30", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5),
    ("300ms", 0.3), (0, 0.0), ("0", 0.0), (-1, None), ("-1m", None), ("never", None)])
def test_durations_read_as_ollama_reads_keep_alive(text, seconds):
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "", True, [5], "m5"])
def test_a_duration_that_isnt_one_says_what_is_expected(bad):
    with pytest.raises(ValueError, match="a duration like"):
        duration_seconds(bad)


def unloaded(node: NodeProcess) -> str | None:
    runner = node.client.status().runner
    return runner.unloaded if isinstance(runner, RunnerIdle) else None


def chat(node: NodeProcess, **extra) -> httpx.Response:
    return httpx.post(node.url + "/api/chat", timeout=120, json={
        "model": "tiny-llama", "messages": HELLO, "stream": False,
        "options": {"num_predict": 4}, **extra})


def test_a_model_unused_for_the_nodes_keep_alive_unloads_and_loads_again(
        tmp_path, tiny_model_dir):
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama",
                       "--unload-after", "2s").wait_healthy()
    try:
        node.wait_ready()
        assert chat(node).status_code == 200
        t0 = time.monotonic()
        wait_until(lambda: unloaded(node) == "tiny-llama", 20)
        assert time.monotonic() - t0 >= 1.0  # not before its keep-alive
        status = node.client.status()
        assert status.worker_pid is None and status.runner.idle_s >= 2
        r = chat(node)  # the next request loads it again
        assert r.status_code == 200 and r.json()["done"]
        assert isinstance(node.client.status().runner, RunnerReady)
    finally:
        node.stop()


def test_a_keep_alive_counts_from_when_the_model_is_ready(tmp_path, tiny_model_dir):
    """A keep-alive shorter than the node's start and load: the model stays ready for
    the keep-alive after it is, not unloaded the moment it is (CI saw the idle clock
    count from the node's start). Timed by the node's own log lines, not by polls, so a
    loaded machine's slow status call can't blur it."""
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama",
                       "--unload-after", "1s").wait_healthy()
    try:
        wait_until(lambda: unloaded(node) == "tiny-llama", 120)
        log = node.log.read_text(errors="replace")
    finally:
        node.stop()

    def at(pattern: str) -> datetime:
        line = next(x for x in log.splitlines() if re.search(pattern, x))
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    ready, gone = at(r"model tiny-llama ready in"), at(r"unloading tiny-llama: unused")
    assert (gone - ready).total_seconds() >= 0.95  # its whole keep-alive, from ready


def test_an_ollama_requests_keep_alive_holds_for_its_model(tmp_path, tiny_model_dir):
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama").wait_healthy()
    try:
        node.wait_ready()
        r = chat(node, keep_alive="soon")
        assert r.status_code == 400 and "keep_alive" in r.json()["error"]  # Ollama's shape
        assert chat(node, keep_alive="30m").status_code == 200
        ps = httpx.get(node.url + "/api/ps", timeout=30).json()["models"][0]
        left = datetime.fromisoformat(ps["expires_at"]) - datetime.now(UTC)
        assert 25 * 60 < left.total_seconds() <= 30 * 60  # what the request asked for
        assert chat(node, keep_alive="1s").status_code == 200
        wait_until(lambda: unloaded(node) == "tiny-llama", 20)
        assert chat(node, keep_alive=-1).status_code == 200  # loaded again, for good
        time.sleep(3)
        assert isinstance(node.client.status().runner, RunnerReady)
        r = httpx.post(node.url + "/api/generate", timeout=60,
                       json={"model": "tiny-llama", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload"
        wait_until(lambda: node.client.status().worker_pid is None, 20)
    finally:
        node.stop()


def test_a_bad_unload_after_is_refused_at_start(tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine.cli", "node", "--home", str(tmp_path),
                        "--unload-after", "soon"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--unload-after" in r.stderr and "5m" in r.stderr
