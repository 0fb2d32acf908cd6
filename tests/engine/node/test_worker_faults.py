"""Stop, disconnect, a crashing worker and a damaged model file, against real processes."""

from __future__ import annotations

import os
import signal
import socket
import time

import httpx
import openai
import pytest

from engine.errors import ShoalError
from tests_support import wait_until

HELLO = [{"role": "user", "content": "Tell me a long story"}]


def _stream(node, max_tokens: int = 100_000):
    return node.client.chat(HELLO, model="tiny-llama", max_tokens=max_tokens, temperature=0)


def test_closing_the_stream_stops_generation(tiny_node):
    stream = _stream(tiny_node)
    it = iter(stream)
    for _ in range(5):
        next(it)
    assert tiny_node.client.status().state == "generating"
    stream.close()
    t0 = time.monotonic()
    wait_until(lambda: tiny_node.client.status().state == "idle", 5)
    assert time.monotonic() - t0 < 2
    # The next answer is whole and its own.
    r = tiny_node.client.complete(HELLO, model="tiny-llama", max_tokens=4)
    assert r["usage"]["completion_tokens"] == 4


def test_worker_killed_mid_stream_gives_an_error_then_recovers(fresh_node):
    old_pid = fresh_node.client.status().worker_pid
    stream = _stream(fresh_node)
    it = iter(stream)
    next(it)
    os.kill(old_pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(ShoalError) as e:
        for _ in it:
            pass
    assert time.monotonic() - t0 < 5
    assert "exited unexpectedly" in str(e.value)
    assert f"on {socket.gethostname()}" in str(e.value)  # which machine holds the log
    st = fresh_node.client.status()
    assert st.state == "error" and "exited unexpectedly" in st.error
    # The next request starts a fresh worker.
    r = fresh_node.client.complete(HELLO, model="tiny-llama", max_tokens=3)
    assert r["usage"]["completion_tokens"] == 3
    assert fresh_node.client.status().worker_pid not in (None, old_pid)


def test_truncated_weights_are_named(fresh_node):
    fresh_node.client.unload()
    broken = fresh_node.home / "models" / "broken"
    src = fresh_node.home / "models" / "tiny-llama"
    broken.mkdir()
    for f in src.iterdir():
        data = f.read_bytes()
        (broken / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors"
                                      else data)
    oai = openai.OpenAI(base_url=fresh_node.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="broken", messages=HELLO, max_tokens=3)
    msg = e.value.body["message"]
    assert "model.safetensors" in msg and "truncated" in msg
    assert fresh_node.client.status().state == "error"
    r = httpx.get(fresh_node.url + "/health", timeout=10)
    assert r.json()["ok"]


def test_sigterm_stops_node_and_worker(fresh_node):
    pid = fresh_node.client.status().worker_pid
    fresh_node.proc.send_signal(signal.SIGTERM)
    assert fresh_node.proc.wait(20) == 0
    wait_until(lambda: not _alive(pid), 5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once not running.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_a_port_in_use_is_a_clear_error(tmp_path):
    import socket
    import subprocess
    import sys

    from nodes import ROOT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "app.cli", "node", "--port", str(port),
                            "--home", str(tmp_path), "--model", "none"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"Can't listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_unknown_start_model_shows_as_an_error(tmp_path):
    from nodes import NodeProcess
    node = NodeProcess(tmp_path / "home", "no-such-model").wait_healthy()
    try:
        st = node.wait_state("error", 30)
        assert "no-such-model" in st.error
    finally:
        node.stop()


def test_the_request_log_shows_answers_and_refusals_without_bodies(tiny_node):
    """GET /shoal/requests (the app's Developer panel): route, status, client, reason."""
    import time as _time

    since = _time.time() - 1
    httpx.post(tiny_node.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": HELLO, "max_tokens": 2},
        headers={"User-Agent": "log-test/1"})
    httpx.post(tiny_node.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "SECRET-PROMPT"}],
        "temprature": 1}, headers={"User-Agent": "log-test/1"})
    got = httpx.get(tiny_node.url + "/shoal/requests", params={"since": since},
                    timeout=10).json()["requests"]
    mine = [e for e in got if e["client"] == "log-test/1"]
    assert [(e["path"], e["status"]) for e in mine] == [("/v1/chat/completions", 200),
                                                         ("/v1/chat/completions", 400)]
    assert "temprature" in mine[1]["reason"] and "SECRET-PROMPT" not in str(got)
    # engine.client's records (the Developer panel's rows)
    read = [e for e in tiny_node.client.requests(since) if e.client == "log-test/1"]
    assert [(e.path, e.status, e.reason) for e in read] == [
        (e["path"], e["status"], e["reason"]) for e in mine]


def test_the_event_stream_starts_with_the_status(tiny_node):
    from engine.records import StatusInfo

    events = tiny_node.client.events()
    first = next(events)
    events.close()
    assert isinstance(first, StatusInfo)
    assert first.models_dir and first.models_dir == tiny_node.client.status().models_dir
