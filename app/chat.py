"""The chat pane: conversations on the left; model picker, system prompt, sampling
settings, messages and prompt on the right.

Every node call goes through Tasks, so the GUI thread never waits on the network; every
failure (unknown model, node gone, busy) is shown inline next to what caused it. A model
spread over several nodes is chatted with exactly like a local one (same API).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.common import message_of as _message_of
from app.conversations import Conversation, ConversationStore, Message
from app.messages import MessageView, PromptEdit
from app.tasks import StreamTask, Tasks
from engine.client import ChatDelta, NodeClient

log = logging.getLogger(__name__)
NODE_DEFAULT = "node default"


class ChatPane(QWidget):
    """Chat with the local node. `chat_params` go with every request (max_tokens, ...);
    the sampling boxes edit it. reply_finished(stats) and reply_progress(tokens, seconds)
    feed the charts."""

    reply_finished = Signal(dict)
    reply_progress = Signal(int, float)

    def __init__(self, client: NodeClient, store: ConversationStore, tasks: Tasks,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.store, self.tasks = client, store, tasks
        self.chat_params: dict[str, Any] = {}
        self._stream: StreamTask | None = None
        self._stream_conv: Conversation | None = None
        self._build()
        self._fill_conversations()
        if store.warning:
            self.show_error(store.warning)
        if store.conversations:
            self.conversation_list.setCurrentRow(0)

    # --- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.conversation_list = QListWidget()
        self.conversation_list.currentItemChanged.connect(self._on_select)
        self.new_button = QPushButton("New")
        self.new_button.clicked.connect(self.new_conversation)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_conversation)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.conversation_list)
        row = QHBoxLayout()
        row.addWidget(self.new_button)
        row.addWidget(self.delete_button)
        lv.addLayout(row)

        self.model_picker = QComboBox()
        self.model_picker.setEditable(True)  # a model id or path not in the list is allowed
        self.model_picker.setMinimumContentsLength(24)
        self.model_picker.lineEdit().setPlaceholderText("Choose a model")
        self.model_picker.textActivated.connect(self.load_model)
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("System prompt for this conversation (optional)")
        self.system_edit.editingFinished.connect(self._system_edited)
        self.temperature = self._sampling_box(QDoubleSpinBox(), "temperature", -0.1, 2.0, 0.1)
        self.top_p = self._sampling_box(QDoubleSpinBox(), "top_p", 0.0, 1.0, 0.05)
        self.max_tokens = self._sampling_box(QSpinBox(), "max_tokens", 0, 32768, 64)
        self.error_label = QLabel()
        self.error_label.setObjectName("chatError")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.hide()
        self.view = MessageView()
        self.prompt = PromptEdit()
        self.prompt.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.prompt.setMaximumHeight(110)
        self.prompt.submitted.connect(self.send)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Answer the last message again")
        self.regenerate_button.setEnabled(False)
        self.regenerate_button.clicked.connect(self.regenerate)

        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(QLabel("Model:"))
        top.addWidget(self.model_picker, 1)
        rv.addLayout(top)
        rv.addWidget(self.system_edit)
        sampling = QHBoxLayout()
        for text, box in (("Temperature:", self.temperature), ("Top p:", self.top_p),
                          ("Max tokens:", self.max_tokens)):
            sampling.addWidget(QLabel(text))
            sampling.addWidget(box)
        sampling.addStretch(1)
        rv.addLayout(sampling)
        rv.addWidget(self.error_label)
        rv.addWidget(self.view, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.prompt, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.regenerate_button)
        bottom.addLayout(buttons)
        rv.addLayout(bottom)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([200, 600])
        QVBoxLayout(self).addWidget(splitter)

    def _sampling_box(self, box: QSpinBox | QDoubleSpinBox, key: str, low: float,
                      high: float, step: float) -> QSpinBox | QDoubleSpinBox:
        """A box for one sampling parameter; its lowest value means "the node's default"
        (the parameter is then not sent)."""
        box.setRange(low, high)
        box.setSingleStep(step)
        box.setSpecialValueText(NODE_DEFAULT)
        box.setValue(low)
        box.setObjectName(key)

        def changed(value: float) -> None:
            if value == box.minimum():
                self.chat_params.pop(key, None)
            else:
                self.chat_params[key] = value
        box.valueChanged.connect(changed)
        return box

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
                       on_error=lambda e: self.show_error(
                           f"Couldn't list models: {_message_of(e)}"), owner=self)

    def _fill_models(self, models: list[dict[str, Any]]) -> None:
        text = self.model_picker.currentText()
        self.model_picker.clear()
        self.model_picker.addItems([str(m.get("id")) for m in models])
        self.model_picker.setCurrentText(text)

    def load_model(self, name: str) -> None:
        """Ask the node to load `name` (the user picked it); failures show inline."""
        name = name.strip()
        if not name:
            return
        self.clear_error()
        self.tasks.run(self.client.load, name, on_error=lambda e: self.show_error(
            f"Couldn't load {name}: {_message_of(e)}"), owner=self)

    def set_node_status(self, status: dict[str, Any]) -> None:
        """Follow the node: show its model, and its error inline (e.g. a failed load)."""
        model = status.get("model")
        if model and not self.model_picker.lineEdit().hasFocus():
            self.model_picker.setCurrentText(str(model))
        if status.get("state") == "error" and status.get("error"):
            self.show_error(str(status["error"]))

    # --- conversations --------------------------------------------------------------------
    def current(self) -> Conversation | None:
        return self.view.conversation

    def _fill_conversations(self) -> None:
        self.conversation_list.blockSignals(True)
        self.conversation_list.clear()
        for conv in self.store.conversations:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            self.conversation_list.addItem(item)
        self.conversation_list.blockSignals(False)

    def _select(self, conv: Conversation | None) -> None:
        self._fill_conversations()
        row = self.store.conversations.index(conv) if conv else -1
        self.conversation_list.setCurrentRow(row)
        if row < 0:
            self.view.show_conversation(None)

    def _on_select(self, item: QListWidgetItem | None, _previous: object = None) -> None:
        conv = self.store.get(item.data(Qt.ItemDataRole.UserRole)) if item else None
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

    def _save(self) -> None:
        try:
            self.store.save()
        except OSError as e:
            self.show_error(f"Couldn't save conversations to {self.store.path}: {e}. "
                            "Free some disk space; nothing is lost while Shoal runs.")

    # --- chat -----------------------------------------------------------------------------
    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def send(self) -> None:
        """Send the prompt box's text and stream the answer into a new reply."""
        text = self.prompt.toPlainText().strip()
        if not text or self.streaming:
            return
        self.clear_error()
        conv = self.current() or self.new_conversation()
        if self.system_edit.text() != conv.system:
            conv.system = self.system_edit.text()
        if not any(m.role == "user" for m in conv.messages):
            conv.title = text.splitlines()[0][:48]
            self.conversation_list.currentItem().setText(conv.title)
        conv.messages.append(Message("user", text))
        self.view.add(conv.messages[-1])
        self.prompt.clear()
        self._answer(conv)

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

    def _answer(self, conv: Conversation) -> None:
        history = conv.history()
        reply = Message("assistant", "")
        conv.messages.append(reply)
        self.view.add(reply)
        model = self.model_picker.currentText().strip() or None
        conv.model = model or conv.model
        params = dict(self.chat_params)
        started = time.monotonic()
        self._stream_conv = conv
        client = self.client  # the worker must hold no widget (see app/tasks.py)
        self._stream = self.tasks.stream(
            lambda: client.chat(history, model=model, **params),
            on_items=lambda deltas: self._on_deltas(reply, deltas, started),
            on_done=lambda: self._finish(reply),
            on_error=lambda e: self._fail(reply, e), owner=self)
        self._set_streaming(True)

    def stop(self) -> None:
        """Stop the reply: nothing more is shown; the worker closes the stream at the next
        token, which makes the node stop. Send comes back once the stream has closed."""
        if self._stream is None or self._stream.cancelled.is_set():
            return
        self._stream.cancel()
        reply = self._stream_conv.messages[-1]
        reply.stats["stopped"] = True
        self.view.refresh(reply)
        self.stop_button.setEnabled(False)
        self.stop_button.setText("Stopping…")

    def _set_streaming(self, on: bool) -> None:
        self.send_button.setEnabled(not on)
        self.stop_button.setEnabled(on)
        self.stop_button.setText("Stop")
        conv = self.current()
        self.regenerate_button.setEnabled(
            not on and conv is not None and any(m.role == "user" for m in conv.messages))

    def _on_deltas(self, reply: Message, deltas: list[ChatDelta], started: float) -> None:
        for d in deltas:
            if d.text and "ttft_s" not in reply.stats:
                reply.stats["ttft_s"] = time.monotonic() - started  # until the node says
                reply.stats["_first_at"] = time.monotonic()
            if d.text:
                reply.stats["_pieces"] = reply.stats.get("_pieces", 0) + 1
            reply.content += d.text
            if d.reasoning:  # kept with the reply, apart from what is sent back to the model
                reply.stats["reasoning"] = reply.stats.get("reasoning", "") + d.reasoning
            if d.shoal:
                for key in ("ttft_s", "generation_tps", "prompt_tps"):
                    if key in d.shoal:
                        reply.stats[key] = d.shoal[key]
            if d.usage:
                reply.stats["completion_tokens"] = d.usage.get("completion_tokens")
                details = d.usage.get("prompt_tokens_details") or {}
                reply.stats["cached_tokens"] = details.get("cached_tokens")
            if d.finish_reason:
                reply.stats["finish_reason"] = d.finish_reason
        self.view.refresh(reply)
        if "_first_at" in reply.stats:
            self.reply_progress.emit(int(reply.stats["_pieces"]),
                                     time.monotonic() - reply.stats["_first_at"])

    def _finish(self, reply: Message) -> None:
        self._stream = None
        for key in ("_first_at", "_pieces"):  # bookkeeping, not figures to keep
            reply.stats.pop(key, None)
        self._set_streaming(False)
        self.view.refresh(reply)
        self._save()
        if reply.stats.get("generation_tps") is not None:
            self.reply_finished.emit(dict(reply.stats))

    def _fail(self, reply: Message, error: BaseException) -> None:
        log.info("Chat failed: %s", error)
        reply.error = _message_of(error)
        self._finish(reply)
