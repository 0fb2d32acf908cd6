"""The app finds or starts its node, shows it, and leaves nothing running when it quits."""

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.main import ShoalApp, main
from app.window import KEEP_IN_TRAY, MainWindow
from engine.client import NodeClient
from engine.errors import ShoalError


@pytest.fixture
def make_app(qtbot, home):
    made = []

    def make(port, command=None, tray=False, **kw):
        shoal = ShoalApp(home, port, tray_available=tray, node_command=command,
                         status_interval=0.1, **kw)
        qtbot.addWidget(shoal.window)
        made.append(shoal)
        return shoal

    yield make
    for shoal in made:
        shoal.shutdown()


def status_text(shoal) -> str:
    return shoal.window.statusBar().findChild(type(shoal.window.start_page.title),
                                              "nodeStatus").text()


def test_starts_its_node_and_stops_it_on_quit(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port))
    shoal.start()
    assert shoal.window.start_page.title.text() == "Starting node…"
    qtbot.waitUntil(lambda: shoal.window.pages.currentWidget() is shoal.chat, timeout=20000)
    qtbot.waitUntil(lambda: "Node: idle" in status_text(shoal))
    assert "fake-model" in status_text(shoal) and "v0.0-fake" in status_text(shoal)
    assert shoal.tray.state == "idle"
    qtbot.waitUntil(lambda: shoal.chat.model_picker.findText("other-model") >= 0)

    proc = shoal.node.proc
    shoal.quit()
    assert proc.returncode is not None  # stopped and reaped before quit() returns
    assert not shoal.window.isVisible()


def test_node_already_running_is_left_alone(qtbot, make_app, fake_node):
    shoal = make_app(fake_node.port, ["false"])
    shoal.start()
    qtbot.waitUntil(lambda: shoal.window.pages.currentWidget() is shoal.chat, timeout=20000)
    shoal.quit()
    assert fake_node.proc.poll() is None
    assert fake_node.client.health()


def test_failed_start_shows_reason_and_log(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port, "--fail"))
    shoal.start()
    page = shoal.window.start_page
    qtbot.waitUntil(lambda: page.retry_button.isVisible(), timeout=20000)
    assert "exit code 3" in page.reason.text()
    assert "can't open the models folder" in page.log_view.toPlainText()
    assert shoal.tray.state == "error"
    assert "exit code 3" in status_text(shoal)


def test_quit_while_the_node_is_starting_leaves_nothing(qtbot, make_app, port,
                                                        node_command):
    shoal = make_app(port, node_command(port, "--hang"))
    shoal.start()
    qtbot.waitUntil(lambda: shoal.node.proc is not None, timeout=10000)
    proc = shoal.node.proc
    shoal.quit()
    assert proc.returncode is not None


def test_tray_and_status_follow_a_generation(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port))
    shoal.start()
    qtbot.waitUntil(lambda: shoal.window.pages.currentWidget() is shoal.chat, timeout=20000)
    shoal.chat.chat_params = {"max_tokens": 3000}
    shoal.chat.prompt.setPlainText("go on")
    shoal.chat.send()
    qtbot.waitUntil(lambda: shoal.tray.state == "generating", timeout=10000)
    assert "Node: generating" in status_text(shoal)
    shoal.chat.stop()
    qtbot.waitUntil(lambda: shoal.tray.state == "idle", timeout=10000)


def test_ctrl_q_quits_and_stops_the_node(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port))
    shoal.start()
    qtbot.waitUntil(lambda: shoal.window.pages.currentWidget() is shoal.chat, timeout=20000)
    proc = shoal.node.proc
    shoal.window.activateWindow()
    qtbot.waitActive(shoal.window)
    qtbot.keyClick(shoal.window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert proc.returncode is not None


def test_closing_the_window_quits_unless_kept_in_tray(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port), tray=True)
    shoal.start()
    qtbot.waitUntil(lambda: shoal.window.pages.currentWidget() is shoal.chat, timeout=20000)
    proc = shoal.node.proc

    shoal.window.keep_action.setChecked(True)
    assert shoal.settings.value(KEEP_IN_TRAY) in (True, "true")
    shoal.window.close()
    assert not shoal.window.isVisible() and proc.poll() is None  # still running, in the tray

    shoal.tray.show_action.trigger()
    assert shoal.window.isVisible()
    shoal.window.keep_action.setChecked(False)
    shoal.window.close()
    assert proc.returncode is not None


def test_without_a_tray_closing_the_window_quits(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port), tray=False)
    shoal.settings.setValue(KEEP_IN_TRAY, True)  # meaningless without a tray
    shoal.start()
    qtbot.waitUntil(lambda: shoal.window.pages.currentWidget() is shoal.chat, timeout=20000)
    assert not shoal.window.keep_action.isEnabled()
    proc = shoal.node.proc
    shoal.window.close()
    assert proc.returncode is not None


def test_main_runs_until_the_window_closes(qtbot, home, port, node_command, monkeypatch):
    monkeypatch.setattr("app.node.node_command", lambda host, p, h: node_command(port))
    seen = {}

    def close_when_chatting():
        windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
        if windows and windows[0].chat is not None:
            seen["window"] = windows[0]
            windows[0].close()  # no tray offscreen: closing quits
        else:
            QTimer.singleShot(50, close_when_chatting)

    QTimer.singleShot(0, close_when_chatting)
    assert main(["shoal", "--home", str(home), "--port", str(port)]) == 0
    assert "window" in seen
    with NodeClient(f"http://127.0.0.1:{port}", timeout=1) as client, \
            pytest.raises(ShoalError):
        client.health()  # the node it started is gone
