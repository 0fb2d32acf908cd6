"""The app keeps its own node alive: a real node child killed with SIGKILL under a real app
is noticed within 2 s, started again with the reason in one line, and the app carries on
where it was; three stops in a minute stop the restarts; someone else's node is never
restarted; Settings → Restart now restarts the node with what was saved."""

import os
import signal
import time

import httpx
import pytest
from processes import running
from PySide6.QtCore import Qt

from app.keeper import Restarts
from app.logs import LogDialog
from app.node import how_it_ended
from nodes import free_port


def status_text(shoal) -> str:
    return shoal.window.statusBar().findChild(type(shoal.window.start_page.title),
                                              "nodeStatus").text()


def up(qtbot, shoal, model: str = "", timeout: int = 30000) -> None:
    qtbot.waitUntil(lambda: shoal.chat is not None
                    and f"Node: idle{' · ' + model if model else ''}" in status_text(shoal),
                    timeout=timeout)


def watched(qtbot, shoal) -> None:
    """The keeper watches once the node answers (the first start, or a restart)."""
    qtbot.waitUntil(lambda: shoal.keeper.watching and not shoal.keeper.busy, timeout=30000)


def record(signal_) -> list:
    seen: list = []
    signal_.connect(lambda *args: seen.append((time.monotonic(), *args)))
    return seen


def test_a_killed_node_is_started_again_and_the_app_carries_on(qtbot, make_app, port,
                                                               node_command):
    command = node_command(port, "tiny-llama")
    command[-1] = "none"  # the node loads nothing itself: the app must load it again
    shoal = make_app(port, command, topology_interval=0.5)
    shoal.start()
    qtbot.waitUntil(lambda: shoal.chat is not None
                    and not shoal.window.showing_start_page(), timeout=30000)
    shoal.chat.load_model("tiny-llama")
    up(qtbot, shoal, "tiny-llama")
    watched(qtbot, shoal)
    shoal.window.show_view("Topology")
    qtbot.waitUntil(lambda: len(shoal.topology.cards) == 1, timeout=10000)

    # A reply is being written when the node dies.
    shoal.chat.chat_params = {"max_tokens": 3000}
    shoal.chat.prompt.setPlainText("go on")
    shoal.chat.send()
    qtbot.waitUntil(lambda: shoal.tray.state == "generating", timeout=20000)
    reply = shoal.chat.current().messages[-1]

    banner_said: list = []
    shoal.keeper.restarting.connect(lambda _s: banner_said.append(
        (shoal.banner.isVisible(), shoal.banner.text.text(), status_text(shoal))))
    restarting, back = record(shoal.keeper.restarting), record(shoal.keeper.back)
    old = shoal.node.proc
    worker_pid = shoal.node.client.status().worker_pid
    killed_at = time.monotonic()
    os.kill(old.pid, signal.SIGKILL)

    qtbot.waitUntil(lambda: bool(restarting), timeout=5000)
    assert restarting[0][0] - killed_at < 2.0  # noticed within 2 s
    sentence = ("Shoal's engine stopped unexpectedly (it was forced to quit, signal 9); "
                "starting it again…")
    assert restarting[0][1] == sentence
    [(shown, said, status)] = banner_said
    assert shown and said == sentence and sentence in status
    assert not shoal.banner.retry_button.isVisible()  # Shoal is on it
    assert shoal.banner.log_button.isVisible()

    qtbot.waitUntil(lambda: bool(back), timeout=30000)
    print(f"\nkilled → its node answers again: {back[0][0] - killed_at:.1f} s")
    assert shoal.node.proc is not old and running(shoal.node.proc.pid)
    assert not running(worker_pid)  # the dead node's worker went with it
    up(qtbot, shoal, "tiny-llama")  # the model it ran is loaded again
    print(f"\nkilled → serving tiny-llama again: {time.monotonic() - killed_at:.1f} s")
    assert not shoal.banner.isVisible()
    assert not shoal.chat.error_label.isVisible()  # no stale "couldn't list models"
    assert shoal.window.tabs.currentWidget() is shoal.topology  # the same view
    assert len(shoal.topology.cards) == 1
    polled = record(shoal.state.poller.updated)
    qtbot.waitUntil(lambda: bool(polled), timeout=10000)  # the views' polls go on

    # The reply that failed says so, and answering again works now the node is back.
    qtbot.waitUntil(lambda: not shoal.chat.streaming, timeout=10000)
    # whichever comes first, the broken stream or the keeper, it is said in words
    assert reply.error and "Errno" not in reply.error
    assert "starts it again" in reply.error or "starting it again" in reply.error
    shoal.chat.chat_params = {"max_tokens": 5}
    shoal.window.show_view("Chat")
    retry = shoal.chat.view.widgets()[-1].retry_button
    qtbot.waitUntil(retry.isVisible, timeout=5000)
    qtbot.mouseClick(retry, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not shoal.chat.streaming, timeout=30000)
    again = shoal.chat.current().messages[-1]
    assert again is not reply and again.error is None and again.content


