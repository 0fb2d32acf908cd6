"""The app finds or starts its node, shows it, and leaves nothing running when it quits.

Every node here is a real `shoal node`, except the one that must never answer."""

import time

import pytest
from processes import running
from PySide6.QtCore import Qt, QTimer

import app.main
from app.main import ShoalApp, main
from app.window import KEEP_IN_TRAY
from engine import __version__
from engine.client import NodeClient
from engine.errors import ShoalError


def status_text(shoal) -> str:
    return shoal.window.statusBar().findChild(type(shoal.window.start_page.title),
                                              "nodeStatus").text()


def chatting(qtbot, shoal) -> None:
    qtbot.waitUntil(lambda: shoal.chat is not None
                    and shoal.window.pages.currentWidget() is shoal.window.tabs
                    and shoal.window.tabs.currentWidget() is shoal.chat, timeout=20000)


def test_starts_its_node_and_stops_it_on_quit(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port, "tiny-llama"))
    shoal.start()
    assert shoal.window.start_page.title.text() == "Starting node…"
    chatting(qtbot, shoal)
    qtbot.waitUntil(lambda: "Node: idle · tiny-llama" in status_text(shoal), timeout=30000)
    assert f"v{__version__}" in status_text(shoal)
    assert shoal.tray.state == "idle"
    qtbot.waitUntil(lambda: shoal.chat.model_picker.findText("tiny-llama") >= 0)
    tabs = shoal.window.tabs
    assert [tabs.tabText(i) for i in range(tabs.count())] == [
        "Chat", "Models", "Topology", "Placement", "Charts", "Developer"]
    qtbot.waitUntil(lambda: len(shoal.topology.cards) == 1, timeout=10000)
    assert shoal.tray.cluster_action.text() == "Cluster: 1 machine"

    proc, worker_pid = shoal.node.proc, shoal.node.client.status().worker_pid
    assert running(proc.pid) and running(worker_pid)
    shoal.quit()
    assert proc.returncode is not None  # stopped and reaped before quit() returns
    assert not running(proc.pid) and not running(worker_pid)
    assert not shoal.window.isVisible()


def test_node_already_running_is_left_alone(qtbot, make_app, fresh_node):
    worker_pid = fresh_node.client.status().worker_pid
    shoal = make_app(fresh_node.port, ["false"])
    shoal.start()
    chatting(qtbot, shoal)
    qtbot.waitUntil(lambda: "Node: idle · tiny-llama" in status_text(shoal))
    shoal.quit()
    assert fresh_node.proc.poll() is None and fresh_node.client.health().ok
    assert fresh_node.client.status().worker_pid == worker_pid and running(worker_pid)


@pytest.mark.app_errors("The local node didn't start")
def test_port_in_use_shows_why_and_the_node_log_then_try_again(qtbot, make_app, port,
                                                               port_holder, node_command):
    shoal = make_app(port, node_command(port))
    shoal.start()
    page = shoal.window.start_page
    qtbot.waitUntil(lambda: page.retry_button.isVisible(), timeout=20000)
    assert page.title.text() == "The local node didn't start"
    assert f"Port {port} on 127.0.0.1 is in use by another program" in page.reason.text()
    assert str(shoal.node.log_path) in page.reason.text()
    assert "address already in use" in page.log_view.toPlainText().lower()  # its own words
    assert shoal.tray.state == "error"
    assert "in use by another program" in status_text(shoal)

    port_holder.close()  # the user quits the other program
    qtbot.mouseClick(page.retry_button, Qt.MouseButton.LeftButton)
    chatting(qtbot, shoal)
    qtbot.waitUntil(lambda: "Node: idle" in status_text(shoal))


def test_a_model_that_cannot_load_says_why(qtbot, make_app, home, port, node_command):
    command = node_command(port, "tiny-llama")
    for weights in (home / "models" / "tiny-llama").glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])  # a download cut short
    shoal = make_app(port, command)
    shoal.start()
    chatting(qtbot, shoal)
    qtbot.waitUntil(lambda: shoal.tray.state == "error", timeout=30000)
    assert "Node: error · tiny-llama" in status_text(shoal)
    assert "is damaged" in status_text(shoal)
    error = shoal.chat.error_label
    assert error.isVisible() and "is damaged" in error.text() and "again" in error.text()


def test_quit_while_the_node_is_starting_leaves_nothing(qtbot, make_app, port,
                                                        silent_command):
    shoal = make_app(port, silent_command(port))
    shoal.start()
    qtbot.waitUntil(lambda: shoal.node.proc is not None, timeout=10000)
    proc = shoal.node.proc
    shoal.quit()
    assert proc.returncode is not None and not running(proc.pid)


