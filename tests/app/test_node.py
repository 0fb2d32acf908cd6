"""Finding or starting the local node, and leaving nothing running at quit."""

import pytest

from app.node import LocalNode, NodeStartError
from engine.client import NodeClient
from engine.errors import ShoalError


def answers(url: str) -> bool:
    try:
        with NodeClient(url, timeout=1.0) as c:
            c.health()
        return True
    except ShoalError:
        return False


def test_starts_a_node_and_stops_it(home, port, node_command):
    node = LocalNode(home, port, command=node_command(port), start_timeout=30)
    node.start()
    try:
        assert node.started_by_us and answers(node.url)
    finally:
        node.stop()
    assert node.proc.returncode is not None  # exited and reaped
    assert not answers(node.url)


def test_node_already_running_is_left_alone(home, fake_node):
    node = LocalNode(home, fake_node.port, command=["false"])
    node.start()
    assert not node.started_by_us
    node.stop()
    assert fake_node.proc.poll() is None and answers(fake_node.url)


def test_node_that_exits_reports_its_log(home, port, node_command):
    node = LocalNode(home, port, command=node_command(port, "--fail"))
    with pytest.raises(NodeStartError) as info:
        node.start()
    assert "exit code 3" in info.value.message
    assert "can't open the models folder" in info.value.log_tail
    node.stop()


def test_node_that_never_answers_is_stopped(home, port, node_command):
    node = LocalNode(home, port, command=node_command(port, "--hang"),
                     start_timeout=1.0)
    with pytest.raises(NodeStartError, match="didn't answer"):
        node.start()
    assert node.proc.returncode is not None
    node.stop()