def test_three_stops_within_a_minute_and_shoal_stops_restarting(qtbot, make_app, port,
                                                                node_command):
    shoal = make_app(port, node_command(port), topology_interval=0.5)
    shoal.start()
    up(qtbot, shoal)
    gave_up = record(shoal.keeper.gave_up)
    for stop in range(3):
        watched(qtbot, shoal)
        proc = shoal.node.proc
        os.kill(proc.pid, signal.SIGKILL)
        if stop < 2:
            qtbot.waitUntil(lambda p=proc: shoal.node.proc is not p, timeout=10000)
    qtbot.waitUntil(lambda: bool(gave_up), timeout=5000)

    assert shoal.node.proc is proc and proc.returncode == -9  # not started a fourth time
    banner = shoal.banner
    assert banner.isVisible() and banner.retry_button.isVisible()
    said = banner.text.text()
    assert said.startswith("Shoal's engine stopped 3 times within a minute (the last "
                           "time: it was forced to quit, signal 9), so Shoal stopped "
                           "starting it again.")
    assert said in status_text(shoal) and shoal.tray.state == "error"
    # the chat adds no second, stale sentence ("Shoal starts its node again"): the
    # model list isn't read from a node that is down (give its poll time to try)
    qtbot.wait(1500)
    assert not shoal.chat.error_label.isVisibleTo(shoal.chat), shoal.chat.error_label.text()

    # Its log is one click away, with the restarts in it.
    qtbot.mouseClick(banner.log_button, Qt.MouseButton.LeftButton)
    dialog = banner.findChild(LogDialog)
    assert dialog is not None and dialog.isVisible()
    assert dialog.path == shoal.node.log_path
    assert dialog.text.toPlainText().count(
        "restarted by the app: Shoal's engine stopped unexpectedly (it was forced to quit, "
        "signal 9)") == 2
    dialog.close()

    qtbot.mouseClick(banner.retry_button, Qt.MouseButton.LeftButton)
    watched(qtbot, shoal)  # and it is watched again, counting afresh
    up(qtbot, shoal)
    assert not banner.isVisible() and running(shoal.node.proc.pid)
    proc = shoal.node.proc
    os.kill(proc.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: shoal.node.proc is not proc, timeout=10000)
    up(qtbot, shoal)
    assert len(gave_up) == 1


def test_a_node_that_stops_answering_is_restarted(qtbot, make_app, port, node_command):
    shoal = make_app(port, node_command(port), hang_after=2.0, topology_interval=0.5)
    shoal.start()
    up(qtbot, shoal)
    watched(qtbot, shoal)
    proc = shoal.node.proc
    restarting = record(shoal.keeper.restarting)
    os.kill(proc.pid, signal.SIGSTOP)  # alive, but it answers nothing (quit kills it)
    qtbot.waitUntil(lambda: bool(restarting), timeout=10000)
    assert restarting[0][1] == ("Shoal's engine stopped unexpectedly (not answering for "
                                "2 s); starting it again…")
    watched(qtbot, shoal)
    up(qtbot, shoal)
    assert shoal.node.proc is not proc and not running(proc.pid)


