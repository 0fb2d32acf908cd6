"""Nothing in the chat is lost by one click or one key: a deleted conversation comes back
with Undo, a message sent while a reply streams waits its turn, a failed reply is tried
again once the node answers (a real node killed with SIGKILL and started again), a
stopped reply keeps its speed (and its point on the charts) and continues cleanly."""

import os
import signal
import threading

from PySide6.QtCore import Qt

from app import chat as chat_module
from app.charts import ChartsView
from app.conversations import ConversationStore, Message
from app.metrics import Metrics
from engine.client import ChatDelta
from tests.app import test_chat
from tests.app.test_chat import last_reply, type_and_send
from tests.nodes import NodeProcess

make_pane, dead_url = test_chat.make_pane, test_chat.dead_url  # its fixtures


class Script:
    """A node client whose chats answer as each test says: `replies` are lists of text
    pieces, streamed one by one; `hold` pauses before the first piece, `pace` between
    pieces (until Stop); every request's messages are kept."""

    def __init__(self, *replies, pace=0.0):
        self.replies, self.pace, self.sent = list(replies), pace, []
        self.hold = threading.Event()
        self.hold.set()

    def chat(self, messages, model=None, **params):
        pieces = self.replies.pop(0) if self.replies else ["ok"]
        self.sent.append(messages)  # after taking its answer: tests wait on this
        self.hold.wait(20)
        for i, text in enumerate(pieces):
            last = i == len(pieces) - 1
            yield ChatDelta(text=text, finish_reason="stop" if last else None,
                            shoal={"generation_tps": 30.0} if last else {},
                            usage={"completion_tokens": len(pieces)} if last else None)
            if self.pace:
                threading.Event().wait(self.pace)

    def models(self):
        return []


def titles(pane):
    return [pane.conversation_list.item(i).text() for i in range(pane.conversation_list.count())]


def test_a_deleted_conversation_comes_back_with_undo(qtbot, make_pane, home, dead_url,
                                                     monkeypatch):
    store = ConversationStore(home)
    for title in ("Oldest", "Middle", "Newest"):
        store.new().title = title
        store.conversations[0].messages.append(Message("user", f"about {title}"))
    store.save()
    pane = make_pane(url=dead_url)
    pane.conversation_list.setCurrentRow(1)

    qtbot.mouseClick(pane.delete_button, Qt.MouseButton.LeftButton)
    assert titles(pane) == ["Newest", "Oldest"]
    assert [c.title for c in ConversationStore(home).conversations] == ["Newest", "Oldest"]
    bar = pane.undo_bar
    assert bar.isVisible() and "Middle" in bar.label.text() and bar.button.text() == "Undo"
    assert 9000 < bar.remaining_ms() <= 11000  # about ten seconds to change one's mind

    qtbot.mouseClick(bar.button, Qt.MouseButton.LeftButton)
    assert titles(pane) == ["Newest", "Middle", "Oldest"] and not bar.isVisible()
    assert pane.current().title == "Middle"
    assert [w.text() for w in pane.view.widgets()] == ["about Middle"]
    assert [c.title for c in ConversationStore(home).conversations] == [
        "Newest", "Middle", "Oldest"]

    # Unused, the offer goes by itself.
    monkeypatch.setattr(chat_module, "UNDO_MS", 200)
    qtbot.mouseClick(pane.delete_button, Qt.MouseButton.LeftButton)
    assert bar.isVisible()
    qtbot.waitUntil(lambda: not bar.isVisible(), timeout=3000)


