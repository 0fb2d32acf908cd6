"""Widgets that show a conversation: one bubble per message (prose, code blocks, Copy),
the prompt box."""

from __future__ import annotations

import re
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Conversation, Message

FENCE = re.compile(r"^[ \t]*```(.*)$", re.MULTILINE)


def split_fences(text: str) -> list[tuple[str, str]]:
    """Prose and ``` fenced code, in order: [("text", ...), ("code", ...), ...]. A fence
    still open (a reply mid-stream) runs to the end of the text."""
    parts: list[tuple[str, str]] = []
    pos, in_code = 0, False
    for m in FENCE.finditer(text):
        chunk = text[pos:m.start()]
        if in_code:
            parts.append(("code", chunk.removesuffix("\n")))
        elif chunk.strip():
            parts.append(("text", chunk.strip("\n")))
        pos = min(m.end() + 1, len(text))  # skip the fence line and its newline
        in_code = not in_code
    rest = text[pos:]
    if in_code:
        parts.append(("code", rest))
    elif rest.strip() or not parts:
        parts.append(("text", rest.strip("\n") if parts else rest))
    return parts


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
    if stats.get("cached_tokens"):
        parts.append(f"{stats['cached_tokens']} tokens cached")
    return " · ".join(parts)


def copy_text(text: str) -> None:
    QGuiApplication.clipboard().setText(text)


class CodeBlock(QFrame):
    """A fenced block: monospace on a dark background, with its own Copy button."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.setStyleSheet("#codeBlock { background: #23272e; border-radius: 6px; }"
                           "QLabel { color: #e6e6e6; }")
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.clicked.connect(lambda: copy_text(self.label.text()))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.copy_button, 0, Qt.AlignmentFlag.AlignTop)

    def text(self) -> str:
        return self.label.text()

    def setText(self, text: str) -> None:  # noqa: N802 - like QLabel's
        self.label.setText(text)


def _prose_label() -> QLabel:
    label = QLabel()
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class MessageWidget(QFrame):
    """One message: its prose and code blocks (a model's output is never HTML), the speed
    figures, the error if it failed, and Copy."""

    def __init__(self, message: Message, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.setObjectName(f"{message.role}Message")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        head = QHBoxLayout()
        self.role_label = QLabel("You" if message.role == "user" else "Assistant")
        self.role_label.setStyleSheet("font-weight: bold;")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(lambda: copy_text(self.message.content))
        head.addWidget(self.role_label)
        head.addStretch(1)
        head.addWidget(self.copy_button)
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        self.segments: list[QWidget] = []  # QLabel for prose, CodeBlock for code
        self.stats_label = QLabel()
        self.stats_label.setObjectName("stats")
        self.stats_label.setStyleSheet("color: gray; font-size: small;")
        self.error_label = QLabel()
        self.error_label.setObjectName("error")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        layout.addLayout(head)
        layout.addLayout(self.body)
        layout.addWidget(self.stats_label)
        layout.addWidget(self.error_label)
        self.refresh()

    def text(self) -> str:
        """The text shown (prose and code, without the fences)."""
        return "\n".join(w.text() for w in self.segments if not w.isHidden())

    def code_blocks(self) -> list[CodeBlock]:
        return [w for w in self.segments if isinstance(w, CodeBlock)]

    def refresh(self) -> None:
        m = self.message
        parts = split_fences(m.content)
        # Reuse the widgets of an unchanged prefix: a streaming reply only grows at the end.
        for i, (kind, text) in enumerate(parts):
            want = CodeBlock if kind == "code" else QLabel
            if i < len(self.segments) and type(self.segments[i]) is not want:
                for w in self.segments[i:]:
                    self.body.removeWidget(w)
                    w.deleteLater()
                del self.segments[i:]
            if i == len(self.segments):
                w = CodeBlock(self) if kind == "code" else _prose_label()
                self.segments.append(w)
                self.body.addWidget(w)
            if self.segments[i].text() != text:
                self.segments[i].setText(text)
        for w in self.segments[len(parts):]:
            self.body.removeWidget(w)
            w.deleteLater()
        del self.segments[len(parts):]
        if self.segments:
            self.segments[0].setVisible(bool(m.content) or m.error is None)
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