def test_someone_elses_node_is_not_restarted(qtbot, make_app, fresh_node, node_command):
    port = fresh_node.port
    shoal = make_app(port, node_command(port), topology_interval=0.5)
    shoal.start()
    up(qtbot, shoal, "tiny-llama")
    watched(qtbot, shoal)
    assert not shoal.node.started_by_us
    lost = record(shoal.keeper.lost)
    fresh_node.proc.send_signal(signal.SIGKILL)
    qtbot.waitUntil(lambda: bool(lost), timeout=5000)

    banner = shoal.banner
    said = banner.text.text()
    assert said.startswith("The Shoal node that was running on this machine, which Shoal "
                           "didn't start, stopped answering.")
    assert banner.retry_button.isVisible() and not banner.log_button.isVisible()
    assert shoal.node.proc is None  # nothing started in its place
    assert said in status_text(shoal)

    qtbot.mouseClick(banner.retry_button, Qt.MouseButton.LeftButton)  # Shoal starts its own
    watched(qtbot, shoal)
    up(qtbot, shoal)
    assert shoal.node.started_by_us and not banner.isVisible()


def test_restart_now_applies_saved_settings_and_keeps_the_window(qtbot, make_app, port,
                                                                 node_command):
    shoal = make_app(port, node_command(port), topology_interval=0.5)
    shoal.start()
    up(qtbot, shoal)
    watched(qtbot, shoal)
    shoal.window.show_view("Models")
    lan = {"Host": f"shoal.lan:{port}"}
    assert httpx.get(shoal.node.url + "/shoal/status", headers=lan).status_code == 403

    shoal.open_settings("API")
    dialog = shoal.settings_dialog
    dialog.hosts_edit.setText("shoal.lan")
    assert dialog.save_api()
    assert dialog.restart_button.isVisible()
    assert "Restart now applies them" in dialog.api_message.text()
    proc = shoal.node.proc
    qtbot.mouseClick(dialog.restart_button, Qt.MouseButton.LeftButton)
    assert shoal.banner.isVisible()
    assert "Restarting Shoal's engine to apply the new settings" in shoal.banner.text.text()
    qtbot.waitUntil(lambda: shoal.node.proc is not proc and not shoal.keeper.busy,
                    timeout=30000)
    up(qtbot, shoal)
    assert proc.returncode == 0  # asked to stop, it stopped by itself
    assert httpx.get(shoal.node.url + "/shoal/status", headers=lan).status_code == 200
    assert dialog.api_message.text() == "Shoal's engine runs with these settings now."
    assert not dialog.restart_button.isVisible() and dialog.isVisible()
    assert shoal.window.tabs.currentWidget() is shoal.models_view
    assert not shoal.banner.isVisible()

    # A new port and key: Restart now moves the engine, and the app follows it there.
    new_port = free_port()
    dialog.port_spin.setValue(new_port)
    dialog.key_edit.setText("sk-local-restart-test")
    assert dialog.save_api()
    assert dialog.restart_button.isVisible()
    old_url = shoal.node.url
    qtbot.mouseClick(dialog.restart_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: shoal.node.port == new_port and not shoal.keeper.busy,
                    timeout=30000)
    up(qtbot, shoal)  # the status bar reads the node at its new port, with the key
    url = f"http://127.0.0.1:{new_port}"
    assert httpx.get(url + "/v1/models").status_code == 401  # the key is required now
    with pytest.raises(httpx.ConnectError):
        httpx.get(old_url + "/health", timeout=2)
    assert shoal.developer.address.text() == f"{url}/v1"
    models = shoal.node.client.models()  # the views' shared client, with the key
    assert isinstance(models, list)
    assert "--port" in shoal.node.command and str(new_port) in shoal.node.command


def test_the_third_stop_within_a_minute_ends_the_restarts():
    now = [0.0]
    restarts = Restarts(clock=lambda: now[0])
    assert restarts.record()  # 0 s: restart
    now[0] = 30.0
    assert restarts.record()  # 30 s: restart
    now[0] = 59.0
    assert not restarts.record()  # 59 s: the third within a minute
    restarts.clear()  # Try again counts afresh
    for t in (100.0, 140.0, 161.0):  # 100 s is more than a minute before 161 s
        now[0] = t
        assert restarts.record()


def test_how_a_node_ended_in_a_few_words():
    assert how_it_ended(-9) == "it was forced to quit, signal 9"
    assert how_it_ended(1) == "it exited with error code 1"
    assert how_it_ended(-11) == "it crashed, signal 11"
