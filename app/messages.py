"""Widgets that show a conversation: one bubble per message, the prompt box."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (QFrame, QLabel, QPlainTextEdit, QScrollArea, QVBoxLayout,
                               QWidget)

from app.conversations import Conversation, Message


def format_stats(stats: dict[str, Any]) -> str:
    """The line under a reply, e.g. '41.2 tokens/s · first token 0.18 s · 64 tokens'."""
    parts = []
    if stats.get("stopped"):
        parts.append("Stopped")
    if stats.get("generation_tps") is not None:
        parts.append(f"{stats['generation_tps']:.1f} tokens/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token {stats['ttft_s']:.2f} s")
    if stats.get("completion_tokens") is not None:
        parts.append(f"{stats['completion_tokens']} tokens")
    return " · ".join(parts)


class MessageWidget(QFrame):
    """One message. Text is shown as plain text (a model's output is never HTML)."""

    def __init__(self, message: Message, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.setObjectName(f"{message.role}Message")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        self.role_label = QLabel("You" if message.role == "user" else "Assistant")
        self.role_label.setStyleSheet("font-weight: bold;")
        self.text_label = QLabel()
        self.text_label.setTextFormat(Qt.TextFormat.PlainText)
        self.text_label.setWordWrap(True)
        self.text_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("stats")
        self.stats_label.setStyleSheet("color: gray; font-size: small;")
        self.error_label = QLabel()
        self.error_label.setObjectName("error")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        for w in (self.role_label, self.text_label, self.stats_label, self.error_label):
            layout.addWidget(w)
        self.refresh()

    def refresh(self) -> None:
        m = self.message
        self.text_label.setText(m.content)
        self.text_label.setVisible(bool(m.content) or m.error is None)
        stats = format_stats(m.stats)
        self.stats_label.setText(stats)
        self.stats_label.setVisible(bool(stats))
        self.error_label.setText(m.error or "")
        self.error_label.setVisible(m.error is not None)


class MessageView(QScrollArea):
    """The messages of one conversation; keeps the view pinned to the newest text."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self._inner = QWidget()
        self._layout = QVBoxLayout(self._inner)
        self._layout.addStretch(1)
        self.setWidget(self._inner)
        self.conversation: Conversation | None = None
        self._widgets: dict[int, MessageWidget] = {}  # id(Message) -> its widget

    def show_conversation(self, conv: Conversation | None) -> None:
        for w in self._widgets.values():
            w.deleteLater()
        self._widgets.clear()
        self.conversation = conv
        for m in conv.messages if conv else []:
            self.add(m)

    def add(self, message: Message) -> MessageWidget:
        w = MessageWidget(message, self._inner)
        self._layout.insertWidget(self._layout.count() - 1, w)
        self._widgets[id(message)] = w
        self._scroll_to_end()
        return w

    def refresh(self, message: Message) -> None:
        """Repaint a message if it is on screen (it may belong to another conversation)."""
        w = self._widgets.get(id(message))
        if w is not None:
            w.refresh()
            self._scroll_to_end()

    def widgets(self) -> list[MessageWidget]:
        return list(self._widgets.values())

    def _scroll_to_end(self) -> None:
        # After the layout has grown, not before.
        QTimer.singleShot(0, self, self._pin_to_end)

    def _pin_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())


class PromptEdit(QPlainTextEdit):
    """The input box: Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        if (event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
        elif event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.insertPlainText("\n")  # a plain newline, not Qt's soft line separator
        else:
            super().keyPressEvent(event)
