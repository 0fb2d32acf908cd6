"""The chat pane, driven the way a user drives it, against the real tiny-model node
(`tiny_node` from tests/conftest.py, shared by the session: these tests don't change it)."""

import pytest
from PySide6.QtCore import Qt

from app.chat import ChatPane
from app.conversations import ConversationStore, Message
from app.tasks import Tasks
from engine.client import NodeClient


@pytest.fixture
def make_pane(qtbot, home):
    tasks = Tasks()
    own_clients = []

    def make(node=None, url=None):
        if node is not None:
            client = node.client
        else:
            client = NodeClient(url)
            own_clients.append(client)
        pane = ChatPane(client, ConversationStore(home), tasks)
        qtbot.addWidget(pane)
        pane.resize(800, 500)
        pane.show()
        return pane

    yield make
    tasks.cancel_streams()
    assert tasks.wait(20000)
    for client in own_clients:
        client.close()


@pytest.fixture
def dead_url(port):
    return f"http://127.0.0.1:{port}"  # nothing listens there


def type_and_send(qtbot, pane, text):
    pane.prompt.setFocus()
    qtbot.keyClicks(pane.prompt, text)
    qtbot.keyClick(pane.prompt, Qt.Key.Key_Return)


def last_reply(pane):
    return pane.view.widgets()[-1]


def test_send_streams_a_reply_with_its_speed(qtbot, make_pane, tiny_node, home):
    pane = make_pane(tiny_node)
    pane.chat_params = {"max_tokens": 8, "temperature": 0.0}
    type_and_send(qtbot, pane, "Hello there")

    you, reply = pane.view.widgets()
    assert you.text_label.text() == "Hello there" and pane.prompt.toPlainText() == ""
    assert pane.stop_button.isEnabled() and not pane.send_button.isEnabled()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)
    assert reply.text_label.text() != "" and not reply.error_label.isVisible()
    stats = reply.stats_label.text()
    assert "tokens/s" in stats and "first token" in stats and "8 tokens" in stats
    assert pane.send_button.isEnabled()
    assert pane.conversation_list.currentItem().text() == "Hello there"

    # The conversation, reply and figures are there after a restart.
    conv = ConversationStore(home).conversations[0]
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1].content == reply.text_label.text()
    assert conv.messages[1].stats["completion_tokens"] == 8


def test_stop_ends_a_long_generation(qtbot, make_pane, tiny_node):
    pane = make_pane(tiny_node)
    pane.chat_params = {"max_tokens": 4096}
    type_and_send(qtbot, pane, "Tell me a long story")
    reply = last_reply(pane)
    qtbot.waitUntil(lambda: reply.text_label.text() != "", timeout=60000)
    assert pane.streaming

    qtbot.mouseClick(pane.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.send_button.isEnabled(), timeout=10000)
    shown = reply.text_label.text()
    assert "Stopped" in reply.stats_label.text() and not reply.error_label.isVisible()
    # The node stopped too, long before 4096 pieces.
    qtbot.waitUntil(lambda: tiny_node.client.status()["state"] != "generating", timeout=10000)
    assert reply.text_label.text() == shown
    assert len(shown.split()) < 4096


def test_unknown_model_is_an_inline_error(qtbot, make_pane, tiny_node):
    pane = make_pane(tiny_node)
    edit = pane.model_picker.lineEdit()
    edit.selectAll()
    qtbot.keyClicks(edit, "no-such-model")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: pane.error_label.isVisible(), timeout=30000)
    assert "no-such-model" in pane.error_label.text()

    # Chatting with it fails inline on the reply, and the pane stays usable.
    type_and_send(qtbot, pane, "Hi")
    qtbot.waitUntil(lambda: not pane.streaming, timeout=30000)
    assert last_reply(pane).error_label.isVisible()
    assert pane.send_button.isEnabled()


def test_unreachable_node_is_an_inline_error(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    type_and_send(qtbot, pane, "Anyone there?")
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    error = last_reply(pane).error_label
    assert error.isVisible() and "Can't reach the node" in error.text()
    assert pane.send_button.isEnabled()


def test_shift_enter_is_a_new_line(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.prompt.setFocus()
    qtbot.keyClicks(pane.prompt, "line one")
    qtbot.keyClick(pane.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(pane.prompt, "line two")
    assert pane.prompt.toPlainText() == "line one\nline two"
    assert pane.view.widgets() == [] and not pane.streaming


def test_conversations_new_select_delete(qtbot, make_pane, home, dead_url):
    store = ConversationStore(home)
    older = store.new()
    older.title = "Older"
    older.messages.append(Message("user", "first question"))
    newer = store.new()
    newer.title = "Newer"
    newer.messages += [Message("user", "second question"), Message("assistant", "answer")]
    store.save()

    pane = make_pane(url=dead_url)
    titles = [pane.conversation_list.item(i).text() for i in range(pane.conversation_list.count())]
    assert titles == ["Newer", "Older"]
    assert [w.text_label.text() for w in pane.view.widgets()] == ["second question", "answer"]

    pane.conversation_list.setCurrentRow(1)
    assert [w.text_label.text() for w in pane.view.widgets()] == ["first question"]

    qtbot.mouseClick(pane.delete_button, Qt.MouseButton.LeftButton)
    assert pane.conversation_list.count() == 1 and pane.current().title == "Newer"
    assert [c.title for c in ConversationStore(home).conversations] == ["Newer"]

    qtbot.mouseClick(pane.new_button, Qt.MouseButton.LeftButton)
    assert pane.conversation_list.count() == 2 and pane.view.widgets() == []
    assert pane.conversation_list.currentRow() == 0
    assert len(ConversationStore(home).conversations) == 2


def test_corrupt_conversations_file_is_reported_in_the_pane(qtbot, make_pane, home, dead_url):
    (home / "conversations.json").write_text("{oops")
    pane = make_pane(url=dead_url)
    assert pane.error_label.isVisible() and "couldn't be read" in pane.error_label.text()
    assert list(home.glob("conversations.json.corrupt-*"))