def test_tray_and_status_follow_a_generation(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port, "tiny-llama"))
    shoal.start()
    chatting(qtbot, shoal)
    qtbot.waitUntil(lambda: "Node: idle · tiny-llama" in status_text(shoal), timeout=30000)
    shoal.chat.chat_params = {"max_tokens": 3000}
    shoal.chat.prompt.setPlainText("go on")
    shoal.chat.send()
    qtbot.waitUntil(lambda: shoal.tray.state == "generating", timeout=10000)
    assert "Node: generating · tiny-llama" in status_text(shoal)
    shoal.chat.stop()
    qtbot.waitUntil(lambda: shoal.tray.state == "idle", timeout=10000)
    assert shoal.tray.model_action.text().startswith("Model: tiny-llama")

    # The tray's Stop model unloads it.
    assert shoal.tray.stop_action.isEnabled()
    shoal.tray.stop_action.trigger()
    qtbot.waitUntil(lambda: shoal.tray.model_action.text() == "No model running",
                    timeout=10000)
    assert not shoal.tray.stop_action.isEnabled()


def test_ctrl_q_quits_and_stops_the_node(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port))
    shoal.start()
    chatting(qtbot, shoal)
    proc = shoal.node.proc
    shoal.window.activateWindow()
    qtbot.waitActive(shoal.window)
    qtbot.keyClick(shoal.window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert proc.returncode is not None and not running(proc.pid)


def test_closing_the_window_quits_unless_kept_in_tray(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port), tray=True)
    shoal.start()
    chatting(qtbot, shoal)
    proc = shoal.node.proc

    shoal.window.keep_action.setChecked(True)
    assert shoal.settings.value(KEEP_IN_TRAY) in (True, "true")
    shoal.window.close()
    assert not shoal.window.isVisible() and proc.poll() is None  # still running, in the tray
    assert shoal.node.client.health().ok

    shoal.tray.show_action.trigger()
    assert shoal.window.isVisible()
    shoal.window.keep_action.setChecked(False)
    shoal.window.close()
    assert proc.returncode is not None and not running(proc.pid)


def test_without_a_tray_closing_the_window_quits(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port), tray=False)
    shoal.settings.setValue(KEEP_IN_TRAY, True)  # meaningless without a tray
    shoal.start()
    chatting(qtbot, shoal)
    assert not shoal.window.keep_action.isEnabled()
    proc = shoal.node.proc
    shoal.window.close()
    assert proc.returncode is not None and not running(proc.pid)


def test_main_runs_until_the_window_closes(qtbot, home, port, node_command, monkeypatch):
    command = node_command(port, "tiny-llama")
    monkeypatch.setattr("app.node.node_command", lambda host, p, h: command)
    made = []

    class Recorded(ShoalApp):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(app.main, "ShoalApp", Recorded)
    seen = {}
    deadline = time.monotonic() + 60

    def close_when_ready():
        status = made[0].monitor.status if made else {}
        if status.get("state") == "idle" and status.get("model") == "tiny-llama":
            seen["pids"] = made[0].node.proc.pid, made[0].node.client.status().worker_pid
            made[0].window.close()  # no tray offscreen: closing quits
        elif time.monotonic() > deadline:
            made[0].window.close()  # the test fails below, but doesn't hang
        else:
            QTimer.singleShot(50, close_when_ready)

    QTimer.singleShot(0, close_when_ready)
    assert main(["shoal", "--home", str(home), "--port", str(port)]) == 0
    assert "pids" in seen, f"the model never showed as loaded: {made[0].monitor.status}"
    node_pid, worker_pid = seen["pids"]
    assert not running(node_pid) and not running(worker_pid)
    with NodeClient(f"http://127.0.0.1:{port}", timeout=1) as client, \
            pytest.raises(ShoalError):
        client.health()  # the node it started is gone



def test_a_model_the_node_gains_while_the_app_runs_reaches_chat_and_placement(
        qtbot, make_app, home, port, node_command, tiny_model_dir):
    """The model lists follow the node: here a second model appears on its disk and an
    API client loads it (a first run's import is the same: the list read while the
    import ran was empty)."""
    import shutil
    shoal = make_app(port, node_command(port, "tiny-llama"))
    shoal.start()
    chatting(qtbot, shoal)
    qtbot.waitUntil(lambda: shoal.placement.model_box.findText("tiny-llama") >= 0,
                    timeout=30000)
    assert shoal.placement.model_box.findText("second") < 0
    shutil.copytree(tiny_model_dir, home / "models" / "second")
    NodeClient(shoal.node.url).load("second")
    qtbot.waitUntil(lambda: shoal.placement.model_box.findText("second") >= 0
                    and shoal.chat.model_picker.findText("second") >= 0, timeout=30000)
