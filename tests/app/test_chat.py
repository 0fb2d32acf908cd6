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
    qtbot.waitUntil(lambda: tiny_node.client.status().state != "generating", timeout=10000)
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


def test_code_blocks_are_rendered_apart_highlighted_and_copied(qtbot, make_pane, dead_url):
    from PySide6.QtGui import QFontDatabase, QGuiApplication

    from app.messages import CodeBlock, MessageWidget
    text = "Try this:\n```python\ndef hi():\n    print('hi')  # say it\n```\nThen run it."
    w = MessageWidget(Message("assistant", text))
    qtbot.addWidget(w)
    kinds = [(type(s).__name__, s.plain() if hasattr(s, "plain") else s.text())
             for s in w.segments]
    assert kinds == [("ProseLabel", "Try this:"),
                     ("CodeBlock", "def hi():\n    print('hi')  # say it"),
                     ("ProseLabel", "Then run it.")]
    (block,) = w.code_blocks()
    assert isinstance(block, CodeBlock) and block.language_label.text() == "Python"
    assert block.view.font() == QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    # Keywords, strings and comments each have their own colour.
    first, second = block.view.document().firstBlock(), block.view.document().lastBlock()
    colours = {second.text()[f.start:f.start + f.length]: f.format.foreground().color().name()
               for f in second.layout().formats()}
    assert len({colours["'hi'"], colours["# say it"]}) == 2
    assert any(second.text()[f.start:f.start + f.length] == "print"
               for f in second.layout().formats())
    assert first.layout().formats()[0].format.fontWeight() > 400  # "def"
    qtbot.mouseClick(block.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "def hi():\n    print('hi')  # say it"
    assert block.copy_button.text() == "Copied"  # it says so, then goes back
    qtbot.waitUntil(lambda: block.copy_button.text() == "Copy", timeout=3000)
    qtbot.mouseClick(w.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == text

    # A reply still streaming: the open fence is code up to the end, and it grows there.
    w.message.content = "Look:\n```\nx = 1"
    w.refresh()
    assert [type(s).__name__ for s in w.segments] == ["ProseLabel", "CodeBlock"]
    w.message.content += "\ny = 2\n```\n"
    w.refresh()
    assert w.code_blocks()[0].text() == "x = 1\ny = 2"


def test_markdown_is_rendered_and_a_models_html_is_not(qtbot):
    from app.messages import MessageWidget
    text = "# Steps\n\n1. **Bold** and `code`\n2. <b>not bold</b> <script>x</script>"
    w = MessageWidget(Message("assistant", text))
    qtbot.addWidget(w)
    shown = w.text()
    assert "Steps" in shown and "#" not in shown and "**" not in shown
    assert "<b>not bold</b>" in shown and "<script>x</script>" in shown  # shown as written
    html = w.segments[0].text()
    assert "font-weight:700" in html and "&lt;b&gt;not bold&lt;/b&gt;" in html
    assert "<b>" not in html and "<script>" not in html
    assert w.accessibleName() == "Reply" and "Bold" in w.accessibleDescription()


def test_reasoning_is_folded_away_and_opens(qtbot):
    from app.messages import MessageWidget
    m = Message("assistant", "It is 4.")
    m.reasoning = "Two plus two: count on from two."
    w = MessageWidget(m)
    qtbot.addWidget(w)
    w.show()
    assert w.reasoning_button.isVisible() and "7 words" in w.reasoning_button.text()
    assert not w.reasoning_label.isVisible() and w.text() == "It is 4."
    qtbot.mouseClick(w.reasoning_button, Qt.MouseButton.LeftButton)
    assert w.reasoning_label.isVisible() and "count on" in w.reasoning_label.text()


class Scripted:
    """A node client whose one chat answers as told: prefill progress, then waits for
    `go`, then text with the node's own figures."""

    def __init__(self):
        import threading
        self.go = threading.Event()

    def chat(self, messages, model=None, **params):
        from engine.client import ChatDelta
        yield ChatDelta(prefill=(40, 60, 100))
        self.go.wait(20)
        yield ChatDelta(text="Hello", shoal={"ttft_s": 0.1, "generation_tps": 30.0})
        yield ChatDelta(text=" there", finish_reason="stop",
                        usage={"completion_tokens": 2, "prompt_tokens": 100})


def test_a_waiting_reply_says_what_it_waits_for_and_the_real_wait(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.client = Scripted()
    loading = {"state": "loading", "model": "m",
               "runner": {"type": "Loading", "model": "m", "layers_done": 3,
                          "layers_total": 12}}
    pane.set_node_status(loading)
    assert pane.model_state.text() == "Loading 3/12 layers…"
    type_and_send(qtbot, pane, "Hi")
    reply = last_reply(pane)
    qtbot.waitUntil(lambda: "100 tokens" in reply.pending_label.text(), timeout=5000)
    assert "60/100" in reply.pending_label.text() and "40 from the cache" in \
        reply.pending_label.text()
    pane.set_node_status(loading)
    assert "loading 3/12 layers" in reply.pending_label.text()
    qtbot.wait(300)
    pane.set_node_status({"state": "idle", "model": "m", "runner": {
        "type": "Ready", "model": "m", "context_length": 8192}})
    pane.client.go.set()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    assert not reply.pending_label.isVisible() and reply.text() == "Hello there"
    stats = reply.stats_label.text()
    # The wait the user had, not the node's 0.1 s, and how much of it was the loading.
    assert "first token after 0.1" not in stats and "first token after" in stats
    assert "loading the model" in stats
    assert reply.message.stats["wait_s"] >= 0.3 and reply.message.stats["ttft_s"] == 0.1


def test_a_reply_at_the_default_length_offers_continue(qtbot, make_pane, tiny_node):
    pane = make_pane(tiny_node)
    assert pane.chat_params == {"max_tokens": 1024}  # bounded by default
    pane.client = Recording(tiny_node.client)
    pane.max_tokens.setValue(8)
    type_and_send(qtbot, pane, "Tell me a long story")
    qtbot.waitUntil(lambda: not pane.streaming, timeout=30000)
    reply = last_reply(pane)
    first = reply.message.content
    assert "length limit" in reply.stats_label.text()
    assert reply.continue_button.isVisible()

    qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    assert pane.streaming and not reply.continue_button.isVisible()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=30000)
    sent = pane.client.sent[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": first.rstrip()}
    assert sent["continue_final"] is True  # the same message goes on (test_continue_final)
    conv = pane.current()
    assert [m.role for m in conv.messages] == ["user", "assistant"]  # the same bubble
    assert reply.message.content.startswith(first) and len(reply.message.content) > len(first)
    assert "16 tokens" in reply.stats_label.text()


def test_tab_leaves_the_message_box_and_reaches_the_buttons(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.activateWindow()
    pane.prompt.setFocus()
    qtbot.waitUntil(pane.prompt.hasFocus, timeout=3000)
    qtbot.keyClick(pane.prompt, Qt.Key.Key_Tab)
    assert pane.prompt.toPlainText() == "" and pane.send_button.hasFocus()
    seen = set()
    for _ in range(30):  # the whole chain comes round again
        w = pane.focusWidget()
        seen.add(w)
        qtbot.keyClick(w, Qt.Key.Key_Tab)
    wanted = {pane.conversation_list, pane.new_button, pane.delete_button,
              pane.model_picker, pane.system_edit, pane.temperature, pane.top_p,
              pane.max_tokens, pane.prompt, pane.send_button}
    focused = {w if w in wanted else w.parent() for w in seen}  # a combo's or box's editor
    assert wanted <= focused


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
    assert pane.chat_params == {"max_tokens": 1024}  # the rest start at the node's default
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


def test_the_stats_line_gives_the_wait_from_send():
    from app.messages import format_stats
    assert format_stats({"generation_tps": 41.25, "wait_s": 6.3, "ttft_s": 1.15,
                         "load_s": 5.14, "completion_tokens": 64}) == (
        "41.2 tokens/s · first token after 6.30 s (5.1 s of it loading the model) · 64 tokens")
    # A status poll may see the model ready a moment after the first token came.
    assert "(3.8 s of it loading" in format_stats({"wait_s": 3.85, "load_s": 3.91})
    assert format_stats({"ttft_s": 0.2, "finish_reason": "length"}) == (
        "Stopped at the length limit · first token after 0.20 s")
    # Speculative decoding ran: how many of its guesses the model kept.
    assert format_stats({"completion_tokens": 40, "drafted_tokens": 30,
                         "accepted_tokens": 24}) == "40 tokens · 24 of 30 drafted tokens kept"
    assert "drafted" not in format_stats({"completion_tokens": 40, "drafted_tokens": 0})


def test_the_developer_log_shows_every_clients_requests_from_the_node(qtbot, tiny_node):
    """The Developer panel reads the node's own request log: another client's request
    shows with its client name, and a refused one with the reason, never its body."""
    import httpx

    from app.developer import DeveloperPanel

    tasks = Tasks()
    dev = DeveloperPanel(tiny_node.url, None, tasks=tasks)
    qtbot.addWidget(dev)
    dev.show()
    r = httpx.post(tiny_node.url + "/v1/chat/completions", timeout=30,
                   headers={"User-Agent": "my-agent/1.0"},
                   json={"model": "tiny-llama", "messages": [{"role": "user",
                                                                "content": "secret words"}],
                         "temperature": 9})
    assert r.status_code == 400

    def row() -> list[str] | None:
        for i in range(dev.log_table.rowCount()):
            cells = [dev.log_table.item(i, j).text() for j in range(5)]
            if cells[1] == "my-agent/1.0":
                return cells
        return None
    qtbot.waitUntil(lambda: row() is not None, timeout=10000)
    cells = row()
    assert cells[2] == "POST /v1/chat/completions" and cells[3] == "400"
    assert "temperature" in cells[4] and "secret" not in " ".join(cells)
    dev.hide()
    assert tasks.wait(20000)
