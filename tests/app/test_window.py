"""The window a user opens, with every view built and no node behind it (the views show
their inline errors and stay usable): start-up steps, the smallest size, light and dark
while running, keyboard shortcuts, Tab through every control, names for screen readers,
the Developer panel and the tray's additions."""

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAccessible, QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel, QWidget

from app import theme
from app.main import ShoalApp
from app.startup import StartPage

pytestmark = pytest.mark.app_errors("Can't reach the node")


@pytest.fixture
def shoal(qtbot, home, port):
    """The app with its views built, its node never started (nothing answers on port)."""
    app = ShoalApp(home, port, tray_available=False)
    qtbot.addWidget(app.window)
    app._build_views()
    app._started()
    app.window.show()
    yield app
    app.appearance.set_mode("light")  # the next test starts as the default does
    app.shutdown()


def test_start_up_shows_its_steps_with_progress(qtbot):
    page = StartPage()
    qtbot.addWidget(page)
    page.show()
    assert page.steps["node"].state == "now" and page.title.text() == "Starting node…"
    preparing = {"state": "loading", "model": "SmolLM2-135M-Instruct", "runner": {
        "type": "Preparing", "model": "SmolLM2-135M-Instruct",
        "step": "importing the default model", "done": 40, "total": 100}}
    assert page.follow(preparing) is False
    step = page.steps["prepare"]
    assert page.steps["node"].state == "done" and step.state == "now"
    assert step.detail.text() == "Importing the default model: 40%"
    assert step.bar.isVisible() and step.bar.value() == 40 and step.bar.maximum() == 100
    assert page.skip_button.isVisible()  # the other views need not wait

    loading = {"state": "loading", "model": "m", "runner": {
        "type": "Loading", "model": "m", "layers_done": 12, "layers_total": 30}}
    assert page.follow(loading) is False
    assert page.steps["prepare"].state == "done" and page.steps["load"].state == "now"
    assert page.steps["load"].detail.text() == "12/30 layers"
    assert page.steps["load"].bar.value() == 12
    assert page.follow({"state": "idle", "model": "m", "runner": {
        "type": "Ready", "model": "m", "context_length": 8192}}) is True
    assert page.follow({"state": "idle", "runner": {"type": "Idle"}}) is True


def test_the_window_fits_a_small_laptop(qtbot, shoal):
    win = shoal.window
    assert win.minimumSizeHint().width() <= 900 and win.minimumSizeHint().height() <= 600
    for title in win.views:  # every view, not only the one on top
        win.show_view(title)
        win.resize(900, 600)
        qtbot.waitUntil(lambda: win.size() == QSize(900, 600), timeout=3000)
    win.show_view("Charts")
    qtbot.waitUntil(lambda: shoal.charts.columns == 1, timeout=3000)  # the charts reflow
    win.resize(1600, 1000)
    win.show_view("Chat")
    qtbot.waitUntil(lambda: shoal.charts.columns == 2 or win.width() == 1600, timeout=3000)
    view = shoal.chat.view
    qtbot.waitUntil(lambda: view.viewport().width() > 1000, timeout=3000)
    assert view._column.width() <= 860  # a readable line, centred


def test_light_dark_and_back_while_running(qtbot, shoal):
    from app.topology import NodeCardItem
    from engine.cluster_records import TopologyInfo
    shoal.state.set_topology(TopologyInfo.from_json({"nodes": [
        {"id": "a", "name": "studio", "self": True, "reachable": True, "trusted": True,
         "machine": {"memory": {"total_bytes": 64 * 10**9, "available_bytes": 40 * 10**9}}}],
        "links": []}).to_json())
    qtbot.waitUntil(lambda: len(shoal.topology.cards) == 1, timeout=3000)
    for mode, dark in (("dark", True), ("light", False), ("dark", True)):
        shoal.window.appearance_actions[mode].trigger()
        assert shoal.settings.value(theme.APPEARANCE) == mode
        pal = QApplication.instance().palette()
        assert theme.is_dark(pal) is dark
        assert theme.colour("error").name() in QApplication.instance().styleSheet()
        # Painted views follow: the card, the strips' names, the charts' background.
        card: NodeCardItem = shoal.topology.cards["a"]
        image = card_image(card)
        assert (image.pixelColor(40, 60).lightness() < 100) is dark
        strip_text = shoal.placement.strips.palette().color(QPalette.ColorRole.WindowText)
        assert (strip_text.lightness() > 150) is dark  # names readable on the background
        bg = shoal.charts.tps.backgroundBrush().color()
        assert (bg.lightness() < 100) is dark
        legend = shoal.charts.tps.getPlotItem().legend
        assert all((QColor(label.opts["color"]).lightness() > 150) is dark
                   for _sample, label in legend.items)
    shoal.window.appearance_actions["system"].trigger()
    assert shoal.appearance.mode == "system"


