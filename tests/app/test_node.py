"""Finding or starting the local node, noticing when it stops and starting it again, and
leaving nothing running at quit."""

import os
import signal
import threading
import time

import pytest
from processes import running

from app.node import LocalNode, NodeStartError
from engine.client import NodeClient
from engine.errors import ShoalError
from tests_support import wait_until


def answers(url: str) -> bool:
    try:
        with NodeClient(url, timeout=1.0) as c:
            c.health()
        return True
    except ShoalError:
        return False


def test_starts_a_node_and_stops_it_with_its_worker(home, port, node_command):
    node = LocalNode(home, port, command=node_command(port, "tiny-llama"), start_timeout=30)
    node.start()
    try:
        assert node.started_by_us and answers(node.url)
        wait_until(lambda: node.client.status().worker_pid, timeout=60)
        worker_pid = node.client.status().worker_pid
    finally:
        node.stop()
    assert node.proc.returncode is not None  # exited and reaped
    assert not running(node.proc.pid) and not running(worker_pid)
    assert not answers(node.url)


def test_node_already_running_is_left_alone(home, fresh_node):
    worker_pid = fresh_node.client.status().worker_pid
    node = LocalNode(home, fresh_node.port, command=["false"])
    node.start()
    assert not node.started_by_us
    node.stop()
    assert fresh_node.proc.poll() is None and answers(fresh_node.url)
    assert fresh_node.client.status().worker_pid == worker_pid and running(worker_pid)


def test_port_taken_by_another_program_is_the_reason(home, port, port_holder, node_command):
    node = LocalNode(home, port, command=node_command(port))
    with pytest.raises(NodeStartError) as info:
        node.start()
    assert f"Port {port} on 127.0.0.1 is in use by another program" in info.value.message
    assert "--port" in info.value.message
    assert "address already in use" in info.value.log_tail.lower()  # the node's own words
    node.stop()


def test_node_that_never_answers_is_stopped(home, port, silent_command):
    node = LocalNode(home, port, command=silent_command(port), start_timeout=1.0)
    with pytest.raises(NodeStartError, match="didn't answer"):
        node.start()
    assert node.proc.returncode is not None and not running(node.proc.pid)
    node.stop()


def test_watch_says_how_the_node_ended_and_a_restart_keeps_its_log(home, port, node_command):
    node = LocalNode(home, port, command=node_command(port), start_timeout=30)
    node.start()
    try:
        node.log_path.write_text("the first node's last words\n")
        stop = threading.Event()
        first = node.proc
        os.kill(first.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert node.watch(stop) == "it was forced to quit, signal 9"
        assert time.monotonic() - killed < 2.0
        node.restart("restarted by the app: it was killed")
        assert node.proc is not first and node.started_by_us and answers(node.url)
        log_text = node.log_path.read_text()
        assert log_text.startswith("the first node's last words\n")  # kept, not wiped
        assert "restarted by the app: it was killed" in log_text
        stop.set()
        assert node.watch(stop) is None  # stopped watching on purpose: nothing to say
    finally:
        node.stop()
    assert not running(node.proc.pid)
