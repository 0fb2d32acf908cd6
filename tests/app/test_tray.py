"""The tray icon's colour follows the node's state; its menu shows the window or quits."""

import pytest
from PySide6.QtGui import QColor

from app.tray import Tray, draw_icon


def centre_colour(icon) -> QColor:
    image = icon.pixmap(64, 64).toImage()
    return image.pixelColor(image.width() // 2 - 8, image.height() // 2 + 8)


def test_each_state_has_its_own_colour(qapp):
    colours = {s: centre_colour(draw_icon(s)).name()
               for s in ("idle", "loading", "generating", "error", None)}
    assert len(set(colours.values())) == 5
    assert colours["error"] == "#d03b3b"


@pytest.mark.parametrize("available", [False, None])
def test_icon_follows_status(qapp, qtbot, available):
    tray = Tray(available=available)  # None: whatever this desktop has
    for state, colour in [("loading", "#e0a020"), ("idle", "#2e9d57"),
                          ("generating", "#2f7fd8"), ("error", "#d03b3b"),
                          ("stopped", "#8a8a8a")]:
        tray.set_status({"state": state, "model": "tiny"})
        assert tray.state == state
        assert centre_colour(tray.icon.icon()).name() == colour
    assert "stopped" in tray.icon.toolTip() and "tiny" in tray.icon.toolTip()
    tray.hide()


def test_menu_actions_emit_requests(qapp, qtbot):
    tray = Tray(available=False)
    with qtbot.waitSignal(tray.show_requested):
        tray.show_action.trigger()
    with qtbot.waitSignal(tray.quit_requested):
        tray.quit_action.trigger()


def test_downloading_shows_unless_the_node_is_busy(qapp):
    tray = Tray(available=False)
    tray.set_status({"state": "idle"})
    tray.set_downloading(True)
    assert tray.state == "downloading"
    assert centre_colour(tray.icon.icon()).name() == "#8e5bd0"
    tray.set_status({"state": "generating", "model": "tiny"})
    assert tray.state == "generating"  # what the node does wins over a download
    tray.set_downloading(False)
    tray.set_status({"state": "idle"})
    assert tray.state == "idle"


def test_menu_sums_up_the_cluster_and_the_model(qapp, qtbot):
    tray = Tray(available=False)
    assert not tray.stop_action.isEnabled()
    tray.set_cluster(3, 2)
    assert tray.cluster_action.text() == "Cluster: 3 machines (2 reachable)"
    tray.set_status({"state": "idle", "model": "tiny",
                     "runner": {"type": "Ready", "model": "tiny"}})
    tray.set_speed({"generation_tps": 41.25})
    assert tray.model_action.text() == "Model: tiny · 41.2 tokens/s"
    assert tray.stop_action.isEnabled()
    with qtbot.waitSignal(tray.stop_requested):
        tray.stop_action.trigger()
    with qtbot.waitSignal(tray.settings_requested):
        tray.settings_action.trigger()


def test_a_model_unloaded_for_want_of_use_is_named(qapp):
    tray = Tray(available=False)
    tray.set_status({"state": "idle", "model": None,
                     "runner": {"type": "Idle", "unloaded": "tiny", "idle_s": 600.0}})
    assert tray.model_action.text() == "tiny unloaded (unused); the next request loads it"
    assert not tray.stop_action.isEnabled()
    tray.set_status({"state": "idle", "runner": {"type": "Idle", "unloaded": None}})
    assert tray.model_action.text() == "No model running"


def test_a_live_speed_stops_saying_now_when_the_reply_ends(qapp, qtbot, monkeypatch):
    monkeypatch.setattr("app.tray.LIVE_FOR_MS", 300)
    tray = Tray(available=False)
    tray.set_status({"state": "generating", "model": "tiny",
                     "runner": {"type": "Ready", "model": "tiny"}})
    tray.set_speed({"generation_tps": 41.25})
    tray.set_live_speed(22, 2.0)
    assert tray.model_action.text() == "Model: tiny · 10.5 tokens/s now"
    # Stop: no more tokens, no finished reply; the node goes idle.
    tray.set_status({"state": "idle", "model": "tiny",
                     "runner": {"type": "Ready", "model": "tiny"}})
    qtbot.waitUntil(lambda: "now" not in tray.model_action.text(), timeout=3000)
    assert tray.model_action.text() == "Model: tiny · 41.2 tokens/s"  # the last finished

    tray.set_live_speed(22, 2.0)
    tray.end_live()  # the chat says so at once (ChatPane.reply_ended)
    assert tray.model_action.text() == "Model: tiny · 41.2 tokens/s"


def test_another_model_has_no_speed_yet(qapp):
    tray = Tray(available=False)
    tray.set_status({"state": "idle", "model": "tiny",
                     "runner": {"type": "Ready", "model": "tiny"}})
    tray.set_speed({"generation_tps": 41.25})
    tray.set_status({"state": "idle", "model": None, "runner": {"type": "Idle"}})
    tray.set_status({"state": "idle", "model": "other",
                     "runner": {"type": "Ready", "model": "other"}})
    assert tray.model_action.text() == "Model: other"
