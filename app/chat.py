"""The chat pane: conversations on the left; model picker, system prompt, sampling
settings, messages and prompt on the right.

Every node call goes through Tasks, so the GUI thread never waits on the network; every
failure (unknown model, node gone, busy) is shown inline next to what caused it, with Try
again. A model spread over several machines is chatted with exactly like a local one.
Nothing is lost by one key or click: a deleted conversation can be brought back for a
while, and a message sent while a reply streams waits its turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from app import replies, theme
from app.attachments import Image, carries_images
from app.catalog import capabilities_of
from app.chat_images import PendingImages
from app.chat_list import ConversationList
from app.chat_settings import ChatSettings
from app.common import message_of as _message_of
from app.conversations import Conversation, ConversationStore, Message
from app.messages import MessageView, PromptEdit
from app.notice import NoticeBar
from app.snapshots import NodeCard
from app.status import BUSY, runner_text
from app.tasks import StreamTask, Tasks
from engine.client import ChatDelta, NodeClient
from engine.errors import PeerUnreachable
from engine.records import ModelCard

log = logging.getLogger(__name__)
UNDO_MS = 10_000  # how long a deleted conversation can be brought back
DOWN = ("starting", "unreachable", "stopped")  # the node doesn't answer (app/status.py)


class ChatPane(QWidget):
    """Chat with the local node. `chat_params` go with every request (max_tokens, ...);
    the sampling boxes edit it. reply_finished(stats), reply_progress(tokens, seconds)
    and reply_ended() feed the charts and the tray; request_done(record) the request log.
    node_lost(reason) and node_back() are for the app that restarts its own node."""

    reply_finished = Signal(dict)
    reply_progress = Signal(int, float)
    reply_ended = Signal()  # finished, failed or stopped: nothing streams now
    request_done = Signal(dict)  # one request, for the Developer panel's log

    def __init__(self, client: NodeClient, store: ConversationStore, tasks: Tasks,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.store, self.tasks = client, store, tasks
        self.node_status: dict[str, Any] = {}
        self._stream: StreamTask | None = None
        self._stream_conv: Conversation | None = None
        self._stream_reply: Message | None = None
        # a message sent while a reply streams, with its pictures: sent when the reply ends
        self._queued: tuple[Conversation, str, list[Image]] | None = None
        self._capabilities: dict[str, list[str] | None] = {}  # model -> what it does
        self._retry: Message | None = None  # a failed reply to send again once the node answers
        self._lost: str | None = None  # why the app's node went, while it restarts
        self._build()
        self.conversations.fill()
        if store.warning:
            self.show_error(store.warning)
        if store.conversations:
            self.conversation_list.setCurrentRow(0)

    # --- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        left = self.conversations = ConversationList(self.store)
        left.chosen.connect(self._on_select)
        left.new_button.clicked.connect(self.new_conversation)
        left.delete_button.clicked.connect(self.delete_conversation)
        self.conversation_list, self.undo_bar = left.list, left.undo_bar
        self.new_button, self.delete_button = left.new_button, left.delete_button

        settings = self.settings = ChatSettings()
        self.model_picker, self.system_edit = settings.model_picker, settings.system_edit
        self.model_state, self.load_bar = settings.model_state, settings.load_bar
        self.temperature, self.top_p = settings.temperature, settings.top_p
        self.max_tokens = settings.max_tokens
        self.model_picker.textActivated.connect(self.load_model)
        self.system_edit.editingFinished.connect(self._system_edited)
        self.error_label = QLabel()
        self.error_label.setObjectName("chatError")
        self.error_label.setWordWrap(True)
        theme.set_role(self.error_label, "error")
        self.error_label.hide()
        self.view = MessageView()
        self.view.continue_requested.connect(self.continue_reply)
        self.view.retry_requested.connect(self.try_again)
        self.queued_bar = NoticeBar("queued")
        self.prompt = PromptEdit()
        self.prompt.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.prompt.setAccessibleName("Message")
        self.prompt.setMaximumHeight(110)
        self.prompt.setMinimumHeight(48)
        self.prompt.submitted.connect(self.send)
        self.prompt.images_given.connect(self._take_mime)
        self.pending = PendingImages(self.tasks)
        self.attach_button = self.pending.button
        self.model_picker.currentTextChanged.connect(lambda _t: self._show_takes_images())
        self.setAcceptDrops(True)  # an image file dropped anywhere on the chat
        self.view.image = self.store.image
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send the message")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.setAccessibleName("Stop the reply")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Answer the last message again")
        self.regenerate_button.setAccessibleName("Answer the last message again")
        self.regenerate_button.setEnabled(False)
        self.regenerate_button.clicked.connect(self.regenerate)

        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        rv.addWidget(settings)
        rv.addWidget(self.error_label)
        rv.addWidget(self.view, 1)
        rv.addWidget(self.queued_bar)
        rv.addWidget(self.pending)
        bottom = QHBoxLayout()
        bottom.addWidget(self.prompt, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.attach_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.regenerate_button)
        bottom.addLayout(buttons)
        rv.addLayout(bottom)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([200, 600])
        splitter.setChildrenCollapsible(False)
        left.setMinimumWidth(140)
        QVBoxLayout(self).addWidget(splitter)
        # Tab goes through the pane in reading order (the splitter's own order is not it);
        # each message's buttons are off it (the conversation's arrow keys reach them).
        order = [self.conversation_list, self.new_button, self.delete_button,
                 self.undo_bar.button, self.model_picker, self.system_edit,
                 self.temperature, self.top_p, self.max_tokens, self.view,
                 self.queued_bar.button, self.prompt, self.send_button, self.attach_button,
                 self.stop_button,
                 self.regenerate_button]
        for a, b in zip(order, order[1:]):
            QWidget.setTabOrder(a, b)

    @property
    def chat_params(self) -> dict[str, Any]:
        """What goes with every request (max_tokens, ...); the sampling boxes edit it."""
        return self.settings.params

    @chat_params.setter
    def chat_params(self, params: dict[str, Any]) -> None:
        self.settings.params = params

    def _system_edited(self) -> None:
        conv = self.current()
        if conv is not None and conv.system != self.system_edit.text():
            conv.system = self.system_edit.text()
            self._save()

    # --- errors -------------------------------------------------------------------------
    def show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.show()

    def clear_error(self) -> None:
        self.error_label.hide()
        self.error_label.clear()

    # --- models -------------------------------------------------------------------------
    def refresh_models(self) -> None:
        self.tasks.run(self.client.models, on_done=self._fill_models,
                       on_error=self._models_failed, owner=self)

    def _models_failed(self, error: BaseException) -> None:
        if self._lost is None:  # with the node down, the app's banner says why, once
            self.show_error(f"Couldn't list models: {_message_of(error)}")

    def _fill_models(self, models: list[ModelCard]) -> None:
        # an embedding model or reranker has no chat: it isn't offered here
        self._capabilities = {m.id: capabilities_of(m.shoal.capabilities) for m in models}
        self.model_picker.set_models([m for m in models if self._capabilities[m.id] is None
                                      or "generate" in self._capabilities[m.id]])
        self._show_takes_images()

    def takes_images(self, model: str | None) -> bool | None:
        """Does `model` take images? The worker's word when it is the one loaded, else
        its card's; None when neither says (an older node)."""
        if not model:
            return None
        runner = self.node_status.get("runner") or {}
        caps = capabilities_of(runner.get("capabilities")) \
            if runner.get("model") == model else None
        caps = caps if caps is not None else self._capabilities.get(model)
        return None if caps is None else "vision" in caps

    def _show_takes_images(self) -> None:
        model = self.model_picker.currentText().strip() or self.node_status.get("model")
        self.pending.set_model(model, self.takes_images(model))

    # --- images: the Image… button, a paste, a drop ----------------------------------------
    def _take_mime(self, mime: Any) -> None:
        self.pending.take_mime(mime)
        self.prompt.setFocus()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if carries_images(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        if carries_images(event.mimeData()):
            event.acceptProposedAction()
            self._take_mime(event.mimeData())

    def set_cards(self, cards: list[NodeCard]) -> None:
        """The cluster's machines, for whether each model fits (the picker's badges)."""
        self.model_picker.set_cards(cards)

    def follow_cluster(self, state: Any) -> None:
        """Keep the picker's fit in step with `state` (a ClusterState). A bound slot: Qt
        drops the connection when this pane is deleted, as at quit."""
        self._cluster = state
        state.changed.connect(self._cluster_changed)

    def _cluster_changed(self) -> None:
        self.set_cards(self._cluster.cards())

    def load_model(self, name: str) -> None:
        """Ask the node to load `name` (the user picked it); failures show inline."""
        name = name.strip()
        if not name:
            return
        self.clear_error()
        self.tasks.run(self.client.load, name, on_error=lambda e: self.show_error(
            f"Couldn't load {name}: {_message_of(e)}"), owner=self)

    def set_node_status(self, status: dict[str, Any]) -> None:
        """Follow the node: its model, what it is doing before it can answer (in the
        pane and in a reply that waits), and its error inline (e.g. a failed load)."""
        was_down = self.node_status.get("state") in DOWN
        self.node_status = status
        self.settings.show_status(status)
        self._show_takes_images()
        runner = status.get("runner") or {}
        # the app's own node given up on: its banner says why, and the node is still down
        given_up = self._lost is not None and status.get("state") == "error"
        if status.get("state") == "error" and status.get("error") and not given_up:
            self.show_error(str(status["error"]))
        self._follow_wait(runner)
        if was_down and status.get("state") not in DOWN and not given_up:
            self.node_back()

    def focus_home(self) -> None:
        """Where the keyboard goes when the Chat tab is shown (Ctrl+1): the message box."""
        self.prompt.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def focus_model_picker(self) -> None:
        """Ctrl+L: straight to the model list."""
        self.settings.focus_model_picker()

    # --- conversations --------------------------------------------------------------------
    def current(self) -> Conversation | None:
        return self.view.conversation

    def _select(self, conv: Conversation | None) -> None:
        if not self.conversations.select(conv):
            self.view.show_conversation(None)

    def _on_select(self, conv: Conversation | None) -> None:
        self.view.show_conversation(conv)
        self.system_edit.setText(conv.system if conv else "")
        self._set_streaming(self.streaming)

    def new_conversation(self) -> Conversation:
        conv = self.store.new(self.model_picker.currentText().strip() or None)
        conv.system = self.system_edit.text()  # a new conversation keeps the system prompt
        self._select(conv)
        self._save()
        self.prompt.setFocus()
        return conv

    def delete_conversation(self) -> None:
        """Delete the conversation on screen; Undo in the bar below the list brings it
        back for UNDO_MS."""
        conv = self.current()
        if conv is None:
            return
        if self._stream is not None and self._stream_conv is conv:
            self.stop()
        index = self.store.conversations.index(conv)
        self.store.delete(conv.id)
        rest = self.store.conversations
        self._select(rest[min(index, len(rest) - 1)] if rest else None)
        self._save()
        self.conversations.offer_undo(conv, index, self.undo_delete, UNDO_MS)

    def undo_delete(self) -> None:
        """Bring the last deleted conversation back, where it was."""
        deleted = self.conversations.take_deleted()
        if deleted is None:
            return
        conv, index = deleted
        self.store.restore(conv, index)
        self._select(conv)
        self._save()

    def _save(self) -> None:
        try:
            self.store.save()
        except OSError as e:
            self.show_error(f"Couldn't save conversations to {self.store.path}: {e}. "
                            "Free some disk space; nothing is lost while Shoal runs.")

    # --- chat ---------------------------------------------------------------------------
    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def send(self) -> None:
        """Send the prompt box's text and the pictures waiting above it, and stream the
        answer into a new reply; while a reply streams, they wait their turn (queued)."""
        text = self.prompt.toPlainText().strip()
        if self.pending.reading:  # the message would go without the picture being read
            self.pending.add([], ["An image is still being read: send again in a moment."])
            return
        if not text and not self.pending.images:
            return
        images = self.pending.take()
        self.prompt.clear()
        self.prompt.setFocus()
        if self.streaming:
            self._queue(text, images)
            return
        self._send_text(self.current() or self.new_conversation(), text, images)

    def _send_text(self, conv: Conversation, text: str, images: Sequence[Image] = ()) -> None:
        self.clear_error()
        try:  # the pictures are kept before they are sent: a reply never outlives them
            for image in images:
                self.store.keep_image(image.data, image.name)
        except OSError as e:
            self.pending.put_back(list(images))
            self.prompt.setPlainText(text)
            self.show_error(f"Couldn't keep the image in {self.store.images_dir}: {e}. "
                            "Free some disk space and send it again.")
            return
        if conv is not self.current():
            self._select(conv)
        if self.system_edit.text() != conv.system:
            conv.system = self.system_edit.text()
        if not any(m.role == "user" for m in conv.messages):
            conv.title = text.splitlines()[0][:48] if text else images[0].label[:48]
            self.conversations.set_current_title(conv.title)
        conv.messages.append(Message("user", text, images=[i.name for i in images]))
        self.view.add(conv.messages[-1])
        self._answer(conv)

    # --- a message sent while a reply streams ---------------------------------------------
    def _queue(self, text: str, images: Sequence[Image] = ()) -> None:
        conv = self._stream_conv or self.current() or self.new_conversation()
        images = list(images)
        if self._queued is not None:  # a second message joins the first
            text = "\n\n".join(t for t in (self._queued[1], text) if t)
            images = self._queued[2] + images
        self._queued = (conv, text, images)
        short = text if len(text) <= 60 else text[:59] + "…"
        pictures = f"{len(images)} image{'s' if len(images) > 1 else ''}" if images else ""
        what = f"“{short}”" + (f" with {pictures}" if short and pictures else pictures)
        self.queued_bar.show_notice(f"Queued: {what} is sent when this reply ends.",
                                    "Cancel", self._unqueue)

    def _unqueue(self) -> None:
        """Cancel: the queued text goes back into the message box."""
        if self._queued is None:
            return
        text, images = self._queued[1], self._queued[2]
        self._queued = None
        self.pending.put_back(images)
        self.queued_bar.dismiss()
        rest = self.prompt.toPlainText()
        self.prompt.setPlainText(text + (f"\n{rest}" if rest else ""))
        self.prompt.setFocus()

    def _send_queued(self, failed: bool) -> None:
        if self._queued is None:
            return
        conv, text, images = self._queued
        if failed or self.store.get(conv.id) is None:
            self._unqueue()
            self.queued_bar.show_notice(
                "Your queued message wasn't sent: the reply before it "
                + ("failed." if failed else "was deleted.")
                + " It is back in the message box.", timeout_ms=UNDO_MS)
            return
        self._queued = None
        self.queued_bar.dismiss()
        self._send_text(conv, text, images)

    def regenerate(self) -> None:
        """Drop the last reply and answer the last message again (with the current model,
        system prompt and sampling settings)."""
        conv = self.current()
        if conv is None or self.streaming or not conv.messages:
            return
        if conv.messages[-1].role == "assistant":
            conv.messages.pop()
            self.view.show_conversation(conv)
        if conv.messages and conv.messages[-1].role == "user":
            self.clear_error()
            self._answer(conv)

    def continue_reply(self, reply: Message) -> None:
        """A reply that stopped early (the answer length, or Stop) goes on in the same
        bubble: the model is sent it as its unfinished answer (continue_final_message)."""
        conv = self.current()
        if (conv is None or self.streaming or not conv.messages
                or conv.messages[-1] is not reply or reply.error is not None
                or not reply.content.strip()):
            return
        self.clear_error()
        # The reply is the last turn, unfinished: the model continues that same message
        # (no hidden request, no second answer to join on).
        history = conv.history(self.store.image)
        history[-1] = {"role": "assistant", "content": replies.go_on(reply)}
        self._start(conv, reply, history, continue_final=True)

    def try_again(self, reply: Message) -> None:
        """A failed reply is answered again, once Shoal's node answers (at once when it
        does now)."""
        conv = next((c for c in self.store.conversations if reply in c.messages), None)
        if conv is None or conv.messages[-1] is not reply or self.streaming:
            return
        if self.node_status.get("state") in DOWN:
            self._retry = reply
            self._show_wait(reply, "Waiting for Shoal's node to answer; your message is "
                            "sent again then…")
            return
        self._retry = None
        conv.messages.pop()
        if conv is self.current():
            self.view.show_conversation(conv)
        else:
            self._select(conv)
        self._answer(conv)

    def node_lost(self, reason: str) -> None:
        """The app's own node stopped and the app restarts it: the reply streaming now
        fails with `reason` (a sentence, e.g. "Shoal's node stopped; Shoal is starting
        it again.") and offers Try again, which waits for node_back()."""
        self._lost = reason
        self.clear_error()  # an earlier failure's sentence is not what happens now
        self.node_status = {**self.node_status, "state": "unreachable"}
        if self._stream is not None and self._stream_reply is not None:
            stream, reply = self._stream, self._stream_reply
            stream.cancel()
            self._fail(reply, None)

    def node_back(self) -> None:
        """The node answers again: the model list is read again, and a Try again that
        waited is sent."""
        self._lost = None
        if self.node_status.get("state") in DOWN:
            self.node_status = {**self.node_status, "state": "idle"}
        self.refresh_models()
        reply, self._retry = self._retry, None
        if reply is not None:
            self._show_wait(reply, None)
            self.try_again(reply)

    def _answer(self, conv: Conversation) -> None:
        history = conv.history(self.store.image)
        reply = Message("assistant", "")
        conv.messages.append(reply)
        self.view.add(reply)
        self._start(conv, reply, history)

    def _start(self, conv: Conversation, reply: Message,
               history: list[dict[str, Any]], continue_final: bool = False) -> None:
        model = self.model_picker.currentText().strip() or None
        conv.model = model or conv.model
        params = dict(self.chat_params)
        started = time.monotonic()
        reply.stats["_started"] = started
        reply.stats["_wall"] = time.time()
        if model:
            reply.stats["model"] = model
        if (self.node_status.get("runner") or {}).get("type") in BUSY:
            reply.stats["_loading_since"] = started
        self._stream_conv, self._stream_reply = conv, reply
        client = self.client  # the worker must hold no widget (see app/tasks.py)
        stream = self.tasks.stream(
            lambda: client.chat(history, model=model, continue_final=continue_final,
                                **params),
            on_items=lambda deltas: self._on_deltas(reply, deltas, started),
            on_done=lambda: self._ended(stream, reply),
            on_error=lambda e: self._ended(stream, reply, e), owner=self)
        self._stream = stream
        self._set_streaming(True)
        self._show_wait(reply, "Sending your message…")

    def stop(self) -> None:
        """Stop the reply: nothing more is shown; the worker closes the stream at the next
        token, which makes the node stop. Send comes back once the stream has closed."""
        if self._stream is None or self._stream.cancelled.is_set():
            return
        reply = self._stream_reply
        if reply is None:
            return
        self._stream.cancel()
        reply.stats["stopped"] = True
        self._show_wait(reply, None)
        self.view.refresh(reply)
        self.stop_button.setEnabled(False)
        self.stop_button.setText("Stopping…")
        self.reply_ended.emit()

    def _set_streaming(self, on: bool) -> None:
        self.send_button.setEnabled(not on)
        self.stop_button.setEnabled(on)
        self.stop_button.setText("Stop")
        conv = self.current()
        self.regenerate_button.setEnabled(
            not on and conv is not None and any(m.role == "user" for m in conv.messages))
        if conv is not None and conv.messages:
            w = self.view.widget_of(conv.messages[-1])
            if w is not None and w.streaming != (on and conv is self._stream_conv):
                w.set_streaming(on and conv is self._stream_conv)

    # --- what a reply waits for -----------------------------------------------------------
    def _waiting_reply(self) -> Message | None:
        """The streaming reply while it has no text yet."""
        reply = self._stream_reply if self._stream is not None else None
        return None if reply is None or "_first_at" in reply.stats else reply

    def _show_wait(self, reply: Message, text: str | None) -> None:
        w = self.view.widget_of(reply)
        if w is not None:
            w.set_pending(text)

    def _follow_wait(self, runner: dict[str, Any]) -> None:
        """A reply waiting while the node prepares or loads the model: say so, and count
        that time apart in its figures."""
        reply = self._waiting_reply()
        if reply is None:
            return
        now = time.monotonic()
        if runner.get("type") in BUSY:
            reply.stats.setdefault("_loading_since", now)
            reply.stats.pop("_loaded_at", None)
            self._show_wait(reply, f"Waiting for the model: {runner_text(runner)}…")
        elif "_loading_since" in reply.stats and "_loaded_at" not in reply.stats:
            reply.stats["_loaded_at"] = now
            self._show_wait(reply, "The model is ready; reading your message…")

    def _on_deltas(self, reply: Message, deltas: list[ChatDelta], started: float) -> None:
        for d in deltas:
            wait = replies.take(reply, d, started)
            if wait is not None:
                self._show_wait(reply, wait or None)
        speed = replies.speed(reply.stats)
        if speed is not None:
            reply.stats["_live_tps"] = speed  # under the reply while it streams
        self.view.refresh(reply)
        if reply.stats.get("_pieces"):
            self.reply_progress.emit(int(reply.stats["_pieces"]),
                                     time.monotonic() - reply.stats["_first_at"])

    def _ended(self, stream: StreamTask, reply: Message,
               error: BaseException | None = None) -> None:
        if stream is not self._stream:
            return  # already ended (node_lost failed it)
        if error is None:
            self._finish(reply)
        else:
            self._fail(reply, error)

    def _finish(self, reply: Message) -> None:
        stopped = self._stream is not None and self._stream.cancelled.is_set()
        self._stream = None
        self._stream_reply = None
        record = replies.close(reply, stopped)
        s = reply.stats
        self._show_wait(reply, None)
        self._set_streaming(False)
        self.view.refresh(reply)
        self._save()
        self.reply_ended.emit()
        if s.get("generation_tps") is not None:
            self.reply_finished.emit(dict(s))
        self.request_done.emit(record)
        if self._queued is not None:  # after this reply's own signals
            failed = reply.error is not None
            QTimer.singleShot(0, self, lambda: self._send_queued(failed))

    def _fail(self, reply: Message, error: BaseException | None) -> None:
        log.info("Chat failed: %s", error or self._lost)
        if error is None:  # node_lost: the app's words for why its node went
            reply.error = f"{self._lost} Try again sends your message once it answers."
        else:
            reply.error = _message_of(error)
        reply.stats["_unsent"] = isinstance(error, PeerUnreachable)  # never reached the node
        self._finish(reply)