def card_image(card):
    from PySide6.QtGui import QImage, QPainter
    rect = card.boundingRect()
    image = QImage(int(rect.width()), int(rect.height()), QImage.Format.Format_ARGB32)
    image.fill(0)
    p = QPainter(image)
    p.translate(-rect.topLeft())
    card.paint(p, None)
    p.end()
    return image


def test_shortcuts_for_new_chat_model_picker_stop_and_tabs(qtbot, shoal):
    win, chat = shoal.window, shoal.chat
    win.activateWindow()
    qtbot.waitActive(win)
    before = len(shoal.store.conversations)
    qtbot.keyClick(win, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert len(shoal.store.conversations) == before + 1 and chat.prompt.hasFocus()
    qtbot.keyClick(win, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert win.tabs.currentWidget() is shoal.topology
    qtbot.keyClick(win, Qt.Key.Key_6, Qt.KeyboardModifier.ControlModifier)
    assert win.tabs.currentWidget() is shoal.developer
    qtbot.keyClick(win, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    assert win.tabs.currentWidget() is chat and chat.model_picker.hasFocus()
    stopped = []
    chat.stop = lambda: stopped.append(True)  # Esc asks the chat to stop its reply
    win.activateWindow()
    qtbot.keyClick(win, Qt.Key.Key_Escape)
    assert stopped == [True]
    assert [a.shortcut().toString() for a in (win.new_chat_action, win.model_action,
                                              win.stop_action)] == ["Ctrl+N", "Ctrl+L", "Esc"]


def test_ctrl_1_lands_in_the_message_box_and_tab_leaves_tables(qtbot, shoal):
    win, chat = shoal.window, shoal.chat
    win.activateWindow()
    qtbot.waitActive(win)
    chat.prompt.setFocus()
    qtbot.keyClicks(chat.prompt, "Anyone there?")
    qtbot.keyClick(chat.prompt, Qt.Key.Key_Return)  # no node: the reply fails, Try again
    qtbot.waitUntil(lambda: not chat.streaming, timeout=10000)
    reply = chat.view.widgets()[-1]
    chat.view.setFocus()
    qtbot.keyClick(chat.view, Qt.Key.Key_Up)
    assert reply.retry_button.hasFocus()  # where the keyboard was before leaving the tab
    qtbot.keyClick(win, Qt.Key.Key_6, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(win, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    assert win.tabs.currentWidget() is chat and chat.prompt.hasFocus()

    # The request log has a row of five cells: Tab leaves the table, not cell by cell.
    win.show_view("Developer")
    table = shoal.developer.log_table
    qtbot.waitUntil(lambda: table.rowCount() > 0, timeout=5000)
    table.setFocus()
    table.setCurrentCell(0, 0)
    qtbot.keyClick(table, Qt.Key.Key_Tab)
    assert not table.hasFocus()


def focusable(view: QWidget) -> list[QWidget]:
    return [w for w in view.findChildren(QWidget)
            if w.isVisibleTo(view) and w.isEnabled()
            and w.focusPolicy() & Qt.FocusPolicy.TabFocus and w.focusProxy() is None]


@pytest.mark.parametrize("title", ["Chat", "Models", "Topology", "Placement", "Developer"])
def test_tab_reaches_every_control_and_each_has_a_name(qtbot, shoal, title):
    win = shoal.window
    win.show_view(title)
    win.activateWindow()
    qtbot.waitActive(win)
    view = win.views[title]
    controls = focusable(view)
    assert controls
    for w in controls:
        iface = QAccessible.queryAccessibleInterface(w)
        name = iface.text(QAccessible.Text.Name) if iface else ""
        assert name.strip(), f"{type(w).__name__} {w.objectName()!r} has no accessible name"
    start = controls[0]
    start.setFocus(Qt.FocusReason.TabFocusReason)
    seen = set()
    for _ in range(len(controls) * 2 + 10):
        w = QApplication.focusWidget()
        seen.add(w)
        qtbot.keyClick(w, Qt.Key.Key_Tab)
    missed = [f"{type(w).__name__} {w.accessibleName() or getattr(w, 'text', str)()}"
              for w in controls if w not in seen]
    assert not missed, f"Tab never reaches: {missed}"


def test_developer_panel_gives_address_model_and_agent_settings(qtbot, shoal, port):
    dev = shoal.developer
    assert dev.address.text() == f"http://127.0.0.1:{port}/v1"
    dev.set_node_status({"state": "idle", "model": "SmolLM2-135M-Instruct", "runner": {
        "type": "Ready", "model": "SmolLM2-135M-Instruct", "context_length": 8192}})
    assert dev.model_field.text() == "SmolLM2-135M-Instruct"
    assert "None" in dev.key_state.text()
    from engine.connect import Target, render
    target = Target(f"http://127.0.0.1:{port}", "SmolLM2-135M-Instruct", 8192, False)
    for agent in ("claude", "codex", "opencode", "continue"):
        dev.agent_box.setCurrentIndex(dev.agent_box.findData(agent))
        assert dev.snippet.toPlainText() == render(agent, target)  # what `shoal connect` says
    dev.agent_box.setCurrentIndex(dev.agent_box.findData("openwebui"))
    assert f"http://127.0.0.1:{port}/v1" in dev.snippet.toPlainText()
    copy = [b for b in dev.findChildren(QAbstractButton) if b.accessibleName() ==
            "Copy the API address"][0]
    qtbot.mouseClick(copy, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == f"http://127.0.0.1:{port}/v1"

    # The chat's requests show in the log, a failed one with its reason.
    shoal.chat.prompt.setPlainText("Hi")
    shoal.chat.send()
    qtbot.waitUntil(lambda: dev.log_table.rowCount() == 1, timeout=10000)
    assert dev.log_table.item(0, 2).text() == "POST /v1/chat/completions"
    assert "Can't reach the node" in dev.log_table.item(0, 4).text()


def test_the_status_bar_says_in_words_that_the_node_is_down(qtbot, shoal):
    text = shoal.window.statusBar().findChild(QLabel, "nodeStatus")
    shoal.monitor.start()  # polls a port where nothing answers
    qtbot.waitUntil(lambda: "Can't reach the node on this computer" in text.text(),
                    timeout=10000)
    assert "Errno" not in text.text() and "127.0.0.1" not in text.text()
    note = text.parentWidget()
    assert note.details_button.isVisible() and not note.detail.isVisible()
    qtbot.mouseClick(note.details_button, Qt.MouseButton.LeftButton)
    assert note.detail.isVisible() and "Connection refused" in note.detail.text()


def test_tray_copies_the_api_url_and_shows_live_figures(qtbot, shoal, port):
    tray = shoal.tray
    tray.copy_url_action.trigger()
    assert QGuiApplication.clipboard().text() == f"http://127.0.0.1:{port}/v1"
    tray.set_status({"state": "generating", "model": "tiny",
                     "runner": {"type": "Ready", "model": "tiny"}})
    shoal.chat.reply_progress.emit(21, 1.0)  # a reply streaming now
    assert tray.model_action.text() == "Model: tiny · 20.0 tokens/s now"
    tray.set_watts(31.6)
    assert tray.model_action.text().endswith("· 32 W")
    shoal.models_view.download_progress.emit("Downloading Qwen3-4B-4bit: 42%")
    assert tray.download_action.isVisible() and "42%" in tray.download_action.text()
    shoal.models_view.download_progress.emit(None)
    assert not tray.download_action.isVisible()


def test_the_macos_menubar_icon_is_a_template(qapp):
    from app.tray import Tray
    tray = Tray(available=False, template=True)
    icon = tray.icons["idle"]
    assert icon.isMask()
    image = icon.pixmap(64, 64).toImage()
    colours = {image.pixelColor(x, y).name() for x in range(0, 64, 4) for y in range(0, 64, 4)
               if image.pixelColor(x, y).alpha() > 128}
    assert colours == {"#000000"}  # black on transparency: macOS tints it
    assert not Tray(available=False, template=False).icons["idle"].isMask()


def test_every_settings_control_has_a_name(qtbot, shoal):
    shoal.open_settings("Cluster")
    dialog = shoal.settings_dialog
    assert dialog.tabs.tabText(dialog.tabs.currentIndex()) == "Cluster"
    for i in range(dialog.tabs.count()):
        dialog.tabs.setCurrentIndex(i)
        for w in focusable(dialog.tabs.currentWidget()):
            iface = QAccessible.queryAccessibleInterface(w)
            assert iface and iface.text(QAccessible.Text.Name).strip(), \
                f"{dialog.tabs.tabText(i)}: {type(w).__name__} has no accessible name"
    # Appearance is one of the settings, applied at once.
    box = dialog.appearance_box
    box.setCurrentIndex(box.findData("dark"))
    assert theme.is_dark(QApplication.instance().palette())
    assert shoal.window.appearance_actions["dark"].isChecked()
    dialog.close()
