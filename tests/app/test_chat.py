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
    assert you.text() == "Hello there" and pane.prompt.toPlainText() == ""
    assert pane.stop_button.isEnabled() and not pane.send_button.isEnabled()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)
    assert reply.text() != "" and not reply.error_label.isVisible()
    stats = reply.stats_label.text()
    assert "tokens/s" in stats and "first token" in stats and "8 tokens" in stats
    assert pane.send_button.isEnabled()
    assert pane.conversation_list.currentItem().text() == "Hello there"

    # The conversation, reply and figures are there after a restart.
    conv = ConversationStore(home).conversations[0]
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1].content == reply.text()
    assert conv.messages[1].stats["completion_tokens"] == 8


def test_stop_ends_a_long_generation(qtbot, make_pane, tiny_node):
    pane = make_pane(tiny_node)
    pane.chat_params = {"max_tokens": 4096}
    type_and_send(qtbot, pane, "Tell me a long story")
    reply = last_reply(pane)
    qtbot.waitUntil(lambda: reply.text() != "", timeout=60000)
    assert pane.streaming

    qtbot.mouseClick(pane.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.send_button.isEnabled(), timeout=10000)
    shown = reply.text()
    assert "Stopped" in reply.stats_label.text() and not reply.error_label.isVisible()
    # The node stopped too, long before 4096 pieces.
    qtbot.waitUntil(lambda: tiny_node.client.status()["state"] != "generating", timeout=10000)
    assert reply.text() == shown
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
    assert [w.text() for w in pane.view.widgets()] == ["second question", "answer"]

    pane.conversation_list.setCurrentRow(1)
    assert [w.text() for w in pane.view.widgets()] == ["first question"]

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


def test_code_blocks_are_rendered_apart_and_copied(qtbot, make_pane, dead_url):
    from PySide6.QtGui import QFontDatabase, QGuiApplication

    from app.messages import CodeBlock, MessageWidget
    text = "Try this:\n```python\nprint('hi')\n```\nThen run it."
    w = MessageWidget(Message("assistant", text))
    qtbot.addWidget(w)
    kinds = [(type(s).__name__, s.text()) for s in w.segments]
    assert kinds == [("QLabel", "Try this:"), ("CodeBlock", "print('hi')"),
                     ("QLabel", "Then run it.")]
    (block,) = w.code_blocks()
    assert isinstance(block, CodeBlock)
    assert block.label.font() == QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    qtbot.mouseClick(block.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "print('hi')"
    qtbot.mouseClick(w.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == text

    # A reply still streaming: the open fence is code up to the end, and it grows there.
    w.message.content = "Look:\n```\nx = 1"
    w.refresh()
    assert [type(s).__name__ for s in w.segments] == ["QLabel", "CodeBlock"]
    w.message.content += "\ny = 2\n```\n"
    w.refresh()
    assert w.code_blocks()[0].text() == "x = 1\ny = 2"


class Recording:
    """A NodeClient that remembers what each chat request sent."""

    def __init__(self, client):
        self.client, self.sent = client, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def chat(self, messages, model=None, **params):
        self.sent.append({"messages": messages, "model": model, **params})
        return self.client.chat(messages, model=model, **params)


def test_system_prompt_sampling_and_regenerate(qtbot, make_pane, tiny_node, home):
    pane = make_pane(tiny_node)
    pane.client = Recording(tiny_node.client)
    assert pane.chat_params == {}  # every box starts at the node's default
    pane.max_tokens.setValue(4)
    pane.temperature.setValue(0.0)
    pane.top_p.setValue(0.9)
    assert pane.chat_params == {"max_tokens": 4, "temperature": 0.0, "top_p": 0.9}
    pane.top_p.setValue(pane.top_p.minimum())
    assert "top_p" not in pane.chat_params and pane.top_p.text() == "node default"
    pane.system_edit.setText("Answer in one word.")

    type_and_send(qtbot, pane, "Hello")
    qtbot.waitUntil(lambda: not pane.streaming, timeout=30000)
    first = last_reply(pane)
    assert first.text() != "" and "4 tokens" in first.stats_label.text()
    first_text = first.text()
    sent = pane.client.sent[-1]
    assert sent["messages"] == [{"role": "system", "content": "Answer in one word."},
                                {"role": "user", "content": "Hello"}]
    assert sent["max_tokens"] == 4 and sent["temperature"] == 0.0
    assert pane.regenerate_button.isEnabled()

    qtbot.mouseClick(pane.regenerate_button, Qt.MouseButton.LeftButton)
    assert pane.streaming
    qtbot.waitUntil(lambda: not pane.streaming, timeout=30000)
    conv = pane.current()
    assert [m.role for m in conv.messages] == ["user", "assistant"]  # replaced, not added
    assert pane.client.sent[-1]["messages"] == sent["messages"]
    assert conv.messages[1].content == first_text  # greedy: the same answer again
    assert last_reply(pane).text() == first_text and "4 tokens" in \
        last_reply(pane).stats_label.text()
    assert "tokens cached" in last_reply(pane).stats_label.text()  # the resend hit the cache
    assert ConversationStore(home).conversations[0].system == "Answer in one word."
