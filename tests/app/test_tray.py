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
