"""The chat's Continue goes on with the same message: the stopped reply is sent as the
assistant's unfinished last turn (continue_final_message, no generation prompt), not a
hidden user turn, and what the model says is added to it as it is. Against the real
tiny-model node, whose greedy answer cut at 8 tokens and continued reads exactly as the
16-token answer in one go."""

from __future__ import annotations

import json
import threading

import httpx
from PySide6.QtCore import Qt

from engine.client import ChatDelta
from tests.app import test_chat
from tests.app.test_chat import last_reply, type_and_send

make_pane, dead_url = test_chat.make_pane, test_chat.dead_url  # its fixtures
ASK = "Tell me a long story"


def test_continue_sends_the_reply_as_the_unfinished_last_turn(qtbot, make_pane, tiny_node):
    pane = make_pane(url=tiny_node.url)
    bodies: list[dict] = []
    lock = threading.Lock()

    def record(request: httpx.Request) -> None:
        if request.url.path == "/v1/chat/completions":
            with lock:
                bodies.append(json.loads(request.content))
    pane.client._http.event_hooks["request"].append(record)
    pane.chat_params = {"max_tokens": 8, "temperature": 0.0}
    type_and_send(qtbot, pane, ASK)
    qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)
    reply = last_reply(pane)
    first = reply.message.content
    assert reply.continue_button.isVisible() and first

    qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    assert pane.streaming and not reply.continue_button.isVisible()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)
    sent = bodies[-1]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["messages"] == [{"role": "user", "content": ASK},
                                {"role": "assistant", "content": first.rstrip()}]
    conv = pane.current()
    assert [m.role for m in conv.messages] == ["user", "assistant"]  # the same bubble

    whole = httpx.post(tiny_node.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": ASK}], "max_tokens": 16,
        "temperature": 0.0}).json()["choices"][0]["message"]["content"]
    assert reply.message.content == whole != first  # the same message, gone on
    assert "16 tokens" in reply.stats_label.text()


class Script:
    """A node client whose first chat stops with trailing blank lines and whose second
    goes on; every request's messages and parameters are kept."""

    def __init__(self) -> None:
        self.answers = [["Para one.", "\n\n"], ["\n\nPara two."]]
        self.sent: list[tuple[list, dict]] = []

    def chat(self, messages, model=None, **params):
        self.sent.append((messages, params))
        pieces = self.answers.pop(0)
        for i, text in enumerate(pieces):
            yield ChatDelta(text=text, finish_reason="length" if i == len(pieces) - 1
                            else None, shoal={}, usage=None)


def test_the_text_goes_on_as_the_model_writes_it(qtbot, make_pane, dead_url):
    pane = make_pane(url=dead_url)
    pane.client = Script()
    type_and_send(qtbot, pane, ASK)
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    reply = last_reply(pane)
    assert reply.message.content == "Para one.\n\n"
    qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not pane.streaming, timeout=10000)
    messages, params = pane.client.sent[-1]
    # Chat templates trim a message's trailing blank lines: the model goes on from the
    # trimmed text, so the app sends that and adds the model's words to it unchanged.
    assert messages[-1] == {"role": "assistant", "content": "Para one."}
    assert params["continue_final"] is True
    assert reply.message.content == "Para one.\n\nPara two."
