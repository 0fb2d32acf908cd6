"""The chat by keyboard: Tab goes control to control and skips every message's buttons
(Copy, Continue, Try again, a code block's Copy), the arrow keys reach those from the
conversation, and the keyboard is back in the message box after sending."""

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.codeblock import CodeView
from app.conversations import ConversationStore, Message
from tests.app import test_chat
from tests.app.test_chat_recovery import Script

make_pane, dead_url = test_chat.make_pane, test_chat.dead_url  # its fixtures


def pane_with_a_reply(make_pane, home, url):
    store = ConversationStore(home)
    conv = store.new()
    conv.title = "Code"
    conv.messages += [Message("user", "Show me code"),
                      Message("assistant", "Here:\n```python\nx = 1\n```\nDone",
                              stats={"finish_reason": "length", "completion_tokens": 9})]
    store.save()
    return make_pane(url=url)


def active(qtbot, pane):
    pane.activateWindow()
    qtbot.waitUntil(pane.isActiveWindow, timeout=3000)


def test_tab_skips_message_buttons_and_arrows_reach_them(qtbot, make_pane, home, dead_url):
    pane = pane_with_a_reply(make_pane, home, dead_url)
    active(qtbot, pane)
    reply = pane.view.widgets()[-1]
    buttons = pane.view.buttons()
    assert reply.continue_button in buttons and reply.code_blocks()[0].copy_button in buttons

    pane.conversation_list.setFocus()
    seen = []
    for _ in range(40):
        w = QApplication.focusWidget()
        seen.append(w)
        qtbot.keyClick(w, Qt.Key.Key_Tab)
    assert pane.view in seen and pane.prompt in seen
    assert not [w for w in seen if w in buttons or isinstance(w, CodeView)]

    # From the conversation, Up reaches the newest message's last button, then the ones
    # before it; Enter presses the focused one; Tab goes on to the message box.
    pane.view.setFocus()
    qtbot.keyClick(pane.view, Qt.Key.Key_Up)
    assert reply.continue_button.hasFocus()
    qtbot.keyClick(reply.continue_button, Qt.Key.Key_Up)
    code_copy = reply.code_blocks()[0].copy_button
    assert code_copy.hasFocus()
    qtbot.keyClick(code_copy, Qt.Key.Key_Return)
    assert QGuiApplication.clipboard().text() == "x = 1"
    qtbot.keyClick(code_copy, Qt.Key.Key_Down)
    assert reply.continue_button.hasFocus()
    qtbot.keyClick(reply.continue_button, Qt.Key.Key_Tab)
    assert pane.prompt.hasFocus()


def test_the_keyboard_is_back_in_the_message_box_after_sending(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.client = Script(["Hi"])
    active(qtbot, pane)
    pane.prompt.setFocus()
    qtbot.keyClicks(pane.prompt, "Hello")
    qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    assert pane.prompt.hasFocus() and pane.prompt.toPlainText() == ""
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    assert pane.prompt.hasFocus()


def test_only_the_newest_reply_offers_continue_or_try_again(qtbot, make_pane, home, dead_url):
    store = ConversationStore(home)
    conv = store.new()
    conv.messages += [Message("user", "a"), Message("assistant", "", error="It failed."),
                      Message("user", "b"), Message("assistant", "cut", stats={
                          "finish_reason": "length"})]
    store.save()
    pane = make_pane(url=dead_url)
    old, new = pane.view.widgets()[1], pane.view.widgets()[3]
    assert old.error_label.isVisible() and not old.retry_button.isVisible()
    assert new.continue_button.isVisible()
    # What the arrow keys walk: each message's Copy, then the newest one's Continue.
    assert pane.view.buttons() == [*(w.copy_button for w in pane.view.widgets()),
                                   new.continue_button]