def test_enter_while_a_reply_streams_queues_the_message(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.client = Script(["First", " answer"], ["Second", " answer"])
    pane.client.hold.clear()
    pane.activateWindow()
    qtbot.waitUntil(pane.isActiveWindow, timeout=3000)
    type_and_send(qtbot, pane, "one")
    assert pane.streaming
    type_and_send(qtbot, pane, "two")
    assert pane.prompt.toPlainText() == "" and pane.prompt.hasFocus()
    assert pane.queued_bar.isVisible() and "“two”" in pane.queued_bar.label.text()
    assert "sent when this reply ends" in pane.queued_bar.label.text()
    assert [m.content for m in pane.current().messages] == ["one", ""]  # not sent yet

    pane.client.hold.set()
    qtbot.waitUntil(lambda: len(pane.current().messages) == 4 and not pane.streaming,
                    timeout=10000)
    assert [m.content for m in pane.current().messages] == [
        "one", "First answer", "two", "Second answer"]
    assert not pane.queued_bar.isVisible()
    assert pane.client.sent[1][-2:] == [{"role": "assistant", "content": "First answer"},
                                        {"role": "user", "content": "two"}]

    # Cancel puts the queued text back in the message box, unsent.
    pane.client.hold.clear()
    type_and_send(qtbot, pane, "three")
    type_and_send(qtbot, pane, "four")
    qtbot.mouseClick(pane.queued_bar.button, Qt.MouseButton.LeftButton)
    assert pane.prompt.toPlainText() == "four" and not pane.queued_bar.isVisible()
    pane.client.hold.set()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    assert len(pane.client.sent) == 3 and pane.prompt.toPlainText() == "four"


class Failing(Script):
    def chat(self, messages, model=None, **params):
        from engine.errors import PeerUnreachable
        self.sent.append(messages)
        self.hold.wait(20)
        raise PeerUnreachable("connection refused")
        yield


def test_a_queued_message_after_a_failed_reply_goes_back_to_the_box(qtbot, make_pane,
                                                                    dead_url):
    pane = make_pane(url=dead_url)
    pane.client = Failing()
    pane.client.hold.clear()
    type_and_send(qtbot, pane, "one")
    type_and_send(qtbot, pane, "two")
    pane.client.hold.set()
    qtbot.waitUntil(lambda: pane.prompt.toPlainText() == "two", timeout=10000)
    assert "wasn't sent: the reply before it failed" in pane.queued_bar.label.text()
    assert len(pane.client.sent) == 1 and not pane.streaming


def test_a_stopped_reply_keeps_its_speed_counts_in_the_charts_and_continues(
        qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    metrics = Metrics()
    charts = ChartsView(metrics)
    qtbot.addWidget(charts)
    pane.reply_finished.connect(metrics.add_request)  # as the app wires them
    pane.reply_ended.connect(metrics.end_live)
    words = ["The"] + [" word"] * 400
    pane.client = Script(words, [" and the end."], pace=0.02)
    type_and_send(qtbot, pane, "Talk")
    reply = last_reply(pane)
    # While it streams, the speed so far is under the reply.
    qtbot.waitUntil(lambda: "tokens/s so far" in reply.stats_label.text(), timeout=10000)
    assert pane.streaming

    qtbot.mouseClick(pane.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    stats = reply.stats_label.text()
    assert stats.startswith("Stopped · ") and "tokens/s" in stats and "so far" not in stats
    assert reply.continue_button.isVisible()
    charts.tick()
    assert len(charts.tps_curve.getData()[1]) == 1  # the stopped reply has its point
    assert not charts.tps.empty_label.isVisible()

    before = reply.message.content
    assert before.endswith("word")
    qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    # The model goes on with the same message (tests/app/test_continue_final.py).
    assert reply.message.content == before + " and the end."
    assert pane.client.sent[-1][-1] == {"role": "assistant", "content": before}
    assert "Stopped" not in reply.stats_label.text()
    assert [m.role for m in pane.current().messages] == ["user", "assistant"]


def test_a_failed_reply_is_tried_again_when_the_node_is_back(qtbot, make_pane, fresh_node):
    """The app's own node killed mid-reply: the reply fails with Try again, which waits
    while nothing answers and sends the conversation when the node is back."""
    pane = make_pane(url=fresh_node.url)
    pane.chat_params = {"max_tokens": 4096}
    type_and_send(qtbot, pane, "Tell me a long story")
    reply = last_reply(pane)
    qtbot.waitUntil(lambda: reply.text() != "", timeout=60000)
    os.killpg(fresh_node.proc.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: not pane.streaming, timeout=20000)
    assert reply.error_label.isVisible() and reply.retry_button.isVisible()
    assert not reply.continue_button.isVisible()

    pane.set_node_status({"state": "unreachable"})  # what the status poll says now
    qtbot.mouseClick(reply.retry_button, Qt.MouseButton.LeftButton)
    assert "Waiting for Shoal's node" in reply.pending_label.text() and not pane.streaming

    again = NodeProcess(fresh_node.home, "tiny-llama", port=fresh_node.port)
    try:
        status = again.wait_healthy().wait_ready()
        pane.chat_params = {"max_tokens": 8}
        pane.set_node_status(status.to_json())
        assert pane.streaming
        qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)
        conv = pane.current()
        assert [m.role for m in conv.messages] == ["user", "assistant"]  # no failed one left
        answer = last_reply(pane)
        assert answer.text() != "" and not answer.error_label.isVisible()
        assert "8 tokens" in answer.stats_label.text()
    finally:
        again.stop()


def test_a_reply_cut_by_the_apps_node_restart_offers_try_again(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.client = Script(["never"], ["Back", " again"])
    pane.client.hold.clear()
    type_and_send(qtbot, pane, "Hello")
    reply = last_reply(pane)
    qtbot.waitUntil(lambda: len(pane.client.sent) == 1, timeout=5000)  # it took "never"
    pane.node_lost("Shoal's node stopped; Shoal is starting it again.")
    assert not pane.streaming and pane.send_button.isEnabled()
    assert reply.error_label.text().startswith("Shoal's node stopped; Shoal is starting it")
    qtbot.mouseClick(reply.retry_button, Qt.MouseButton.LeftButton)
    assert not pane.streaming  # nothing answers yet: it waits
    pane.client.hold.set()
    pane.node_back()
    qtbot.waitUntil(lambda: not pane.streaming and last_reply(pane).text() == "Back again",
                    timeout=10000)
    assert [m.content for m in pane.current().messages] == ["Hello", "Back again"]
